use elastrec_model::layers::Dropout;
use elastrec_model::{
    bce_with_logits, bce_with_logits_loss, Activation, Interaction, InteractionKind, Linear, Mlp,
    NormKind, NormMode,
};

use crate::common::{check_fd, randv, rng};

/// A training forward whose rows are the whole batch.
const TRAIN: NormMode = NormMode::Training { weight: 1.0 };

fn weighted_sum(y: &[f32], r: &[f32]) -> f64 {
    y.iter().zip(r).map(|(&a, &b)| a as f64 * b as f64).sum()
}

fn check_linear(act: Activation, seed: u64) {
    let (n, inp, out) = (7, 5, 6);
    let mut g = rng(seed);
    // Parameters at a nonzero offset inside a larger flat buffer.
    let off = 3;
    let l = Linear::new(inp, out, off, act);
    let mut params = randv(&mut g, off + l.num_params() + 2, 0.8);
    let x = randv(&mut g, n * inp, 1.0);
    let r = randv(&mut g, n * out, 1.0);
    let mut y = vec![0.0; n * out];
    l.forward(&params, &x, n, &mut y);
    // Forward matches the naive formula.
    let (w, b) = l.weights(&params);
    for s in 0..n {
        for o in 0..out {
            let mut pre = b[o];
            for i in 0..inp {
                pre += x[s * inp + i] * w[o * inp + i];
            }
            let want = match act {
                Activation::None => pre,
                Activation::Relu => pre.max(0.0),
                Activation::Sigmoid => 1.0 / (1.0 + (-pre).exp()),
            };
            assert!((y[s * out + o] - want).abs() < 1e-5, "forward mismatch");
        }
    }
    let mut grads = vec![f32::NAN; params.len()];
    let mut dy = r.clone();
    let mut dx = vec![0.0; n * inp];
    l.backward(&params, &mut grads, &x, &y, &mut dy, Some(&mut dx), n);
    // Gradients only written at the layer's offsets.
    assert!(grads[..off].iter().all(|v| v.is_nan()));
    assert!(grads[l.end_offset()..].iter().all(|v| v.is_nan()));

    let fwd = |params: &[f32], x: &[f32]| -> (f64, Vec<bool>) {
        let mut y = vec![0.0; n * out];
        l.forward(params, x, n, &mut y);
        (weighted_sum(&y, &r), y.iter().map(|&v| v > 0.0).collect())
    };
    let pslice = params[off..l.end_offset()].to_vec();
    check_fd(
        "linear params",
        &pslice,
        &grads[off..l.end_offset()],
        1e-3,
        2e-3,
        1e-2,
        |p| {
            params[off..l.end_offset()].copy_from_slice(p);
            fwd(&params, &x)
        },
    );
    params[off..l.end_offset()].copy_from_slice(&pslice);
    check_fd("linear input", &x, &dx, 1e-3, 2e-3, 1e-2, |xx| {
        fwd(&params, xx)
    });
}

#[test]
fn linear_relu_gradcheck() {
    for seed in 0..3 {
        check_linear(Activation::Relu, seed);
    }
}

#[test]
fn linear_identity_gradcheck() {
    check_linear(Activation::None, 11);
}

#[test]
fn linear_sigmoid_gradcheck() {
    check_linear(Activation::Sigmoid, 12);
}

#[test]
fn linear_bias_gradient_is_column_sum() {
    // An odd batch size: the bias gradient is the column sums of dy.
    let (n, inp, out) = (203, 3, 4);
    let mut g = rng(5);
    let l = Linear::new(inp, out, 0, Activation::None);
    let params = randv(&mut g, l.num_params(), 0.5);
    let x = randv(&mut g, n * inp, 1.0);
    let mut y = vec![0.0; n * out];
    l.forward(&params, &x, n, &mut y);
    let mut dy = randv(&mut g, n * out, 1.0);
    let want: Vec<f64> = (0..out)
        .map(|o| (0..n).map(|s| dy[s * out + o] as f64).sum())
        .collect();
    let mut grads = vec![0.0; l.num_params()];
    l.backward(&params, &mut grads, &x, &y, &mut dy, None, n);
    for o in 0..out {
        assert!((grads[l.b_offset + o] as f64 - want[o]).abs() < 1e-4);
    }
}

fn check_interaction(kind: InteractionKind, bottom_dim: usize) {
    check_interaction_shape(kind, bottom_dim, 5, 4, 3, true);
}

/// Forward against a naive formula, backward against the naive analytic gradient (f64)
/// and, when `fd`, against finite differences.
fn check_interaction_shape(
    kind: InteractionKind,
    bottom_dim: usize,
    n: usize,
    t: usize,
    d: usize,
    fd: bool,
) {
    let it = Interaction {
        kind,
        bottom_dim,
        num_tables: t,
        dim: d,
    };
    let mut g = rng(7);
    let z = randv(&mut g, n * bottom_dim, 1.0);
    let e = randv(&mut g, n * t * d, 1.0);
    let od = it.out_dim();
    let r = randv(&mut g, n * od, 1.0);
    let mut out = vec![0.0; n * od];
    it.forward(&z, &e, n, &mut out);
    // Naive forward.
    for s in 0..n {
        let f = |i: usize| -> Vec<f32> {
            if i == 0 {
                z[s * bottom_dim..(s + 1) * bottom_dim].to_vec()
            } else {
                e[(s * t + i - 1) * d..(s * t + i) * d].to_vec()
            }
        };
        let mut want = f(0);
        match kind {
            InteractionKind::Dot => {
                for i in 1..=t {
                    for j in 0..i {
                        want.push(f(i).iter().zip(f(j)).map(|(a, b)| a * b).sum());
                    }
                }
            }
            InteractionKind::Concat => {
                for i in 1..=t {
                    want.extend(f(i));
                }
            }
        }
        assert_eq!(want.len(), od);
        for (a, b) in out[s * od..(s + 1) * od].iter().zip(&want) {
            assert!((a - b).abs() < 1e-5);
        }
    }
    let mut dz = vec![0.0; n * bottom_dim];
    let mut de = vec![f32::NAN; n * t * d];
    it.backward(&z, &e, &r, n, &mut dz, &mut de);
    // Naive analytic backward in f64.
    for s in 0..n {
        let g = &r[s * od..(s + 1) * od];
        let f = |i: usize, k: usize| -> f64 {
            if i == 0 {
                z[s * bottom_dim + k] as f64
            } else {
                e[(s * t + i - 1) * d + k] as f64
            }
        };
        let mut want_z: Vec<f64> = g[..bottom_dim].iter().map(|&v| v as f64).collect();
        let mut want_e = vec![0.0f64; t * d];
        match kind {
            InteractionKind::Dot => {
                let mut p = bottom_dim;
                for i in 1..=t {
                    for j in 0..i {
                        for k in 0..d {
                            let gv = g[p] as f64;
                            let gi = gv * f(j, k);
                            let gj = gv * f(i, k);
                            want_e[(i - 1) * d + k] += gi;
                            if j == 0 {
                                want_z[k] += gj;
                            } else {
                                want_e[(j - 1) * d + k] += gj;
                            }
                        }
                        p += 1;
                    }
                }
            }
            InteractionKind::Concat => {
                for (w, &v) in want_e.iter_mut().zip(&g[bottom_dim..]) {
                    *w = v as f64;
                }
            }
        }
        for (a, b) in dz[s * bottom_dim..(s + 1) * bottom_dim].iter().zip(&want_z) {
            assert!(
                (*a as f64 - b).abs() < 1e-4 * (1.0 + b.abs()),
                "dz {a} vs {b}"
            );
        }
        for (a, b) in de[s * t * d..(s + 1) * t * d].iter().zip(&want_e) {
            assert!(
                (*a as f64 - b).abs() < 1e-4 * (1.0 + b.abs()),
                "demb {a} vs {b}"
            );
        }
    }
    if !fd {
        return;
    }
    let fwd = |z: &[f32], e: &[f32]| -> (f64, Vec<bool>) {
        let mut out = vec![0.0; n * od];
        it.forward(z, e, n, &mut out);
        (weighted_sum(&out, &r), Vec::new())
    };
    check_fd("interaction dz", &z, &dz, 1e-3, 2e-3, 1e-2, |zz| {
        fwd(zz, &e)
    });
    check_fd("interaction demb", &e, &de, 1e-3, 2e-3, 1e-2, |ee| {
        fwd(&z, ee)
    });
}

#[test]
fn dot_interaction_gradcheck() {
    check_interaction(InteractionKind::Dot, 3);
}

#[test]
fn dot_interaction_simd_shapes() {
    // Criteo shape (d = 16, 26 tables): SIMD blocks of 8 samples plus a remainder, over
    // several parallel chunks; d not a multiple of 8; a bottom row longer than 8.
    check_interaction_shape(InteractionKind::Dot, 16, 8 * 40 + 5, 26, 16, false);
    check_interaction_shape(InteractionKind::Dot, 12, 19, 5, 12, false);
    check_interaction_shape(InteractionKind::Dot, 3, 17, 2, 3, true);
}

#[test]
fn concat_interaction_gradcheck() {
    check_interaction(InteractionKind::Concat, 5);
}

#[test]
fn interaction_out_dims() {
    let it = Interaction {
        kind: InteractionKind::Dot,
        bottom_dim: 16,
        num_tables: 26,
        dim: 16,
    };
    assert_eq!(it.out_dim(), 16 + 27 * 26 / 2);
    let it = Interaction {
        kind: InteractionKind::Concat,
        ..it
    };
    assert_eq!(it.out_dim(), 16 + 26 * 16);
}

#[test]
fn bce_values_and_gradient() {
    let mut d = vec![0.0; 1];
    let l = bce_with_logits(&[0.0], &[1.0], &mut d);
    assert!((l - std::f32::consts::LN_2).abs() < 1e-6);
    assert!((d[0] + 0.5).abs() < 1e-6);
    // Extreme logits stay finite and exact.
    let mut d = vec![0.0; 4];
    let l = bce_with_logits(
        &[100.0, -100.0, 100.0, -100.0],
        &[0.0, 1.0, 1.0, 0.0],
        &mut d,
    );
    assert!((l - 50.0).abs() < 1e-4, "{l}");
    assert!(d.iter().all(|v| v.is_finite()));
    assert!((d[0] - 0.25).abs() < 1e-6 && (d[1] + 0.25).abs() < 1e-6);
    // Gradient of the mean loss by finite differences, soft labels included.
    let mut g = rng(9);
    let x = randv(&mut g, 6, 4.0);
    let y = vec![0.0, 1.0, 1.0, 0.0, 0.3, 1.0];
    let mut dx = vec![0.0; 6];
    bce_with_logits(&x, &y, &mut dx);
    check_fd("bce", &x, &dx, 1e-2, 1e-4, 1e-2, |xx| {
        (bce_with_logits_loss(xx, &y) as f64, Vec::new())
    });
}

/// An MLP with dropout on its hidden layers: with the step's mask fixed, finite
/// differences of the forward agree with the backward for every parameter and the input;
/// a dropped unit passes no gradient, a kept one `1 / (1 - rate)` of it.
#[test]
fn mlp_dropout_gradcheck() {
    let (n, sizes) = (9, [5, 12, 10, 3]);
    let mlp = Mlp::new(&sizes, 2, Activation::Relu, Activation::None);
    let mut g = rng(21);
    let mut params = randv(&mut g, 2 + mlp.num_params(), 0.8);
    let x = randv(&mut g, n * sizes[0], 1.0);
    let r = randv(&mut g, n * 3, 1.0);
    let drop = Dropout {
        rate: 0.3,
        seed: 17,
        row0: 40,
    };
    let mut acts: Vec<Vec<f32>> = sizes[1..].iter().map(|&w| vec![0.0; n * w]).collect();
    mlp.forward_full(&params, &x, n, &mut acts, &mut [], Some(drop), TRAIN);
    let dropped = acts[0].iter().filter(|&&v| v == 0.0).count();
    assert!(
        dropped > n * 12 * 3 / 10 / 2,
        "some units dropped: {dropped}"
    );
    let (mut grads, mut dy) = (vec![0.0; params.len()], r.clone());
    let (mut ga, mut gb) = (vec![0.0; n * 12], vec![0.0; n * 12]);
    let mut dx = vec![0.0; n * sizes[0]];
    mlp.backward_full(
        &params,
        &mut grads,
        &x,
        &acts,
        &[],
        &mut dy,
        &mut ga,
        &mut gb,
        Some(&mut dx),
        n,
        Some(drop),
    );
    let fwd = |params: &[f32], x: &[f32]| -> (f64, Vec<bool>) {
        let mut acts: Vec<Vec<f32>> = sizes[1..].iter().map(|&w| vec![0.0; n * w]).collect();
        mlp.forward_full(params, x, n, &mut acts, &mut [], Some(drop), TRAIN);
        let pattern = acts[..2].iter().flatten().map(|&v| v > 0.0).collect();
        (weighted_sum(&acts[2], &r), pattern)
    };
    let p0 = params[2..].to_vec();
    check_fd(
        "mlp dropout params",
        &p0,
        &grads[2..],
        1e-3,
        2e-3,
        1e-2,
        |p| {
            params[2..].copy_from_slice(p);
            fwd(&params, &x)
        },
    );
    params[2..].copy_from_slice(&p0);
    check_fd("mlp dropout input", &x, &dx, 1e-3, 2e-3, 1e-2, |xx| {
        fwd(&params, xx)
    });
}

/// An MLP with layer norms (`Linear → LayerNorm → ReLU`) and dropout: finite differences
/// agree with the backward for every weight, every `γ`, `β` and the input; each
/// normalized pre-activation row has mean 0 and variance 1 before `γ`, `β`.
#[test]
fn mlp_layer_norm_gradcheck() {
    let (n, sizes) = (7, [4, 10, 9, 2]);
    let base = Mlp::new(&sizes, 0, Activation::Relu, Activation::None);
    let mlp = base.clone().with_layer_norm(base.num_params());
    assert_eq!(mlp.norm_params(), 2 * (10 + 9));
    let mut g = rng(31);
    let total = base.num_params() + mlp.norm_params();
    let mut params = randv(&mut g, total, 0.8);
    let x = randv(&mut g, n * sizes[0], 1.0);
    let r = randv(&mut g, n * 2, 1.0);
    let drop = Some(Dropout {
        rate: 0.2,
        seed: 3,
        row0: 0,
    });
    let fresh = || -> (Vec<Vec<f32>>, Vec<elastrec_model::norm::NormActs>) {
        (
            sizes[1..].iter().map(|&w| vec![0.0; n * w]).collect(),
            mlp.norm_acts(n),
        )
    };
    let (mut acts, mut norms) = fresh();
    mlp.forward_full(&params, &x, n, &mut acts, &mut norms, drop, TRAIN);
    for row in norms[0].xhat.chunks(10) {
        let mean: f32 = row.iter().sum::<f32>() / 10.0;
        let var: f32 = row.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / 10.0;
        assert!(
            mean.abs() < 1e-5 && (var - 1.0).abs() < 1e-3,
            "{mean} {var}"
        );
    }
    let (mut grads, mut dy) = (vec![0.0; total], r.clone());
    let (mut ga, mut gb) = (vec![0.0; n * 10], vec![0.0; n * 10]);
    let mut dx = vec![0.0; n * sizes[0]];
    mlp.backward_full(
        &params,
        &mut grads,
        &x,
        &acts,
        &norms,
        &mut dy,
        &mut ga,
        &mut gb,
        Some(&mut dx),
        n,
        drop,
    );
    let fwd = |params: &[f32], x: &[f32]| -> (f64, Vec<bool>) {
        let (mut acts, mut norms) = fresh();
        mlp.forward_full(params, x, n, &mut acts, &mut norms, drop, TRAIN);
        let pattern = acts[..2].iter().flatten().map(|&v| v > 0.0).collect();
        (weighted_sum(&acts[2], &r), pattern)
    };
    let p0 = params.clone();
    check_fd("mlp norm params", &p0, &grads, 1e-3, 2e-3, 2e-2, |p| {
        params.copy_from_slice(p);
        fwd(&params, &x)
    });
    params.copy_from_slice(&p0);
    check_fd("mlp norm input", &x, &dx, 1e-3, 2e-3, 2e-2, |xx| {
        fwd(&params, xx)
    });
}

/// An MLP with batch norms (`Linear → BatchNorm → ReLU`) in a training forward: finite
/// differences agree with the backward for every weight, `γ`, `β` and the input (the
/// statistics of the rows are a function of all of them, so each input's gradient runs
/// through every row); each normalized column has mean 0 and variance 1; at the running
/// statistics the backward writes `weight · (the rows' statistic − the running value)`,
/// with the unbiased variance; and an inference forward normalizes with the running
/// statistics instead.
#[test]
fn mlp_batch_norm_gradcheck() {
    let (n, sizes) = (7, [4, 10, 9, 2]);
    let base = Mlp::new(&sizes, 0, Activation::Relu, Activation::None);
    let mlp = base.clone().with_norm(NormKind::Batch, base.num_params());
    assert_eq!(mlp.norm_params(), 4 * (10 + 9));
    let mut g = rng(37);
    let total = base.num_params() + mlp.norm_params();
    let mut params = randv(&mut g, total, 0.8);
    // Running variances are positive.
    for norm in &mlp.norms {
        let r = norm.statistics();
        let w = norm.width();
        for v in &mut params[r.start + w..r.end] {
            *v = v.abs() + 0.5;
        }
    }
    let x = randv(&mut g, n * sizes[0], 1.0);
    let r = randv(&mut g, n * 2, 1.0);
    let weight = 0.25;
    let mode = NormMode::Training { weight };
    let fresh = || -> (Vec<Vec<f32>>, Vec<elastrec_model::norm::NormActs>) {
        (
            sizes[1..].iter().map(|&w| vec![0.0; n * w]).collect(),
            mlp.norm_acts(n),
        )
    };
    let (mut acts, mut norms) = fresh();
    mlp.forward_full(&params, &x, n, &mut acts, &mut norms, None, mode);
    for j in 0..10 {
        let col: Vec<f32> = norms[0].xhat.iter().skip(j).step_by(10).copied().collect();
        let mean: f32 = col.iter().sum::<f32>() / n as f32;
        let var: f32 = col.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / n as f32;
        assert!(
            mean.abs() < 1e-5 && (var - 1.0).abs() < 1e-3,
            "column {j}: {mean} {var}"
        );
    }
    let (mut grads, mut dy) = (vec![0.0; total], r.clone());
    let (mut ga, mut gb) = (vec![0.0; n * 10], vec![0.0; n * 10]);
    let mut dx = vec![0.0; n * sizes[0]];
    mlp.backward_full(
        &params,
        &mut grads,
        &x,
        &acts,
        &norms,
        &mut dy,
        &mut ga,
        &mut gb,
        Some(&mut dx),
        n,
        None,
    );
    // The first norm's pre-activations, recomputed: the running statistics' entries.
    let mut z = vec![0.0; n * 10];
    let mut plain = base.clone();
    plain.layers[0].act = Activation::None;
    plain.layers[0].forward(&params, &x, n, &mut z);
    let stats = mlp.norms[0].statistics();
    for j in 0..10 {
        let col: Vec<f64> = z
            .iter()
            .skip(j)
            .step_by(10)
            .map(|&v| f64::from(v))
            .collect();
        let mean = col.iter().sum::<f64>() / n as f64;
        let var = col.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        let want_mean = f64::from(weight) * (mean - f64::from(params[stats.start + j]));
        let want_var = f64::from(weight) * (var - f64::from(params[stats.start + 10 + j]));
        assert!((f64::from(grads[stats.start + j]) - want_mean).abs() < 1e-5);
        assert!((f64::from(grads[stats.start + 10 + j]) - want_var).abs() < 1e-4);
    }
    // Finite differences over everything but the running statistics.
    let statistics: Vec<std::ops::Range<usize>> =
        mlp.norms.iter().map(|n| n.statistics()).collect();
    let trained: Vec<usize> = (0..total)
        .filter(|i| !statistics.iter().any(|r| r.contains(i)))
        .collect();
    let fwd = |params: &[f32], x: &[f32]| -> (f64, Vec<bool>) {
        let (mut acts, mut norms) = fresh();
        mlp.forward_full(params, x, n, &mut acts, &mut norms, None, mode);
        let pattern = acts[..2].iter().flatten().map(|&v| v > 0.0).collect();
        (weighted_sum(&acts[2], &r), pattern)
    };
    let p0: Vec<f32> = trained.iter().map(|&i| params[i]).collect();
    let g0: Vec<f32> = trained.iter().map(|&i| grads[i]).collect();
    let full = params.clone();
    check_fd("mlp batch norm params", &p0, &g0, 1e-3, 2e-3, 2e-2, |p| {
        for (&i, &v) in trained.iter().zip(p) {
            params[i] = v;
        }
        fwd(&params, &x)
    });
    params.copy_from_slice(&full);
    check_fd("mlp batch norm input", &x, &dx, 1e-3, 2e-3, 2e-2, |xx| {
        fwd(&params, xx)
    });
    // Inference: `γ (z − μ_run) / sqrt(σ²_run + ε) + β`, then the ReLU, row by row.
    let (mut acts, mut norms) = fresh();
    mlp.forward_full(
        &params,
        &x,
        n,
        &mut acts,
        &mut norms,
        None,
        NormMode::Inference,
    );
    let off = mlp.norms[0].offset();
    for (i, (&got, &pre)) in acts[0].iter().zip(&z).enumerate() {
        let j = i % 10;
        let (gamma, beta) = (params[off + j], params[off + 10 + j]);
        let (mean, var) = (params[off + 20 + j], params[off + 30 + j]);
        let want = (gamma * (pre - mean) / (var + 1e-5).sqrt() + beta).max(0.0);
        assert!(
            (got - want).abs() < 1e-5,
            "row {} unit {j}: {got} vs {want}",
            i / 10
        );
    }
}
