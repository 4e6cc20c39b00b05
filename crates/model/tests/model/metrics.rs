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
