use elastrec_embedding::{row_of, EmbeddingConfig, EmbeddingError, EmbeddingStore, ShardSpec};

use crate::common::batch;

const MISSING_CATEGORY: u64 = 1 << 32;

fn store() -> EmbeddingStore {
    let mut cfg = EmbeddingConfig::with_rows(vec![7, 1000, 50_000, 3]);
    cfg.dim = 8;
    EmbeddingStore::new(cfg).unwrap()
}

#[test]
fn gather_copies_the_hashed_rows() {
    let store = store();
    let (t, d, n) = (4, 8, 300);
    let (mut ids, _) = batch(1, n, t, d, 1 << 40);
    ids[5] = MISSING_CATEGORY;
    let mut out = vec![f32::NAN; n * t * d];
    store.gather(&ids, &mut out).unwrap();
    for s in 0..n {
        for tt in 0..t {
            let row = row_of(tt, ids[s * t + tt], store.config().rows[tt]);
            let want = store.table(tt).unwrap().weights(row).unwrap();
            assert_eq!(&out[(s * t + tt) * d..(s * t + tt + 1) * d], want);
            assert!(want
                .iter()
                .all(|w| w.abs() <= 1.0 / (store.config().rows[tt] as f32).sqrt()));
        }
    }
    // The precomputed-rows path agrees.
    let mut rows = vec![0u64; ids.len()];
    store.ids_to_rows(&ids, &mut rows).unwrap();
    let mut out2 = vec![0.0; out.len()];
    store.gather_rows(&rows, &mut out2).unwrap();
    assert_eq!(out, out2);
}

#[test]
fn distinct_rows_hold_distinct_values() {
    let store = store();
    let table = store.table(2).unwrap();
    assert_ne!(table.weights(0).unwrap(), table.weights(1).unwrap());
    assert_ne!(
        store.table(1).unwrap().weights(0).unwrap(),
        table.weights(0).unwrap()
    );
}

#[test]
fn bad_shapes_and_foreign_rows_are_errors() {
    let store = store();
    let mut out = vec![0.0; 8 * 4];
    assert!(matches!(
        store.gather(&[1, 2, 3], &mut out),
        Err(EmbeddingError::Shape { .. })
    ));
    assert!(matches!(
        store.gather(&[1, 2, 3, 4], &mut out[..8]),
        Err(EmbeddingError::Shape { .. })
    ));
    assert_eq!(
        store.gather_rows(&[0, 0, 0, 3], &mut out).unwrap_err(),
        EmbeddingError::RowOutOfRange {
            table: 3,
            row: 3,
            rows: 3
        }
    );
    let cfg = store.config().clone();
    let shard = EmbeddingStore::new_shard(cfg, ShardSpec::new(1, 2).unwrap()).unwrap();
    // Table 0: shard 1 of 2 owns odd rows.
    assert!(matches!(
        shard.gather_rows(&[2, 0, 1, 1], &mut out),
        Err(EmbeddingError::WrongShard {
            table: 0,
            row: 2,
            owner: 0,
            shard: 1
        })
    ));
}
