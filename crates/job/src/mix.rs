//! `[data.mix]`: batch + stream mixture training (Primus §5). A job with a `[stream]` and
//! this section trains its history (the `data.train` files or its training datasets) and
//! its stream in one job, one model and one ledger; how requests for work are served from
//! the two sources is `mode` (`docs/data.md`).

use serde::{Deserialize, Serialize};

/// The `[data.mix]` section.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MixConfig {
    /// How the history's and the stream's serving buffers are served:
    /// `"sequential"` (all of the history first, then the stream),
    /// `"weighted"` (rows in proportion to `history_weight : stream_weight` while both
    /// have data) or `"priority"` (Primus Eq. 4: the buffer with the highest
    /// `weight · sigmoid(queued tasks − target_tasks)`).
    pub mode: MixMode,
    /// Weight of the history's buffer (`weighted`, `priority`).
    pub history_weight: f64,
    /// Weight of the stream's buffer (`weighted`, `priority`); Primus gives the stream
    /// the larger weight, so that fresh data is not starved by a backlog of history.
    pub stream_weight: f64,
    /// `priority`: queued tasks at which a buffer has half its weight. The stream waits
    /// for about this many tasks before it preempts the history when its weight is not
    /// much larger (`docs/data.md`).
    pub target_tasks: f64,
}

/// How the mixture's buffers are served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MixMode {
    /// History first, then the stream.
    Sequential,
    /// Proportional to the weights.
    Weighted,
    /// Primus Eq. 4.
    #[default]
    Priority,
}

impl Default for MixConfig {
    fn default() -> Self {
        Self {
            mode: MixMode::Priority,
            history_weight: 1.0,
            stream_weight: 4.0,
            target_tasks: 2.0,
        }
    }
}

impl MixConfig {
    /// Checks the section; `Err((field, reason))`.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        for (field, w) in [
            ("data.mix.history_weight", self.history_weight),
            ("data.mix.stream_weight", self.stream_weight),
        ] {
            if !(w.is_finite() && w > 0.0) {
                return Err((field, format!("must be a positive number, got {w}")));
            }
        }
        if !(self.target_tasks.is_finite() && self.target_tasks >= 0.0) {
            return Err((
                "data.mix.target_tasks",
                format!("must be 0 or a positive number, got {}", self.target_tasks),
            ));
        }
        Ok(())
    }
}
