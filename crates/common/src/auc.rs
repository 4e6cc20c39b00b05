//! Exact ROC AUC via the Mann-Whitney statistic.

use rayon::prelude::*;

/// Exact ROC AUC of `scores` against `labels`, where `is_positive` decides a label's class.
/// `None` when either class is absent.
///
/// Sorts once (O(n log n)); tied scores share their average rank. Scores are ordered and
/// compared with `f32::total_cmp`, so NaNs sort last and the result does not depend on the
/// order of equal scores. Ranks are half-integers summed in `f64`, exact below 2^52, so
/// the result is deterministic.
pub fn exact_auc<L, F>(scores: &[f32], labels: &[L], is_positive: F) -> Option<f64>
where
    L: Copy + Sync,
    F: Fn(L) -> bool + Sync,
{
    assert_eq!(scores.len(), labels.len());
    let mut pairs: Vec<(f32, bool)> = scores
        .par_iter()
        .zip(labels.par_iter())
        .map(|(&s, &l)| (s, is_positive(l)))
        .collect();
    pairs.par_sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
    let mut pos_rank_sum = 0.0f64;
    let mut n_pos = 0u64;
    let mut i = 0;
    while i < pairs.len() {
        let s = pairs[i].0;
        let mut j = i + 1;
        while j < pairs.len() && pairs[j].0.total_cmp(&s).is_eq() {
            j += 1;
        }
        // ranks i+1 ..= j, averaged.
        let avg_rank = (i + 1 + j) as f64 / 2.0;
        for &(_, pos) in &pairs[i..j] {
            if pos {
                pos_rank_sum += avg_rank;
                n_pos += 1;
            }
        }
        i = j;
    }
    let n_neg = scores.len() as u64 - n_pos;
    if n_pos == 0 || n_neg == 0 {
        return None;
    }
    let (p, q) = (n_pos as f64, n_neg as f64);
    Some((pos_rank_sum - p * (p + 1.0) / 2.0) / (p * q))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SplitMix64;

    #[test]
    fn known_values() {
        let pos = |l: u8| l != 0;
        assert_eq!(exact_auc(&[0.1, 0.9], &[0, 1], pos), Some(1.0));
        assert_eq!(exact_auc(&[0.9, 0.1], &[0, 1], pos), Some(0.0));
        assert_eq!(exact_auc(&[0.5, 0.5], &[0, 1], pos), Some(0.5));
        // 3 positives, 2 negatives: 4 of 6 pairs ordered right, one tie counts half.
        let auc = exact_auc(&[0.1, 0.4, 0.35, 0.8, 0.4], &[0, 0, 1, 1, 1], pos).unwrap();
        assert!((auc - (4.5 / 6.0)).abs() < 1e-12, "{auc}");
        assert_eq!(exact_auc(&[0.1], &[1], pos), None);
        assert_eq!(exact_auc::<u8, _>(&[], &[], pos), None);
    }

    // Golden bits from the two implementations this one replaced (`model::metrics::auc`
    // with `f32` labels `> 0.5`, `data::gen::exact_auc` with `u8` labels `!= 0`), which
    // agreed on these inputs.

    #[test]
    fn ties_match_previous_implementations() {
        let scores = [
            0.3f32, 0.7, 0.3, 0.1, 0.9, 0.7, 0.7, 0.5, 0.3, 0.2, 0.9, 0.05,
        ];
        let labels_f = [
            1.0f32, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0,
        ];
        let labels_u: Vec<u8> = labels_f.iter().map(|&y| y as u8).collect();
        let a = exact_auc(&scores, &labels_f, |y| y > 0.5).unwrap();
        let b = exact_auc(&scores, &labels_u, |l| l != 0).unwrap();
        assert_eq!(a.to_bits(), 0x3fe4_9249_2492_4925, "{a}"); // 0.642857...
        assert_eq!(b.to_bits(), a.to_bits());
    }

    #[test]
    fn many_ties_match_previous_implementations() {
        // 10007 scores on 97 levels, labels correlated with the score.
        let mut g = SplitMix64::new(1);
        let (mut scores, mut labels) = (Vec::new(), Vec::new());
        for _ in 0..10_007 {
            let x = g.next_u64();
            let level = (x >> 50) % 97;
            scores.push(level as f32 / 97.0);
            labels.push(if (x & 0xff) < level * 2 { 1.0f32 } else { 0.0 });
        }
        let auc = exact_auc(&scores, &labels, |y| y > 0.5).unwrap();
        assert_eq!(auc.to_bits(), 0x3fe8_ae48_f413_222a, "{auc}"); // 0.771275...
    }
}
