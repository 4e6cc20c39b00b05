//! Binary log-loss of one prediction, clamped so that a confident mistake costs a large
//! finite amount instead of infinity.

/// Probabilities are clamped to `[LOGLOSS_EPS, 1 - LOGLOSS_EPS]` in [`logloss_term`].
pub const LOGLOSS_EPS: f64 = 1e-7;

/// `-(y ln p + (1 - y) ln(1 - p))` for probability `p` and label `y` (0 or 1).
#[inline]
pub fn logloss_term(p: f32, y: f32) -> f64 {
    let p = (p as f64).clamp(LOGLOSS_EPS, 1.0 - LOGLOSS_EPS);
    let y = y as f64;
    -(y * p.ln() + (1.0 - y) * (1.0 - p).ln())
}

/// Normalized entropy (He et al., "Practical lessons from predicting clicks on ads at
/// Facebook"): the mean log loss divided by the entropy of the data's own click rate
/// `p`, `-(p ln p + (1 - p) ln(1 - p))`. Below 1, the model predicts better than always
/// answering the average rate. `None` when the labels are all one class.
pub fn normalized_entropy(logloss: f64, click_rate: f64) -> Option<f64> {
    let p = click_rate;
    let h = -(p * p.ln() + (1.0 - p) * (1.0 - p).ln());
    (p > 0.0 && p < 1.0).then(|| logloss / h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clamps_certain_mistakes_and_matches_the_formula() {
        assert!((logloss_term(0.8, 1.0) - -(0.8f64.ln())).abs() < 1e-6);
        assert!((logloss_term(0.8, 0.0) - -(0.2f64.ln())).abs() < 1e-6);
        let worst = logloss_term(0.0, 1.0);
        assert!(worst.is_finite() && (worst - -(LOGLOSS_EPS.ln())).abs() < 1e-9);
    }
}
