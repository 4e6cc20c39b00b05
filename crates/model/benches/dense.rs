//! Dense DLRM step benchmarks (Criteo-Kaggle shape, batch 2048) and the SGEMM peak of the
//! same GEMM library with the same threads, so "X % of measured GEMM peak" can be stated.
//!
//! `cargo bench -p elastrec-model --bench dense`
//!
//! Throughput: `dense_step/*` in samples (elements = samples); `sgemm_peak/*` and
//! `dense_step_flops/*` in FLOPs (elements = FLOPs, so "Gelem/s" reads as GFLOP/s).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use elastrec_model::{Adagrad, DenseDlrm, DenseOptimizer, DlrmConfig, InteractionKind};

const BATCH: usize = 2048;

fn lcg_vec(len: usize, seed: u64, scale: f32, shift: f32) -> Vec<f32> {
    let mut s = seed;
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - shift) * scale
        })
        .collect()
}

struct Setup {
    model: DenseDlrm,
    dense: Vec<f32>,
    emb: Vec<f32>,
    labels: Vec<f32>,
}

fn setup(interaction: InteractionKind) -> Setup {
    let cfg = DlrmConfig {
        interaction,
        ..DlrmConfig::criteo_kaggle()
    };
    let (t, d, nd) = (cfg.num_tables, cfg.embedding_dim, cfg.num_dense());
    let model = DenseDlrm::new(cfg).expect("valid config");
    Setup {
        model,
        dense: lcg_vec(BATCH * nd, 1, 3.0, 0.0),
        emb: lcg_vec(BATCH * t * d, 2, 0.2, 0.5),
        labels: lcg_vec(BATCH, 3, 1.0, 0.0)
            .iter()
            .map(|&v| f32::from(v < 0.25))
            .collect(),
    }
}

fn dense_step(c: &mut Criterion) {
    let mut g = c.benchmark_group("dense_step");
    g.throughput(Throughput::Elements(BATCH as u64));
    g.sample_size(20);
    for (name, kind) in [
        ("dot", InteractionKind::Dot),
        ("concat", InteractionKind::Concat),
    ] {
        let mut s = setup(kind);
        let mut ws = s.model.workspace(BATCH);
        let mut opt = Adagrad::new(s.model.num_params(), 0.01, 0.0, 1e-10);
        g.bench_function(BenchmarkId::new("fwd_bwd_adagrad_b2048", name), |b| {
            b.iter(|| {
                let loss = s
                    .model
                    .forward_backward(&s.dense, &s.emb, &s.labels, &mut ws)
                    .unwrap();
                opt.step(s.model.params_mut(), ws.grads());
                loss
            })
        });
    }
    let s = setup(InteractionKind::Dot);
    let mut ws = s.model.workspace(BATCH);
    g.bench_function("forward_b2048/dot", |b| {
        b.iter(|| s.model.forward(&s.dense, &s.emb, &mut ws).unwrap()[0])
    });
    g.finish();

    // Same step, FLOP throughput (analytic count, see DenseDlrm::flops_per_sample).
    let mut g = c.benchmark_group("dense_step_flops");
    let mut s = setup(InteractionKind::Dot);
    let flops = s.model.flops_per_sample().total() * BATCH as u64;
    g.throughput(Throughput::Elements(flops));
    g.sample_size(20);
    let mut ws = s.model.workspace(BATCH);
    let mut opt = Adagrad::new(s.model.num_params(), 0.01, 0.0, 1e-10);
    g.bench_function("fwd_bwd_adagrad_b2048/dot", |b| {
        b.iter(|| {
            let loss = s
                .model
                .forward_backward(&s.dense, &s.emb, &s.labels, &mut ws)
                .unwrap();
            opt.step(s.model.params_mut(), ws.grads());
            loss
        })
    });
    g.finish();
}

fn sgemm_peak(c: &mut Criterion) {
    let mut g = c.benchmark_group("sgemm_peak");
    g.sample_size(10);
    for n in [1024usize, 2048] {
        let a = lcg_vec(n * n, 4, 1.0, 0.5);
        let b = lcg_vec(n * n, 5, 1.0, 0.5);
        let mut out = vec![0.0f32; n * n];
        g.throughput(Throughput::Elements(2 * (n * n * n) as u64));
        g.bench_function(BenchmarkId::new("square", n), |bch| {
            bch.iter(|| {
                elastrec_model::gemm::matmul(&a, &b, &mut out, n, n, n);
                out[0]
            })
        });
    }
    g.finish();
}

criterion_group!(benches, dense_step, sgemm_peak);
criterion_main!(benches);
