use elastrec_model::metrics::{group_auc, normalized_entropy, weighted_auc};
use elastrec_model::{auc, logloss, EvalAccumulator};
use rand::Rng;

use crate::common::rng;

fn brute_auc(s: &[f32], y: &[f32]) -> f64 {
    let mut num = 0.0;
    let mut den = 0.0;
    for i in 0..s.len() {
        for j in 0..s.len() {
            if y[i] > 0.5 && y[j] <= 0.5 {
                den += 1.0;
                if s[i] > s[j] {
                    num += 1.0;
                } else if s[i] == s[j] {
                    num += 0.5;
                }
            }
        }
    }
    num / den
}

#[test]
fn auc_matches_bruteforce_with_ties() {
    let mut g = rng(17);
    for trial in 0..20 {
        let n = 50 + trial * 13;
        // Few distinct score levels -> many ties; labels correlated with the score.
        let s: Vec<f32> = (0..n).map(|_| g.random_range(0..8) as f32 / 8.0).collect();
        let y: Vec<f32> = s
            .iter()
            .map(|&v| f32::from(g.random_range(0.0..1.0f32) < 0.2 + 0.6 * v))
            .collect();
        let a = auc(&s, &y).unwrap();
        let b = brute_auc(&s, &y);
        assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    }
}

#[test]
fn auc_edge_cases() {
    assert_eq!(auc(&[0.1, 0.9], &[0.0, 1.0]), Some(1.0));
    assert_eq!(auc(&[0.9, 0.1], &[0.0, 1.0]), Some(0.0));
    assert_eq!(auc(&[0.5, 0.5], &[0.0, 1.0]), Some(0.5));
    assert_eq!(auc(&[0.5, 0.7], &[1.0, 1.0]), None);
}

#[test]
fn logloss_hand_values() {
    let l = logloss(&[0.8, 0.4], &[1.0, 0.0]);
    let want = -(0.8f64.ln() + 0.6f64.ln()) / 2.0;
    assert!((l - want).abs() < 1e-6);
    // Clamped: a confident wrong prediction is finite.
    let l = logloss(&[0.0, 1.0], &[1.0, 0.0]);
    assert!((l - (-(1e-7f64).ln())).abs() < 1e-6, "{l}");
}

#[test]
fn streaming_matches_batch() {
    let mut g = rng(23);
    let s: Vec<f32> = (0..1000).map(|_| g.random_range(0.0..1.0)).collect();
    let y: Vec<f32> = s
        .iter()
        .map(|&v| f32::from(g.random_range(0.0..1.0) < v))
        .collect();
    let mut acc = EvalAccumulator::new();
    let mut other = EvalAccumulator::new();
    for (i, (cs, cy)) in s.chunks(64).zip(y.chunks(64)).enumerate() {
        if i % 3 == 0 {
            other.push(cs, cy);
        } else {
            acc.push(cs, cy);
        }
    }
    acc.merge(&other);
    assert_eq!(acc.count(), 1000);
    assert!((acc.logloss() - logloss(&s, &y)).abs() < 1e-9);
    // AUC is order independent.
    assert!((acc.auc().unwrap() - auc(&s, &y).unwrap()).abs() < 1e-12);
    let acc_want = s
        .iter()
        .zip(&y)
        .filter(|(&p, &t)| (p > 0.5) == (t > 0.5))
        .count();
    assert!((acc.accuracy() - acc_want as f64 / 1000.0).abs() < 1e-12);
    acc.reset();
    assert_eq!(acc.count(), 0);
}

/// A sample of integer weight k counts as k copies of it: the weighted AUC, log loss,
/// NE and calibration equal the unweighted ones over the data with rows repeated.
#[test]
fn integer_weights_count_as_repeated_rows() {
    let mut g = rng(29);
    let n = 400;
    let s: Vec<f32> = (0..n)
        .map(|_| g.random_range(0..10) as f32 / 10.0)
        .collect();
    let y: Vec<f32> = s
        .iter()
        .map(|&v| f32::from(g.random_range(0.0..1.0f32) < 0.1 + 0.7 * v))
        .collect();
    let w: Vec<f32> = (0..n).map(|_| g.random_range(0..4) as f32).collect();
    let (mut rs, mut ry) = (Vec::new(), Vec::new());
    for i in 0..n {
        for _ in 0..w[i] as usize {
            rs.push(s[i]);
            ry.push(y[i]);
        }
    }
    let mut weighted = EvalAccumulator::new();
    // Weighted and unweighted pushes mix: an unweighted batch weighs 1 a row.
    weighted.push_rows(&s[..100], &y[..100], &w[..100], &[]);
    weighted.push_rows(&s[100..], &y[100..], &w[100..], &[]);
    let mut repeated = EvalAccumulator::new();
    repeated.push(&rs, &ry);
    let a = weighted.auc().unwrap();
    assert!((a - brute_auc(&rs, &ry)).abs() < 1e-9, "{a}");
    assert!((a - weighted_auc(&s, &y, &w).unwrap()).abs() < 1e-12);
    assert!((weighted.logloss() - repeated.logloss()).abs() < 1e-9);
    let (ne, ne_rep) = (weighted.normalized_entropy(), repeated.normalized_entropy());
    assert!((ne.unwrap() - ne_rep.unwrap()).abs() < 1e-9);
    let (c, c_rep) = (weighted.calibration(), repeated.calibration());
    assert!((c.unwrap() - c_rep.unwrap()).abs() < 1e-9);
    assert!((weighted.accuracy() - repeated.accuracy()).abs() < 1e-9);
    // An unweighted push after weighted ones weighs 1 a row, as a merge does.
    let mut mixed = EvalAccumulator::new();
    mixed.push_rows(&s[..2], &y[..2], &[2.0, 3.0], &[]);
    mixed.push(&s[2..4], &y[2..4]);
    let mut other = EvalAccumulator::new();
    other.push_rows(&s[..2], &y[..2], &[2.0, 3.0], &[]);
    let mut plain = EvalAccumulator::new();
    plain.push(&s[2..4], &y[2..4]);
    other.merge(&plain);
    assert_eq!(mixed.auc(), other.auc());
    assert!((mixed.logloss() - other.logloss()).abs() < 1e-12);
}

/// NE by hand: predicting the click rate itself scores exactly 1; calibration is the
/// predicted clicks over the actual ones.
#[test]
fn normalized_entropy_and_calibration_by_hand() {
    let y = [1.0, 0.0, 0.0, 0.0];
    let mut acc = EvalAccumulator::new();
    acc.push(&[0.25; 4], &y);
    assert!((acc.normalized_entropy().unwrap() - 1.0).abs() < 1e-6);
    assert!((acc.calibration().unwrap() - 1.0).abs() < 1e-6);
    let mut acc = EvalAccumulator::new();
    acc.push(&[0.9, 0.2, 0.1, 0.2], &y);
    let ll = -(0.9f64.ln() + 0.8f64.ln() + 0.9f64.ln() + 0.8f64.ln()) / 4.0;
    let h = -(0.25f64 * 0.25f64.ln() + 0.75 * 0.75f64.ln());
    assert!((acc.normalized_entropy().unwrap() - ll / h).abs() < 1e-6);
    assert!((acc.calibration().unwrap() - 1.4).abs() < 1e-6);
    // One class: no entropy to normalize by; no click: nothing to calibrate against.
    assert_eq!(normalized_entropy(0.3, 0.0), None);
    let mut none = EvalAccumulator::new();
    none.push(&[0.2, 0.3], &[0.0, 0.0]);
    assert_eq!(none.normalized_entropy(), None);
    assert_eq!(none.calibration(), None);
}

/// GAUC by hand: two users ranked perfectly and backwards, weighted by their rows; a
/// user with one class only has no AUC and does not count.
#[test]
fn group_auc_averages_each_users_auc_by_their_rows() {
    let scores = [0.9, 0.1, 0.8, 0.2, 0.3, 0.7, 0.5];
    let labels = [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0];
    let users = [1, 1, 1, 1, 2, 2, 3];
    // User 1: AUC 1 over 4 rows; user 2: AUC 0 over 2; user 3: clicks only.
    let g = group_auc(&scores, &labels, &[], &users).unwrap();
    assert!((g - 4.0 / 6.0).abs() < 1e-12, "{g}");
    // Weights: user 2's rows weigh 3 each, so it counts 6 against user 1's 4.
    let w = [1.0, 1.0, 1.0, 1.0, 3.0, 3.0, 1.0];
    let g = group_auc(&scores, &labels, &w, &users).unwrap();
    assert!((g - 4.0 / 10.0).abs() < 1e-12, "{g}");
    // Through the accumulator, in two batches.
    let mut acc = EvalAccumulator::new();
    acc.push_rows(&scores[..3], &labels[..3], &w[..3], &users[..3]);
    acc.push_rows(&scores[3..], &labels[3..], &w[3..], &users[3..]);
    assert!((acc.group_auc().unwrap() - 0.4).abs() < 1e-12);
    assert_eq!(acc.result().gauc, acc.group_auc());
    // One class in every group: none.
    assert_eq!(group_auc(&[0.1, 0.2], &[1.0, 0.0], &[], &[1, 2]), None);
    let mut plain = EvalAccumulator::new();
    plain.push(&scores, &labels);
    assert_eq!(plain.group_auc(), None, "no groups, no GAUC");
}
