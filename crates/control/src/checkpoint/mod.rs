//! The checkpoint coordinator's decisions, pure: when the next checkpoint falls due
//! (CPR's interval from measured costs, or the configured one), whether it is a delta, and
//! how a failed parameter server is recovered. Every clock reading is an argument (ms on a
//! monotonic clock), so a test or the cluster simulator drives a whole job's schedule and
//! recoveries without waiting; the master's coordinator executes what this decides.

use elastrec_common::clock::seconds_between;
use serde::{Deserialize, Serialize};

use crate::cpr::{decide, CprCosts, PlsTracker, RecoveryDecision, RecoveryMode};

/// Which recovery a parameter-server failure gets (CPR).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RecoveryChoice {
    /// Every PS and the data position return to the last checkpoint.
    Full,
    /// Only the failed PS reloads its shard; everything else keeps its progress.
    Partial,
    /// CPR's rule: compare the expected overheads of full (Eq. 1) and partial (Eq. 2)
    /// recovery from measured costs and the mean time between failures.
    #[default]
    Auto,
}

/// Which embedding rows a delta checkpoint saves first (CPR §4.3).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SavePriority {
    /// Every checkpoint saves every row.
    #[default]
    None,
    /// Most frequently used rows (a 4-byte access counter per row of the large tables).
    Mfu,
    /// Sub-sampled used rows (a list of `ratio × rows` entries per large table).
    Ssu,
}

/// What the policy reads of the job's `[checkpoint]` section (its defaults are there).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CheckpointSettings {
    /// Take checkpoints at all.
    pub enabled: bool,
    /// Seconds between full checkpoints (0: CPR's interval from measured costs).
    pub interval_s: f64,
    /// Full, partial or CPR's choice.
    pub recovery: RecoveryChoice,
    /// The portion of lost samples a partial recovery may add (CPR's target).
    pub target_pls: f64,
    /// Mean time between PS failures assumed until failures are observed, seconds.
    pub mtbf_s: f64,
    /// Least relative saving partial recovery must promise over full.
    pub min_benefit: f64,
    /// Rows a delta saves first (none: every checkpoint is full).
    pub priority: SavePriority,
    /// Share of a large table's rows a delta saves; `1/ratio - 1` deltas follow a full one.
    pub ratio: f64,
}

/// Until one checkpoint measured it, the training stall of a checkpoint is assumed to be
/// this long (s) when choosing the interval.
const ASSUMED_SAVE_S: f64 = 0.05;
/// Rescheduling cost (s) assumed until a recovery measured it.
const ASSUMED_RESCHEDULE_S: f64 = 1.0;
/// The first checkpoint comes this soon (s) when the interval is chosen by the policy: it
/// measures the save cost the policy needs.
pub const FIRST_CHECKPOINT_S: f64 = 10.0;
/// Bounds of a policy-chosen interval (s).
const INTERVAL_BOUNDS_S: (f64, f64) = (2.0, 6.0 * 3600.0);
/// The job length CPR plans an online job's checkpoints over (it never ends), seconds.
const ONLINE_HORIZON_S: f64 = 86_400.0;

/// One PS failure and what was done about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecoveryRecord {
    /// When it was detected (ms since the Unix epoch).
    pub at_ms: u64,
    /// Failed PS indices.
    pub ps: Vec<u32>,
    /// Why they were declared dead.
    pub reason: String,
    /// Full or partial.
    pub mode: RecoveryMode,
    /// Checkpoint restored (none: state at initialization).
    pub checkpoint: Option<u64>,
    /// Samples trained when the failure was detected.
    pub samples_at_failure: u64,
    /// Samples of the restored checkpoint's data position.
    pub samples_at_checkpoint: u64,
    /// PLS added (partial recovery, Eq. 3).
    pub pls_added: f64,
    /// Seconds from detection until every PS served again.
    pub seconds: Option<f64>,
    /// Of those, the longest time a relaunched PS spent loading (CPR's `O_load`; the rest
    /// is `O_res`, detecting the failure and rescheduling).
    #[serde(default)]
    pub load_s: Option<f64>,
    /// A partial recovery whose relaunched PS could not take its dense slice from the
    /// replica on its successor: that slice went back to the checkpoint.
    #[serde(default)]
    pub dense_rewound: bool,
    /// The decision with both overhead estimates.
    pub decision: String,
}

/// Aggregates over the job, persisted in the master database.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CheckpointStats {
    /// Checkpoints committed.
    pub count: u64,
    /// Newest committed id.
    pub last_id: u64,
    /// When it was committed (ms since the Unix epoch).
    pub last_ms: u64,
    /// Delta checkpoints since the last full one.
    pub deltas_since_full: u32,
    /// Sum over checkpoints of the longest PS stall (ms).
    pub stall_ms_sum: f64,
    /// Sum of the matching plain memory-copy times (ms).
    pub memcpy_ms_sum: f64,
    /// Sum of background persistence times (s) and bytes.
    pub persist_s_sum: f64,
    /// Bytes persisted.
    pub bytes_sum: u64,
    /// PS load time of the last recovery (s), when measured.
    pub o_load_s: Option<f64>,
    /// Rescheduling time of the last recovery (s), when measured.
    pub o_res_s: Option<f64>,
    /// Portion of lost samples.
    pub pls: Option<PlsTracker>,
    /// Every recovery.
    pub recoveries: Vec<RecoveryRecord>,
    /// Samples trained again after full recoveries.
    pub retrained_samples: u64,
    /// The decision in force.
    pub decision: Option<RecoveryDecision>,
}

impl CheckpointStats {
    fn mean(sum: f64, n: u64) -> f64 {
        if n == 0 {
            0.0
        } else {
            sum / n as f64
        }
    }
    /// Mean stall per checkpoint (ms).
    pub fn stall_ms(&self) -> f64 {
        Self::mean(self.stall_ms_sum, self.count)
    }
    /// Mean memory-copy time of the same bytes (ms).
    pub fn memcpy_ms(&self) -> f64 {
        Self::mean(self.memcpy_ms_sum, self.count)
    }
    /// Background persistence rate (MB/s).
    pub fn persist_mb_s(&self) -> f64 {
        if self.persist_s_sum > 0.0 {
            self.bytes_sum as f64 / 1e6 / self.persist_s_sum
        } else {
            0.0
        }
    }
}

/// What a committed checkpoint measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct Commit {
    /// Its id.
    pub id: u64,
    /// When it was committed (ms since the Unix epoch).
    pub created_ms: u64,
    /// A delta (else full).
    pub delta: bool,
    /// Samples its data position counts.
    pub samples: u64,
    /// Longest training stall over the PS (µs).
    pub stall_us: u64,
    /// The matching plain memory copy (µs).
    pub memcpy_us: u64,
    /// Longest background persistence (µs).
    pub persist_us: u64,
    /// Bytes written.
    pub bytes: u64,
}

/// When to checkpoint and how to recover, from the job's measurements.
#[derive(Debug, Clone)]
pub struct CheckpointPolicy {
    cfg: CheckpointSettings,
    /// Samples the job trains (1 for an online job, which never ends).
    total_samples: u64,
    /// PS count of the layout in force (changes with online re-sharding).
    num_ps: u32,
    /// The next checkpoint must be full (the PS layout changed: a delta's base was written
    /// by other servers).
    force_full: bool,
    /// When this master started (ms, monotonic).
    started_ms: u64,
    /// When this master last committed a checkpoint (monotonic: the interval must not
    /// depend on wall-clock steps).
    last_commit_ms: Option<u64>,
    /// A recovery in progress: (record index, when it started, ms).
    pending: Option<(usize, u64)>,
    /// The longest load time a server relaunched by it reported (s).
    pending_load_s: Option<f64>,
    stats: CheckpointStats,
}

impl CheckpointPolicy {
    /// The policy of a job training `total_samples` on `num_ps` servers, started at
    /// `now_ms`; `stats` come from the master database after a restart.
    pub fn new(
        cfg: CheckpointSettings,
        num_ps: u32,
        total_samples: u64,
        stats: Option<CheckpointStats>,
        now_ms: u64,
    ) -> Self {
        let total_samples = total_samples.max(1);
        let mut stats = stats.unwrap_or_default();
        if stats.pls.is_none() {
            stats.pls = Some(PlsTracker::new(total_samples, num_ps));
        }
        Self {
            cfg,
            total_samples,
            num_ps,
            force_full: false,
            started_ms: now_ms,
            last_commit_ms: None,
            pending: None,
            pending_load_s: None,
            stats,
        }
    }

    /// Everything measured so far.
    pub fn stats(&self) -> &CheckpointStats {
        &self.stats
    }

    /// PS count of the layout in force.
    pub fn num_ps(&self) -> u32 {
        self.num_ps
    }

    /// Seconds since this policy started, on the clock reading `now_ms`.
    fn elapsed_s(&self, now_ms: u64) -> f64 {
        seconds_between(self.started_ms, now_ms)
    }

    fn costs(&self, now: u64) -> CprCosts {
        let st = &self.stats;
        let o_save_s = if st.count > 0 {
            st.stall_ms() / 1e3
        } else {
            ASSUMED_SAVE_S
        };
        // Loading reads what saving wrote: until a recovery measured it, the persistence
        // time of a checkpoint stands in for it.
        let o_load_s = st.o_load_s.unwrap_or(if st.count > 0 {
            st.persist_s_sum / st.count as f64
        } else {
            ASSUMED_SAVE_S
        });
        let failures = st.recoveries.len() as f64;
        let elapsed = self.elapsed_s(now);
        let t_fail_s = if failures > 0.0 {
            // Observed rate, never more optimistic than the configured one.
            (elapsed / failures).min(self.cfg.mtbf_s)
        } else {
            self.cfg.mtbf_s
        };
        CprCosts {
            o_save_s,
            o_load_s,
            o_res_s: st.o_res_s.unwrap_or(ASSUMED_RESCHEDULE_S),
            t_fail_s,
        }
    }

    /// CPR's decision at `now` (`samples_done` estimates the job length), with the
    /// configured mode forced unless `recovery = "auto"`.
    pub fn decision(&self, now: u64, samples_done: u64) -> RecoveryDecision {
        let c = self.costs(now);
        let elapsed = self.elapsed_s(now).max(1.0);
        let rate = samples_done as f64 / elapsed;
        let t_total = if self.total_samples <= 1 {
            // An online job has no end: CPR's job length becomes a day of training.
            ONLINE_HORIZON_S
        } else if rate > 0.0 {
            self.total_samples as f64 / rate
        } else {
            self.cfg.mtbf_s
        };
        let mut d = decide(
            &c,
            t_total,
            self.num_ps,
            self.cfg.target_pls,
            self.cfg.min_benefit,
        );
        let forced = match self.cfg.recovery {
            RecoveryChoice::Auto => None,
            RecoveryChoice::Full => Some(RecoveryMode::Full),
            RecoveryChoice::Partial => Some(RecoveryMode::Partial),
        };
        if let Some(m) = forced {
            if m != d.mode {
                d.reason = format!("{m} recovery (configured); CPR would choose {}", d.reason);
                d.mode = m;
            } else {
                d.reason = format!("{m} recovery (configured, CPR agrees); {}", d.reason);
            }
        }
        d
    }

    /// How to recover a failure at `now`: [`CheckpointPolicy::decision`], or `force` when
    /// given (the whole job restarted: nothing else kept its progress).
    pub fn recovery_decision(
        &self,
        now: u64,
        samples_done: u64,
        force: Option<RecoveryMode>,
    ) -> RecoveryDecision {
        let mut decision = self.decision(now, samples_done);
        if let Some(m) = force {
            if m != decision.mode {
                decision.reason = format!(
                    "{m} recovery (the whole job restarted); {}",
                    decision.reason
                );
                decision.mode = m;
            }
        }
        decision
    }

    /// Seconds between full checkpoints at `now`.
    pub fn interval_s(&self, now: u64, samples_done: u64) -> f64 {
        if self.cfg.interval_s > 0.0 {
            return self.cfg.interval_s;
        }
        let st = &self.stats;
        if st.count == 0 {
            return FIRST_CHECKPOINT_S;
        }
        let persist_s = st.persist_s_sum / st.count as f64;
        // A flash checkpoint barely stalls training, so CPR's optimum can be very short;
        // background persistence still costs CPU and I/O: keep it under half the time.
        let floor = INTERVAL_BOUNDS_S.0.max(2.0 * persist_s);
        self.decision(now, samples_done)
            .t_save_s()
            .clamp(floor, INTERVAL_BOUNDS_S.1.max(floor))
    }

    /// Seconds between checkpoints of any kind (deltas come `1/ratio` times as often).
    fn period_s(&self, now: u64, samples_done: u64) -> f64 {
        let full = self.interval_s(now, samples_done);
        match self.cfg.priority {
            SavePriority::None => full,
            _ => full * self.cfg.ratio,
        }
    }

    /// True when a checkpoint is due at `now` (the caller knows whether one runs).
    pub fn due(&self, now: u64, samples_done: u64) -> bool {
        if !self.cfg.enabled {
            return false;
        }
        let last = self.last_commit_ms.unwrap_or(self.started_ms);
        let since = seconds_between(last, now);
        since >= self.period_s(now, samples_done)
    }

    /// The PS layout changed to `num_ps` servers: checkpoints are written by them from now
    /// on, and the next one is full.
    pub fn layout_changed(&mut self, num_ps: u32) {
        self.num_ps = num_ps;
        self.force_full = true;
        if let Some(p) = self.stats.pls.as_mut() {
            p.n_emb = num_ps;
        }
    }

    /// Whether the checkpoint about to be taken is a delta: with a save priority, `1/ratio
    /// - 1` deltas follow each full one; the first, and the first after a layout change,
    ///   are full.
    pub fn next_is_delta(&mut self) -> bool {
        let forced_full = std::mem::take(&mut self.force_full);
        let per_full = (1.0 / self.cfg.ratio).round().max(1.0) as u32;
        self.cfg.priority != SavePriority::None
            && self.stats.count > 0
            && self.stats.deltas_since_full + 1 < per_full
            && !forced_full
    }

    /// A checkpoint was committed at `now`.
    pub fn committed(&mut self, now: u64, c: &Commit) {
        let st = &mut self.stats;
        st.count += 1;
        st.last_id = c.id;
        st.last_ms = c.created_ms;
        st.deltas_since_full = if c.delta { st.deltas_since_full + 1 } else { 0 };
        st.stall_ms_sum += c.stall_us as f64 / 1e3;
        st.memcpy_ms_sum += c.memcpy_us as f64 / 1e3;
        st.persist_s_sum += c.persist_us as f64 / 1e6;
        st.bytes_sum += c.bytes;
        // A delta saves only the hottest rows of the large tables: the others still go
        // back to the last full checkpoint, so the samples lost since it count (CPR counts
        // MFU's and SSU's PLS from their full saves, as Eq. 3 for vanilla).
        if let Some(p) = st.pls.as_mut().filter(|_| !c.delta) {
            p.on_checkpoint(c.samples);
        }
        self.last_commit_ms = Some(now);
    }

    /// `failed` servers are recovered partially at `samples_done`: the updates since their
    /// last checkpoint are lost; returns the portion of lost samples this adds (CPR Eq. 3).
    pub fn partial_loss(&mut self, samples_done: u64, failed: u32) -> f64 {
        self.stats
            .pls
            .as_mut()
            .map_or(0.0, |p| p.on_failure(samples_done, failed))
    }

    /// A full recovery trains `samples` again.
    pub fn retrained(&mut self, samples: u64) {
        self.stats.retrained_samples += samples;
    }

    /// A recovery started at `now`, decided by `decision`.
    pub fn recovery_started(
        &mut self,
        now: u64,
        record: RecoveryRecord,
        decision: RecoveryDecision,
    ) {
        self.stats.recoveries.push(record);
        self.stats.decision = Some(decision);
        self.pending = Some((self.stats.recoveries.len() - 1, now));
        self.pending_load_s = None;
    }

    /// A server relaunched by the recovery in progress could not take its dense slice from
    /// its replica.
    pub fn dense_rewound(&mut self) {
        if let Some(r) = self
            .pending
            .and_then(|(i, _)| self.stats.recoveries.get_mut(i))
        {
            r.dense_rewound = true;
        }
    }

    /// A server relaunched by the recovery in progress spent `secs` loading its state.
    pub fn loaded(&mut self, secs: f64) {
        if self.pending.is_some() && secs.is_finite() && secs >= 0.0 {
            self.pending_load_s = Some(self.pending_load_s.unwrap_or(0.0).max(secs));
        }
    }

    /// True while a recovery waits for every PS to serve again.
    pub fn recovering(&self) -> bool {
        self.pending.is_some()
    }

    /// Every PS serves again at `now`: closes the recovery in progress and returns how
    /// long it took (s). Eq. 1 and 2 add `O_load` and `O_res`, so the time is split, not
    /// counted twice: the relaunched servers' reported load time is `O_load`, the rest
    /// (detection, rescheduling, start-up) `O_res`.
    pub fn recovered(&mut self, now: u64) -> Option<f64> {
        let (i, t0) = self.pending.take()?;
        let secs = seconds_between(t0, now);
        let load = self.pending_load_s.take().unwrap_or(0.0).min(secs);
        if let Some(r) = self.stats.recoveries.get_mut(i) {
            r.seconds = Some(secs);
            r.load_s = Some(load);
        }
        self.stats.o_load_s = Some(load);
        self.stats.o_res_s = Some(secs - load);
        Some(secs)
    }
}

#[cfg(test)]
mod tests;
