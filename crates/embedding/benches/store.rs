//! Gather and sparse-update throughput on a Criteo-Kaggle-like model:
//! batch 2048 x 26 tables x dim 16, Zipf-distributed raw ids, row-wise Adagrad.
//!
//! `cargo bench -p elastrec-embedding --bench store`; `ELASTREC_BENCH_ROW_CAP` caps rows per
//! table (default 1,000,000), `ELASTREC_BENCH_ZIPF` sets the Zipf exponent (default 1.05).
//! Throughput is in lookups (gather) or per-sample row updates (apply), i.e. `n * T`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use elastrec_embedding::{
    capped_rows, EmbeddingConfig, EmbeddingStore, SparseOptimizerConfig, UpdateScratch,
    CRITEO_KAGGLE_CARDINALITIES,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};

const BATCH: usize = 2048;
const DIM: usize = 16;
const BATCHES: usize = 16;

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `BATCHES` batches of Zipf ids: each table's raw vocabulary is its Kaggle cardinality; the
/// Zipf rank is scrambled into a raw id so hot ids are not the small integers.
fn batches(exponent: f64) -> Vec<Vec<u64>> {
    let mut rng = StdRng::seed_from_u64(42);
    let zipfs: Vec<Zipf<f64>> = CRITEO_KAGGLE_CARDINALITIES
        .iter()
        .map(|&c| Zipf::new(c as f64, exponent).unwrap())
        .collect();
    (0..BATCHES)
        .map(|_| {
            (0..BATCH * zipfs.len())
                .map(|i| {
                    let rank = zipfs[i % zipfs.len()].sample(&mut rng) as u64;
                    rank.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32
                })
                .collect()
        })
        .collect()
}

fn bench_store(c: &mut Criterion) {
    let cap = env_or("ELASTREC_BENCH_ROW_CAP", 1_000_000u64);
    let exponent = env_or("ELASTREC_BENCH_ZIPF", 1.05f64);
    let rows = capped_rows(&CRITEO_KAGGLE_CARDINALITIES, cap);
    let tables = rows.len();
    let config = EmbeddingConfig {
        dim: DIM,
        rows,
        optimizer: SparseOptimizerConfig::RowWiseAdagrad {
            lr: 0.01,
            eps: 1e-8,
            initial_accumulator: 0.0,
        },
        seed: 1,
        dynamic: None,
    };
    let mut store = EmbeddingStore::new(config).unwrap();
    let id_batches = batches(exponent);
    let row_batches: Vec<Vec<u64>> = id_batches
        .iter()
        .map(|ids| {
            let mut rows = vec![0; ids.len()];
            store.ids_to_rows(ids, &mut rows).unwrap();
            rows
        })
        .collect();
    let mut rng = StdRng::seed_from_u64(7);
    let grads: Vec<f32> = (0..BATCH * tables * DIM)
        .map(|_| rng.random_range(-0.01f32..0.01))
        .collect();
    let mut out = vec![0.0f32; BATCH * tables * DIM];
    let mut scratch = UpdateScratch::new();

    let mut g = c.benchmark_group(format!(
        "store_b{BATCH}_t{tables}_d{DIM}_cap{cap}_zipf{exponent}"
    ));
    g.throughput(Throughput::Elements((BATCH * tables) as u64));
    let mut i = 0;
    g.bench_function("gather_ids", |b| {
        b.iter(|| {
            i = (i + 1) % BATCHES;
            store.gather(black_box(&id_batches[i]), &mut out).unwrap();
        })
    });
    g.bench_function("gather_rows", |b| {
        b.iter(|| {
            i = (i + 1) % BATCHES;
            store
                .gather_rows(black_box(&row_batches[i]), &mut out)
                .unwrap();
        })
    });
    g.bench_function("ids_to_rows", |b| {
        let mut rows = vec![0u64; BATCH * tables];
        b.iter(|| {
            i = (i + 1) % BATCHES;
            store
                .ids_to_rows(black_box(&id_batches[i]), &mut rows)
                .unwrap();
        })
    });
    g.bench_function("apply_gradients_ids", |b| {
        b.iter(|| {
            i = (i + 1) % BATCHES;
            store
                .apply_gradients(black_box(&id_batches[i]), &grads, &mut scratch)
                .unwrap();
        })
    });
    g.bench_function("apply_gradients_rows", |b| {
        b.iter(|| {
            i = (i + 1) % BATCHES;
            store
                .apply_gradients_rows(black_box(&row_batches[i]), &grads, &mut scratch)
                .unwrap();
        })
    });
    g.finish();
}

criterion_group!(benches, bench_store);
criterion_main!(benches);
