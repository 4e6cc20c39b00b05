use elastrec_embedding::{
    EmbeddingConfig, EmbeddingError, EmbeddingStore, SparseOptimizerConfig, TableSnapshot,
    UpdateScratch,
};

use crate::common::{adagrad, batch, config, Reference};

/// Overwrites row `row` of table 0 with `values` (weights ++ state).
fn set_row(store: &mut EmbeddingStore, row: u64, values: &[f32]) {
    let t = store.table(0).unwrap();
    let snap = TableSnapshot {
        table: 0,
        table_rows: t.rows(),
        dim: t.dim(),
        state_len: t.state_len(),
        rows: vec![row],
        values: values.to_vec(),
        usage: Vec::new(),
        dynamic: None,
    };
    store.import_table(&snap).unwrap();
}

#[test]
fn sgd_step_by_hand() {
    let mut store =
        EmbeddingStore::new(config(vec![4], 2, SparseOptimizerConfig::Sgd { lr: 0.5 })).unwrap();
    set_row(&mut store, 1, &[0.5, -0.5]);
    let before_row2 = store.table(0).unwrap().row(2).unwrap().to_vec();
    // Row 1 twice (grads summed to [4, -2]), row 2 once with a zero gradient.
    let rows = [1, 2, 1];
    let grads = [1.0, 2.0, 0.0, 0.0, 3.0, -4.0];
    let mut scratch = UpdateScratch::new();
    store
        .apply_gradients_rows(&rows, &grads, &mut scratch)
        .unwrap();
    // w = [0.5, -0.5] - 0.5 * [4, -2]
    assert_eq!(store.table(0).unwrap().row(1).unwrap(), &[-1.5, 0.5]);
    assert_eq!(store.table(0).unwrap().row(2).unwrap(), &before_row2[..]);
}

#[test]
fn row_wise_adagrad_steps_by_hand() {
    let mut store = EmbeddingStore::new(config(vec![4], 2, adagrad(0.5, 0.0, 3.5))).unwrap();
    assert_eq!(
        store.table(0).unwrap().row(3).unwrap()[2],
        3.5,
        "fresh accumulator"
    );
    set_row(&mut store, 0, &[1.0, -1.0, 3.5]);
    let mut scratch = UpdateScratch::new();
    // g = [3, 4]: acc = 3.5 + (9 + 16) / 2 = 16, step = 0.5 / 4 = 0.125.
    store
        .apply_gradients_rows(&[0], &[3.0, 4.0], &mut scratch)
        .unwrap();
    assert_eq!(
        store.table(0).unwrap().row(0).unwrap(),
        &[0.625, -1.5, 16.0]
    );
    // Duplicates [1, 2] + [2, 1] = [3, 3]: acc = 16 + 9 = 25, step = 0.5 / 5 = 0.1.
    store
        .apply_gradients_rows(&[0, 0], &[1.0, 2.0, 2.0, 1.0], &mut scratch)
        .unwrap();
    let row = store.table(0).unwrap().row(0).unwrap();
    assert_eq!(row[2], 25.0);
    assert!(
        (row[0] - 0.325).abs() < 1e-6 && (row[1] + 1.8).abs() < 1e-6,
        "{row:?}"
    );
}

fn row(store: &EmbeddingStore, r: u64) -> Vec<f32> {
    store.table(0).unwrap().row(r).unwrap().to_vec()
}

fn close(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (a, b) in got.iter().zip(want) {
        assert!(
            (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
            "{got:?} vs {want:?}"
        );
    }
}

#[test]
fn adagrad_keeps_one_accumulator_per_weight() {
    let opt = SparseOptimizerConfig::Adagrad {
        lr: 0.5,
        eps: 0.0,
        initial_accumulator: 7.0,
    };
    let mut store = EmbeddingStore::new(config(vec![4], 2, opt)).unwrap();
    assert_eq!(&row(&store, 3)[2..], &[7.0, 7.0], "fresh accumulators");
    set_row(&mut store, 0, &[1.0, -1.0, 7.0, 0.0 + 12.0]);
    let mut scratch = UpdateScratch::new();
    // g = [3, 2]: acc = [7 + 9, 12 + 4] = [16, 16]; w -= 0.5 * g / 4.
    store
        .apply_gradients_rows(&[0], &[3.0, 2.0], &mut scratch)
        .unwrap();
    close(&row(&store, 0), &[0.625, -1.25, 16.0, 16.0]);
}

#[test]
fn lazy_adam_steps_by_hand_with_a_per_row_step_count() {
    let opt = SparseOptimizerConfig::Adam {
        lr: 0.1,
        beta1: 0.5,
        beta2: 0.75,
        eps: 1e-12,
    };
    let mut store = EmbeddingStore::new(config(vec![4], 2, opt)).unwrap();
    assert_eq!(
        row(&store, 2)[2..],
        [0.0; 5],
        "fresh moments and step count"
    );
    set_row(&mut store, 0, &[1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    let untouched = row(&store, 1);
    let mut scratch = UpdateScratch::new();
    // t = 1: m = 0.5 g = [1, -2]; v = 0.25 g^2 = [1, 4]; m^ = [2, -4]; v^ = [4, 16];
    // w -= 0.1 * [2/2, -4/4].
    store
        .apply_gradients_rows(&[0], &[2.0, -4.0], &mut scratch)
        .unwrap();
    close(&row(&store, 0), &[0.9, 2.1, 1.0, -2.0, 1.0, 4.0, 1.0]);
    // t = 2, same gradient as two duplicates [1, -2] + [1, -2]: m = [1.5, -3];
    // v = [1.75, 7]; m^ = m / 0.75 = [2, -4]; v^ = v / 0.4375 = [4, 16]: the same step.
    store
        .apply_gradients_rows(&[0, 0], &[1.0, -2.0, 1.0, -2.0], &mut scratch)
        .unwrap();
    close(&row(&store, 0), &[0.8, 2.2, 1.5, -3.0, 1.75, 7.0, 2.0]);
    assert_eq!(
        row(&store, 1),
        untouched,
        "lazy: a row not in the batch keeps its moments"
    );
}

#[test]
fn ftrl_proximal_steps_by_hand_with_l1_sparsity() {
    let opt = SparseOptimizerConfig::Ftrl {
        lr: 1.0,
        beta: 1.0,
        l1: 0.5,
        l2: 0.0,
        initial_accumulator: 0.0,
    };
    let mut store = EmbeddingStore::new(config(vec![4], 2, opt)).unwrap();
    set_row(&mut store, 0, &[0.2, 0.3, 0.0, 0.0, 0.0, 0.0]);
    let mut scratch = UpdateScratch::new();
    // j = 0: sigma = 3, z = 3 - 3 * 0.2 = 2.4, n = 9, w = -(2.4 - 0.5) / (1 + 3) = -0.475.
    // j = 1: sigma = 0.1, z = 0.1 - 0.1 * 0.3 = 0.07 <= l1, so w = 0 exactly.
    store
        .apply_gradients_rows(&[0], &[3.0, 0.1], &mut scratch)
        .unwrap();
    close(&row(&store, 0), &[-0.475, 0.0, 2.4, 0.07, 9.0, 0.01]);
    assert_eq!(row(&store, 0)[1], 0.0);
    let fresh = SparseOptimizerConfig::Ftrl {
        lr: 0.05,
        beta: 1.0,
        l1: 0.0,
        l2: 0.0,
        initial_accumulator: 0.1,
    };
    let store = EmbeddingStore::new(config(vec![4], 2, fresh)).unwrap();
    assert_eq!(
        &row(&store, 1)[2..],
        &[0.0, 0.0, 0.1, 0.1],
        "z starts at 0, n at 0.1"
    );
}

#[test]
fn new_optimizers_are_validated() {
    let bad = [
        SparseOptimizerConfig::Adam {
            lr: 0.1,
            beta1: 1.0,
            beta2: 0.9,
            eps: 1e-8,
        },
        SparseOptimizerConfig::Adam {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.9,
            eps: 0.0,
        },
        SparseOptimizerConfig::Ftrl {
            lr: 0.0,
            beta: 1.0,
            l1: 0.0,
            l2: 0.0,
            initial_accumulator: 0.1,
        },
        SparseOptimizerConfig::Ftrl {
            lr: 0.1,
            beta: 1.0,
            l1: -1.0,
            l2: 0.0,
            initial_accumulator: 0.1,
        },
        SparseOptimizerConfig::Adagrad {
            lr: 0.1,
            eps: 0.0,
            initial_accumulator: 0.0,
        },
    ];
    for opt in bad {
        let e = EmbeddingStore::new(config(vec![4], 2, opt)).err();
        assert!(e.is_some(), "{opt:?} was accepted");
    }
}

fn matches_reference(optimizer: SparseOptimizerConfig, by_ids: bool) {
    let (t, d, n) = (3, 5, 256);
    let mut store = EmbeddingStore::new(config(vec![40, 3, 1000], d, optimizer)).unwrap();
    let mut reference = Reference::from_store(&store);
    let mut scratch = UpdateScratch::new();
    for step in 0..4 {
        let (ids, grads) = batch(100 + step, n, t, d, 5000);
        let mut rows = vec![0; ids.len()];
        store.ids_to_rows(&ids, &mut rows).unwrap();
        let dups = rows.len() - rows.iter().collect::<std::collections::BTreeSet<_>>().len();
        assert!(dups > 100, "the batch must exercise duplicates");
        if by_ids {
            store.apply_gradients(&ids, &grads, &mut scratch).unwrap();
        } else {
            store
                .apply_gradients_rows(&rows, &grads, &mut scratch)
                .unwrap();
        }
        reference.apply(&rows, &grads, t);
    }
    reference.assert_matches(&store, 1e-5);
}

#[test]
fn duplicate_rows_are_coalesced_like_the_naive_reference_adagrad() {
    matches_reference(adagrad(0.05, 1e-8, 0.0), true);
    matches_reference(adagrad(0.05, 1e-3, 0.1), false);
}

#[test]
fn duplicate_rows_are_coalesced_like_the_naive_reference_sgd() {
    matches_reference(SparseOptimizerConfig::Sgd { lr: 0.1 }, true);
}

#[test]
fn a_bad_row_leaves_the_store_untouched() {
    let mut store = EmbeddingStore::new(config(vec![10, 10], 2, adagrad(0.1, 1e-8, 0.0))).unwrap();
    let before = (
        store.export_table(0).unwrap(),
        store.export_table(1).unwrap(),
    );
    let mut scratch = UpdateScratch::new();
    let err = store
        .apply_gradients_rows(&[1, 2, 3, 10], &[1.0; 8], &mut scratch)
        .unwrap_err();
    assert_eq!(
        err,
        EmbeddingError::RowOutOfRange {
            table: 1,
            row: 10,
            rows: 10
        }
    );
    assert_eq!(
        (
            store.export_table(0).unwrap(),
            store.export_table(1).unwrap()
        ),
        before
    );
}

#[test]
fn access_counters_count_every_update() {
    let mut store = EmbeddingStore::new(EmbeddingConfig {
        dim: 2,
        ..EmbeddingConfig::with_rows(vec![5])
    })
    .unwrap();
    assert!(
        store.table(0).unwrap().access_counts().is_none(),
        "off by default"
    );
    store.enable_access_counters();
    let mut scratch = UpdateScratch::new();
    store
        .apply_gradients_rows(&[4, 1, 4, 4], &[0.1; 8], &mut scratch)
        .unwrap();
    store
        .apply_gradients_rows(&[1], &[0.1; 2], &mut scratch)
        .unwrap();
    assert_eq!(
        store.table(0).unwrap().access_counts().unwrap(),
        &[0, 2, 0, 0, 3]
    );
}

#[test]
fn duplicate_rows_are_coalesced_like_the_naive_reference_adagrad_adam_and_ftrl() {
    matches_reference(
        SparseOptimizerConfig::Adagrad {
            lr: 0.05,
            eps: 1e-8,
            initial_accumulator: 0.1,
        },
        true,
    );
    matches_reference(
        SparseOptimizerConfig::Adam {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        },
        false,
    );
    matches_reference(
        SparseOptimizerConfig::Ftrl {
            lr: 0.05,
            beta: 1.0,
            l1: 0.01,
            l2: 0.1,
            initial_accumulator: 0.1,
        },
        true,
    );
}
