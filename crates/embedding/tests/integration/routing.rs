use elastrec_embedding::{
    row_of, shard_of, EmbeddingConfig, EmbeddingStore, ShardSpec, TableScratch, TableSnapshot,
    UpdateScratch,
};

use crate::common::{adagrad, batch, config};

fn shard_stores(cfg: &EmbeddingConfig, n: u32) -> Vec<EmbeddingStore> {
    (0..n)
        .map(|i| EmbeddingStore::new_shard(cfg.clone(), ShardSpec::new(i, n).unwrap()).unwrap())
        .collect()
}

/// Sends each (row, grad) of the batch to the shard owning it, as a worker would.
fn apply_sharded(shards: &mut [EmbeddingStore], rows: &[u64], grads: &[f32], t: usize, d: usize) {
    let n = shards.len() as u32;
    let mut scratch = TableScratch::default();
    for (k, store) in shards.iter_mut().enumerate() {
        for tt in 0..t {
            let (mut r, mut g) = (Vec::new(), Vec::new());
            for (i, &row) in rows.iter().enumerate().filter(|(i, _)| i % t == tt) {
                if shard_of(tt, row, n) == k as u32 {
                    r.push(row);
                    g.extend_from_slice(&grads[i * d..(i + 1) * d]);
                }
            }
            store
                .table_mut(tt)
                .unwrap()
                .apply_rows(&r, &g, &mut scratch)
                .unwrap();
        }
    }
}

fn assert_same_rows(single: &EmbeddingStore, shards: &[EmbeddingStore]) {
    let n = shards.len() as u32;
    for t in 0..single.num_tables() {
        let total: usize = shards
            .iter()
            .map(|s| s.table(t).unwrap().local_rows())
            .sum();
        assert_eq!(
            total as u64,
            single.config().rows[t],
            "shards partition table {t}"
        );
        for row in 0..single.config().rows[t] {
            let owner = &shards[shard_of(t, row, n) as usize];
            assert_eq!(
                owner.table(t).unwrap().row(row).unwrap(),
                single.table(t).unwrap().row(row).unwrap()
            );
        }
    }
}

#[test]
fn initialization_does_not_depend_on_sharding() {
    let cfg = config(vec![1, 2, 5, 97, 1000], 4, adagrad(0.1, 1e-8, 0.25));
    let single = EmbeddingStore::new(cfg.clone()).unwrap();
    for n in [2, 3, 7] {
        assert_same_rows(&single, &shard_stores(&cfg, n));
    }
}

#[test]
fn two_shards_restore_onto_three_with_every_row_intact() {
    let (t, d) = (4, 6);
    let cfg = config(vec![2, 11, 300, 5000], d, adagrad(0.05, 1e-8, 0.0));
    let mut single = EmbeddingStore::new(cfg.clone()).unwrap();
    let mut two = shard_stores(&cfg, 2);
    let mut scratch = UpdateScratch::new();
    for step in 0..3 {
        let (ids, grads) = batch(7 + step, 200, t, d, 20_000);
        let rows: Vec<u64> = ids
            .iter()
            .enumerate()
            .map(|(i, &id)| row_of(i % t, id, cfg.rows[i % t]))
            .collect();
        single
            .apply_gradients_rows(&rows, &grads, &mut scratch)
            .unwrap();
        apply_sharded(&mut two, &rows, &grads, t, d);
    }
    assert_same_rows(&single, &two);

    // Checkpoint the 2 shards as bytes, restore onto 3 shards built with another seed.
    let bytes: Vec<Vec<Vec<u8>>> = two
        .iter()
        .map(|s| {
            (0..t)
                .map(|tt| s.export_table(tt).unwrap().to_bytes())
                .collect()
        })
        .collect();
    let mut three = shard_stores(
        &EmbeddingConfig {
            seed: 999,
            ..cfg.clone()
        },
        3,
    );
    for tt in 0..t {
        let parts: Vec<TableSnapshot> = bytes
            .iter()
            .map(|per_shard| TableSnapshot::from_bytes(&per_shard[tt]).unwrap())
            .collect();
        let routed = TableSnapshot::concat(&parts).unwrap().route(3);
        for (k, part) in routed.iter().enumerate() {
            let written = three[k].import_table(part).unwrap();
            assert_eq!(
                written,
                three[k].table(tt).unwrap().local_rows(),
                "every row restored"
            );
        }
    }
    assert_same_rows(&single, &three);
}
