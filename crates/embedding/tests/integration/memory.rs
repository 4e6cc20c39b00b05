use elastrec_embedding::{
    capped_rows, EmbeddingStore, SparseOptimizerConfig, CRITEO_KAGGLE_CARDINALITIES,
};

use crate::common::{adagrad, config};

#[test]
fn overhead_beyond_raw_rows_is_at_most_ten_percent() {
    let rows = capped_rows(&CRITEO_KAGGLE_CARDINALITIES, 20_000);
    for (d, opt) in [
        (16, adagrad(0.1, 1e-8, 0.0)),
        (4, SparseOptimizerConfig::Sgd { lr: 0.1 }),
    ] {
        let store = EmbeddingStore::new(config(rows.clone(), d, opt)).unwrap();
        let stride = d + opt.state_len(d);
        let raw: u64 = rows.iter().map(|r| r * stride as u64 * 4).sum();
        assert_eq!(store.raw_bytes() as u64, raw);
        let ratio = store.memory_bytes() as f64 / store.raw_bytes() as f64;
        assert!((1.0..=1.10).contains(&ratio), "memory/raw = {ratio}");
    }
}
