use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

pub fn randv(rng: &mut StdRng, len: usize, a: f32) -> Vec<f32> {
    (0..len).map(|_| rng.random_range(-a..a)).collect()
}

/// Central finite differences of `loss(x)` around `x0` compared with `analytic`.
///
/// `loss` returns the scalar (f64, computed from the f32 forward) and a "kink pattern"
/// (e.g. the ReLU on/off pattern); coordinates whose perturbation changes the pattern
/// are skipped, at most `max_skip_frac` of them. Tolerance: `|a - f| <= atol + rtol*max`.
pub fn check_fd(
    what: &str,
    x0: &[f32],
    analytic: &[f32],
    h: f32,
    atol: f64,
    rtol: f64,
    mut loss: impl FnMut(&[f32]) -> (f64, Vec<bool>),
) {
    assert_eq!(x0.len(), analytic.len(), "{what}: length");
    let (_, pat0) = loss(x0);
    let mut x = x0.to_vec();
    let mut skipped = 0;
    let mut checked = 0;
    for i in 0..x0.len() {
        x[i] = x0[i] + h;
        let (lp, pp) = loss(&x);
        x[i] = x0[i] - h;
        let (lm, pm) = loss(&x);
        x[i] = x0[i];
        if pp != pat0 || pm != pat0 {
            skipped += 1;
            continue;
        }
        let fd = (lp - lm) / (2.0 * h as f64);
        let a = analytic[i] as f64;
        let tol = atol + rtol * fd.abs().max(a.abs());
        assert!(
            (fd - a).abs() <= tol,
            "{what}[{i}]: analytic {a} vs finite-diff {fd} (tol {tol})"
        );
        checked += 1;
    }
    assert!(
        skipped * 10 <= x0.len(),
        "{what}: too many kinks skipped ({skipped} of {})",
        x0.len()
    );
    assert!(checked > 0);
}
