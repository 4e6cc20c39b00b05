use elastrec_embedding::{capped_rows, EmbeddingStore, UpdateScratch, CRITEO_KAGGLE_CARDINALITIES};

use crate::common::{adagrad, batch, config};

/// Trains a few steps in a pool of `threads` threads; returns every row's bits and the last
/// gathered batch.
fn run(threads: usize) -> (Vec<Vec<u32>>, Vec<f32>) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| {
        let (t, d, n) = (26, 8, 512);
        let rows = capped_rows(&CRITEO_KAGGLE_CARDINALITIES, 5000);
        let mut store = EmbeddingStore::new(config(rows, d, adagrad(0.05, 1e-8, 0.0))).unwrap();
        let mut scratch = UpdateScratch::new();
        let mut out = vec![0.0; n * t * d];
        for step in 0..4 {
            let (ids, grads) = batch(step, n, t, d, 100_000);
            store.gather(&ids, &mut out).unwrap();
            store.apply_gradients(&ids, &grads, &mut scratch).unwrap();
        }
        let bits = store
            .tables()
            .iter()
            .map(|tb| tb.data().iter().map(|x| x.to_bits()).collect())
            .collect();
        (bits, out)
    })
}

#[test]
fn results_do_not_depend_on_thread_count() {
    let one = run(1);
    for threads in [2, 3, 8] {
        let other = run(threads);
        assert!(one.0 == other.0, "weights differ with {threads} threads");
        assert_eq!(
            one.1.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            other.1.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }
}
