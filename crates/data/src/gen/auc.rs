//! Exact, sort-based ROC AUC (ties get the average rank).

use rayon::prelude::*;

/// Exact AUC of `scores` against binary `labels` (1 = positive). `None` if one class is
/// absent.
pub fn exact_auc(scores: &[f32], labels: &[u8]) -> Option<f64> {
    assert_eq!(scores.len(), labels.len());
    let mut pairs: Vec<(f32, u8)> = scores.iter().copied().zip(labels.iter().copied()).collect();
    pairs.par_sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
    let pos = labels.iter().filter(|&&l| l != 0).count() as f64;
    let neg = labels.len() as f64 - pos;
    if pos == 0.0 || neg == 0.0 {
        return None;
    }
    let mut rank_sum = 0.0f64;
    let mut i = 0;
    while i < pairs.len() {
        let mut j = i;
        while j < pairs.len() && pairs[j].0 == pairs[i].0 {
            j += 1;
        }
        // Ranks i+1..=j share the average rank.
        let avg = (i + 1 + j) as f64 / 2.0;
        let p = pairs[i..j].iter().filter(|x| x.1 != 0).count() as f64;
        rank_sum += avg * p;
        i = j;
    }
    Some((rank_sum - pos * (pos + 1.0) / 2.0) / (pos * neg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        assert_eq!(exact_auc(&[0.1, 0.9], &[0, 1]), Some(1.0));
        assert_eq!(exact_auc(&[0.9, 0.1], &[0, 1]), Some(0.0));
        assert_eq!(exact_auc(&[0.5, 0.5], &[0, 1]), Some(0.5));
        // 3 positives, 2 negatives: pairs (p>n) = 5 of 6, one tie counts half.
        let auc = exact_auc(&[0.1, 0.4, 0.35, 0.8, 0.4], &[0, 0, 1, 1, 1]).unwrap();
        assert!((auc - (4.5 / 6.0)).abs() < 1e-12, "{auc}");
        assert_eq!(exact_auc(&[0.1], &[1]), None);
    }
}
