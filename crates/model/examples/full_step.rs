//! The complete training step of the Criteo-Kaggle DLRM, as the trainer runs it, so it
//! can be compared one to one with `bench/pytorch_dlrm.py --mode full`:
//! embedding gather (elastrec-embedding) → dense forward/backward (this crate) → dense
//! Adagrad → sparse row-wise Adagrad. Random in-memory batches with Zipf(1.2) ids, 25 %
//! positives, 8 distinct batches cycled, Criteo-Kaggle row counts (capped by the first
//! argument, 0 = none). Prints one JSON line with samples/s and a per-phase split.
//!
//! `cargo run --release -p elastrec-model --example full_step -- [max_rows] [steps]`

use std::time::Instant;

use elastrec_embedding::{
    capped_rows, EmbeddingConfig, EmbeddingStore, UpdateScratch, CRITEO_KAGGLE_CARDINALITIES,
};
use elastrec_model::{Adagrad, DenseDlrm, DenseOptimizer, DlrmConfig};
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("number"))
        .collect();
    let cap = args.first().copied().unwrap_or(0);
    let steps = args.get(1).copied().unwrap_or(20) as usize;
    let (warmup, nb, n) = (5usize, 8usize, 2048usize);

    let cfg = DlrmConfig::criteo_kaggle();
    let (t, d, nd) = (cfg.num_tables, cfg.embedding_dim, cfg.num_dense());
    let rows = capped_rows(
        &CRITEO_KAGGLE_CARDINALITIES,
        if cap == 0 { u64::MAX } else { cap },
    );
    let t0 = Instant::now();
    let mut store = EmbeddingStore::new(EmbeddingConfig::with_rows(rows.clone())).expect("store");
    let init_s = t0.elapsed().as_secs_f64();
    let mut model = DenseDlrm::new(cfg).expect("config");
    let mut ws = model.workspace(n);
    let mut opt = Adagrad::new(model.num_params(), 0.01, 0.0, 1e-10);
    let mut scratch = UpdateScratch::new();

    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let zipfs: Vec<Zipf<f64>> = rows
        .iter()
        .map(|&r| Zipf::new(r as f64, 1.2).expect("zipf"))
        .collect();
    let batches: Vec<(Vec<f32>, Vec<u64>, Vec<f32>)> = (0..nb)
        .map(|_| {
            let dense = (0..n * nd)
                .map(|_| {
                    (1.0 - rng.random::<f32>())
                        .ln()
                        .abs()
                        .mul_add(10.0, 1.0)
                        .ln()
                })
                .collect();
            let ids = (0..n * t)
                .map(|i| zipfs[i % t].sample(&mut rng) as u64 - 1)
                .collect();
            let labels = (0..n)
                .map(|_| f32::from(rng.random::<f32>() < 0.25))
                .collect();
            (dense, ids, labels)
        })
        .collect();
    let mut emb = vec![0.0f32; n * t * d];

    let mut phase = [0.0f64; 4];
    let mut loss = 0.0;
    let mut total = 0.0;
    for i in 0..warmup + steps {
        let (dense, ids, labels) = &batches[i % nb];
        let timed = i >= warmup;
        let s0 = Instant::now();
        store.gather(ids, &mut emb).expect("gather");
        let s1 = Instant::now();
        loss = model
            .forward_backward(dense, &emb, labels, &mut ws)
            .expect("step");
        let s2 = Instant::now();
        opt.step(model.params_mut(), ws.grads());
        let s3 = Instant::now();
        store
            .apply_gradients(ids, ws.d_emb(), &mut scratch)
            .expect("apply");
        let s4 = Instant::now();
        if timed {
            for (p, (a, b)) in phase
                .iter_mut()
                .zip([(s0, s1), (s1, s2), (s2, s3), (s3, s4)])
            {
                *p += (b - a).as_secs_f64();
            }
            total += (s4 - s0).as_secs_f64();
        }
    }
    let ms = |v: f64| v * 1e3 / steps as f64;
    println!(
        "{{\"impl\":\"elastrec\",\"mode\":\"full\",\"samples_per_s\":{:.1},\"ms_per_step\":{:.3},\
\"threads\":{},\"batch\":{n},\"steps\":{steps},\"rows_total\":{},\"ms_gather\":{:.3},\
\"ms_dense_fwd_bwd\":{:.3},\"ms_dense_adagrad\":{:.3},\"ms_sparse_update\":{:.3},\
\"store_init_s\":{init_s:.2},\"last_loss\":{loss:.5}}}",
        (steps * n) as f64 / total,
        ms(total),
        rayon::current_num_threads(),
        rows.iter().sum::<u64>(),
        ms(phase[0]),
        ms(phase[1]),
        ms(phase[2]),
        ms(phase[3]),
    );
}
