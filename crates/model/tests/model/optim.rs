use elastrec_model::{Adagrad, Adam, DenseOptimizer, DenseOptimizerConfig, Sgd};

fn close(a: &[f32], b: &[f64]) {
    for (x, y) in a.iter().zip(b) {
        assert!((*x as f64 - y).abs() < 2e-6, "{x} vs {y}");
    }
}

const G: [[f32; 2]; 3] = [[0.5, 0.25], [-0.3, 0.1], [0.2, -0.4]];

#[test]
fn sgd_steps() {
    let mut p = vec![1.0f32, -2.0];
    let mut o = Sgd::new(0.1);
    o.step(&mut p, &G[0]);
    close(&p, &[0.95, -2.025]);
    o.step(&mut p, &G[1]);
    close(&p, &[0.98, -2.035]);
}

#[test]
fn adagrad_steps() {
    let mut p = vec![1.0f32, -2.0];
    let mut o = Adagrad::new(2, 0.1, 0.1, 1e-10);
    o.step(&mut p, &G[0]);
    close(&p, &[0.9154845745414341, -2.0620173672792195]);
    o.step(&mut p, &G[1]);
    close(&p, &[0.9607112762212804, -2.086094537890576]);
    close(o.state()[0], &[0.1 + 0.25 + 0.09, 0.1 + 0.0625 + 0.01]);
}

#[test]
fn adam_steps() {
    let mut p = vec![1.0f32, -2.0];
    let mut o = Adam::new(2, 0.01, 0.9, 0.999, 1e-8);
    let want = [
        [0.9900000002, -2.0099999996],
        [0.9880850198941775, -2.018985751173687],
        [0.9846107430790882, -2.0175611372430193],
    ];
    for (g, w) in G.iter().zip(want) {
        o.step(&mut p, g);
        close(&p, &w);
    }
}

#[test]
fn parallel_chunks_match_scalar_formula() {
    // Longer than one parallel chunk: every element follows the same formula.
    let n = 100_003;
    let g: Vec<f32> = (0..n)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    let mut p: Vec<f32> = (0..n).map(|i| (i % 13) as f32 * 0.1).collect();
    let p0 = p.clone();
    let mut o = DenseOptimizerConfig::Adagrad {
        lr: 0.1,
        initial_accumulator: 0.5,
        eps: 1e-10,
        weight_decay: 0.0,
    }
    .build(n);
    o.step(&mut p, &g);
    for i in 0..n {
        let a = 0.5 + g[i] * g[i];
        let want = p0[i] - 0.1 * g[i] / (a.sqrt() + 1e-10);
        assert!((p[i] - want).abs() < 1e-6);
    }
}

/// `weight_decay` adds `wd · p` to the gradient before each optimizer's update (PyTorch's
/// L2 semantics): with `p = 1`, `g = 0.5`, `wd = 0.2` every optimizer sees `g' = 0.7`.
#[test]
fn weight_decay_adds_the_l2_gradient_before_the_update() {
    let configs = [
        // p - lr g' = 1 - 0.1 · 0.7
        (r#"{"type": "sgd", "lr": 0.1, "weight_decay": 0.2}"#, 0.93),
        // acc = 0.49, p - lr g' / sqrt(acc) = 1 - 0.1 · 0.7 / 0.7
        (
            r#"{"type": "adagrad", "lr": 0.1, "weight_decay": 0.2}"#,
            0.9,
        ),
        // m̂ = 0.7, v̂ = 0.49 after one corrected step: p - lr · 0.7 / 0.7
        (r#"{"type": "adam", "lr": 0.1, "weight_decay": 0.2}"#, 0.9),
    ];
    for (json, want) in configs {
        let c: DenseOptimizerConfig = serde_json::from_str(json).unwrap();
        assert_eq!(c.weight_decay(), 0.2);
        let mut p = vec![1.0f32];
        c.build(1).step(&mut p, &[0.5]);
        close(&p, &[want]);
        // Written back as it was read; without decay the field is not written at all,
        // so configs from before it existed serialize (and fingerprint) unchanged.
        assert!(serde_json::to_string(&c).unwrap().contains("weight_decay"));
    }
    let plain: DenseOptimizerConfig =
        serde_json::from_str(r#"{"type": "adam", "lr": 0.1}"#).unwrap();
    assert_eq!(plain.weight_decay(), 0.0);
    assert!(!serde_json::to_string(&plain)
        .unwrap()
        .contains("weight_decay"));
}
