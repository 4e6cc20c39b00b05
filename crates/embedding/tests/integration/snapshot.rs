use elastrec_embedding::{
    EmbeddingConfig, EmbeddingError, EmbeddingStore, ShardSpec, TableSnapshot, UpdateScratch,
};

use crate::common::{adagrad, batch, config};

#[test]
fn export_import_round_trips_rows_and_state() {
    let (t, d) = (2, 4);
    let cfg = config(vec![50, 300], d, adagrad(0.1, 1e-8, 0.0));
    let mut store = EmbeddingStore::new(cfg.clone()).unwrap();
    let (ids, grads) = batch(3, 64, t, d, 1000);
    store
        .apply_gradients(&ids, &grads, &mut UpdateScratch::new())
        .unwrap();

    let mut fresh = EmbeddingStore::new(EmbeddingConfig { seed: 12345, ..cfg }).unwrap();
    assert_ne!(
        fresh.table(1).unwrap().data(),
        store.table(1).unwrap().data()
    );
    for tt in 0..t {
        let snap = store.export_table(tt).unwrap();
        assert!(
            snap.values.chunks(d + 1).any(|r| r[d] > 0.0),
            "state is exported"
        );
        let decoded = TableSnapshot::from_bytes(&snap.to_bytes()).unwrap();
        assert_eq!(decoded, snap);
        assert_eq!(decoded.encoded_len(), snap.to_bytes().len());
        fresh.import_table(&decoded).unwrap();
        assert_eq!(
            fresh.table(tt).unwrap().data(),
            store.table(tt).unwrap().data()
        );
    }
}

#[test]
fn partial_export_and_bad_imports() {
    let cfg = config(vec![10], 3, adagrad(0.1, 1e-8, 0.0));
    let store = EmbeddingStore::new(cfg.clone()).unwrap();
    let part = store.table(0).unwrap().export_rows(&[7, 2]).unwrap();
    assert_eq!(part.rows, vec![7, 2]);
    assert_eq!(part.row_values(0), store.table(0).unwrap().row(7).unwrap());

    let mut shard1 = EmbeddingStore::new_shard(cfg.clone(), ShardSpec::new(1, 2).unwrap()).unwrap();
    assert!(matches!(
        shard1.import_table(&part),
        Err(EmbeddingError::WrongShard { row: 2, .. })
    ));
    let mut sgd = EmbeddingStore::new(config(
        vec![10],
        3,
        elastrec_embedding::SparseOptimizerConfig::Sgd { lr: 0.1 },
    ))
    .unwrap();
    assert!(matches!(
        sgd.import_table(&part),
        Err(EmbeddingError::SnapshotMismatch { .. })
    ));

    let bytes = part.to_bytes();
    // With usage (version 2), a body without it is short; a hashed table's snapshot is
    // version 1, as older binaries wrote.
    assert_eq!(u32::from_le_bytes(bytes[4..8].try_into().unwrap()), 1);
    let with_usage = TableSnapshot {
        usage: vec![elastrec_embedding::RowUsage { idle: 3, hits: 9 }; 2],
        ..part.clone()
    }
    .to_bytes();
    assert_eq!(u32::from_le_bytes(with_usage[4..8].try_into().unwrap()), 2);
    assert_eq!(
        TableSnapshot::from_bytes(&with_usage).unwrap().usage[1].hits,
        9
    );
    let mut v2_without_usage = bytes.clone();
    v2_without_usage[4] = 2;
    for bad in [
        &bytes[..bytes.len() - 1],
        &bytes[..10],
        &[b'X'; 40][..],
        &v2_without_usage,
        &with_usage[..with_usage.len() - 8],
    ] {
        assert!(matches!(
            TableSnapshot::from_bytes(bad),
            Err(EmbeddingError::CorruptSnapshot { .. })
        ));
    }
}
