//! Dynamic tables: a collision-free key map under a memory budget, with admission and
//! eviction, checked against a per-key reference and against the hashed table's bytes.

use std::collections::BTreeMap;

use elastrec_embedding::{
    init_bound, init_row, row_of, DynamicConfig, EmbeddingConfig, EmbeddingError, EmbeddingStore,
    Eviction, ShardSpec, SparseOptimizerConfig, TableSnapshot, UpdateScratch, DYNAMIC_KEY_SPACE,
};

use crate::common::batch;

const SEED: u64 = 11;

fn dynamic_config(rows: Vec<u64>, dim: usize, dynamic: DynamicConfig) -> EmbeddingConfig {
    EmbeddingConfig {
        dim,
        rows,
        optimizer: SparseOptimizerConfig::Sgd { lr: 0.1 },
        seed: SEED,
        dynamic: Some(dynamic),
    }
}

/// The gathered weights of raw ids `ids` (one table).
fn gather(store: &EmbeddingStore, ids: &[u64]) -> Vec<f32> {
    let mut out = vec![0.0; ids.len() * store.dim()];
    store.gather(ids, &mut out).unwrap();
    out
}

/// One SGD update of table 0 (one-table store) with gradient `g` for every sample of `ids`.
fn update(store: &mut EmbeddingStore, ids: &[u64], g: f32) {
    let grads = vec![g; ids.len() * store.dim()];
    store
        .apply_gradients(ids, &grads, &mut UpdateScratch::new())
        .unwrap();
}

fn initial(store: &EmbeddingStore, budget: u64, id: u64) -> Vec<f32> {
    let mut w = vec![0.0; store.dim()];
    init_row(
        SEED,
        0,
        row_of(0, id, DYNAMIC_KEY_SPACE),
        init_bound(budget),
        &mut w,
    );
    w
}

/// With room for every id, a dynamic table is a hashed table without collisions: every
/// key starts at its seeded value and takes exactly its own summed gradients, bit for bit.
#[test]
fn with_room_for_every_id_each_key_trains_alone() {
    let (t, d, n) = (3, 4, 256);
    let budget = vec![100_000u64; t];
    let mut store =
        EmbeddingStore::new(dynamic_config(budget, d, DynamicConfig::default())).unwrap();
    let lr = 0.1f32;
    // key -> weights, initialized lazily from the formula.
    let mut reference: BTreeMap<(usize, u64), Vec<f32>> = BTreeMap::new();
    let mut scratch = UpdateScratch::new();
    for step in 0..5 {
        let (ids, grads) = batch(step, n, t, d, 3000);
        let got = {
            let mut out = vec![0.0; n * t * d];
            store.gather(&ids, &mut out).unwrap();
            out
        };
        for (i, &id) in ids.iter().enumerate() {
            let table = i % t;
            let key = row_of(table, id, DYNAMIC_KEY_SPACE);
            let want = reference.get(&(table, key)).cloned().unwrap_or_else(|| {
                let mut w = vec![0.0; d];
                init_row(SEED, table, key, init_bound(100_000), &mut w);
                w
            });
            assert_eq!(
                &got[i * d..(i + 1) * d],
                &want[..],
                "step {step} sample {i}"
            );
        }
        store.apply_gradients(&ids, &grads, &mut scratch).unwrap();
        for table in 0..t {
            let mut sums: BTreeMap<u64, Vec<f32>> = BTreeMap::new();
            for s in 0..n {
                let i = s * t + table;
                let key = row_of(table, ids[i], DYNAMIC_KEY_SPACE);
                let acc = sums.entry(key).or_insert_with(|| vec![0.0; d]);
                let g = &grads[i * d..(i + 1) * d];
                for j in 0..d {
                    acc[j] += g[j];
                }
            }
            for (key, g) in sums {
                let w = reference.entry((table, key)).or_insert_with(|| {
                    let mut w = vec![0.0; d];
                    init_row(SEED, table, key, init_bound(100_000), &mut w);
                    w
                });
                for j in 0..d {
                    w[j] -= lr * g[j];
                }
            }
        }
    }
    // Every key seen has a row; nothing was evicted.
    let stored: usize = store.tables().iter().map(|tb| tb.local_rows()).sum();
    assert_eq!(stored, reference.len());
    let stats = store.table(0).unwrap().dynamic_stats().unwrap();
    assert_eq!((stats.evicted, stats.filtered), (0, 0));
}

#[test]
fn an_id_gets_a_row_only_after_admit_count_updates() {
    let cfg = DynamicConfig {
        admit_count: 3,
        ..DynamicConfig::default()
    };
    let mut store = EmbeddingStore::new(dynamic_config(vec![10_000], 2, cfg)).unwrap();
    let init = initial(&store, 10_000, 77);
    for _ in 0..2 {
        update(&mut store, &[77], 1.0);
        // The gradient was dropped: the id still reads as its initial value.
        assert_eq!(gather(&store, &[77]), init);
    }
    assert_eq!(store.table(0).unwrap().local_rows(), 0);
    update(&mut store, &[77], 1.0);
    let got = gather(&store, &[77]);
    assert_eq!(got, init.iter().map(|w| w - 0.1).collect::<Vec<_>>());
    let stats = store.table(0).unwrap().dynamic_stats().unwrap();
    assert_eq!((stats.admitted, stats.filtered), (1, 2));
}

/// Budget of 64 rows (the floor): 64 slots.
fn small_table(eviction: Eviction, ttl_steps: u32) -> EmbeddingStore {
    let cfg = DynamicConfig {
        eviction,
        ttl_steps,
        ..DynamicConfig::default()
    };
    let store = EmbeddingStore::new(dynamic_config(vec![64], 2, cfg)).unwrap();
    assert_eq!(store.table(0).unwrap().row_capacity(), 64);
    store
}

fn stored(store: &EmbeddingStore, id: u64) -> bool {
    store
        .table(0)
        .unwrap()
        .row(row_of(0, id, DYNAMIC_KEY_SPACE))
        .is_ok()
}

#[test]
fn lru_evicts_the_rows_updated_longest_ago() {
    let mut store = small_table(Eviction::Lru, 0);
    for id in 0..64 {
        update(&mut store, &[id], 1.0);
    }
    assert_eq!(store.table(0).unwrap().local_rows(), 64);
    // Ids 0..8 are used again: the least recently used are now 8, 9, ...
    update(&mut store, &(0..8).collect::<Vec<_>>(), 1.0);
    update(&mut store, &[1000], 1.0);
    let table = store.table(0).unwrap();
    assert!(table.local_rows() <= 64);
    assert!(stored(&store, 1000), "the new id was admitted");
    assert!(
        (0..8).all(|id| stored(&store, id)),
        "recently used rows stay"
    );
    assert!(!stored(&store, 8), "the least recently used row went");
    // An evicted id reads as its initial value again.
    assert_eq!(gather(&store, &[8]), initial(&store, 64, 8));
    let stats = store.table(0).unwrap().dynamic_stats().unwrap();
    assert!(stats.evicted >= 1 && stats.evicted <= 3, "{stats:?}");
}

#[test]
fn lfu_keeps_the_rows_updated_most_often() {
    let mut store = small_table(Eviction::Lfu, 0);
    for id in 0..64 {
        // Id i is updated by (i % 4) + 1 samples.
        update(&mut store, &vec![id; (id % 4 + 1) as usize], 1.0);
    }
    update(&mut store, &[5000, 5001], 1.0);
    assert!(stored(&store, 5000) && stored(&store, 5001));
    // The victims had the fewest updates (one), and the oldest of them went first.
    assert!(!stored(&store, 0) && !stored(&store, 4));
    assert!((0..64)
        .filter(|id| id % 4 == 3)
        .all(|id| stored(&store, id)));
}

#[test]
fn rows_of_the_current_batch_are_never_evicted() {
    let mut store = small_table(Eviction::Lru, 0);
    // 100 distinct ids in one batch into 64 slots: 64 get rows, none evicted for another.
    let ids: Vec<u64> = (0..100).collect();
    update(&mut store, &ids, 1.0);
    let table = store.table(0).unwrap();
    assert_eq!(table.local_rows(), 64);
    let stats = table.dynamic_stats().unwrap();
    assert_eq!((stats.admitted, stats.evicted, stats.filtered), (64, 0, 36));
}

#[test]
fn ttl_drops_rows_not_updated_in_time() {
    let mut store = small_table(Eviction::Lru, 8);
    update(&mut store, &[1, 2], 1.0);
    for _ in 0..12 {
        update(&mut store, &[2], 1.0);
    }
    assert!(!stored(&store, 1), "id 1 was idle for more than 8 updates");
    assert!(stored(&store, 2));
    assert!(store.table(0).unwrap().dynamic_stats().unwrap().expired >= 1);
}

#[test]
fn a_checkpoint_restores_onto_another_shard_count() {
    let d = 3;
    let cfg = dynamic_config(vec![5000, 5000], d, DynamicConfig::default());
    let mut store = EmbeddingStore::new(cfg.clone()).unwrap();
    let mut scratch = UpdateScratch::new();
    for step in 0..3 {
        let (ids, grads) = batch(step, 128, 2, d, 2000);
        store.apply_gradients(&ids, &grads, &mut scratch).unwrap();
    }
    let (probe, _) = batch(99, 256, 2, d, 2500);
    let before = {
        let mut out = vec![0.0; probe.len() * d];
        store.gather(&probe, &mut out).unwrap();
        out
    };
    // Encode, decode, route onto three shards, import, and gather through them.
    let mut shards: Vec<EmbeddingStore> = (0..3)
        .map(|i| EmbeddingStore::new_shard(cfg.clone(), ShardSpec::new(i, 3).unwrap()).unwrap())
        .collect();
    for t in 0..2 {
        let snap = store.export_table(t).unwrap();
        let decoded = TableSnapshot::from_bytes(&snap.to_bytes()).unwrap();
        assert_eq!(decoded, snap);
        for (i, part) in decoded.route(3).into_iter().enumerate() {
            shards[i].import_table(&part).unwrap();
        }
    }
    let mut keys = vec![0u64; probe.len()];
    store.ids_to_rows(&probe, &mut keys).unwrap();
    for (i, &key) in keys.iter().enumerate() {
        let t = i % 2;
        let owner = elastrec_embedding::shard_of(t, key, 3) as usize;
        let mut w = vec![0.0; d];
        shards[owner]
            .table(t)
            .unwrap()
            .read_weights(key, &mut w)
            .unwrap();
        assert_eq!(&w[..], &before[i * d..(i + 1) * d], "sample {i}");
        // Any other shard refuses the key.
        let other = (owner + 1) % 3;
        let err = shards[other].table(t).unwrap().read_weights(key, &mut w);
        assert!(
            matches!(err, Err(EmbeddingError::WrongShard { .. })),
            "{err:?}"
        );
    }
}

/// A snapshot carries each row's usage, so a table restored from it evicts the rows the
/// saved one would have (LRU: the least recently updated; LFU: the least often), instead
/// of taking every restored row for fresh. Routed onto shards and concatenated back, the
/// usage stays with its row.
#[test]
fn a_restored_table_evicts_what_the_saved_one_would() {
    for eviction in [Eviction::Lru, Eviction::Lfu] {
        let mut saved = small_table(eviction, 0);
        // Admitted in id order (the slots' order), then updated in the reverse order: the
        // least recently used is id 63, not slot 0. LFU: even ids are updated more often.
        for id in 0..64 {
            update(&mut saved, &[id], 1.0);
        }
        for id in (0..64).rev() {
            let times = if eviction == Eviction::Lfu && id % 2 == 0 {
                3
            } else {
                1
            };
            update(&mut saved, &vec![id; times], 1.0);
        }
        let snap = saved.export_table(0).unwrap();
        assert_eq!(snap.usage.len(), 64, "{eviction:?}");
        let bytes = snap.to_bytes();
        assert_eq!(bytes.len(), snap.encoded_len());
        let decoded = TableSnapshot::from_bytes(&bytes).unwrap();
        assert_eq!(decoded, snap);
        let parts = decoded.route(2);
        assert_eq!(TableSnapshot::concat(&parts).unwrap().usage.len(), 64);
        let mut restored = small_table(eviction, 0);
        restored.import_table(&decoded).unwrap();
        // Without the usage (an older snapshot), the same rows restored look alike.
        let mut blind = small_table(eviction, 0);
        blind
            .import_table(&TableSnapshot {
                usage: Vec::new(),
                ..snap.clone()
            })
            .unwrap();
        let kept = |store: &mut EmbeddingStore| {
            update(store, &[5000, 5001, 5002, 5003], 1.0);
            (0..64)
                .filter(|&id| stored(store, id))
                .collect::<Vec<u64>>()
        };
        let expected = kept(&mut saved);
        assert!(expected.len() < 64, "{eviction:?}: nothing was evicted");
        assert_eq!(kept(&mut restored), expected, "{eviction:?}");
        assert_ne!(
            kept(&mut blind),
            expected,
            "{eviction:?}: usage made no difference"
        );
    }
}

/// What a checkpoint saves of table 0: every row, with the shard's clock and filter.
fn checkpoint_of(store: &EmbeddingStore) -> TableSnapshot {
    let t = store.table(0).unwrap();
    t.export().with_dynamic(t.dynamic_state())
}

/// A checkpoint carries the admission filter: ids counted toward admission before the
/// save are admitted after a restore when they reach `admit_count`, as they would have been
/// without the failure. Without it (a snapshot of rows alone, or a new layout) they start
/// counting again.
#[test]
fn a_restored_table_admits_the_ids_the_saved_one_had_counted() {
    let cfg = DynamicConfig {
        admit_count: 3,
        ..DynamicConfig::default()
    };
    let ids: Vec<u64> = (100..110).collect();
    let mut saved = EmbeddingStore::new(dynamic_config(vec![10_000], 2, cfg)).unwrap();
    update(&mut saved, &[1], 1.0);
    update(&mut saved, &[1], 1.0);
    update(&mut saved, &[1], 1.0);
    for _ in 0..2 {
        update(&mut saved, &ids, 1.0);
    }
    // Only id 1 has a row; the others are counted, twice each.
    assert_eq!(saved.table(0).unwrap().local_rows(), 1);
    let snap = checkpoint_of(&saved);
    let bytes = snap.to_bytes();
    assert_eq!(bytes.len(), snap.encoded_len());
    let decoded = TableSnapshot::from_bytes(&bytes).unwrap();
    assert_eq!(decoded, snap);
    let filter = decoded.dynamic.as_ref().unwrap();
    assert!(filter.filter.iter().any(|&c| c > 0));
    let restore = |snap: &TableSnapshot| {
        let mut s = EmbeddingStore::new(dynamic_config(vec![10_000], 2, cfg)).unwrap();
        s.import_table(snap).unwrap();
        s
    };
    let mut restored = restore(&decoded);
    let mut rows_only = restore(&TableSnapshot {
        dynamic: None,
        ..decoded.clone()
    });
    // Routed onto another layout, the filter cannot follow its keys: only the clock does.
    let routed = decoded.route(2);
    let part = routed.iter().find(|p| !p.is_empty()).unwrap();
    assert_eq!(part.dynamic.as_ref().unwrap().clock, filter.clock);
    assert!(part.dynamic.as_ref().unwrap().filter.is_empty());
    for s in [&mut saved, &mut restored, &mut rows_only] {
        update(s, &ids, 1.0);
    }
    let admitted = |s: &EmbeddingStore| s.table(0).unwrap().local_rows();
    assert_eq!(admitted(&saved), 11);
    assert_eq!(admitted(&restored), 11);
    assert_eq!(gather(&restored, &ids), gather(&saved, &ids));
    assert_eq!(admitted(&rows_only), 1, "the filter made no difference");
}

/// A chain of a full checkpoint and a delta restores every row's idle time as the saved
/// table had it when the delta was taken: rows saved only by the full checkpoint age by
/// the updates between the two (the saved clock), instead of looking as recent as they
/// were at the full checkpoint.
#[test]
fn a_restored_chain_ages_the_rows_of_its_full_checkpoint() {
    let mut saved = small_table(Eviction::Lru, 0);
    for id in 0..64 {
        update(&mut saved, &[id], 1.0);
    }
    let full = checkpoint_of(&saved);
    // Ten updates of ids 0..8 only; the delta saves those rows.
    for _ in 0..10 {
        update(&mut saved, &(0..8).collect::<Vec<u64>>(), 1.0);
    }
    let keys: Vec<u64> = (0..8).map(|id| row_of(0, id, DYNAMIC_KEY_SPACE)).collect();
    let t = saved.table(0).unwrap();
    let delta = t
        .export_rows(&keys)
        .unwrap()
        .with_dynamic(t.dynamic_state());
    let usage = |s: &EmbeddingStore, id: u64| {
        let t = s.table(0).unwrap();
        t.usage_of(t.local_of(row_of(0, id, DYNAMIC_KEY_SPACE)).unwrap())
            .unwrap()
    };
    let chain = |full: &TableSnapshot, delta: &TableSnapshot| {
        let mut s = small_table(Eviction::Lru, 0);
        s.import_table(full).unwrap();
        s.import_table(delta).unwrap();
        s
    };
    let restored = chain(&full, &delta);
    for id in 0..64 {
        assert_eq!(usage(&restored, id), usage(&saved, id), "id {id}");
    }
    // Without the clocks, the rows of the full checkpoint look ten updates fresher.
    let unclocked = chain(
        &TableSnapshot {
            dynamic: None,
            ..full.clone()
        },
        &TableSnapshot {
            dynamic: None,
            ..delta.clone()
        },
    );
    assert_eq!(usage(&unclocked, 40).idle + 10, usage(&saved, 40).idle);
}

/// A delta checkpoint exports rows chosen earlier (SSU records keys as they are
/// updated): a key evicted since is left out, not an error; another shard's key still is.
#[test]
fn exporting_chosen_rows_leaves_out_the_evicted_ones() {
    let mut store = small_table(Eviction::Lru, 0);
    for id in 0..64 {
        update(&mut store, &[id], 1.0);
    }
    update(&mut store, &[1000], 1.0);
    let key = |id: u64| row_of(0, id, DYNAMIC_KEY_SPACE);
    assert!(!stored(&store, 0), "id 0 was evicted");
    let table = store.table(0).unwrap();
    let snap = table.export_rows(&[key(0), key(63), key(1000)]).unwrap();
    assert_eq!(snap.rows, vec![key(63), key(1000)]);
    assert_eq!(snap.row_values(1), table.row(key(1000)).unwrap());
    let shards: Vec<EmbeddingStore> = (0..2)
        .map(|i| {
            let cfg = store.config().clone();
            EmbeddingStore::new_shard(cfg, ShardSpec::new(i, 2).unwrap()).unwrap()
        })
        .collect();
    let other = 1 - elastrec_embedding::shard_of(0, key(5), 2) as usize;
    let err = shards[other].table(0).unwrap().export_rows(&[key(5)]);
    assert!(
        matches!(err, Err(EmbeddingError::WrongShard { .. })),
        "{err:?}"
    );
}

#[test]
fn access_counters_follow_their_rows_through_evictions() {
    let mut store = small_table(Eviction::Lru, 0);
    store.enable_access_counters();
    for id in 0..64 {
        update(&mut store, &[id; 2], 1.0);
    }
    update(&mut store, &[100, 101, 102], 1.0);
    let table = store.table(0).unwrap();
    let counts = table.access_counts().unwrap();
    assert_eq!(counts.len(), table.local_rows());
    for (slot, &c) in counts.iter().enumerate() {
        let key = table.global_of(slot);
        let new = [100u64, 101, 102].map(|id| row_of(0, id, DYNAMIC_KEY_SPACE));
        assert_eq!(c, if new.contains(&key) { 1 } else { 2 }, "slot {slot}");
    }
}

#[test]
fn a_full_dynamic_table_fits_in_the_hashed_tables_bytes() {
    let (rows, d) = (20_000u64, 16);
    let hashed = EmbeddingStore::new(EmbeddingConfig {
        dim: d,
        rows: vec![rows],
        optimizer: SparseOptimizerConfig::default(),
        seed: SEED,
        dynamic: None,
    })
    .unwrap();
    let mut dynamic = EmbeddingStore::new(EmbeddingConfig {
        dynamic: Some(DynamicConfig::default()),
        ..hashed.config().clone()
    })
    .unwrap();
    let grads = vec![0.01; 1000 * d];
    for chunk in 0..40u64 {
        let ids: Vec<u64> = (chunk * 1000..(chunk + 1) * 1000).collect();
        dynamic
            .apply_gradients(&ids, &grads, &mut UpdateScratch::new())
            .unwrap();
    }
    let table = dynamic.table(0).unwrap();
    // It filled up: the pass that made room freed 1/32 of the slots beyond the need.
    assert!(table.dynamic_stats().unwrap().evicted > 0);
    assert!(table.local_rows() >= table.row_capacity() - table.row_capacity() / 32 - 1000);
    assert!(
        dynamic.memory_bytes() <= hashed.memory_bytes(),
        "dynamic {} bytes > hashed {}",
        dynamic.memory_bytes(),
        hashed.memory_bytes()
    );
    assert!(table.row_capacity() as u64 > rows / 2);
}

/// `local_of` of a dynamic table is a key's slot (what `global_of` maps back), and a key
/// without one is not stored, never a hashed table's `row / shards`.
#[test]
fn local_of_a_dynamic_key_is_its_slot() {
    let mut store = small_table(Eviction::Lru, 0);
    update(&mut store, &[7, 8, 9], 1.0);
    let table = store.table(0).unwrap();
    for id in [7, 8, 9] {
        let key = row_of(0, id, DYNAMIC_KEY_SPACE);
        assert_eq!(table.global_of(table.local_of(key).unwrap()), key);
    }
    let absent = table.local_of(row_of(0, 10, DYNAMIC_KEY_SPACE));
    assert!(
        matches!(absent, Err(EmbeddingError::NotStored { .. })),
        "{absent:?}"
    );
}

/// A served model following its trainer drops the keys the trainer evicted: the others
/// keep their values, an absent key is skipped, and a hashed table refuses.
#[test]
fn removed_keys_read_as_their_initial_value_and_the_rest_stay() {
    let mut store = small_table(Eviction::Lru, 0);
    update(&mut store, &[7, 8, 9], 1.0);
    let kept = gather(&store, &[8, 9]);
    let key = |id| row_of(0, id, DYNAMIC_KEY_SPACE);
    let removed = store
        .table_mut(0)
        .unwrap()
        .remove_keys(&[key(7), key(10)])
        .unwrap();
    assert_eq!(removed, 1, "key 10 was never stored");
    assert!(!stored(&store, 7) && stored(&store, 8) && stored(&store, 9));
    assert_eq!(gather(&store, &[7]), initial(&store, 64, 7));
    assert_eq!(gather(&store, &[8, 9]), kept);
    let mut hashed = EmbeddingStore::new(EmbeddingConfig {
        dim: 2,
        rows: vec![64],
        optimizer: SparseOptimizerConfig::default(),
        seed: SEED,
        dynamic: None,
    })
    .unwrap();
    let e = hashed.table_mut(0).unwrap().remove_keys(&[1]).unwrap_err();
    assert!(e.to_string().contains("hashed"), "{e}");
}
