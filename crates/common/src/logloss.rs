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
