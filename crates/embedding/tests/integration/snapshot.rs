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
    // With a dynamic table's clock and filter (version 3): the filter's length is read from
    // the bytes, so it must be exactly what follows.
    let with_state = TableSnapshot {
        dynamic: Some(elastrec_embedding::DynamicState {
            clock: 41,
            filter_adds: 5,
            filter: vec![0, 2, 1, 0],
        }),
        ..part.clone()
    }
    .to_bytes();
    assert_eq!(u32::from_le_bytes(with_state[4..8].try_into().unwrap()), 3);
    let read = TableSnapshot::from_bytes(&with_state).unwrap();
    assert_eq!(read.dynamic.as_ref().unwrap().filter, [0, 2, 1, 0]);
    assert_eq!(
        (read.dynamic.as_ref().unwrap().clock, read.usage.len()),
        (41, 2)
    );
    let mut lying_filter_len = with_state.clone();
    let at = lying_filter_len.len() - 4 - 8;
    lying_filter_len[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    let mut v3_without_state = with_usage.clone();
    v3_without_state[4] = 3;
    for bad in [
        &bytes[..bytes.len() - 1],
        &bytes[..10],
        &[b'X'; 40][..],
        &v2_without_usage,
        &with_usage[..with_usage.len() - 8],
        &with_state[..with_state.len() - 1],
        &lying_filter_len,
        &v3_without_state,
    ] {
        assert!(matches!(
            TableSnapshot::from_bytes(bad),
            Err(EmbeddingError::CorruptSnapshot { .. })
        ));
    }
}
