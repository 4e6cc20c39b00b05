//! What each round does: probe an allocation the profile lacks, keep growing while a
//! growth pays, or ask the brain for a plan.

use super::*;

impl Autoscaler {
    /// What to do now: nothing, a plan round, or a probe.
    pub fn next_round(&mut self, v: &View) -> Round {
        let fresh = self.samples_taken > self.samples_at_last_plan;
        // Exploring, a probe needs one window at the allocation in force, not a whole
        // planning interval: a cold job reaches its scale in a few windows.
        let measured_here = self
            .measured
            .is_some_and(|(_, w, p)| (w, p) == (v.workers, v.ps));
        // A probe (or an undone growth) is measured by one window too, and a plan's growth
        // is judged by its first.
        let plan_due = v.now_ms.saturating_sub(self.last_plan_ms) >= self.settings.interval_ms
            || (self.exploring && measured_here)
            || self.measure_next;
        if !fresh || !v.steady || !(plan_due || self.growth.is_some()) {
            return Round::Idle;
        }
        self.samples_at_last_plan = self.samples_taken;
        let report = ProfileReport {
            samples: std::mem::take(&mut self.unreported),
            memory: std::mem::take(&mut self.memory),
        };
        if let Some(d) = self.undo_unpaid_plan(v) {
            return Round::Revert(report, d);
        }
        if !plan_due {
            return Round::Report(report);
        }
        self.last_plan_ms = v.now_ms;
        let [wmin, wmax] = self.settings.workers;
        // A probe takes a worker without asking: only where the job plans its own
        // capacity, and only when the capacity has room for it. On a shared brain service
        // every worker comes from the cluster's plan.
        let room = self.settings.allocation(v.workers + 1, v.ps).total_cpu()
            <= self.settings.cluster_cpu + 1e-9;
        if self.settings.send_capacity && self.seen_workers.len() < 2 {
            // Up when there is room; otherwise (a warm start that filled the capacity) down
            // by a quarter. A fit from one allocation predicted 1 worker as fast as 15 and
            // the job dropped to 1: the second allocation must be measured, not guessed.
            let to = if room && v.workers < wmax {
                Some(if self.exploring {
                    self.grown(v, 2)
                } else {
                    v.workers + 1
                })
            } else if v.workers > wmin {
                Some((v.workers * 3 / 4).clamp(wmin, v.workers - 1))
            } else {
                None
            };
            if let Some(to) = to {
                let d = self.worker_probe(v, to, format!(
                    "probe: the profile holds only {} worker(s); {to} workers measure how throughput scales (the fit needs two allocations)",
                    v.workers
                ));
                return Round::Probe(report, d);
            }
        }
        // A give-back probe costs throughput now for plans that repay it over the rest of
        // the job: one that ends within a few planning intervals keeps what it has.
        let remaining_s = self
            .measured()
            .filter(|t| *t > 0.0)
            .map_or(f64::INFINITY, |t| {
                v.samples_total.saturating_sub(v.samples_done) as f64 / t
            });
        let worth_probing =
            remaining_s * 1000.0 > PROBE_MIN_INTERVALS_LEFT * self.settings.interval_ms as f64;
        if !self.settings.send_capacity && worth_probing {
            if let Some(d) = self.shared_probe(v) {
                return Round::Probe(report, d);
            }
        }
        if self.exploring {
            match self.keep_growing(v) {
                Some((to, why)) => return Round::Probe(report, self.worker_probe(v, to, why)),
                // Scaling flattened (or a bound was reached): the brain plans from here.
                None => self.exploring = false,
            }
        }
        if let Some(d) = self.identifying_probe(v) {
            return Round::Probe(report, d);
        }
        if self.samples_taken < DLROVER_MIN_SAMPLES as u64 {
            // Too few windows for a fit with a held-out check: report them and wait.
            return Round::Report(report);
        }
        let plan = self.plan_ask(v);
        self.measure_next = false;
        Round::Plan(report, plan)
    }

    /// A probe that identifies a term of Eq. 2 the profile cannot tell yet, once the
    /// workers are measured: one core more per worker, one core more per PS, or (on the
    /// brain's word) one PS more. Only where the job plans its own capacity.
    fn identifying_probe(&mut self, v: &View) -> Option<Decision> {
        let [_, wmax] = self.settings.workers;
        // Vertical: the cores of a worker (Eq. 2's `l_w`) are identified only once the profile
        // holds two values; probe one core more when the bounds allow it.
        let cpu = self.settings.worker_cpu;
        let room = f64::from(v.workers) * (cpu + 1.0) + f64::from(v.ps) * self.settings.ps_cpu
            <= self.settings.cluster_cpu + 1e-9;
        if self.settings.send_capacity
            && room
            && (self.seen_workers.len() >= 2 || v.workers >= wmax)
            && self.seen_cpu.len() < 2
            && cpu + 1.0 <= self.settings.worker_cpu_max
        {
            let d = Decision::Apply {
                workers: v.workers,
                worker_cpu: cpu + 1.0,
                ps: v.ps,
                ps_cpu: self.settings.ps_cpu,
                predicted: None,
                reasons: vec![format!(
                    "probe: the profile holds only {cpu} core(s) per worker; one more measures what a worker's cores are worth (Eq. 2)"
                )],
            };
            return Some(d);
        }
        // A PS's cores enter Eq. 2 only as `w / (p * ps_cpu)`: from one PS count and one
        // value of them, the fit cannot tell that term from the workers' own; one core
        // more per PS (in place, no restart) measures it.
        let ps_cpu = self.settings.ps_cpu;
        let room = self.settings.allocation(v.workers, v.ps).total_cpu() + f64::from(v.ps)
            <= self.settings.cluster_cpu + 1e-9;
        if self.settings.send_capacity
            && room
            && (self.seen_workers.len() >= 2 || v.workers >= wmax)
            && (self.seen_cpu.len() >= 2 || cpu + 1.0 > self.settings.worker_cpu_max)
            && self.seen_ps_cpu.len() < 2
            && self.seen_ps.len() < 2
            && ps_cpu + 1.0 <= self.settings.ps_cpu_max + 1e-9
        {
            let d = Decision::Apply {
                workers: v.workers,
                worker_cpu: cpu,
                ps: v.ps,
                ps_cpu: ps_cpu + 1.0,
                predicted: None,
                reasons: vec![format!(
                    "probe: the profile holds only {ps_cpu} core(s) per PS; one more measures what a server's cores are worth (Eq. 2, changed in place)"
                )],
            };
            return Some(d);
        }
        // A plan that wanted more PS for speed was refused while the profile held one PS
        // count (and a PS's cores could not vary: fixed, or no room for one more): a
        // second PS count identifies the PS term, so one more PS (an online re-sharding)
        // measures what a server is worth. Without it a job that may grow its PS for
        // speed never does. Only on the brain's word: a probe before it would pre-empt the
        // memory and hot-PS changes with one that has no reason of its own.
        let [_, pmax] = self.settings.ps;
        let room = self.settings.allocation(v.workers, v.ps + 1).total_cpu()
            <= self.settings.cluster_cpu + 1e-9;
        if self.ps_probe_wanted
            && self.settings.send_capacity
            && self.settings.ps_scaling
            && room
            && v.ps < pmax
            && !v.recovering
            && (self.seen_workers.len() >= 2 || v.workers >= wmax)
            && (self.seen_cpu.len() >= 2 || cpu + 1.0 > self.settings.worker_cpu_max)
            && self.seen_ps_cpu.len() < 2
            && self.seen_ps.len() < 2
        {
            self.ps_probe_wanted = false;
            let d = Decision::Apply {
                workers: v.workers,
                worker_cpu: cpu,
                ps: v.ps + 1,
                ps_cpu,
                predicted: None,
                reasons: vec![format!(
                    "probe: the profile holds only {} PS; {} measure what a server is worth (Eq. 2's w / (p ps_cpu), through online re-sharding)",
                    v.ps,
                    v.ps + 1
                )],
            };
            return Some(d);
        }
        None
    }

    /// The re-plan the brain is asked for: where the job stands, what it measured and the
    /// limits it learned.
    fn plan_ask(&self, v: &View) -> PlanAsk {
        let remaining = v.samples_total.saturating_sub(v.samples_done);
        let current = self.settings.allocation(v.workers, v.ps);
        let horizon_s = self
            .measured()
            .filter(|t| *t > 0.0)
            .map_or(0.0, |t| remaining as f64 / t);
        let m = u64::from(self.settings.batch_size.max(1));
        PlanAsk {
            current: Some(current),
            remaining_samples: remaining.max(1),
            current_step: v.samples_done / m,
            total_steps: v.samples_total.div_ceil(m).max(v.samples_done / m + 1),
            worker_start_s: self.settings.worker_start_s,
            ps_migration_s: self.settings.ps_migration_s,
            horizon_s,
            free_cpu: self
                .settings
                .send_capacity
                .then(|| (self.settings.cluster_cpu - current.total_cpu()).max(0.0)),
            free_mem_gb: self
                .settings
                .send_capacity
                .then(|| (self.settings.cluster_mem_gb - current.total_mem_gb()).max(0.0)),
            max_cpu: self.max_cpu,
            max_workers: self.max_workers,
        }
    }

    /// On a shared brain service a job measures by giving back, never by taking (every
    /// core it takes comes from the cluster's plan): a quarter fewer workers, then cores
    /// per worker, then cores per PS (in place; the PS term of Eq. 2 is `w / (p ps_cpu)`,
    /// so this also tells what a PS is worth), each while the profile holds one value of
    /// it. Without them a fit over one allocation can say nothing about a dimension, the
    /// plans' changes in it are refused, and a job that started with one PS stayed
    /// PS-bound (the cluster simulator: 4x the JCT of the users' own configurations).
    pub(super) fn shared_probe(&self, v: &View) -> Option<Decision> {
        let [wmin, _] = self.settings.workers;
        let quarter_off = |x: f64| x - (x / 4.0).floor().max(1.0);
        if self.seen_workers.len() < 2 && v.workers > wmin {
            let to = (v.workers * 3 / 4).clamp(wmin, v.workers - 1);
            return Some(self.worker_probe(v, to, format!(
                "probe: the profile holds only {} worker(s); {to} workers measure how throughput scales (on a shared brain a probe gives back, never takes)",
                v.workers
            )));
        }
        let cpu = self.settings.worker_cpu;
        if self.seen_cpu.len() < 2 && cpu >= 2.0 {
            let to = quarter_off(cpu);
            return Some(Decision::Apply {
                workers: v.workers,
                worker_cpu: to,
                ps: v.ps,
                ps_cpu: self.settings.ps_cpu,
                predicted: None,
                reasons: vec![format!(
                    "probe: the profile holds only {cpu} core(s) per worker; {to} measure what a worker's cores are worth (Eq. 2; on a shared brain a probe gives back)"
                )],
            });
        }
        let ps_cpu = self.settings.ps_cpu;
        if self.seen_ps_cpu.len() < 2 && self.seen_ps.len() < 2 && ps_cpu >= 2.0 {
            let to = quarter_off(ps_cpu);
            return Some(Decision::Apply {
                workers: v.workers,
                worker_cpu: cpu,
                ps: v.ps,
                ps_cpu: to,
                predicted: None,
                reasons: vec![format!(
                    "probe: the profile holds only {ps_cpu} core(s) per PS and one PS count; {to} measure what a server is worth (Eq. 2's w / (p ps_cpu), changed in place)"
                )],
            });
        }
        None
    }

    /// `factor` times the workers of `v`, within the worker bound and the capacity (at
    /// least one more).
    pub(super) fn grown(&self, v: &View, factor: u32) -> u32 {
        let [_, wmax] = self.settings.workers;
        let fits = |n: u32| {
            self.settings.allocation(n, v.ps).total_cpu() <= self.settings.cluster_cpu + 1e-9
        };
        let mut to = (factor * v.workers).min(wmax).max(v.workers + 1);
        while to > v.workers + 1 && !fits(to) {
            to -= 1;
        }
        to
    }

    /// While exploring: the next growth, if the last one paid (throughput at the current
    /// workers against the largest smaller count measured at the same PS and cores is at
    /// least `explore_efficiency` of proportional; four times the workers at
    /// `explore_linear`, else twice) and the bounds and capacity leave room.
    pub(super) fn keep_growing(&self, v: &View) -> Option<(u32, String)> {
        let (now, w, p) = self.measured?;
        if (w, p) != (v.workers, v.ps) {
            return None;
        }
        let (cpu, ps_cpu) = self.settings.cores_key();
        let (&(.., w0), &before) = self
            .throughput_at
            .range((p, cpu, ps_cpu, 0)..(p, cpu, ps_cpu, w))
            .next_back()?;
        let efficiency = (now / before) / (f64::from(w) / f64::from(w0));
        let linear = efficiency >= self.settings.explore_linear;
        let to = self.grown(v, if linear { 4 } else { 2 });
        let room = self.settings.allocation(to, p).total_cpu() <= self.settings.cluster_cpu + 1e-9;
        let [_, wmax] = self.settings.workers;
        (efficiency >= self.settings.explore_efficiency && w < wmax && room).then(|| {
            (
                to,
                format!(
                    "probe: {w0} -> {w} workers raised throughput {:.2}x ({:.0}% of proportional); {to} while it scales (a cold start explores before the fit)",
                    now / before,
                    100.0 * efficiency
                ),
            )
        })
    }

    /// A probe to `workers` workers at the current cores and PS.
    pub(super) fn worker_probe(&self, v: &View, workers: u32, why: String) -> Decision {
        Decision::Apply {
            workers,
            worker_cpu: self.settings.worker_cpu,
            ps: v.ps,
            ps_cpu: self.settings.ps_cpu,
            predicted: None,
            reasons: vec![why],
        }
    }
}
