//! What an exported model reads: its dense columns, its single-id slots, its lists, and
//! the tables they look up. The ONNX graph's inputs, the inputs file of a data set and
//! the side file that documents both are all derived from this one description.

use elastrec_data::{Pooling, Schema, NUM_DENSE, NUM_SPARSE};
use elastrec_worker::Dlrm;
use serde::Serialize;

use crate::error::{ExportError, Result};

/// The inputs of a model.
#[derive(Debug, Clone, Serialize)]
pub struct Signature {
    /// The dense columns, in order (input `dense`, `[batch, len]`).
    pub dense: Vec<DenseColumn>,
    /// The single-id features, in order (input `sparse_rows`, `[batch, len]`).
    pub singles: Vec<Slot>,
    /// The bags and sequences, in order (inputs `<feature>_rows` and
    /// `<feature>_weights`, `[batch, max_len]` each).
    pub lists: Vec<List>,
    /// The tables (ONNX constants `embedding.<name>`).
    pub tables: Vec<TableInfo>,
}

/// One dense column.
#[derive(Debug, Clone, Serialize)]
pub struct DenseColumn {
    /// The feature's name.
    pub feature: String,
    /// What the reader applies to the raw value before the model reads it (`none`,
    /// `log1p`, or `ops` for the feature's own chain).
    pub transform: &'static str,
    /// The feature's own operator chain (`data.feature.ops`), applied before `dense`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ops: Vec<String>,
}

/// One single-id feature.
#[derive(Debug, Clone, Serialize)]
pub struct Slot {
    /// The feature's name.
    pub feature: String,
    /// Index into [`Signature::tables`].
    pub table: usize,
    /// The feature's own operator chain, applied to its id (or number) before the row
    /// is found.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ops: Vec<String>,
}

/// One bag or sequence.
#[derive(Debug, Clone, Serialize)]
pub struct List {
    /// The feature's name.
    pub feature: String,
    /// Index into [`Signature::tables`].
    pub table: usize,
    /// Ids per row the inputs hold (longer lists are cut by the reader).
    pub max_len: usize,
    /// How the ids' vectors pool.
    pub pooling: Pooling,
    /// The feature's own operator chain, applied to its kept ids before their rows are
    /// found.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ops: Vec<String>,
}

/// One embedding table.
#[derive(Debug, Clone, Serialize)]
pub struct TableInfo {
    /// Its name.
    pub name: String,
    /// Its rows: ids hash into `0..rows`.
    pub rows: u64,
}

impl Signature {
    /// The signature of `model`, whose named features (if any) are `schema`.
    pub fn of(model: &Dlrm, schema: Option<&Schema>) -> Result<Self> {
        if model.embeddings.config().dynamic.is_some() {
            return Err(ExportError::Unsupported(
                "the model's tables are dynamic (model.dynamic_embeddings): their keys span \
                 2^64, so they have no row array to export; train with hashed tables to \
                 export this model"
                    .into(),
            ));
        }
        let rows = &model.embeddings.config().rows;
        let nd = model.dense.config().num_dense();
        let slots = model.tables();
        let Some(schema) = schema else {
            // The Criteo layout or a `[[preprocess]]` graph: one table per slot.
            let criteo = nd == NUM_DENSE && slots == NUM_SPARSE;
            let dense = (0..nd)
                .map(|i| DenseColumn {
                    feature: if criteo {
                        format!("I{}", i + 1)
                    } else {
                        format!("dense_{i}")
                    },
                    transform: if criteo { "log1p" } else { "preprocess" },
                    ops: Vec::new(),
                })
                .collect();
            let names: Vec<String> = (0..slots)
                .map(|i| {
                    if criteo {
                        format!("C{}", i + 1)
                    } else {
                        format!("sparse_{i}")
                    }
                })
                .collect();
            return Ok(Self {
                dense,
                singles: names
                    .iter()
                    .enumerate()
                    .map(|(t, f)| Slot {
                        feature: f.clone(),
                        table: t,
                        ops: Vec::new(),
                    })
                    .collect(),
                lists: Vec::new(),
                tables: names
                    .into_iter()
                    .zip(rows)
                    .map(|(name, &rows)| TableInfo { name, rows })
                    .collect(),
            });
        };
        let table_names = schema.table_names();
        if table_names.len() != rows.len() {
            return Err(ExportError::Shape(format!(
                "the schema names {} tables where the model has {}",
                table_names.len(),
                rows.len()
            )));
        }
        let table_of = |f: &elastrec_data::FeatureSpec| {
            table_names
                .iter()
                .position(|&n| n == f.table())
                .expect("every slot's table is among the schema's tables")
        };
        Ok(Self {
            dense: schema
                .dense()
                .map(|f| DenseColumn {
                    feature: f.name.clone(),
                    transform: match f.transform {
                        _ if !f.ops.is_empty() => "ops",
                        elastrec_data::schema::DenseTransform::None => "none",
                        elastrec_data::schema::DenseTransform::Log1p => "log1p",
                    },
                    ops: f.ops.clone(),
                })
                .collect(),
            singles: schema
                .categorical()
                .map(|f| Slot {
                    feature: f.name.clone(),
                    table: table_of(f),
                    ops: f.ops.clone(),
                })
                .collect(),
            lists: schema
                .lists()
                .map(|f| List {
                    feature: f.name.clone(),
                    table: table_of(f),
                    max_len: f.max_len(),
                    pooling: f.pooling,
                    ops: f.ops.clone(),
                })
                .collect(),
            tables: table_names
                .iter()
                .zip(rows)
                .map(|(name, &rows)| TableInfo {
                    name: name.to_string(),
                    rows,
                })
                .collect(),
        })
    }

    /// The name of list `b`'s rows input.
    pub fn list_rows(&self, b: usize) -> String {
        format!("{}_rows", self.lists[b].feature)
    }

    /// The name of list `b`'s weights input.
    pub fn list_weights(&self, b: usize) -> String {
        format!("{}_weights", self.lists[b].feature)
    }

    /// The table index of embedding slot `s` (single ids first, then lists).
    pub fn slot_table(&self, s: usize) -> usize {
        match self.singles.get(s) {
            Some(slot) => slot.table,
            None => self.lists[s - self.singles.len()].table,
        }
    }
}
