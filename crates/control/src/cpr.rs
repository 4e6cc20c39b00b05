//! CPR's checkpoint policy (Maeng et al., "Understanding and Improving Failure Tolerant
//! Training for Deep Learning Recommendation with Partial Recovery", MLSys 2021): the cost
//! model of full and partial recovery (Eq. 1, 2), the portion of lost samples (PLS, Eq. 3,
//! 4), the checkpoint interval of each mode and the full-vs-partial decision.
//!
//! Everything here is a pure function of measured costs, so the live master, the tests and
//! the simulator run the same code. Times are seconds; any consistent unit works.
//!
//! * **Full recovery** (Eq. 1): every failure rewinds every node to the last checkpoint and
//!   re-trains what was lost, `T_save / 2` on average:
//!   `O_full = O_save·T_total/T_save + (O_load + T_save/2 + O_res)·T_total/T_fail`,
//!   minimized by `T_save,full = sqrt(2·O_save·T_fail)` ([`interval_full`]).
//! * **Partial recovery** (Eq. 2): only the failed parameter servers reload their last
//!   checkpoint; nothing is re-trained, so
//!   `O_part = O_save·T_total/T_save + (O_load + O_res)·T_total/T_fail`, and the updates the
//!   failed servers received since their checkpoint are lost instead.
//! * **PLS** (Eq. 3): the share of samples whose effect was lost, `Σ failures
//!   failed_ps·(S_i − S_last_ckpt)/(S_total·N_emb)` ([`PlsTracker`]); its expectation (Eq. 4)
//!   is `E[PLS] = 0.5·T_save/(T_fail·N_emb)` ([`expected_pls`]), so a target PLS fixes the
//!   interval `T_save,part = 2·PLS·N_emb·T_fail` ([`interval_partial`]).
//! * **Decision** ([`decide`]): Eq. 1 at `T_save,full` against Eq. 2 at `T_save,part`; partial
//!   recovery only when it saves more than a given fraction of full recovery's overhead.

use serde::{Deserialize, Serialize};

/// Measured checkpoint-related costs of a job and its failure rate (seconds).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CprCosts {
    /// Time to save one checkpoint (`O_save`).
    pub o_save_s: f64,
    /// Time to load one checkpoint (`O_load`).
    pub o_load_s: f64,
    /// Time to find and start replacements for failed nodes (`O_res`).
    pub o_res_s: f64,
    /// Mean time between failures of the job (`T_fail`); `f64::INFINITY` for none.
    pub t_fail_s: f64,
}

impl CprCosts {
    /// True when every cost is finite and non-negative and `T_fail` is positive (it may be
    /// infinite: no failures).
    pub fn is_valid(&self) -> bool {
        [self.o_save_s, self.o_load_s, self.o_res_s]
            .iter()
            .all(|v| v.is_finite() && *v >= 0.0)
            && self.t_fail_s > 0.0
    }

    /// Expected number of failures in `t_total_s`: `T_total / T_fail` (0 when `T_fail` is
    /// infinite).
    pub fn expected_failures(&self, t_total_s: f64) -> f64 {
        t_total_s / self.t_fail_s
    }
}

/// Eq. 1: expected checkpoint-related overhead (seconds) of full recovery over a job of
/// `t_total_s` seconds that saves every `t_save_s` seconds. The lost computation per
/// failure is `T_save / 2` (failures uniform in time).
pub fn overhead_full(c: &CprCosts, t_total_s: f64, t_save_s: f64) -> f64 {
    c.o_save_s * t_total_s / t_save_s
        + (c.o_load_s + t_save_s / 2.0 + c.o_res_s) * c.expected_failures(t_total_s)
}

/// Eq. 2: expected overhead (seconds) of partial recovery: as Eq. 1 without the lost
/// computation (the lost updates show up in the PLS instead).
pub fn overhead_partial(c: &CprCosts, t_total_s: f64, t_save_s: f64) -> f64 {
    c.o_save_s * t_total_s / t_save_s + (c.o_load_s + c.o_res_s) * c.expected_failures(t_total_s)
}

/// The interval minimizing Eq. 1: `T_save,full = sqrt(2·O_save·T_fail)`.
pub fn interval_full(o_save_s: f64, t_fail_s: f64) -> f64 {
    (2.0 * o_save_s * t_fail_s).sqrt()
}

/// Eq. 4 solved for the interval: `T_save,part = 2·PLS·N_emb·T_fail`, the interval whose
/// expected PLS is `target_pls` with `n_emb` embedding parameter servers.
pub fn interval_partial(target_pls: f64, n_emb: u32, t_fail_s: f64) -> f64 {
    2.0 * target_pls * f64::from(n_emb) * t_fail_s
}

/// Eq. 4: expected PLS at the end of a job that saves every `t_save_s` seconds, with one
/// of `n_emb` parameter servers failing every `t_fail_s` seconds on average:
/// `0.5·T_save/(T_fail·N_emb)`. It does not depend on the job's length.
pub fn expected_pls(t_save_s: f64, t_fail_s: f64, n_emb: u32) -> f64 {
    0.5 * t_save_s / (t_fail_s * f64::from(n_emb))
}

/// Eq. 3, the portion of lost samples, accumulated over a job's failures.
///
/// One global last-checkpoint position is kept: every parameter server saves at the same
/// checkpoint (the master triggers checkpoints job-wide), so all of them last saved at the
/// same sample count. A partial recovery restores the failed servers to that checkpoint and
/// leaves the position unchanged: a later failure of another server loses the samples
/// since that same checkpoint. A full recovery rewinds everything and loses no sample (the
/// caller simply does not call [`PlsTracker::on_failure`] for it, and calls
/// [`PlsTracker::on_checkpoint`] with the rewound position if it wants to be exact).
///
/// Serializable so the master can persist it with its job state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlsTracker {
    /// Samples of the whole job (`S_total`).
    pub total_samples: u64,
    /// Embedding parameter servers (`N_emb`).
    pub n_emb: u32,
    /// Samples processed when the last checkpoint was taken (`S_last_ckpt`).
    pub last_checkpoint_samples: u64,
    /// PLS so far.
    pub pls: f64,
    /// Failures recorded.
    pub failures: u32,
}

impl PlsTracker {
    /// A tracker for a job of `total_samples` samples over `n_emb` parameter servers, PLS 0,
    /// last checkpoint at sample 0 (the initial model is the first checkpoint).
    pub fn new(total_samples: u64, n_emb: u32) -> Self {
        Self {
            total_samples,
            n_emb,
            last_checkpoint_samples: 0,
            pls: 0.0,
            failures: 0,
        }
    }

    /// Records a checkpoint taken after `samples_now` samples.
    pub fn on_checkpoint(&mut self, samples_now: u64) {
        self.last_checkpoint_samples = samples_now;
    }

    /// Records a partial recovery of `failed_ps` servers after `samples_now` samples:
    /// adds `failed_ps·(S_i − S_last_ckpt)/(S_total·N_emb)` and returns that increment.
    pub fn on_failure(&mut self, samples_now: u64, failed_ps: u32) -> f64 {
        self.failures += 1;
        let denom = self.total_samples as f64 * f64::from(self.n_emb);
        if denom <= 0.0 {
            return 0.0;
        }
        let lost = samples_now.saturating_sub(self.last_checkpoint_samples) as f64;
        let inc = f64::from(failed_ps) * lost / denom;
        self.pls += inc;
        inc
    }

    /// PLS so far.
    pub fn pls(&self) -> f64 {
        self.pls
    }
}

/// How failures of embedding parameter servers are recovered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecoveryMode {
    /// Everything rewinds to the last checkpoint (model, optimizer state, data position).
    Full,
    /// Only the failed servers reload their part; training continues from where it was.
    Partial,
}

impl std::fmt::Display for RecoveryMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Full => "full",
            Self::Partial => "partial",
        })
    }
}

/// The outcome of [`decide`], with the figures it was based on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecoveryDecision {
    /// The chosen mode.
    pub mode: RecoveryMode,
    /// Eq. 1 at `t_save_full_s` (seconds).
    pub overhead_full_s: f64,
    /// Eq. 2 at `t_save_partial_s` (seconds).
    pub overhead_partial_s: f64,
    /// `sqrt(2·O_save·T_fail)`.
    pub t_save_full_s: f64,
    /// `2·PLS·N_emb·T_fail`.
    pub t_save_partial_s: f64,
    /// Expected final PLS of the chosen mode (Eq. 4; 0 for full recovery).
    pub expected_pls: f64,
    /// Both overheads and why this mode won, for logs.
    pub reason: String,
}

impl RecoveryDecision {
    /// The checkpoint interval of the chosen mode.
    pub fn t_save_s(&self) -> f64 {
        match self.mode {
            RecoveryMode::Full => self.t_save_full_s,
            RecoveryMode::Partial => self.t_save_partial_s,
        }
    }
}

/// CPR's choice between full and partial recovery for a job of `t_total_s` seconds with
/// `n_emb` embedding parameter servers and a tolerated `target_pls`.
///
/// Full recovery is costed with Eq. 1 at its optimal interval, partial recovery with Eq. 2
/// at the interval that meets the target PLS (Eq. 4). Partial recovery is chosen only when
/// it saves more than `min_benefit` (a fraction, e.g. 0.1) of full recovery's overhead;
/// invalid costs (see [`CprCosts::is_valid`]), a non-positive target or any non-finite
/// figure choose full recovery, which is always correct.
pub fn decide(
    c: &CprCosts,
    t_total_s: f64,
    n_emb: u32,
    target_pls: f64,
    min_benefit: f64,
) -> RecoveryDecision {
    let t_save_full_s = interval_full(c.o_save_s, c.t_fail_s);
    let t_save_partial_s = interval_partial(target_pls, n_emb, c.t_fail_s);
    let overhead_full_s = overhead_full(c, t_total_s, t_save_full_s);
    let overhead_partial_s = overhead_partial(c, t_total_s, t_save_partial_s);
    let figures = format!(
        "full recovery: {overhead_full_s:.3} s overhead saving every {t_save_full_s:.1} s (Eq. 1); \
         partial recovery: {overhead_partial_s:.3} s overhead saving every {t_save_partial_s:.1} s \
         for target PLS {target_pls} over {n_emb} embedding PS (Eq. 2)"
    );
    let saved = 1.0 - overhead_partial_s / overhead_full_s;
    let (mode, why) = if !c.is_valid() || t_total_s.is_nan() || t_total_s <= 0.0 || n_emb == 0 {
        (
            RecoveryMode::Full,
            "invalid costs, job length or PS count".to_string(),
        )
    } else if target_pls.is_nan() || target_pls <= 0.0 {
        (
            RecoveryMode::Full,
            "no lost samples tolerated (target PLS ≤ 0)".to_string(),
        )
    } else if !overhead_full_s.is_finite() || !overhead_partial_s.is_finite() || saved.is_nan() {
        (RecoveryMode::Full, "an overhead is not finite".to_string())
    } else if saved > min_benefit {
        (
            RecoveryMode::Partial,
            format!(
                "partial saves {:.1}% of full's overhead (> {:.1}% required)",
                saved * 100.0,
                min_benefit * 100.0
            ),
        )
    } else {
        (
            RecoveryMode::Full,
            format!(
                "partial would save {:.1}% of full's overhead (≤ {:.1}% required)",
                saved * 100.0,
                min_benefit * 100.0
            ),
        )
    };
    let expected_pls = match mode {
        RecoveryMode::Full => 0.0,
        RecoveryMode::Partial => expected_pls(t_save_partial_s, c.t_fail_s, n_emb),
    };
    RecoveryDecision {
        mode,
        overhead_full_s,
        overhead_partial_s,
        t_save_full_s,
        t_save_partial_s,
        expected_pls,
        reason: format!("{mode} recovery: {why}; {figures}"),
    }
}

/// The checkpoint interval of `mode`: [`interval_full`] for full recovery,
/// [`interval_partial`] at `target_pls` for partial recovery.
pub fn checkpoint_interval(mode: RecoveryMode, c: &CprCosts, n_emb: u32, target_pls: f64) -> f64 {
    match mode {
        RecoveryMode::Full => interval_full(c.o_save_s, c.t_fail_s),
        RecoveryMode::Partial => interval_partial(target_pls, n_emb, c.t_fail_s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    /// O_save 2, O_load 3, O_res 5, T_fail 100 (10 failures in a 1000 s job).
    const C: CprCosts = CprCosts {
        o_save_s: 2.0,
        o_load_s: 3.0,
        o_res_s: 5.0,
        t_fail_s: 100.0,
    };

    #[test]
    fn eq1_eq2_by_hand() {
        // 2·1000/20 = 100 saving; (3 + 20/2 + 5)·1000/100 = 180 per-failure.
        assert!(close(overhead_full(&C, 1000.0, 20.0), 280.0));
        // Same without the lost 10 s per failure: 100 + 80.
        assert!(close(overhead_partial(&C, 1000.0, 20.0), 180.0));
    }

    #[test]
    fn intervals_and_expected_pls_by_hand() {
        assert!(close(interval_full(2.0, 100.0), 20.0));
        assert!(close(interval_partial(0.1, 8, 100.0), 160.0));
        // 0.5·160/(100·8)
        assert!(close(expected_pls(160.0, 100.0, 8), 0.1));
        // Eq. 4 and its inverse agree.
        for pls in [0.01, 0.1, 0.3] {
            let t = interval_partial(pls, 4, 3600.0);
            assert!(close(expected_pls(t, 3600.0, 4), pls));
        }
        assert!(close(
            checkpoint_interval(RecoveryMode::Full, &C, 8, 0.1),
            20.0
        ));
        assert!(close(
            checkpoint_interval(RecoveryMode::Partial, &C, 8, 0.1),
            160.0
        ));
    }

    #[test]
    fn interval_full_minimizes_eq1() {
        let best = overhead_full(&C, 1000.0, interval_full(C.o_save_s, C.t_fail_s));
        for t in [5.0, 10.0, 15.0, 19.0, 21.0, 30.0, 60.0] {
            assert!(overhead_full(&C, 1000.0, t) > best, "t_save {t}");
        }
    }

    #[test]
    fn no_failures_means_save_cost_only() {
        let c = CprCosts {
            t_fail_s: f64::INFINITY,
            ..C
        };
        assert!(close(overhead_full(&c, 1000.0, 50.0), 40.0));
        assert!(close(overhead_partial(&c, 1000.0, 50.0), 40.0));
    }

    #[test]
    fn decide_picks_partial_when_it_pays() {
        // Full: 280 at T_save 20. Partial at PLS 0.1, 8 PS: T_save 160, 2000/160 + 80 = 92.5.
        let d = decide(&C, 1000.0, 8, 0.1, 0.1);
        assert_eq!(d.mode, RecoveryMode::Partial);
        assert!(close(d.overhead_full_s, 280.0));
        assert!(close(d.overhead_partial_s, 92.5));
        assert!(close(d.t_save_full_s, 20.0));
        assert!(close(d.t_save_partial_s, 160.0));
        assert!(close(d.expected_pls, 0.1));
        assert!(close(d.t_save_s(), 160.0));
        assert!(
            d.reason.contains("280.0") && d.reason.contains("92.5"),
            "{}",
            d.reason
        );
    }

    #[test]
    fn decide_falls_back_to_full_when_partial_saves_too_often() {
        // PLS 0.01 over 2 PS: T_save 4, 2000/4 + 80 = 580 > 280.
        let d = decide(&C, 1000.0, 2, 0.01, 0.1);
        assert_eq!(d.mode, RecoveryMode::Full);
        assert!(close(d.overhead_partial_s, 580.0));
        assert_eq!(d.expected_pls, 0.0);
        assert!(close(d.t_save_s(), 20.0));
        assert!(
            d.reason.contains("580.0") && d.reason.contains("280.0"),
            "{}",
            d.reason
        );
    }

    #[test]
    fn decide_respects_min_benefit() {
        // PLS 0.0125 over 5 PS: T_save 12.5, 2000/12.5 + 80 = 240: saves 1/7 = 14.3%.
        assert_eq!(
            decide(&C, 1000.0, 5, 0.0125, 0.1).mode,
            RecoveryMode::Partial
        );
        assert_eq!(decide(&C, 1000.0, 5, 0.0125, 0.2).mode, RecoveryMode::Full);
        // PLS 0.01 over 5 PS: T_save 10, 200 + 80 = 280: no benefit at all.
        assert_eq!(decide(&C, 1000.0, 5, 0.01, 0.0).mode, RecoveryMode::Full);
    }

    #[test]
    fn decide_is_full_on_degenerate_input() {
        assert_eq!(decide(&C, 1000.0, 8, 0.0, 0.1).mode, RecoveryMode::Full);
        assert_eq!(decide(&C, 1000.0, 0, 0.1, 0.1).mode, RecoveryMode::Full);
        let bad = CprCosts {
            o_save_s: f64::NAN,
            ..C
        };
        assert_eq!(decide(&bad, 1000.0, 8, 0.1, 0.1).mode, RecoveryMode::Full);
    }

    #[test]
    fn pls_tracker_sequence() {
        let mut t = PlsTracker::new(1000, 4);
        // Before any checkpoint: lost since sample 0. 1·50/(1000·4)
        assert!(close(t.on_failure(50, 1), 0.0125));
        t.on_checkpoint(100);
        // 1·(300 − 100)/4000
        assert!(close(t.on_failure(300, 1), 0.05));
        // Two servers at once, same checkpoint: 2·400/4000
        assert!(close(t.on_failure(500, 2), 0.2));
        t.on_checkpoint(600);
        assert!(close(t.on_failure(650, 1), 0.0125));
        assert!(close(t.pls(), 0.0125 + 0.05 + 0.2 + 0.0125));
        assert_eq!(t.failures, 4);
        // Persisted and restored by the master.
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(serde_json::from_str::<PlsTracker>(&json).unwrap(), t);
    }

    #[test]
    fn recovery_mode_serializes_lowercase() {
        assert_eq!(
            serde_json::to_string(&RecoveryMode::Partial).unwrap(),
            "\"partial\""
        );
        assert_eq!(
            serde_json::from_str::<RecoveryMode>("\"full\"").unwrap(),
            RecoveryMode::Full
        );
    }
}
