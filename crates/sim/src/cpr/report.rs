//! What the CPR emulation reports: one row per strategy, as JSON and as a markdown table.

use std::fmt::Write as _;

use elastrec_control::cpr::{CprCosts, RecoveryDecision, RecoveryMode};
use serde::{Deserialize, Serialize};

use super::config::{CprEmulationConfig, Strategy};

/// A failure injected into every run with failures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InjectedFailure {
    /// Training progress (samples of the epoch) at which it strikes.
    pub at_sample: u64,
    /// The virtual parameter servers lost.
    pub servers: Vec<u32>,
}

/// Emulated checkpoint-related overhead of one run (seconds of the emulated job).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Overhead {
    /// `O_save` times the checkpoints saved, in units of a full checkpoint (a partial save
    /// costs its share of the rows).
    pub save_s: f64,
    /// `O_load` per failure.
    pub load_s: f64,
    /// Re-trained samples times the emulated seconds per sample (full recovery only).
    pub lost_s: f64,
    /// `O_res` per failure.
    pub res_s: f64,
}

impl Overhead {
    /// Sum of the four parts.
    pub fn total_s(&self) -> f64 {
        self.save_s + self.load_s + self.lost_s + self.res_s
    }
}

/// The outcome of one strategy.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StrategyResult {
    /// The strategy.
    pub strategy: Strategy,
    /// How its failures were recovered (CPR falls back to full recovery when partial
    /// recovery does not pay).
    pub recovery: RecoveryMode,
    /// Checkpoint interval `T_save`, emulated seconds (`None`: never saves).
    pub t_save_s: Option<f64>,
    /// Checkpoint interval in samples.
    pub t_save_samples: Option<u64>,
    /// Saves taken (each prioritized save of CPR-MFU/SSU counts as one).
    pub checkpoints: u64,
    /// Rows written by all saves, in units of a whole checkpoint (all rows of all tables).
    pub checkpoint_volume: f64,
    /// Failures that struck.
    pub failures: u32,
    /// Samples trained, re-trained ones included.
    pub samples_trained: u64,
    /// Samples trained twice because full recovery rewound them.
    pub samples_retrained: u64,
    /// Final portion of lost samples (Eq. 3).
    pub pls: f64,
    /// Expected PLS at this interval (Eq. 4; 0 for full recovery).
    pub expected_pls: f64,
    /// Rows that partial recovery actually changed: their updates since their last save
    /// were lost.
    pub stale_rows_restored: u64,
    /// CPR-MFU/SSU: most rows of the large tables written by one prioritized save.
    pub max_prioritized_rows: Option<u64>,
    /// CPR-MFU/SSU: the budget per prioritized save, `Σ ⌊r·N_t⌋` over the large tables.
    pub prioritized_row_budget: Option<u64>,
    /// CPR-SSU: heap bytes of the SSU lists; CPR-MFU: bytes of the access counters.
    pub tracking_bytes: Option<u64>,
    /// Emulated overhead, measured.
    pub overhead: Overhead,
    /// Emulated overhead as a share of the failure-free job (`job_hours`), percent.
    pub overhead_pct: f64,
    /// The same predicted by Eq. 1 (full) or Eq. 2 (partial) at this interval, percent.
    pub predicted_overhead_pct: f64,
    /// Held-out AUC of the final model.
    pub auc: f64,
    /// Held-out log loss of the final model.
    pub logloss: f64,
    /// Mean training loss over every step of the run.
    pub train_loss: f64,
    /// Real seconds the run took (training, saves, restores; not the evaluation).
    pub wall_s: f64,
}

/// The whole emulation: settings, the CPR decision and one result per strategy.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CprReport {
    /// The settings.
    pub config: CprEmulationConfig,
    /// The costs given to the CPR policy.
    pub costs: CprCosts,
    /// CPR's full-vs-partial decision for this job.
    pub decision: RecoveryDecision,
    /// Training samples in the epoch (`S_total`).
    pub train_samples: u64,
    /// Held-out samples.
    pub eval_samples: u64,
    /// Emulated seconds each training sample stands for.
    pub emulated_s_per_sample: f64,
    /// Rows per table.
    pub table_rows: Vec<u64>,
    /// Tables MFU/SSU prioritize (the rest are saved whole).
    pub large_tables: Vec<usize>,
    /// Their share of all rows.
    pub large_table_share: f64,
    /// The failures injected into every run with failures.
    pub injected: Vec<InjectedFailure>,
    /// The generator's teacher AUC, when the data has a `report.json`: the ceiling.
    pub teacher_auc: Option<f64>,
    /// The failure-free run first, then one per strategy.
    pub results: Vec<StrategyResult>,
    /// Real seconds of the whole emulation, data loading included.
    pub wall_s: f64,
}

impl CprReport {
    /// The result of `strategy`, if it ran.
    pub fn result(&self, strategy: Strategy) -> Option<&StrategyResult> {
        self.results.iter().find(|r| r.strategy == strategy)
    }

    /// A markdown summary: settings, CPR's decision and the side-by-side table.
    pub fn to_markdown(&self) -> String {
        let c = &self.config;
        let h = |s: f64| s / 3600.0;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "CPR emulation: {} training samples ({:.2} emulated s each) in a {} h job, {} failure(s) \
             of {}/{} embedding PS each, T_fail {:.1} h, O_save {:.0} s, O_load {:.0} s, O_res {:.0} s, \
             target PLS {}, r = {}, large tables {:?} ({:.1}% of rows).",
            self.train_samples,
            self.emulated_s_per_sample,
            c.job_hours,
            c.failures,
            c.failed_ps,
            c.n_emb,
            h(self.costs.t_fail_s),
            c.o_save_s,
            c.o_load_s,
            c.o_res_s,
            c.target_pls,
            c.priority_ratio,
            self.large_tables,
            100.0 * self.large_table_share,
        );
        let failures: Vec<String> = self
            .injected
            .iter()
            .map(|f| format!("sample {} (PS {:?})", f.at_sample, f.servers))
            .collect();
        let _ = writeln!(out, "Failures at: {}.", failures.join(", "));
        let _ = writeln!(out, "CPR decision: {}.", self.decision.reason);
        out.push('\n');
        out.push_str(
            "| strategy | recovery | T_save (h) | saves | saved (× full) | failures | re-trained samples \
             | PLS (expected) | stale rows restored | overhead % (save + load + lost + res) \
             | Eq. 1/2 % | AUC | logloss |\n",
        );
        out.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|\n");
        for r in &self.results {
            let o = &r.overhead;
            let pct = |s: f64| 100.0 * s / c.job_s();
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {:.2} | {} | {} | {:.4} ({:.4}) | {} | {:.2} ({:.2} + {:.2} + {:.2} + {:.2}) | {:.2} | {:.4} | {:.4} |",
                r.strategy,
                if r.strategy == Strategy::NoFailures {
                    "-".to_string()
                } else {
                    r.recovery.to_string()
                },
                r.t_save_s.map_or("-".into(), |t| format!("{:.2}", h(t))),
                r.checkpoints,
                r.checkpoint_volume,
                r.failures,
                r.samples_retrained,
                r.pls,
                r.expected_pls,
                r.stale_rows_restored,
                r.overhead_pct,
                pct(o.save_s),
                pct(o.load_s),
                pct(o.lost_s),
                pct(o.res_s),
                r.predicted_overhead_pct,
                r.auc,
                r.logloss,
            );
        }
        if let Some(t) = self.teacher_auc {
            let _ = writeln!(out, "\nTeacher AUC of the data (the ceiling): {t:.4}.");
        }
        out
    }
}
