//! Binary cross-entropy on logits.

use crate::layers::sigmoid;

/// Mean binary cross-entropy of `logits` against `labels` (0/1, soft labels allowed),
/// computed stably as `max(x, 0) - x y + ln(1 + exp(-|x|))`; writes
/// `dlogits[i] = (sigmoid(x_i) - y_i) / n`, the gradient of the mean loss.
///
/// # Panics
/// If the three slices do not have the same length.
pub fn bce_with_logits(logits: &[f32], labels: &[f32], dlogits: &mut [f32]) -> f32 {
    assert_eq!(logits.len(), labels.len());
    assert_eq!(logits.len(), dlogits.len());
    let n = logits.len();
    if n == 0 {
        return 0.0;
    }
    (bce_sum_with_logits(logits, labels, &[], 1.0 / n as f32, dlogits) / n as f64) as f32
}

/// The summed (not averaged) binary cross-entropy of a block of a batch, each sample's
/// term times its weight (`weights` empty: 1 each), writing
/// `dlogits[i] = w_i (sigmoid(x_i) - y_i) * grad_scale`; with `grad_scale = 1 / sum(w)`
/// the blocks' gradients are those of the whole batch's weighted mean loss.
pub(crate) fn bce_sum_with_logits(
    logits: &[f32],
    labels: &[f32],
    weights: &[f32],
    grad_scale: f32,
    dlogits: &mut [f32],
) -> f64 {
    let mut sum = 0.0f64;
    if weights.is_empty() {
        for ((&x, &y), g) in logits.iter().zip(labels).zip(dlogits.iter_mut()) {
            sum += bce_term(x, y) as f64;
            *g = (sigmoid(x) - y) * grad_scale;
        }
        return sum;
    }
    for (((&x, &y), &w), g) in logits
        .iter()
        .zip(labels)
        .zip(weights)
        .zip(dlogits.iter_mut())
    {
        sum += f64::from(w) * bce_term(x, y) as f64;
        *g = w * (sigmoid(x) - y) * grad_scale;
    }
    sum
}

/// Mean binary cross-entropy on logits without the gradient.
pub fn bce_with_logits_loss(logits: &[f32], labels: &[f32]) -> f32 {
    assert_eq!(logits.len(), labels.len());
    if logits.is_empty() {
        return 0.0;
    }
    let sum: f64 = logits
        .iter()
        .zip(labels)
        .map(|(&x, &y)| bce_term(x, y) as f64)
        .sum();
    (sum / logits.len() as f64) as f32
}

#[inline]
fn bce_term(x: f32, y: f32) -> f32 {
    x.max(0.0) - x * y + (-x.abs()).exp().ln_1p()
}
