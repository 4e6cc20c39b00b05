use elastrec_model::{DenseDlrm, DlrmConfig, InteractionKind, MmoeConfig, ModelError, Tower};

use crate::common::{check_fd, randv, rng};

fn small(kind: InteractionKind) -> DlrmConfig {
    DlrmConfig {
        bottom: vec![5, 8, 4],
        top: vec![6, 1],
        num_tables: 3,
        embedding_dim: 4,
        interaction: kind,
        seed: 42,
        adapt: Vec::new(),
        cross_layers: 0,
        fm: false,
        dense_shift: Vec::new(),
        dense_scale: Vec::new(),
        dropout: 0.0,
        first_order: false,
        layer_norm: false,
        batch_norm: false,
        mmoe: None,
        attention: Vec::new(),
    }
}

/// Sum (not mean) BCE in f64 from the f32 logits of the model's serving tower, plus the
/// ReLU pattern of every hidden activation.
fn loss_and_pattern(
    m: &DenseDlrm,
    ws: &mut elastrec_model::Workspace,
    x: &[f32],
    e: &[f32],
    y: &[f32],
) -> (f64, Vec<bool>) {
    tower_loss(m, ws, x, e, y, m.serving_tower())
}

fn gradcheck_model(kind: InteractionKind) {
    gradcheck_config(small(kind));
}

fn gradcheck_config(config: DlrmConfig) {
    let width = 3 * config.row_width();
    let mut m = DenseDlrm::new(config).unwrap();
    let n = 6;
    let mut ws = m.workspace(8);
    let mut g = rng(3);
    let x = randv(&mut g, n * 5, 1.0);
    let e = randv(&mut g, n * width, 1.0);
    let y: Vec<f32> = (0..n).map(|i| (i % 2) as f32).collect();
    m.forward_backward(&x, &e, &y, &mut ws).unwrap();
    // Analytic gradients of the *sum* loss = n * gradients of the mean loss.
    let gp: Vec<f32> = ws.grads().iter().map(|v| v * n as f32).collect();
    let ge: Vec<f32> = ws.d_emb().iter().map(|v| v * n as f32).collect();
    assert_eq!(ge.len(), n * width);
    let p0 = m.params().to_vec();
    let mut ws2 = m.workspace(8);
    check_fd("dlrm params", &p0, &gp, 2e-3, 1e-3, 2e-2, |p| {
        m.params_mut().copy_from_slice(p);
        loss_and_pattern(&m, &mut ws2, &x, &e, &y)
    });
    m.params_mut().copy_from_slice(&p0);
    check_fd("dlrm emb", &e, &ge, 2e-3, 1e-3, 2e-2, |ee| {
        loss_and_pattern(&m, &mut ws2, &x, ee, &y)
    });
}

#[test]
fn dlrm_dot_gradcheck() {
    gradcheck_model(InteractionKind::Dot);
}

#[test]
fn dlrm_concat_gradcheck() {
    gradcheck_model(InteractionKind::Concat);
}

/// DCN-v2: two cross layers on either interaction; finite differences agree with every
/// parameter's gradient (the cross layers' `W`, `b` included) and the embeddings'.
#[test]
fn dcn_v2_gradcheck() {
    for kind in [InteractionKind::Concat, InteractionKind::Dot] {
        gradcheck_config(DlrmConfig {
            cross_layers: 2,
            ..small(kind)
        });
    }
}

/// DeepFM: the FM term's gradient joins the embeddings'; finite differences agree on
/// every parameter and embedding, alone and with cross layers too.
#[test]
fn deepfm_gradcheck() {
    for cross_layers in [0, 1] {
        gradcheck_config(DlrmConfig {
            fm: true,
            cross_layers,
            ..small(InteractionKind::Concat)
        });
    }
}

/// The FM term has no parameters: a DeepFM's logit is the DLRM's plus
/// `Σ_{i<j} ⟨e_i, e_j⟩`, computed here pair by pair.
#[test]
fn deepfm_adds_the_pairwise_dots_to_the_logit() {
    let plain = DenseDlrm::new(small(InteractionKind::Concat)).unwrap();
    let fm = DenseDlrm::new(DlrmConfig {
        fm: true,
        ..small(InteractionKind::Concat)
    })
    .unwrap();
    assert_eq!(plain.params(), fm.params());
    let mut g = rng(11);
    let n = 4;
    let x = randv(&mut g, n * 5, 1.0);
    let e = randv(&mut g, n * 3 * 4, 1.0);
    let (mut w1, mut w2) = (plain.workspace(8), fm.workspace(8));
    let a = plain.forward(&x, &e, &mut w1).unwrap().to_vec();
    let b = fm.forward(&x, &e, &mut w2).unwrap().to_vec();
    for r in 0..n {
        let v = |t: usize| &e[(r * 3 + t) * 4..(r * 3 + t + 1) * 4];
        let dot = |i: usize, j: usize| v(i).iter().zip(v(j)).map(|(p, q)| p * q).sum::<f32>();
        let pairs = dot(0, 1) + dot(0, 2) + dot(1, 2);
        assert!(
            (b[r] - (a[r] + pairs)).abs() < 1e-5,
            "row {r}: {} vs {} + {pairs}",
            b[r],
            a[r]
        );
    }
}

/// Cross layers add their parameters after every other layer's and change nothing
/// before them; a zeroed cross layer (`W = 0`, `b = 0`) passes its input through, so
/// the model then equals the DLRM with the same other parameters.
#[test]
fn cross_layers_follow_the_other_parameters_and_a_zeroed_one_is_the_identity() {
    let plain = DenseDlrm::new(small(InteractionKind::Concat)).unwrap();
    let mut dcn = DenseDlrm::new(DlrmConfig {
        cross_layers: 1,
        ..small(InteractionKind::Concat)
    })
    .unwrap();
    let k = plain.num_params();
    let d = plain.interaction().out_dim();
    assert_eq!(dcn.num_params(), k + d * d + d);
    assert_eq!(&dcn.params()[..k], plain.params());
    dcn.params_mut()[k..].fill(0.0);
    let mut g = rng(9);
    let n = 5;
    let x = randv(&mut g, n * 5, 1.0);
    let e = randv(&mut g, n * 3 * 4, 1.0);
    let (mut w1, mut w2) = (plain.workspace(8), dcn.workspace(8));
    let a = plain.forward(&x, &e, &mut w1).unwrap().to_vec();
    let b = dcn.forward(&x, &e, &mut w2).unwrap().to_vec();
    assert_eq!(a, b);
}

#[test]
fn deterministic_init() {
    let a = DenseDlrm::new(DlrmConfig::criteo_kaggle()).unwrap();
    let b = DenseDlrm::new(DlrmConfig::criteo_kaggle()).unwrap();
    assert_eq!(a.params(), b.params());
    let c = DenseDlrm::new(DlrmConfig {
        seed: 1,
        ..DlrmConfig::criteo_kaggle()
    })
    .unwrap();
    assert_ne!(a.params(), c.params());
    // Xavier bound respected on the first weight matrix.
    let l = &a.bottom().layers[0];
    let bound = (6.0f32 / (13 + 512) as f32).sqrt();
    let (w, _) = l.weights(a.params());
    assert!(w.iter().all(|v| v.abs() <= bound));
    assert!(w.iter().any(|v| v.abs() > 0.5 * bound));
}

#[test]
fn criteo_kaggle_shapes() {
    let m = DenseDlrm::new(DlrmConfig::criteo_kaggle()).unwrap();
    assert_eq!(m.interaction().out_dim(), 367);
    assert_eq!(m.top().layers[0].in_dim, 367);
    let want = 13 * 512
        + 512
        + 512 * 256
        + 256
        + 256 * 64
        + 64
        + 64 * 16
        + 16
        + 367 * 512
        + 512
        + 512 * 256
        + 256
        + 256
        + 1;
    assert_eq!(m.num_params(), want);
}

#[test]
fn config_errors() {
    let bad = DlrmConfig {
        bottom: vec![13, 8],
        ..DlrmConfig::criteo_kaggle()
    };
    assert_eq!(
        DenseDlrm::new(bad).unwrap_err(),
        ModelError::DotDimMismatch {
            bottom_out: 8,
            embedding_dim: 16
        }
    );
    let ok = DlrmConfig {
        bottom: vec![13, 8],
        interaction: InteractionKind::Concat,
        ..DlrmConfig::criteo_kaggle()
    };
    assert!(DenseDlrm::new(ok).is_ok());
    let bad = DlrmConfig {
        top: vec![4, 2],
        ..DlrmConfig::criteo_kaggle()
    };
    assert_eq!(
        DenseDlrm::new(bad).unwrap_err(),
        ModelError::TopOutputNotOne { got: 2 }
    );
    let bad = DlrmConfig {
        bottom: vec![13],
        ..DlrmConfig::criteo_kaggle()
    };
    assert!(matches!(
        DenseDlrm::new(bad),
        Err(ModelError::MlpTooShort { .. })
    ));
    let bad = DlrmConfig {
        top: vec![0, 1],
        ..DlrmConfig::criteo_kaggle()
    };
    assert!(matches!(
        DenseDlrm::new(bad),
        Err(ModelError::ZeroWidth { .. })
    ));
}

#[test]
fn shape_errors() {
    let m = DenseDlrm::new(small(InteractionKind::Dot)).unwrap();
    let mut ws = m.workspace(4);
    let x = vec![0.0; 4 * 5];
    let e = vec![0.0; 4 * 12];
    assert!(matches!(
        m.forward_backward(&x, &e[1..], &[0.0; 4], &mut ws),
        Err(ModelError::Shape { what: "emb", .. })
    ));
    assert!(matches!(
        m.forward_backward(&x, &e, &[0.0; 3], &mut ws),
        Err(ModelError::Shape { what: "labels", .. })
    ));
    let x8 = vec![0.0; 8 * 5];
    let e8 = vec![0.0; 8 * 12];
    assert_eq!(
        m.forward(&x8, &e8, &mut ws).unwrap_err(),
        ModelError::BatchTooLarge {
            batch: 8,
            capacity: 4
        }
    );
}

#[test]
fn smaller_batch_than_capacity_and_training_reduces_loss() {
    use elastrec_model::{Adagrad, DenseOptimizer};
    let mut m = DenseDlrm::new(small(InteractionKind::Dot)).unwrap();
    let mut ws = m.workspace(64);
    let mut g = rng(1);
    let n = 37;
    let x = randv(&mut g, n * 5, 1.0);
    let e = randv(&mut g, n * 12, 1.0);
    let y: Vec<f32> = x.chunks(5).map(|r| f32::from(r[0] + r[1] > 0.0)).collect();
    let mut opt = Adagrad::new(m.num_params(), 0.05, 0.0, 1e-10);
    let first = m.forward_backward(&x, &e, &y, &mut ws).unwrap();
    let mut last = first;
    for _ in 0..200 {
        last = m.forward_backward(&x, &e, &y, &mut ws).unwrap();
        opt.step(m.params_mut(), ws.grads());
    }
    assert!(last < 0.5 * first, "loss {first} -> {last}");
    // Same inputs in a workspace of exact capacity give the same gradient.
    let mut ws2 = m.workspace(n);
    m.forward_backward(&x, &e, &y, &mut ws).unwrap();
    m.forward_backward(&x, &e, &y, &mut ws2).unwrap();
    assert_eq!(ws.grads(), ws2.grads());
    assert_eq!(ws.d_emb(), ws2.d_emb());
}

#[test]
fn empty_batch_gives_zero_gradients() {
    let m = DenseDlrm::new(small(InteractionKind::Dot)).unwrap();
    let mut ws = m.workspace(4);
    let mut g = rng(2);
    let x = randv(&mut g, 4 * 5, 1.0);
    let e = randv(&mut g, 4 * 12, 1.0);
    m.forward_backward(&x, &e, &[1.0, 0.0, 1.0, 0.0], &mut ws)
        .unwrap();
    assert!(ws.grads().iter().any(|&v| v != 0.0));
    let loss = m.forward_backward(&[], &[], &[], &mut ws).unwrap();
    assert_eq!(loss, 0.0);
    assert!(ws.grads().iter().all(|&v| v == 0.0));
    assert!(ws.d_emb().is_empty() && ws.logits().is_empty());
}

/// Per-block results of a batch spanning several row blocks (the last one partial) must
/// be those of the whole batch: the gradient of the mean loss is the size-weighted mean of
/// the sub-batches' gradients, and nothing depends on how many threads ran the blocks.
#[test]
fn row_blocks_add_up_to_the_whole_batch_on_any_thread_count() {
    use elastrec_model::dlrm::BLOCK_ROWS;
    let m = DenseDlrm::new(small(InteractionKind::Dot)).unwrap();
    let n = 2 * BLOCK_ROWS + 88;
    let mut g = rng(9);
    let x = randv(&mut g, n * 5, 1.0);
    let e = randv(&mut g, n * 12, 1.0);
    let y: Vec<f32> = (0..n).map(|i| f32::from(i % 3 == 0)).collect();
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let mut ws = m.workspace(n);
            let loss = m.forward_backward(&x, &e, &y, &mut ws).unwrap();
            (
                loss,
                ws.grads().to_vec(),
                ws.d_emb().to_vec(),
                ws.logits().to_vec(),
            )
        })
    };
    let (loss, grads, d_emb, logits) = run(1);
    assert_eq!(run(3), (loss, grads.clone(), d_emb.clone(), logits.clone()));

    // Reference: each block's rows as their own batch (one block each), re-weighted.
    let mut want_grads = vec![0.0f64; grads.len()];
    let mut want_loss = 0.0f64;
    for r0 in (0..n).step_by(BLOCK_ROWS) {
        let r1 = (r0 + BLOCK_ROWS).min(n);
        let k = r1 - r0;
        let w = k as f64 / n as f64;
        let mut ws = m.workspace(k);
        let l = m
            .forward_backward(
                &x[r0 * 5..r1 * 5],
                &e[r0 * 12..r1 * 12],
                &y[r0..r1],
                &mut ws,
            )
            .unwrap();
        want_loss += w * l as f64;
        for (a, &b) in want_grads.iter_mut().zip(ws.grads()) {
            *a += w * b as f64;
        }
        for (i, (&got, &part)) in d_emb[r0 * 12..r1 * 12].iter().zip(ws.d_emb()).enumerate() {
            assert!(
                (got as f64 - w * part as f64).abs() < 1e-7,
                "d_emb row {}",
                r0 + i / 12
            );
        }
        assert_eq!(&logits[r0..r1], ws.logits());
    }
    assert!(
        (loss as f64 - want_loss).abs() < 1e-6,
        "{loss} vs {want_loss}"
    );
    for (i, (&got, &want)) in grads.iter().zip(&want_grads).enumerate() {
        assert!(
            (got as f64 - want).abs() < 1e-5 * (1.0 + want.abs()),
            "param {i}: {got} vs {want}"
        );
    }
}

/// Sum BCE of `tower`'s logits in f64, plus the ReLU pattern of every hidden activation
/// the tower's forward computed.
fn tower_loss(
    m: &DenseDlrm,
    ws: &mut elastrec_model::Workspace,
    x: &[f32],
    e: &[f32],
    y: &[f32],
    tower: Tower,
) -> (f64, Vec<bool>) {
    let logits = m.forward_tower(x, e, tower, ws).unwrap().to_vec();
    let loss: f64 = logits
        .iter()
        .zip(y)
        .map(|(&l, &t)| {
            let l = l as f64;
            l.max(0.0) - l * t as f64 + (-l.abs()).exp().ln_1p()
        })
        .sum();
    let mut pat = relu_pattern(m, ws);
    if tower == Tower::Adapt {
        for i in 0..m.adapt().unwrap().layers.len() - 1 {
            pat.extend(ws.adapt_activation(i).iter().map(|&v| v > 0.0));
        }
    }
    (loss, pat)
}

/// MTRM (Primus Algorithm 1): a memory step's gradient is exactly the finite-difference
/// gradient of the memory tower's loss and leaves the adapt tower alone; an adapt step's
/// reaches the adapt tower, the bottom MLP and the embeddings but never the memory tower
/// (h_M is an input, not a path for gradients). With h_M's weights at zero the adapt loss
/// does not depend on the memory tower, so the adapt step's gradient is then exactly the
/// finite-difference one for every parameter.
#[test]
fn mtrm_towers_gradcheck_and_stop_the_gradient_at_h_m() {
    let cfg = DlrmConfig {
        adapt: vec![5, 1],
        ..small(InteractionKind::Dot)
    };
    let mut m = DenseDlrm::new(cfg).unwrap();
    let adapt = m.adapt().unwrap().clone();
    let memory = {
        let t = m.top();
        t.layers[0].w_offset..t.layers.last().unwrap().end_offset()
    };
    let adapt_range = adapt.layers[0].w_offset..adapt.layers.last().unwrap().end_offset();
    assert_eq!(
        adapt_range.end,
        m.num_params(),
        "the adapt tower comes last"
    );
    let n = 6;
    let mut ws = m.workspace(8);
    let mut ws2 = m.workspace(8);
    let mut g = rng(5);
    let x = randv(&mut g, n * 5, 1.0);
    let e = randv(&mut g, n * 3 * 4, 1.0);
    let y: Vec<f32> = (0..n).map(|i| (i % 2) as f32).collect();
    assert_eq!(m.serving_tower(), Tower::Adapt);
    assert_eq!(m.tower_for(false), Tower::Memory);

    // Memory step.
    m.forward_backward_tower(&x, &e, &y, &[], Tower::Memory, &mut ws)
        .unwrap();
    let gp: Vec<f32> = ws.grads().iter().map(|v| v * n as f32).collect();
    assert!(gp[adapt_range.clone()].iter().all(|&v| v == 0.0));
    assert!(gp[memory.clone()].iter().any(|&v| v != 0.0));
    let p0 = m.params().to_vec();
    check_fd("mtrm memory params", &p0, &gp, 2e-3, 1e-3, 2e-2, |p| {
        m.params_mut().copy_from_slice(p);
        tower_loss(&m, &mut ws2, &x, &e, &y, Tower::Memory)
    });
    m.params_mut().copy_from_slice(&p0);

    // Adapt step: the memory tower gets nothing, whatever h_M's weights.
    m.forward_backward_tower(&x, &e, &y, &[], Tower::Adapt, &mut ws)
        .unwrap();
    assert!(ws.grads()[memory.clone()].iter().all(|&v| v == 0.0));
    assert!(ws.grads()[adapt_range.clone()].iter().any(|&v| v != 0.0));
    // h_M is used: the adapt logits move with the memory tower.
    let before = m
        .forward_tower(&x, &e, Tower::Adapt, &mut ws2)
        .unwrap()
        .to_vec();
    let last = m.top().layers.last().unwrap().b_offset;
    m.params_mut()[last] += 0.5;
    let after = m
        .forward_tower(&x, &e, Tower::Adapt, &mut ws2)
        .unwrap()
        .to_vec();
    assert_ne!(before, after);
    m.params_mut()[last] -= 0.5;

    // With h_M's input weights at zero, the finite differences agree everywhere.
    let l0 = &adapt.layers[0];
    for o in 0..l0.out_dim {
        m.params_mut()[l0.w_offset + o * l0.in_dim + l0.in_dim - 1] = 0.0;
    }
    m.forward_backward_tower(&x, &e, &y, &[], Tower::Adapt, &mut ws)
        .unwrap();
    let gp: Vec<f32> = ws.grads().iter().map(|v| v * n as f32).collect();
    let ge: Vec<f32> = ws.d_emb().iter().map(|v| v * n as f32).collect();
    let p1 = m.params().to_vec();
    check_fd("mtrm adapt params", &p1, &gp, 2e-3, 1e-3, 2e-2, |p| {
        m.params_mut().copy_from_slice(p);
        tower_loss(&m, &mut ws2, &x, &e, &y, Tower::Adapt)
    });
    m.params_mut().copy_from_slice(&p1);
    check_fd("mtrm adapt emb", &e, &ge, 2e-3, 1e-3, 2e-2, |ee| {
        tower_loss(&m, &mut ws2, &x, ee, &y, Tower::Adapt)
    });
    // A plain DLRM has no adapt tower to train.
    let plain = DenseDlrm::new(small(InteractionKind::Dot)).unwrap();
    let mut ws3 = plain.workspace(8);
    assert_eq!(
        plain.forward_backward_tower(&x, &e, &y, &[], Tower::Adapt, &mut ws3),
        Err(ModelError::NoAdaptTower)
    );
}

/// Standardized dense features: finite differences agree with every gradient, and the
/// model equals a plain one (same parameters) fed `(x - shift) * scale`.
#[test]
fn standardized_dense_features_gradcheck_and_equal_standardizing_the_input() {
    let shift = vec![0.5, -1.0, 2.0, 0.0, 3.0];
    let scale = vec![2.0, 0.5, 1.0, 4.0, 0.25];
    let norm = DlrmConfig {
        dense_shift: shift.clone(),
        dense_scale: scale.clone(),
        ..small(InteractionKind::Dot)
    };
    gradcheck_config(norm.clone());
    let (a, b) = (
        DenseDlrm::new(norm).unwrap(),
        DenseDlrm::new(small(InteractionKind::Dot)).unwrap(),
    );
    assert_eq!(a.params(), b.params(), "standardizing adds no parameters");
    let n = 7;
    let mut g = rng(11);
    let x = randv(&mut g, n * 5, 3.0);
    let e = randv(&mut g, n * 3 * 4, 1.0);
    let xs: Vec<f32> = x
        .chunks(5)
        .flat_map(|r| {
            (0..5)
                .map(|j| (r[j] - shift[j]) * scale[j])
                .collect::<Vec<_>>()
        })
        .collect();
    let (mut wa, mut wb) = (a.workspace(n), b.workspace(n));
    assert_eq!(
        a.forward(&x, &e, &mut wa).unwrap(),
        b.forward(&xs, &e, &mut wb).unwrap()
    );
    let y: Vec<f32> = (0..n).map(|i| (i % 2) as f32).collect();
    a.forward_backward(&x, &e, &y, &mut wa).unwrap();
    b.forward_backward(&xs, &e, &y, &mut wb).unwrap();
    assert_eq!(wa.grads(), wb.grads());
}

/// Dropout only acts in training steps: a model with dropout predicts exactly what the
/// same parameters predict without it, while its training step's logits differ; the step
/// is the same on any thread count (masks hash the row, not the thread), and a workspace
/// with another stream draws other masks.
#[test]
fn dropout_acts_in_training_steps_only_and_repeats_on_any_thread_count() {
    let cfg = DlrmConfig {
        top: vec![64, 32, 1],
        dropout: 0.5,
        ..small(InteractionKind::Dot)
    };
    let drop = DenseDlrm::new(cfg.clone()).unwrap();
    let plain = DenseDlrm::new(DlrmConfig {
        dropout: 0.0,
        ..cfg
    })
    .unwrap();
    let n = 600; // three row blocks
    let mut g = rng(5);
    let x = randv(&mut g, n * 5, 1.0);
    let e = randv(&mut g, n * 3 * 4, 1.0);
    let y: Vec<f32> = (0..n).map(|i| u8::from(i % 3 == 0) as f32).collect();
    let (mut wd, mut wp) = (drop.workspace(n), plain.workspace(n));
    assert_eq!(
        drop.forward(&x, &e, &mut wd).unwrap(),
        plain.forward(&x, &e, &mut wp).unwrap()
    );
    let step = |threads: usize, stream: Option<u64>| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let mut ws = drop.workspace(n);
        if let Some(s) = stream {
            ws.set_dropout_stream(s);
        }
        pool.install(|| drop.forward_backward(&x, &e, &y, &mut ws).unwrap());
        // Half the first hidden layer's units are zero beyond the ReLU's own zeros.
        let h = ws.top_activation(0);
        (ws.logits().to_vec(), ws.grads().to_vec(), h)
    };
    let (l1, g1, h1) = step(1, None);
    let (l2, g2, _) = step(2, None);
    assert_eq!((&l1, &g1), (&l2, &g2));
    plain.forward_backward(&x, &e, &y, &mut wp).unwrap();
    assert_ne!(l1, wp.logits());
    let (_, _, h_plain) = (0, 0, {
        plain.forward(&x, &e, &mut wp).unwrap();
        wp.top_activation(0)
    });
    let live = |h: &[f32]| h.iter().filter(|&&v| v > 0.0).count() as f64;
    let kept = live(&h1) / live(&h_plain);
    assert!((0.45..0.55).contains(&kept), "kept {kept}");
    let (l3, _, _) = step(1, Some(99));
    assert_ne!(l1, l3);
}

/// The first-order term (Wide & Deep's wide part, DeepFM's first order), alone and with
/// DeepFM's FM term, cross layers and standardized features: finite differences agree
/// with every parameter's gradient and every float of the `d + 1`-wide rows (the
/// weights' included).
#[test]
fn first_order_gradcheck() {
    for (fm, cross_layers, kind) in [
        (false, 0, InteractionKind::Dot),
        (true, 0, InteractionKind::Concat),
        (false, 1, InteractionKind::Concat),
    ] {
        gradcheck_config(DlrmConfig {
            first_order: true,
            fm,
            cross_layers,
            dense_shift: vec![0.1; 5],
            dense_scale: vec![2.0; 5],
            ..small(kind)
        });
    }
}

/// The term adds `Σ_t w[id_t] + v · x + c` to the deep part's logit: with the dense
/// layer's parameters (the last ones) set by hand, the logit is the plain model's (same
/// other parameters, rows without weights) plus that sum, computed here directly.
#[test]
fn first_order_adds_the_row_weights_and_a_dense_linear_term() {
    let plain = DenseDlrm::new(small(InteractionKind::Dot)).unwrap();
    let mut wide = DenseDlrm::new(DlrmConfig {
        first_order: true,
        ..small(InteractionKind::Dot)
    })
    .unwrap();
    let k = plain.num_params();
    assert_eq!(
        wide.num_params(),
        k + 5 + 1,
        "v (5) and c after every other parameter"
    );
    assert_eq!(&wide.params()[..k], plain.params());
    let (v, c) = ([0.5f32, -1.0, 0.25, 2.0, 0.0], 0.3f32);
    wide.params_mut()[k..k + 5].copy_from_slice(&v);
    wide.params_mut()[k + 5] = c;
    let n = 4;
    let mut g = rng(8);
    let x = randv(&mut g, n * 5, 1.0);
    let e = randv(&mut g, n * 3 * 4, 1.0);
    let w = randv(&mut g, n * 3, 1.0);
    // Rows of d + 1 floats: the embedding, then its weight.
    let rows: Vec<f32> = e
        .chunks(4)
        .zip(&w)
        .flat_map(|(r, &wt)| r.iter().copied().chain([wt]).collect::<Vec<_>>())
        .collect();
    let (mut wp, mut ww) = (plain.workspace(n), wide.workspace(n));
    let base = plain.forward(&x, &e, &mut wp).unwrap().to_vec();
    let got = wide.forward(&x, &rows, &mut ww).unwrap();
    for r in 0..n {
        let linear: f32 = (0..5).map(|j| v[j] * x[r * 5 + j]).sum::<f32>() + c;
        let want = base[r] + w[r * 3..r * 3 + 3].iter().sum::<f32>() + linear;
        assert!(
            (got[r] - want).abs() < 1e-5,
            "row {r}: {} vs {want}",
            got[r]
        );
    }
}

/// Layer norms on the bottom and top MLPs' hidden layers: finite differences agree with
/// every gradient (the norms' `γ`, `β` included), alone and with the first-order term
/// and cross layers (with dropout: `mlp_layer_norm_gradcheck`); the norms' parameters
/// come last and start as the identity (`γ = 1`, `β = 0`).
#[test]
fn layer_norm_gradcheck() {
    for (first_order, cross_layers, kind) in [
        (false, 0, InteractionKind::Dot),
        (true, 1, InteractionKind::Concat),
    ] {
        gradcheck_config(DlrmConfig {
            layer_norm: true,
            first_order,
            cross_layers,
            ..small(kind)
        });
    }
    let plain = DenseDlrm::new(small(InteractionKind::Dot)).unwrap();
    let normed = DenseDlrm::new(DlrmConfig {
        layer_norm: true,
        ..small(InteractionKind::Dot)
    })
    .unwrap();
    let k = plain.num_params();
    // bottom [5, 8, 4]: one hidden layer of 8; top [., 6, 1]: one of 6.
    assert_eq!(normed.num_params(), k + 2 * 8 + 2 * 6);
    assert_eq!(&normed.params()[..k], plain.params());
    assert_eq!(&normed.params()[k..k + 8], &[1.0; 8]);
    assert_eq!(&normed.params()[k + 8..k + 16], &[0.0; 8]);
}

fn mmoe_small(kind: InteractionKind, cross_layers: usize) -> DlrmConfig {
    DlrmConfig {
        cross_layers,
        mmoe: Some(MmoeConfig {
            tasks: 3,
            experts: 2,
            expert: vec![5, 4],
            weights: Vec::new(),
            task_experts: 0,
        }),
        ..small(kind)
    }
}

/// The sum BCE, in f64, of the last forward's logits of every task against `labels`,
/// weighted by the tasks' weights (1 for a one-task model).
fn tasks_bce(m: &DenseDlrm, ws: &elastrec_model::Workspace, labels: &[Vec<f32>]) -> f64 {
    weighted_tasks_bce(m, ws, labels, &[])
}

/// [`tasks_bce`] with each row's terms times its sample weight (`weights` empty: 1).
fn weighted_tasks_bce(
    m: &DenseDlrm,
    ws: &elastrec_model::Workspace,
    labels: &[Vec<f32>],
    weights: &[f32],
) -> f64 {
    let bce = |l: f32, t: f32| {
        let l = l as f64;
        l.max(0.0) - l * t as f64 + (-l.abs()).exp().ln_1p()
    };
    let task_weight = |t: usize| m.mmoe().map_or(1.0, |h| f64::from(h.weights[t]));
    let sample_weight = |i: usize| weights.get(i).map_or(1.0, |&w| f64::from(w));
    labels
        .iter()
        .enumerate()
        .map(|(t, y)| {
            task_weight(t)
                * ws.task_logits(t)
                    .iter()
                    .zip(y)
                    .enumerate()
                    .map(|(i, (&l, &y))| sample_weight(i) * bce(l, y))
                    .sum::<f64>()
        })
        .sum()
}

/// The BCE of every task summed with the tasks' weights, in f64, and the ReLU pattern of
/// every hidden activation the tasks' logits go through (bottom, experts, towers).
fn all_tasks_loss(
    m: &DenseDlrm,
    ws: &mut elastrec_model::Workspace,
    x: &[f32],
    e: &[f32],
    labels: &[Vec<f32>],
) -> (f64, Vec<bool>) {
    m.forward(x, e, ws).unwrap();
    (tasks_bce(m, ws, labels), relu_pattern(m, ws))
}

/// The ReLU pattern of every hidden activation of the last forward: the bottom MLP, an
/// MMoE's experts, the top MLP's hidden layers and the other tasks' towers' (an MTRM's
/// adapt tower is the caller's).
fn relu_pattern(m: &DenseDlrm, ws: &elastrec_model::Workspace) -> Vec<bool> {
    let mut acts: Vec<Vec<f32>> = (0..m.bottom().layers.len())
        .map(|i| ws.bottom_activation(i))
        .collect();
    if let Some(head) = m.mmoe() {
        for (k, expert) in head.experts.iter().enumerate() {
            acts.extend((0..expert.layers.len()).map(|i| ws.expert_activation(k, i)));
        }
    }
    acts.extend((0..m.top().layers.len() - 1).map(|i| ws.top_activation(i)));
    if let Some(head) = m.mmoe() {
        for t in 1..head.tasks() {
            let hidden = head.towers[t - 1].layers.len() - 1;
            acts.extend((0..hidden).map(|i| ws.task_tower_activation(t, i)));
        }
    }
    acts.iter().flatten().map(|&v| v > 0.0).collect()
}

/// MMoE: the gradient of the weighted sum of the task losses agrees with finite
/// differences for every parameter (experts, gates through their softmax, every task's
/// tower) and every embedding, on both interactions and under cross layers, with equal
/// weights and with task 0's halved, task 1's doubled and task 2's left out, and with
/// layer norms in every MLP (bottom, experts, every task's tower: their `γ`, `β`
/// included), and as a CGC with two or one experts of each task's own.
#[test]
fn mmoe_gradcheck() {
    for (kind, cross, weights, layer_norm, own) in [
        (InteractionKind::Dot, 0, vec![], false, 0),
        (InteractionKind::Concat, 0, vec![], false, 0),
        (InteractionKind::Concat, 1, vec![], false, 0),
        (InteractionKind::Dot, 0, vec![0.5, 2.0, 0.0], false, 0),
        (InteractionKind::Concat, 1, vec![0.5, 2.0, 0.0], false, 0),
        (InteractionKind::Dot, 0, vec![], true, 0),
        (InteractionKind::Concat, 1, vec![0.5, 2.0, 0.0], true, 0),
        (InteractionKind::Dot, 0, vec![], false, 2),
        (InteractionKind::Concat, 1, vec![0.5, 2.0, 0.0], true, 1),
    ] {
        let mut config = mmoe_small(kind, cross);
        config.mmoe.as_mut().unwrap().weights = weights.clone();
        config.mmoe.as_mut().unwrap().task_experts = own;
        config.layer_norm = layer_norm;
        let width = 3 * config.row_width();
        let mut m = DenseDlrm::new(config).unwrap();
        assert_eq!(m.tasks(), 3);
        let head = m.mmoe().unwrap();
        assert_eq!(head.experts.len(), 2 + 3 * own);
        // One norm per hidden layer of the experts and the towers of tasks 1 and 2.
        let norms = head.experts.len() + 2;
        assert_eq!(head.norms().count(), if layer_norm { norms } else { 0 });
        let n = 6;
        let mut ws = m.workspace(8);
        let mut g = rng(5);
        let x = randv(&mut g, n * 5, 1.0);
        let e = randv(&mut g, n * width, 1.0);
        let labels: Vec<Vec<f32>> = (0..3)
            .map(|t| (0..n).map(|i| ((i + t) % 2) as f32).collect())
            .collect();
        let rest: Vec<f32> = (0..n).flat_map(|i| [labels[1][i], labels[2][i]]).collect();
        let loss = m
            .forward_backward_tasks(&x, &e, &labels[0], &rest, &mut ws)
            .unwrap();
        let (want, _) = all_tasks_loss(&m, &mut m.workspace(8), &x, &e, &labels);
        assert!(
            (f64::from(loss) - want / n as f64).abs() < 1e-4,
            "the step's loss {loss} is the weighted mean {}",
            want / n as f64
        );
        let gp: Vec<f32> = ws.grads().iter().map(|v| v * n as f32).collect();
        let ge: Vec<f32> = ws.d_emb().iter().map(|v| v * n as f32).collect();
        let p0 = m.params().to_vec();
        let mut ws2 = m.workspace(8);
        check_fd("mmoe params", &p0, &gp, 2e-3, 1e-3, 2e-2, |p| {
            m.params_mut().copy_from_slice(p);
            all_tasks_loss(&m, &mut ws2, &x, &e, &labels)
        });
        m.params_mut().copy_from_slice(&p0);
        check_fd("mmoe emb", &e, &ge, 2e-3, 1e-3, 2e-2, |ee| {
            all_tasks_loss(&m, &mut ws2, &x, ee, &labels)
        });
        // Without the other tasks' labels the step is refused, not trained on task 0.
        let err = m
            .forward_backward(&x, &e, &labels[0], &mut ws)
            .unwrap_err()
            .to_string();
        assert!(err.contains("task_labels"), "{err}");
    }
}

/// A one-task model's parameters and logits do not change when an MMoE head is added to
/// another model of the same seed: the head's initialization streams come after every
/// other layer's. And `predict_tasks` gives each task's sigmoid of its logit.
#[test]
fn mmoe_head_leaves_the_shared_layers_initial_values_and_predicts_every_task() {
    let plain = DenseDlrm::new(small(InteractionKind::Dot)).unwrap();
    let multi = DenseDlrm::new(mmoe_small(InteractionKind::Dot, 0)).unwrap();
    let bottom = plain.bottom().num_params();
    assert_eq!(plain.params()[..bottom], multi.params()[..bottom]);
    let mut g = rng(8);
    let n = 5;
    let x = randv(&mut g, n * 5, 1.0);
    let e = randv(&mut g, n * 3 * 4, 1.0);
    let mut ws = multi.workspace(8);
    let mut probs = vec![0.0; n * 3];
    multi.predict_tasks(&x, &e, &mut ws, &mut probs).unwrap();
    for t in 0..3 {
        let gates = ws.gate_weights(t);
        for r in 0..n {
            let p = 1.0 / (1.0 + (-ws.task_logits(t)[r]).exp());
            assert!((probs[r * 3 + t] - p).abs() < 1e-6);
            assert!((gates[r * 2..r * 2 + 2].iter().sum::<f32>() - 1.0).abs() < 1e-6);
        }
    }
    // The tasks have towers of their own: their predictions differ.
    assert_ne!(ws.task_logits(1), ws.task_logits(2));
}

/// A CGC head: a task's own experts learn from that task alone. With only task 1
/// weighted, task 0's and task 2's own experts get no gradient, task 1's and the shared
/// ones do; each gate weighs the shared experts and the task's own.
#[test]
fn cgc_task_experts_learn_from_their_task_alone() {
    let mut config = mmoe_small(InteractionKind::Dot, 0);
    let head_cfg = config.mmoe.as_mut().unwrap();
    head_cfg.task_experts = 2;
    head_cfg.weights = vec![0.0, 1.0, 0.0];
    let m = DenseDlrm::new(config).unwrap();
    let head = m.mmoe().unwrap();
    assert_eq!((head.shared, head.per_task, head.gate_width()), (2, 2, 4));
    let n = 6;
    let mut ws = m.workspace(8);
    let mut g = rng(21);
    let x = randv(&mut g, n * 5, 1.0);
    let e = randv(&mut g, n * 3 * 4, 1.0);
    let labels: Vec<Vec<f32>> = (0..3)
        .map(|t| (0..n).map(|i| ((i + t) % 2) as f32).collect())
        .collect();
    let rest: Vec<f32> = (0..n).flat_map(|i| [labels[1][i], labels[2][i]]).collect();
    m.forward_backward_tasks(&x, &e, &labels[0], &rest, &mut ws)
        .unwrap();
    let grad_norm = |expert: usize| {
        let layers = &head.experts[expert].layers;
        let span = layers[0].w_offset..layers[layers.len() - 1].end_offset();
        ws.grads()[span].iter().map(|v| v * v).sum::<f32>()
    };
    for j in 0..head.experts.len() {
        // Shared: 0, 1; task 0's own: 2, 3; task 1's: 4, 5; task 2's: 6, 7.
        let learns = j < 2 || (4..6).contains(&j);
        assert_eq!(grad_norm(j) > 0.0, learns, "expert {j}");
    }
    for t in 0..3 {
        let gates = ws.gate_weights(t);
        for r in 0..n {
            assert!((gates[r * 4..r * 4 + 4].iter().sum::<f32>() - 1.0).abs() < 1e-6);
        }
    }
}

/// A head that cannot be built is refused at construction.
#[test]
fn mmoe_bad_heads_are_refused() {
    for (tasks, experts, expert, fm, weights) in [
        (0, 2, vec![4], false, vec![]),
        (9, 2, vec![4], false, vec![]),
        (2, 0, vec![4], false, vec![]),
        (2, 2, vec![], false, vec![]),
        (2, 2, vec![4], true, vec![]),
        (2, 2, vec![4], false, vec![1.0]),
        (2, 2, vec![4], false, vec![1.0, -1.0]),
        (2, 2, vec![4], false, vec![0.0, 0.0]),
        (2, 2, vec![4], false, vec![f32::INFINITY, 1.0]),
    ] {
        let cfg = DlrmConfig {
            fm,
            mmoe: Some(MmoeConfig {
                tasks,
                experts,
                expert,
                weights,
                task_experts: 0,
            }),
            ..small(InteractionKind::Concat)
        };
        assert!(matches!(
            DenseDlrm::new(cfg),
            Err(ModelError::BadMmoe { .. })
        ));
    }
}

/// Sum BCE, in f64, of a training step's logits (task 0's and, for a multi-task model,
/// every other task's with its weight), plus the ReLU pattern of every hidden
/// activation: the loss a batch norm's training forward defines (its statistics are the
/// batch's).
fn training_loss(
    m: &DenseDlrm,
    ws: &mut elastrec_model::Workspace,
    x: &[f32],
    e: &[f32],
    labels: &[Vec<f32>],
) -> (f64, Vec<bool>) {
    let n = labels[0].len();
    let rest: Vec<f32> = (0..n)
        .flat_map(|i| labels[1..].iter().map(move |l| l[i]))
        .collect();
    m.forward_backward_tasks(x, e, &labels[0], &rest, ws)
        .unwrap();
    (tasks_bce(m, ws, labels), relu_pattern(m, ws))
}

/// Batch norms on every hidden layer (bottom, top, and an MMoE's experts and towers): in
/// a training step finite differences agree with the gradient of every weight, `γ` and
/// `β` and every embedding (each row's gradient runs through its block's statistics, so
/// through every other row), on both interactions, with cross layers and the first-order
/// term, and in a two-task MMoE; the running statistics are the model's only
/// non-trained floats, 2 per unit after `γ`, `β`, starting at mean 0 and variance 1.
#[test]
fn batch_norm_gradcheck() {
    let two_tasks = DlrmConfig {
        mmoe: Some(MmoeConfig {
            tasks: 2,
            experts: 2,
            expert: vec![5, 4],
            weights: Vec::new(),
            task_experts: 1,
        }),
        ..small(InteractionKind::Concat)
    };
    for config in [
        small(InteractionKind::Dot),
        DlrmConfig {
            first_order: true,
            cross_layers: 1,
            ..small(InteractionKind::Concat)
        },
        two_tasks,
    ] {
        let config = DlrmConfig {
            batch_norm: true,
            ..config
        };
        let tasks = config.tasks();
        let width = 3 * config.row_width();
        let mut m = DenseDlrm::new(config).unwrap();
        let statistics = m.statistic_ranges();
        assert!(!statistics.is_empty());
        let n = 6;
        let mut g = rng(13);
        let x = randv(&mut g, n * 5, 1.0);
        let e = randv(&mut g, n * width, 1.0);
        let labels: Vec<Vec<f32>> = (0..tasks)
            .map(|t| (0..n).map(|i| ((i + t) % 2) as f32).collect())
            .collect();
        let mut ws = m.workspace(8);
        training_loss(&m, &mut ws, &x, &e, &labels);
        let gp: Vec<f32> = ws.grads().iter().map(|v| v * n as f32).collect();
        let ge: Vec<f32> = ws.d_emb().iter().map(|v| v * n as f32).collect();
        let trained: Vec<usize> = (0..m.num_params())
            .filter(|i| !statistics.iter().any(|r| r.contains(i)))
            .collect();
        for r in &statistics {
            let w = r.len() / 2;
            assert_eq!(&m.params()[r.start..r.start + w], vec![0.0; w]);
            assert_eq!(&m.params()[r.start + w..r.end], vec![1.0; w]);
        }
        let full = m.params().to_vec();
        let p0: Vec<f32> = trained.iter().map(|&i| full[i]).collect();
        let g0: Vec<f32> = trained.iter().map(|&i| gp[i]).collect();
        let mut ws2 = m.workspace(8);
        check_fd("batch norm params", &p0, &g0, 2e-3, 1e-3, 2e-2, |p| {
            for (&i, &v) in trained.iter().zip(p) {
                m.params_mut()[i] = v;
            }
            training_loss(&m, &mut ws2, &x, &e, &labels)
        });
        m.params_mut().copy_from_slice(&full);
        check_fd("batch norm emb", &e, &ge, 2e-3, 1e-3, 2e-2, |ee| {
            training_loss(&m, &mut ws2, &x, ee, &labels)
        });
    }
    let bad = DenseDlrm::new(DlrmConfig {
        batch_norm: true,
        layer_norm: true,
        ..small(InteractionKind::Dot)
    });
    assert!(matches!(bad, Err(ModelError::TwoNorms)), "{bad:?}");
}

/// A batch norm's running statistics follow the training steps: with the weights held
/// (learning rate 0), steps on one batch of three row blocks move the running mean and
/// variance of the first bottom layer to the blocks' row-weighted mean and unbiased
/// variance (`running += 0.1 · (step − running)`), on any thread count alike. Predictions then use the running statistics: a
/// row scores the same alone as in its batch, while in a training step its logit depends
/// on the rows beside it.
#[test]
fn batch_norm_predicts_with_the_running_statistics_of_its_steps() {
    use elastrec_model::dlrm::BLOCK_ROWS;
    use elastrec_model::DenseOptimizerConfig;
    let mut m = DenseDlrm::new(DlrmConfig {
        batch_norm: true,
        ..small(InteractionKind::Dot)
    })
    .unwrap();
    let n = 2 * BLOCK_ROWS + 100;
    let mut g = rng(23);
    let x: Vec<f32> = randv(&mut g, n * 5, 1.0)
        .iter()
        .map(|v| 2.0 * v + 1.0)
        .collect();
    let e = randv(&mut g, n * 12, 1.0);
    let y: Vec<f32> = (0..n).map(|i| f32::from(i % 3 == 0)).collect();
    let held = DenseOptimizerConfig::Adam {
        lr: 0.0,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let mut opt = held.build_with_statistics(m.num_params(), m.statistic_ranges());
    let mut ws = m.workspace(n);
    let steps = 80;
    for _ in 0..steps {
        m.forward_backward(&x, &e, &y, &mut ws).unwrap();
        opt.step(m.params_mut(), ws.grads());
    }
    // The targets: the first bottom layer's pre-activations, block by block.
    let layer = &m.bottom().layers[0];
    let (w, b) = layer.weights(m.params());
    let width = layer.out_dim;
    let (mut mean, mut var) = (vec![0.0f64; width], vec![0.0f64; width]);
    for r0 in (0..n).step_by(BLOCK_ROWS) {
        let rows = (r0 + BLOCK_ROWS).min(n) - r0;
        for j in 0..width {
            let z: Vec<f64> = (r0..r0 + rows)
                .map(|r| {
                    let dot: f32 = (0..5).map(|i| x[r * 5 + i] * w[j * 5 + i]).sum();
                    f64::from(dot + b[j])
                })
                .collect();
            let mu = z.iter().sum::<f64>() / rows as f64;
            let v = z.iter().map(|v| (v - mu).powi(2)).sum::<f64>() / (rows - 1) as f64;
            mean[j] += mu * rows as f64 / n as f64;
            var[j] += v * rows as f64 / n as f64;
        }
    }
    let stats = m.statistic_ranges()[0].clone();
    let left = 0.9f64.powi(steps);
    for j in 0..width {
        let (got_mean, got_var) = (
            m.params()[stats.start + j],
            m.params()[stats.start + width + j],
        );
        let want_mean = mean[j] * (1.0 - left);
        let want_var = var[j] * (1.0 - left) + left;
        assert!(
            (f64::from(got_mean) - want_mean).abs() < 1e-3 * (1.0 + want_mean.abs()),
            "unit {j}: running mean {got_mean} vs {want_mean}"
        );
        assert!(
            (f64::from(got_var) - want_var).abs() < 1e-3 * (1.0 + want_var),
            "unit {j}: running variance {got_var} vs {want_var}"
        );
    }
    assert!(
        var.iter().any(|&v| (v - 1.0).abs() > 0.1),
        "{var:?}: a test that can fail"
    );
    // Bit-identical on one and three threads.
    let step = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let mut ws = m.workspace(n);
        pool.install(|| m.forward_backward(&x, &e, &y, &mut ws).unwrap());
        (ws.grads().to_vec(), ws.logits().to_vec())
    };
    let (grads, train_logits) = step(1);
    assert_eq!(step(3), (grads, train_logits.clone()));
    // Predictions: row 0 alone scores what it scores in the batch.
    let all = m.forward(&x, &e, &mut ws).unwrap().to_vec();
    let mut one = m.workspace(1);
    let alone = m.forward(&x[..5], &e[..12], &mut one).unwrap()[0];
    assert!((alone - all[0]).abs() < 1e-5, "{alone} vs {}", all[0]);
    // In a training step it does not: its block's statistics change with the rows.
    let mut pair = m.workspace(2);
    m.forward_backward(&x[..10], &e[..24], &y[..2], &mut pair)
        .unwrap();
    assert!((pair.logits()[0] - train_logits[0]).abs() > 1e-4);
}

/// Attention units take their parameters after every other layer's (the model without
/// them starts from the same values), fill their slot before the forward, and refuse a
/// slot that is not the model's, attends to itself, or queries a pooled history.
#[test]
fn attention_units_extend_the_flat_vector_and_check_their_slots() {
    let unit = |slot, query| elastrec_model::AttentionConfig {
        slot,
        query,
        max_len: 2,
        mlp: vec![3],
        softmax: false,
        transformer: None,
    };
    let plain = DenseDlrm::new(small(InteractionKind::Dot)).unwrap();
    let with = DenseDlrm::new(DlrmConfig {
        attention: vec![unit(2, 0)],
        ..small(InteractionKind::Dot)
    })
    .unwrap();
    let extra = (4 * 4 + 1) * 3 + 4;
    assert_eq!(with.num_params(), plain.num_params() + extra);
    assert_eq!(&with.params()[..plain.num_params()], plain.params());
    // Two rows; row 0's history is 2 items, row 1's is 1.
    let (n, d) = (2, 4);
    let mut ws = with.workspace(n);
    let mut emb = vec![0.5; n * 3 * d];
    let hist: Vec<f32> = (0..n * 2 * d).map(|i| i as f32 / 10.0).collect();
    with.attend(&hist, &[2, 1], &mut emb, &mut ws).unwrap();
    assert_ne!(
        &emb[2 * d..3 * d],
        &[0.5; 4],
        "slot 2 holds the pooled history"
    );
    let err = with.attend(&hist, &[3, 1], &mut emb, &mut ws).unwrap_err();
    assert!(err.to_string().contains("1 to 2"), "{err}");
    for (bad, want) in [
        (vec![unit(3, 0)], "not one of the model's 3"),
        (vec![unit(1, 1)], "attends to itself"),
        (vec![unit(1, 0), unit(2, 1)], "itself a pooled history"),
    ] {
        let err = DenseDlrm::new(DlrmConfig {
            attention: bad,
            ..small(InteractionKind::Dot)
        })
        .unwrap_err();
        assert!(matches!(err, ModelError::BadAttention { .. }), "{err}");
        assert!(err.to_string().contains(want), "{err}");
    }
}

/// The model runs its attention units in row blocks in parallel: the pooled slots, the
/// queries' and histories' gradients and the summed parameter gradient are what one
/// pass of the unit over the whole batch gives.
#[test]
fn attention_in_row_blocks_equals_one_pass_over_the_batch() {
    blocks_equal_one_pass(None);
}

/// As [`attention_in_row_blocks_equals_one_pass_over_the_batch`], for a transformer.
#[test]
fn a_transformer_in_row_blocks_equals_one_pass_over_the_batch() {
    blocks_equal_one_pass(Some(elastrec_model::TransformerConfig {
        heads: 2,
        layers: 2,
        ffn: 8,
        positions: true,
    }));
}

fn blocks_equal_one_pass(transformer: Option<elastrec_model::TransformerConfig>) {
    let config = DlrmConfig {
        attention: vec![elastrec_model::AttentionConfig {
            slot: 2,
            query: 0,
            max_len: 3,
            mlp: vec![5],
            softmax: true,
            transformer,
        }],
        ..small(InteractionKind::Dot)
    };
    let mut model = DenseDlrm::new(config).unwrap();
    let (n, d, t) = (600, 4, 3);
    let mut r = rng(5);
    // Away from the initial values, where a transformer is the identity on the candidate
    // and most of its gradients are 0.
    let range = model.attention()[0].params_range();
    let noise = randv(&mut r, range.len(), 0.5);
    for (p, e) in model.params_mut()[range].iter_mut().zip(noise) {
        *p += e;
    }
    let hist = randv(&mut r, n * t * d, 1.0);
    let lens: Vec<u32> = (0..n).map(|i| 1 + (i % 3) as u32).collect();
    let emb0 = randv(&mut r, n * 3 * d, 1.0);
    // The model, in blocks: d_emb set through a training step's workspace.
    let mut ws = model.workspace(n);
    let mut emb = emb0.clone();
    model.attend(&hist, &lens, &mut emb, &mut ws).unwrap();
    let dense = vec![0.1; n * 5];
    let labels = vec![1.0; n];
    model
        .forward_backward(&dense, &emb, &labels, &mut ws)
        .unwrap();
    let d_emb_model: Vec<f32> = ws.d_emb().to_vec();
    let mut d_hist = vec![0.0; hist.len()];
    model
        .attend_backward(&hist, &lens, &emb, &mut d_hist, &mut ws)
        .unwrap();
    // One pass of the unit itself, from the same d_emb.
    let unit = &model.attention()[0];
    let mut acts = elastrec_model::AttentionActs::default();
    let mut emb1 = emb0.clone();
    unit.forward(model.params(), &hist, &lens, &mut emb1, 3, &mut acts);
    // GEMMs of another height may sum in another order: equal to float rounding.
    let close = |a: &[f32], b: &[f32], what: &str| {
        assert_eq!(a.len(), b.len(), "{what}");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
                "{what} [{i}]: {x} against {y}"
            );
        }
    };
    close(&emb, &emb1, "pooled slots");
    let mut d_emb1 = d_emb_model.clone();
    let mut grads = vec![0.0; model.num_params()];
    let mut d_hist1 = vec![0.0; hist.len()];
    unit.backward(
        model.params(),
        &mut grads,
        &hist,
        &lens,
        &emb1,
        &mut d_emb1,
        &mut d_hist1,
        3,
        &mut acts,
    );
    close(ws.d_emb(), &d_emb1, "queries' gradients");
    close(&d_hist, &d_hist1, "histories' gradients");
    let range = unit.params_range();
    close(
        &ws.grads()[range.clone()],
        &grads[range],
        "parameter gradients",
    );
}

/// `forward_backward_weighted` of `w` on rows `x`, `e`, labels `y` (task 0) and `ty`
/// (the other tasks'): the loss, the dense gradient and the embedding gradient.
fn weighted_step(
    m: &DenseDlrm,
    (x, e, y, ty): (&[f32], &[f32], &[f32], &[f32]),
    w: &[f32],
) -> (f32, Vec<f32>, Vec<f32>) {
    let mut ws = m.workspace(8);
    let labels = elastrec_model::Labels {
        labels: y,
        task_labels: ty,
        weights: w,
    };
    let loss = m
        .forward_backward_weighted(x, e, labels, Tower::Memory, &mut ws)
        .unwrap();
    (loss, ws.grads().to_vec(), ws.d_emb().to_vec())
}

fn assert_close(what: &str, a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-6 + 1e-4 * x.abs().max(y.abs()),
            "{what}[{i}]: {x} vs {y}"
        );
    }
}

/// A sample weight multiplies its sample's loss in a weighted mean, for one task and for
/// every task of a multi-task head: a weight of 0 is the sample left out of the batch,
/// scaling every weight changes nothing, weights of 1 are the unweighted step, and the
/// gradient is that of `sum(w l)` (finite differences).
#[test]
fn sample_weights_weigh_each_samples_loss_and_zero_leaves_it_out() {
    for config in [
        small(InteractionKind::Dot),
        mmoe_small(InteractionKind::Dot, 0),
    ] {
        let m = DenseDlrm::new(config.clone()).unwrap();
        let (n, width, extra) = (6, 3 * config.row_width(), m.tasks() - 1);
        let mut g = rng(11);
        let x = randv(&mut g, n * 5, 1.0);
        let e = randv(&mut g, n * width, 1.0);
        let y: Vec<f32> = (0..n).map(|i| (i % 2) as f32).collect();
        let ty: Vec<f32> = (0..n * extra).map(|i| ((i / 2) % 2) as f32).collect();
        let w = [2.0, 0.0, 1.0, 3.0, 0.0, 0.5];
        let (loss, grads, d_emb) = weighted_step(&m, (&x, &e, &y, &ty), &w);

        let kept: Vec<usize> = (0..n).filter(|&i| w[i] > 0.0).collect();
        let pick = |v: &[f32], k: usize| -> Vec<f32> {
            kept.iter()
                .flat_map(|&i| v[i * k..(i + 1) * k].to_vec())
                .collect()
        };
        let (x2, e2, y2, ty2, w2) = (
            pick(&x, 5),
            pick(&e, width),
            pick(&y, 1),
            pick(&ty, extra),
            pick(&w, 1),
        );
        let (loss2, grads2, d_emb2) = weighted_step(&m, (&x2, &e2, &y2, &ty2), &w2);
        assert!((loss - loss2).abs() < 1e-5, "{loss} vs {loss2}");
        assert_close("dense gradient without the 0-weight rows", &grads, &grads2);
        assert_close(
            "their rows' embedding gradient",
            &pick(&d_emb, width),
            &d_emb2,
        );
        for i in (0..n).filter(|&i| w[i] == 0.0) {
            assert!(d_emb[i * width..(i + 1) * width].iter().all(|&v| v == 0.0));
        }

        let w10: Vec<f32> = w.iter().map(|v| v * 10.0).collect();
        let (loss10, grads10, _) = weighted_step(&m, (&x, &e, &y, &ty), &w10);
        assert!((loss - loss10).abs() < 1e-5, "{loss} vs {loss10}");
        assert_close("weights times 10", &grads, &grads10);

        let (loss1, grads1, _) = weighted_step(&m, (&x, &e, &y, &ty), &[1.0; 6]);
        let (loss0, grads0, _) = weighted_step(&m, (&x, &e, &y, &ty), &[]);
        assert_eq!(loss1, loss0);
        assert_close("weights of 1", &grads0, &grads1);

        // Finite differences of sum(w l) over every task against sum(w) times the
        // gradient of the weighted mean.
        let total: f32 = w.iter().sum();
        let gp: Vec<f32> = grads.iter().map(|v| v * total).collect();
        let labels: Vec<Vec<f32>> = std::iter::once(y.clone())
            .chain((0..extra).map(|t| ty.iter().skip(t).step_by(extra).copied().collect()))
            .collect();
        let mut mm = m.clone();
        let mut ws = mm.workspace(8);
        let p0 = mm.params().to_vec();
        check_fd("weighted params", &p0, &gp, 2e-3, 1e-3, 2e-2, |p| {
            mm.params_mut().copy_from_slice(p);
            mm.forward(&x, &e, &mut ws).unwrap();
            let loss = weighted_tasks_bce(&mm, &ws, &labels, &w);
            (loss, relu_pattern(&mm, &ws))
        });
    }
}

/// A negative or non-finite weight, or one weight too few, is refused naming the row.
#[test]
fn bad_sample_weights_are_refused() {
    let m = DenseDlrm::new(small(InteractionKind::Dot)).unwrap();
    let mut ws = m.workspace(4);
    let mut g = rng(5);
    let x = randv(&mut g, 2 * 5, 1.0);
    let e = randv(&mut g, 2 * 12, 1.0);
    let step = |w: &[f32], ws: &mut elastrec_model::Workspace| {
        let labels = elastrec_model::Labels {
            labels: &[1.0, 0.0],
            task_labels: &[],
            weights: w,
        };
        m.forward_backward_weighted(&x, &e, labels, Tower::Memory, ws)
    };
    for bad in [-1.0, f32::NAN, f32::INFINITY] {
        match step(&[1.0, bad], &mut ws) {
            Err(ModelError::BadWeight { row: 1, .. }) => {}
            other => panic!("{bad}: {other:?}"),
        }
    }
    assert!(matches!(
        step(&[1.0], &mut ws),
        Err(ModelError::Shape { what, .. }) if what.starts_with("weights")
    ));
    // Weights that sum to 0: nothing to learn from.
    assert_eq!(step(&[0.0, 0.0], &mut ws).unwrap(), 0.0);
    assert!(ws.grads().iter().all(|&v| v == 0.0));
}
