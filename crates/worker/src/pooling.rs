//! Embedding lookups of a named-feature batch: features that share a table, and bags and
//! sequences whose ids pool into one vector (TorchRec's `EmbeddingBag`).
//!
//! Every id of the batch becomes one lookup `(table, id)` with the embedding slot it adds
//! to and its scale: 1 for a single id; for a bag of ids `x_1..x_k` with weights `w_i`
//! (1 when the feature has none), `w_i` (sum), `w_i / Σw` (mean) or `w_i / sqrt(Σw²)`
//! (sqrt-n). An empty bag looks up the table's null row ([`NULL_KEY`]) once, so "no
//! history" is learned like a missing single id. The forward pass gathers the rows and
//! adds each, scaled, to its slot; the backward pass hands each lookup its slot's
//! gradient times the same scale, and the store sums duplicate rows before the
//! optimizer runs once per row.

use elastrec_data::schema::NULL_KEY;
use elastrec_data::{Batch, Pooling, Schema};
use elastrec_embedding::{EmbeddingStore, UpdateScratch};

use crate::error::{Result, WorkerError};

/// Which table each embedding slot reads and how each bag pools.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotLayout {
    /// The table of each slot: the single-id slots, then one per bag or sequence.
    pub slot_tables: Vec<u32>,
    /// The pooling of each bag or sequence, in batch order.
    pub pooling: Vec<Pooling>,
    /// For each bag or sequence pooled by attention or a transformer, its longest
    /// history: its ids are not pooled here but laid out for the model's unit (in this
    /// order).
    pub histories: Vec<Option<usize>>,
}

impl SlotLayout {
    /// The layout of `schema`; `None` when its batches take the plain path (one single id
    /// per slot, one table per slot).
    pub fn of(schema: &Schema) -> Option<Self> {
        if schema.is_single_id() {
            return None;
        }
        Some(Self {
            slot_tables: schema.slot_tables().iter().map(|&t| t as u32).collect(),
            pooling: schema.lists().map(|f| f.pooling).collect(),
            histories: schema
                .lists()
                .map(|f| f.pooling.is_learned().then(|| f.max_len()))
                .collect(),
        })
    }

    /// Embedding rows of the attention units' inputs per batch row (`Σ max_len`).
    pub fn history_rows(&self) -> usize {
        self.histories.iter().flatten().sum()
    }

    /// Attention units.
    pub fn attention_units(&self) -> usize {
        self.histories.iter().flatten().count()
    }

    /// Embedding slots per row.
    pub fn slots(&self) -> usize {
        self.slot_tables.len()
    }
}

/// Every embedding lookup of one batch: lookup `k` reads `ids[k]` in table `tables[k]`
/// and adds it, times `scale[k]`, to the embedding at `target[k]` (`row * slots + slot`);
/// a target past the batch's `rows * slots` embeddings is a history position of an
/// attention unit instead (`rows * slots + unit base + row * max_len + item`), which
/// receives the row unscaled. Buffers keep their capacity across batches.
#[derive(Debug, Default, Clone)]
pub struct LookupPlan {
    /// The table of each lookup.
    pub tables: Vec<u32>,
    /// The id of each lookup.
    pub ids: Vec<u64>,
    /// The embedding each lookup adds to.
    pub target: Vec<u32>,
    /// The factor it adds with.
    pub scale: Vec<f32>,
    /// Rows of the batch planned.
    pub rows: usize,
    /// Embedding slots per row.
    pub slots: usize,
    /// The history length of every row for each attention unit (`[units, rows]`).
    pub lens: Vec<u32>,
}

impl LookupPlan {
    /// Lookups held.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// True when there is no lookup.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Lists the lookups of `batch` under `layout`.
    pub fn plan(&mut self, layout: &SlotLayout, batch: &Batch) -> Result<()> {
        let (n, single) = (batch.len(), batch.sparse_width);
        let slots = layout.slots();
        if single + batch.bags.len() != slots || layout.pooling.len() != batch.bags.len() {
            return Err(WorkerError::Layout(format!(
                "a batch of {single} single ids and {} lists does not fit the model's {slots} \
                 embedding slots ({} lists)",
                batch.bags.len(),
                layout.pooling.len()
            )));
        }
        self.tables.clear();
        self.ids.clear();
        self.target.clear();
        self.scale.clear();
        self.rows = n;
        self.slots = slots;
        self.lens.clear();
        self.lens.resize(layout.attention_units() * n, 0);
        // Where each attention unit's histories start, past the embeddings.
        let mut bases = Vec::with_capacity(layout.histories.len());
        let mut base = n * slots;
        for h in &layout.histories {
            bases.push(base);
            base += h.map_or(0, |t| n * t);
        }
        let mut push = |table: u32, id: u64, target: usize, scale: f32| {
            self.tables.push(table);
            self.ids.push(id);
            self.target.push(target as u32);
            self.scale.push(scale);
        };
        for r in 0..n {
            for (s, &id) in batch.sparse_row(r).iter().enumerate() {
                push(layout.slot_tables[s], id, r * slots + s, 1.0);
            }
            let mut unit = 0;
            for (b, (bag, &pooling)) in batch.bags.iter().zip(&layout.pooling).enumerate() {
                let slot = single + b;
                let table = layout.slot_tables[slot];
                let ids = bag.row(r);
                if let Some(max_len) = layout.histories[b] {
                    if ids.len() > max_len {
                        return Err(WorkerError::Layout(format!(
                            "a history of {} ids where the model takes at most {max_len}",
                            ids.len()
                        )));
                    }
                    let at = bases[b] + r * max_len;
                    // "No history" is the table's null row, learned like a missing id.
                    let items: &[u64] = if ids.is_empty() { &[NULL_KEY] } else { ids };
                    for (t, &id) in items.iter().enumerate() {
                        push(table, id, at + t, 1.0);
                    }
                    self.lens[unit * n + r] = items.len() as u32;
                    unit += 1;
                    continue;
                }
                if ids.is_empty() {
                    push(table, NULL_KEY, r * slots + slot, 1.0);
                    continue;
                }
                let weights = bag.row_weights(r);
                let w = |i: usize| weights.get(i).copied().unwrap_or(1.0);
                let norm = pooling_norm(pooling, (0..ids.len()).map(w));
                for (i, &id) in ids.iter().enumerate() {
                    push(table, id, r * slots + slot, w(i) * norm);
                }
            }
        }
        Ok(())
    }

    /// Floats of the attention units' inputs (`[rows, max_len, d]` each, one after the
    /// other) for rows of `d` floats.
    pub fn history_len(&self, layout: &SlotLayout, d: usize) -> usize {
        self.rows * layout.history_rows() * d
    }

    /// Adds each lookup's row (`row(k)`, `d` values), scaled, to its target in `emb`,
    /// which is zeroed first, or copies it to its place in `hist` (zeroed first: the
    /// padding of short histories).
    pub fn pool<'v>(
        &self,
        d: usize,
        emb: &mut [f32],
        hist: &mut [f32],
        row: impl Fn(usize) -> &'v [f32],
    ) {
        emb.fill(0.0);
        hist.fill(0.0);
        let pooled = self.rows * self.slots;
        for (k, (&t, &s)) in self.target.iter().zip(&self.scale).enumerate() {
            let t = t as usize;
            if t >= pooled {
                hist[(t - pooled) * d..][..d].copy_from_slice(&row(k)[..d]);
                continue;
            }
            let dst = &mut emb[t * d..(t + 1) * d];
            for (o, &v) in dst.iter_mut().zip(row(k)) {
                *o += s * v;
            }
        }
    }

    /// The gradient of lookup `k`'s row: its target's gradient in `d_emb` (or, for a
    /// history position, in `d_hist`), scaled, added to `out` (a row may be looked up
    /// several times).
    #[inline]
    pub fn add_grad(&self, k: usize, d: usize, d_emb: &[f32], d_hist: &[f32], out: &mut [f32]) {
        let (t, s) = (self.target[k] as usize, self.scale[k]);
        let pooled = self.rows * self.slots;
        let src = if t >= pooled {
            &d_hist[(t - pooled) * d..][..d]
        } else {
            &d_emb[t * d..(t + 1) * d]
        };
        for (o, &g) in out.iter_mut().zip(src) {
            *o += s * g;
        }
    }
}

/// The factor every id's weight is multiplied by under `pooling`, given the weights.
fn pooling_norm(pooling: Pooling, weights: impl Iterator<Item = f32>) -> f32 {
    let inverse = |total: f32| if total > 0.0 { 1.0 / total } else { 0.0 };
    match pooling {
        // An attention unit weighs the ids itself.
        Pooling::Sum | Pooling::Attention | Pooling::Transformer => 1.0,
        Pooling::Mean => inverse(weights.sum()),
        Pooling::Sqrtn => inverse(weights.map(|w| w * w).sum::<f32>().sqrt()),
    }
}

/// The lookups of one batch and their buffers (kept across batches).
#[derive(Debug, Default)]
pub struct Lookups {
    plan: LookupPlan,
    rows: Vec<f32>,
    grads: Vec<f32>,
    /// The attention units' inputs ([`LookupPlan::pool`]) and their gradient.
    pub hist: Vec<f32>,
    /// See `hist`.
    pub d_hist: Vec<f32>,
}

impl Lookups {
    /// Looks up `batch` and writes its pooled embeddings, `[n, slots, d]`, into `emb`.
    pub fn gather(
        &mut self,
        layout: &SlotLayout,
        store: &EmbeddingStore,
        batch: &Batch,
        emb: &mut [f32],
    ) -> Result<()> {
        self.plan.plan(layout, batch)?;
        let d = store.dim();
        self.rows.resize(self.plan.len() * d, 0.0);
        store.gather_keyed(&self.plan.tables, &self.plan.ids, &mut self.rows)?;
        let rows = &self.rows;
        self.hist.resize(self.plan.history_len(layout, d), 0.0);
        self.plan
            .pool(d, emb, &mut self.hist, |k| &rows[k * d..(k + 1) * d]);
        Ok(())
    }

    /// The history lengths of the last [`Lookups::gather`] (`[units, rows]`).
    pub fn lens(&self) -> &[u32] {
        &self.plan.lens
    }

    /// The histories, their lengths and their gradient buffer (sized like them).
    pub fn histories_mut(&mut self) -> (&[f32], &[u32], &mut [f32]) {
        self.d_hist.resize(self.hist.len(), 0.0);
        (&self.hist, &self.plan.lens, &mut self.d_hist)
    }

    /// Applies `d_emb` (`[n, slots, d]`, the gradient of the embeddings [`Lookups::gather`]
    /// wrote) to the rows it looked up.
    pub fn apply(
        &mut self,
        store: &mut EmbeddingStore,
        d_emb: &[f32],
        scratch: &mut UpdateScratch,
    ) -> Result<()> {
        let d = store.dim();
        self.grads.clear();
        self.grads.resize(self.plan.len() * d, 0.0);
        for (k, g) in self.grads.chunks_exact_mut(d).enumerate() {
            self.plan.add_grad(k, d, d_emb, &self.d_hist, g);
        }
        store.apply_gradients_keyed(&self.plan.tables, &self.plan.ids, &self.grads, scratch)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use elastrec_data::{FeatureKind, FeatureSpec, Jagged, TableSpec};
    use elastrec_embedding::{EmbeddingConfig, SparseOptimizerConfig};

    fn store(rows: Vec<u64>, dim: usize) -> EmbeddingStore {
        EmbeddingStore::new(EmbeddingConfig {
            dim,
            optimizer: SparseOptimizerConfig::Sgd { lr: 0.5 },
            ..EmbeddingConfig::with_rows(rows)
        })
        .unwrap()
    }

    /// One single id (table 0) and one bag (table 1, pooled as `pooling`) per row.
    fn batch(bags: &[&[u64]], weights: Option<&[f32]>) -> Batch {
        let mut b = Batch::with_widths(bags.len(), 0, 1);
        let mut jag = Jagged::default();
        for (r, ids) in bags.iter().enumerate() {
            b.labels.push(0.0);
            b.sparse.push(100 + r as u64);
            jag.ids.extend_from_slice(ids);
            jag.end_row();
        }
        if let Some(w) = weights {
            jag.weights = w.to_vec();
        }
        b.bags.push(jag);
        b
    }

    fn layout(pooling: Pooling) -> SlotLayout {
        SlotLayout {
            slot_tables: vec![0, 1],
            pooling: vec![pooling],
            histories: vec![None],
        }
    }

    fn row(s: &EmbeddingStore, table: u32, id: u64) -> Vec<f32> {
        let mut out = vec![0.0; s.dim()];
        s.gather_keyed(&[table], &[id], &mut out).unwrap();
        out
    }

    #[test]
    fn a_bag_pools_its_rows_and_each_row_gets_its_share_of_the_gradient() {
        let d = 3;
        for (pooling, scale) in [
            (Pooling::Sum, 1.0f32),
            (Pooling::Mean, 0.5),
            (Pooling::Sqrtn, 1.0 / 2f32.sqrt()),
        ] {
            let mut s = store(vec![50, 50], d);
            let b = batch(&[&[7, 9], &[]], None);
            let (a, c, null) = (row(&s, 1, 7), row(&s, 1, 9), row(&s, 1, NULL_KEY));
            let single = row(&s, 0, 100);
            let mut emb = vec![0.0; 2 * 2 * d];
            let mut lookups = Lookups::default();
            lookups.gather(&layout(pooling), &s, &b, &mut emb).unwrap();
            assert_eq!(&emb[..d], &single[..], "slot 0 is the single id");
            for k in 0..d {
                assert!(
                    (emb[d + k] - scale * (a[k] + c[k])).abs() < 1e-6,
                    "{pooling:?}"
                );
            }
            assert_eq!(&emb[3 * d..], &null[..], "an empty bag reads the null row");
            // A gradient of ones on every slot: SGD moves each bag row by lr * scale.
            let d_emb = vec![1.0; emb.len()];
            lookups
                .apply(&mut s, &d_emb, &mut UpdateScratch::new())
                .unwrap();
            for k in 0..d {
                assert!((row(&s, 1, 7)[k] - (a[k] - 0.5 * scale)).abs() < 1e-6);
                assert!((row(&s, 1, 9)[k] - (c[k] - 0.5 * scale)).abs() < 1e-6);
                assert!((row(&s, 0, 100)[k] - (single[k] - 0.5)).abs() < 1e-6);
            }
        }
    }

    #[test]
    fn a_history_for_attention_is_laid_out_padded_and_gets_its_gradient_back() {
        let d = 2;
        let mut s = store(vec![50, 50], d);
        let mut l = layout(Pooling::Attention);
        l.histories = vec![Some(3)];
        let b = batch(&[&[7, 9], &[]], None);
        let (a, c, null) = (row(&s, 1, 7), row(&s, 1, 9), row(&s, 1, NULL_KEY));
        let mut emb = vec![0.0; 2 * 2 * d];
        let mut lookups = Lookups::default();
        lookups.gather(&l, &s, &b, &mut emb).unwrap();
        assert_eq!(
            lookups.lens(),
            [2, 1],
            "an empty history is the null row, once"
        );
        let mut want = vec![0.0; 2 * 3 * d];
        want[..d].copy_from_slice(&a);
        want[d..2 * d].copy_from_slice(&c);
        want[3 * d..4 * d].copy_from_slice(&null);
        assert_eq!(lookups.hist, want, "rows in order, zero padding");
        assert!(
            emb[d..2 * d].iter().all(|&v| v == 0.0),
            "the unit fills the slot"
        );
        // The history's gradient goes to its rows, unscaled (SGD, lr 0.5).
        let d_emb = vec![0.0; emb.len()];
        lookups.d_hist = (0..want.len()).map(|i| i as f32).collect();
        lookups
            .apply(&mut s, &d_emb, &mut UpdateScratch::new())
            .unwrap();
        for k in 0..d {
            assert!((row(&s, 1, 7)[k] - (a[k] - 0.5 * k as f32)).abs() < 1e-6);
            assert!((row(&s, 1, 9)[k] - (c[k] - 0.5 * (d + k) as f32)).abs() < 1e-6);
            assert!((row(&s, 1, NULL_KEY)[k] - (null[k] - 0.5 * (3 * d + k) as f32)).abs() < 1e-6);
        }
        // A history longer than the model takes is refused (the reader cuts it first).
        let long = batch(&[&[1, 2, 3, 4]], None);
        let err = lookups
            .gather(&l, &s, &long, &mut emb[..2 * d])
            .unwrap_err();
        assert!(err.to_string().contains("at most 3"), "{err}");
    }

    #[test]
    fn weights_scale_each_id_and_mean_divides_by_their_sum() {
        let d = 2;
        let s = store(vec![50, 50], d);
        let b = batch(&[&[7, 9]], Some(&[3.0, 1.0]));
        let (a, c) = (row(&s, 1, 7), row(&s, 1, 9));
        let mut emb = vec![0.0; 2 * d];
        Lookups::default()
            .gather(&layout(Pooling::Mean), &s, &b, &mut emb)
            .unwrap();
        for k in 0..d {
            let want = (3.0 * a[k] + c[k]) / 4.0;
            assert!((emb[d + k] - want).abs() < 1e-6);
        }
    }

    #[test]
    fn features_sharing_a_table_read_and_train_the_same_rows() {
        let mut hist = FeatureSpec::new("hist", FeatureKind::Sequence);
        hist.table = Some("item".into());
        let schema = Schema {
            labels: vec!["click".into()],
            weight: None,
            features: vec![FeatureSpec::new("item", FeatureKind::Categorical), hist],
            tables: vec![TableSpec {
                name: "item".into(),
                rows: 50,
            }],
            csv: Default::default(),
        };
        let layout = SlotLayout::of(&schema).unwrap();
        assert_eq!(layout.slot_tables, [0, 0]);
        let s = store(vec![50], 2);
        // Row 0: item 5, history [5].
        let mut b = Batch::with_widths(1, 0, 1);
        b.labels.push(1.0);
        b.sparse.push(5);
        let mut jag = Jagged::default();
        jag.ids.push(5);
        jag.end_row();
        b.bags.push(jag);
        let mut emb = vec![0.0; 4];
        Lookups::default()
            .gather(&layout, &s, &b, &mut emb)
            .unwrap();
        assert_eq!(emb[..2], emb[2..], "one row, read by both features");
    }

    #[test]
    fn a_batch_of_another_schema_is_refused() {
        let s = store(vec![50, 50], 2);
        let mut b = batch(&[&[1]], None);
        b.bags.clear();
        let err = Lookups::default()
            .gather(&layout(Pooling::Mean), &s, &b, &mut [0.0; 4])
            .unwrap_err();
        assert!(err.to_string().contains("embedding slots"), "{err}");
    }
}
