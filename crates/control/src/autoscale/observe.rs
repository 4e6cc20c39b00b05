//! What the autoscaler measures: steady windows become profile samples, PS memory
//! readings feed its own OOM check, and per-PS service times find a hot server.

use super::*;

/// What one PS served between two checks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PsLoad {
    /// PS index.
    pub index: u32,
    /// Requests (pulls and pushes) served.
    pub requests: u64,
    /// Seconds spent serving them.
    pub serve_s: f64,
}

/// DLRover-RM §6's hot PS: the server whose mean time per request is above `ratio` times
/// the median of its peers (and above 1 ms). Returns (index, its ms, peers' median ms).
pub fn hot_ps(loads: &[PsLoad], ratio: f64) -> Option<(u32, f64, f64)> {
    let ms: Vec<(u32, f64)> = loads
        .iter()
        .filter(|l| l.requests >= HOT_MIN_REQUESTS)
        .map(|l| (l.index, l.serve_s * 1e3 / l.requests as f64))
        .collect();
    if ms.len() < 2 {
        return None;
    }
    let (index, worst) = ms.iter().copied().max_by(|a, b| a.1.total_cmp(&b.1))?;
    let mut peers: Vec<f64> = ms.iter().filter(|m| m.0 != index).map(|m| m.1).collect();
    peers.sort_by(f64::total_cmp);
    let median = peers[peers.len() / 2];
    (worst > 1.0 && worst > ratio * median).then_some((index, worst, median))
}

/// The memory watchdog's verdict on one node: `Some(reason)` when its resident memory is
/// above its limit (the local backend's stand-in for a cgroup memory limit: the node is
/// stopped as the kernel's OOM killer would, and the master's failure handling takes over).
pub fn memory_verdict(limit_gb: f64, is_ps: bool, rss_bytes: u64) -> Option<String> {
    let rss_gb = rss_bytes as f64 / (1u64 << 30) as f64;
    (rss_gb > limit_gb).then(|| {
        format!(
            "resident memory {rss_gb:.2} GiB is above its limit of {limit_gb:.2} GiB (autoscale.{}_mem_gb)",
            if is_ps { "ps" } else { "worker" }
        )
    })
}

/// Steps whose PS memory readings the autoscaler keeps for its own OOM check.
pub(super) const MEMORY_STEPS_KEPT: usize = 64;

/// Fewest requests of a PS in a window for its mean time per request to count.
const HOT_MIN_REQUESTS: u64 = 20;

/// Checks in a row a PS must be hot before load is moved off it.
const HOT_STREAK: u32 = 2;

impl Autoscaler {
    /// Checks the PS for a hot one, from each live PS node's cumulative
    /// `(node id, index, requests, seconds serving)`. Once the same PS was hot in
    /// [`HOT_STREAK`] checks in a row, returns a decision that spreads its load over one
    /// more PS (every PS then holds fewer rows, the hot one included).
    pub fn check_hot_ps(&mut self, served: &[(u32, u32, u64, f64)], v: &View) -> Option<Decision> {
        let loads: Vec<PsLoad> = served
            .iter()
            .filter_map(|&(id, index, requests, serve_s)| {
                let (r0, s0) = self.served.get(&id).copied().unwrap_or((requests, serve_s));
                (requests >= r0).then(|| PsLoad {
                    index,
                    requests: requests - r0,
                    serve_s: (serve_s - s0).max(0.0),
                })
            })
            .collect();
        self.served = served.iter().map(|&(id, _, r, s)| (id, (r, s))).collect();
        let Some((index, ms, median)) = hot_ps(&loads, self.settings.hot_ratio) else {
            self.hot_streak = None;
            return None;
        };
        let streak = match self.hot_streak {
            Some((i, n)) if i == index => n + 1,
            _ => 1,
        };
        self.hot_streak = Some((index, streak));
        let [_, pmax] = self.settings.ps;
        if streak < HOT_STREAK || !self.settings.ps_scaling || v.ps >= pmax || v.recovering {
            return None;
        }
        self.hot_streak = None;
        Some(Decision::Apply {
            workers: v.workers,
            worker_cpu: self.settings.worker_cpu,
            ps: v.ps + 1,
            ps_cpu: self.settings.ps_cpu,
            predicted: None,
            reasons: vec![format!(
                "hot PS {index}: {ms:.2} ms per request vs its peers' median {median:.2} ms in {HOT_STREAK} checks in a row; one more PS takes rows off it"
            )],
        })
    }

    /// Feeds one observation: closes a profile window when one is complete.
    pub fn observe(&mut self, v: &View) {
        if !v.steady || v.workers != v.target_workers || v.workers == 0 {
            self.window = None;
            return;
        }
        let (cpu, ps_cpu) = self.settings.cores_key();
        let w = match self.window {
            Some(w)
                if w.workers == v.workers && w.ps == v.ps && w.cpu == cpu && w.ps_cpu == ps_cpu =>
            {
                w
            }
            _ => {
                self.window = Some(Window {
                    start_ms: v.now_ms,
                    samples: v.samples_done,
                    workers: v.workers,
                    ps: v.ps,
                    cpu,
                    ps_cpu,
                });
                return;
            }
        };
        let dt = v.now_ms.saturating_sub(w.start_ms);
        if dt < self.settings.sample_ms {
            return;
        }
        self.window = Some(Window {
            start_ms: v.now_ms,
            samples: v.samples_done,
            ..w
        });
        let trained = v.samples_done.saturating_sub(w.samples);
        if trained == 0 {
            return; // a stalled window says nothing about the allocation's speed
        }
        let throughput = trained as f64 * 1000.0 / dt as f64;
        let m = f64::from(self.settings.batch_size);
        self.unreported.push(ProfileSample {
            alloc: self.settings.allocation(w.workers, w.ps),
            batch_size: self.settings.batch_size,
            iter_time_s: f64::from(w.workers) * m / throughput,
        });
        self.seen_workers.insert(w.workers);
        self.seen_ps.insert(w.ps);
        self.seen_cpu.insert(w.cpu);
        self.seen_ps_cpu.insert(w.ps_cpu);
        self.samples_taken += 1;
        self.measured = Some((throughput, w.workers, w.ps));
        self.throughput_at
            .insert((w.ps, w.cpu, w.ps_cpu, w.workers), throughput);
        if let Some(last) = self.history.last_mut() {
            if last.after == (w.workers, w.ps)
                && last.worker_cpu.1 as u64 == w.cpu
                && (last.ps_cpu.1 * 1000.0).round() as u64 == w.ps_cpu
                && last.measured_after.is_none()
            {
                last.measured_after = Some(throughput);
            }
        }
    }

    /// A PS memory reading (resident memory of PS `index` at global step `step`).
    pub fn observe_memory(&mut self, index: u32, step: u64, mem_gb: f64) {
        if !(mem_gb.is_finite() && mem_gb > 0.0) {
            return;
        }
        self.memory.push(MemorySample {
            ps_index: index,
            step,
            mem_gb,
        });
        match self.memory_by_step.back_mut() {
            Some((s, by_ps)) if *s == step => {
                by_ps.insert(index, mem_gb);
            }
            Some((s, _)) if *s > step => {}
            _ => {
                self.memory_by_step
                    .push_back((step, [(index, mem_gb)].into_iter().collect()));
                if self.memory_by_step.len() > MEMORY_STEPS_KEPT {
                    self.memory_by_step.pop_front();
                }
            }
        }
    }

    /// The PS count the servers' memory needs by the job's end: their total memory
    /// (DLRover-RM's growth model, `a + b s + c sqrt(s)`, fitted to the summed readings)
    /// predicted at the last step, over [`OomPolicy::trigger_fraction`] of a PS's limit;
    /// with why. `None` until enough steps are read.
    ///
    /// [`OomPolicy::trigger_fraction`]: elastrec_brain::oom::OomPolicy
    pub(super) fn ps_needed_for_memory(&self, v: &View) -> Option<(u32, String)> {
        let totals: Vec<elastrec_brain::oom::MemorySample> = self
            .memory_by_step
            .iter()
            .map(|(step, by_ps)| elastrec_brain::oom::MemorySample {
                ps_index: 0,
                step: *step,
                mem_gb: by_ps.values().sum(),
            })
            .collect();
        let growth = elastrec_brain::oom::fit_growth(&totals).ok()?;
        let m = u64::from(self.settings.batch_size.max(1));
        let last_step = v.samples_total.div_ceil(m);
        let peak = growth.at(last_step);
        let per_ps =
            elastrec_brain::oom::OomPolicy::default().trigger_fraction * self.settings.ps_mem_gb;
        if per_ps <= 0.0 {
            return None;
        }
        let need = (peak / per_ps).ceil().max(1.0) as u32;
        Some((
            need,
            format!(
                "PS memory: the servers' memory grows to {peak:.2} GiB in total by step {last_step} (OOM prediction over {} readings); {need} PS of {:.2} GiB hold it",
                totals.len(),
                self.settings.ps_mem_gb
            ),
        ))
    }
}
