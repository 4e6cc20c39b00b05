//! What an evaluation over held-out samples reports, in one shape for every role: the
//! worker computes it, the master records it and writes it to `result.json`.

use serde::{Deserialize, Serialize};

/// Held-out evaluation result. With sample weights (`data.weight`) every figure is the
/// weighted one.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EvalResult {
    /// Exact ROC AUC over the whole held-out set.
    pub auc: f64,
    /// Mean log loss.
    pub logloss: f64,
    /// Samples evaluated.
    pub samples: u64,
    /// Normalized entropy: the log loss over the entropy of the held-out click rate
    /// (below 1 beats always predicting that rate); absent with one class only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ne: Option<f64>,
    /// Predicted over actual clicks (1: calibrated); absent without a click.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<f64>,
    /// GAUC: each user's AUC over their own rows, averaged over users weighted by their
    /// rows (`data.user`); absent without a user column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gauc: Option<f64>,
}

impl EvalResult {
    /// The figures as named scalars, `<prefix>/auc`, `<prefix>/logloss`, then NE,
    /// calibration and GAUC where defined (TensorBoard's tags).
    pub fn scalars(&self, prefix: &str) -> Vec<(String, f64)> {
        let mut out = vec![
            (format!("{prefix}/auc"), self.auc),
            (format!("{prefix}/logloss"), self.logloss),
        ];
        for (name, v) in [
            ("ne", self.ne),
            ("calibration", self.calibration),
            ("gauc", self.gauc),
        ] {
            if let Some(v) = v {
                out.push((format!("{prefix}/{name}"), v));
            }
        }
        out
    }
}

/// `AUC 0.7012  GAUC 0.6512  logloss 0.4413  NE 0.8120  calibration 1.021`, the figures a
/// person reads (GAUC, NE and calibration where defined).
impl std::fmt::Display for EvalResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AUC {:.4}", self.auc)?;
        if let Some(g) = self.gauc {
            write!(f, "  GAUC {g:.4}")?;
        }
        write!(f, "  logloss {:.4}", self.logloss)?;
        if let Some(ne) = self.ne {
            write!(f, "  NE {ne:.4}")?;
        }
        if let Some(c) = self.calibration {
            write!(f, "  calibration {c:.3}")?;
        }
        Ok(())
    }
}
