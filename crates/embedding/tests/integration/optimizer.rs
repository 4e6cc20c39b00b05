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
