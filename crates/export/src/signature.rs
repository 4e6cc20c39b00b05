//! What an exported model reads: its dense columns, its single-id slots, its lists, and
//! the tables they look up. The ONNX graph's inputs, the inputs file of a data set and
//! the side file that documents both are all derived from this one description.

use elastrec_data::{criteo, FeatureSource, Pooling};
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
    /// The column it reads (the Criteo preset's `I1`..`I13` are fields 1-13 of a row).
    pub column: String,
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
    /// Its rows: a hashed table's ids hash into `0..rows`; a dynamic table's are the rows
    /// it stores and one of zeros after them, for keys it never admitted.
    pub rows: u64,
    /// A dynamic table (`model.dynamic_embeddings`): its inputs hold each id's 64-bit key
    /// instead of a row, and the graph finds the key's row (ONNX-ML `LabelEncoder`); the
    /// safetensors export has the keys as `embedding.<name>.keys`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub dynamic: bool,
}

impl TableInfo {
    /// The space an id's key is hashed over: a hashed table's rows, or a dynamic
    /// table's whole key space.
    pub fn key_space(&self) -> u64 {
        if self.dynamic {
            elastrec_embedding::DYNAMIC_KEY_SPACE
        } else {
            self.rows
        }
    }
}

/// Table `t` of `model`, named `name`.
fn table_info(model: &Dlrm, t: usize, name: String) -> Result<TableInfo> {
    let table = model.embeddings.table(t)?;
    let dynamic = table.is_dynamic();
    Ok(TableInfo {
        name,
        rows: if dynamic {
            table.local_rows() as u64 + 1
        } else {
            model.embeddings.config().rows[t]
        },
        dynamic,
    })
}

impl Signature {
    /// The signature of `model` of job `job` (its named features, or its preprocessing
    /// graph's outputs, or the Criteo preset).
    pub fn of_job(model: &Dlrm, job: &elastrec_job::JobConfig) -> Result<Self> {
        let schema = job.data.schema();
        let source = FeatureSource::new(schema.as_ref(), !job.preprocess.is_empty());
        let mut sig = Self::of(model, source)?;
        if matches!(source, FeatureSource::Plan) {
            sig.name_plan_dense(&job.preprocess)?;
        }
        Ok(sig)
    }

    /// A preprocessing graph's dense columns by their features: a one-column feature of
    /// one output keeps its column and chain (which `--raw-dense` can put in the graph);
    /// wider ones (`onehot`, `multihot`) stay `preprocess` columns.
    fn name_plan_dense(&mut self, specs: &[elastrec_preprocess::FeatureSpec]) -> Result<()> {
        let plan = elastrec_preprocess::Plan::compile(specs)
            .map_err(|e| ExportError::Shape(format!("the model's [[preprocess]] graph: {e}")))?;
        let expanded = elastrec_preprocess::spec::expand(specs).map_err(|(entry, e)| {
            ExportError::Shape(format!("[[preprocess]] entry {entry}: {e}"))
        })?;
        let mut columns = Vec::new();
        for (f, (_, spec)) in plan.features().iter().zip(&expanded) {
            if f.kind != elastrec_preprocess::FeatureKind::Dense {
                continue;
            }
            let inputs = spec.input.columns();
            for k in 0..f.width {
                columns.push(match (f.width, inputs.as_slice()) {
                    (1, [column]) => DenseColumn {
                        feature: f.name.clone(),
                        column: column.to_string(),
                        transform: "ops",
                        ops: spec.ops.clone(),
                    },
                    _ => DenseColumn {
                        feature: format!("{}[{k}]", f.name),
                        column: inputs.join(","),
                        transform: "preprocess",
                        ops: spec.ops.clone(),
                    },
                });
            }
        }
        if columns.len() != self.dense.len() {
            return Err(ExportError::Shape(format!(
                "the [[preprocess]] graph makes {} dense columns where the model reads {}",
                columns.len(),
                self.dense.len()
            )));
        }
        self.dense = columns;
        Ok(())
    }

    /// The signature of `model`, whose inputs come from `source`.
    pub fn of(model: &Dlrm, source: FeatureSource<'_>) -> Result<Self> {
        let rows = &model.embeddings.config().rows;
        let nd = model.dense.config().num_dense();
        let slots = model.tables();
        let schema = match source {
            FeatureSource::Named(schema) => schema,
            FeatureSource::Criteo
                if (nd, slots, rows.len()) != (criteo::DENSE, criteo::CATEGORICAL, slots) =>
            {
                return Err(ExportError::Shape(format!(
                    "a model of the Criteo features takes {} dense columns and {} categorical \
                     ones, a table each; this one has {nd} dense columns, {slots} categorical \
                     ones and {} tables",
                    criteo::DENSE,
                    criteo::CATEGORICAL,
                    rows.len()
                )));
            }
            FeatureSource::Criteo => {
                return Self::unnamed(
                    model,
                    (0..nd).map(criteo::dense_name),
                    "log1p",
                    (0..slots).map(criteo::categorical_name),
                )
            }
            FeatureSource::Plan => {
                return Self::unnamed(
                    model,
                    (0..nd).map(|i| format!("dense_{i}")),
                    "preprocess",
                    (0..slots).map(|i| format!("sparse_{i}")),
                )
            }
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
                    column: f.column().to_string(),
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
                .enumerate()
                .map(|(t, name)| table_info(model, t, name.to_string()))
                .collect::<Result<_>>()?,
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

impl Signature {
    /// The signature of a model whose columns have no names of their own (the Criteo
    /// preset's or a preprocessing graph's): one table per single-id slot.
    fn unnamed(
        model: &Dlrm,
        dense: impl Iterator<Item = String>,
        transform: &'static str,
        singles: impl Iterator<Item = String>,
    ) -> Result<Self> {
        let names: Vec<String> = singles.collect();
        Ok(Self {
            dense: dense
                .map(|feature| DenseColumn {
                    column: feature.clone(),
                    feature,
                    transform,
                    ops: Vec::new(),
                })
                .collect(),
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
                .enumerate()
                .map(|(t, name)| table_info(model, t, name))
                .collect::<Result<_>>()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use elastrec_job::JobConfig;

    fn criteo_shaped() -> Dlrm {
        Dlrm::new(&JobConfig::default(), vec![16; criteo::CATEGORICAL]).unwrap()
    }

    /// The preset's columns are named and transformed as its files are read.
    #[test]
    fn a_criteo_model_reads_the_presets_columns() {
        let sig = Signature::of(&criteo_shaped(), FeatureSource::Criteo).unwrap();
        assert_eq!(sig.dense[0].feature, "I1");
        assert_eq!(sig.dense[12].transform, "log1p");
        assert_eq!(sig.singles[25].feature, "C26");
        assert_eq!(sig.tables[3].name, "C4");
    }

    /// A preprocessing graph of 13 dense and 26 categorical outputs has the preset's shape
    /// but not its columns: the signature says the graph's outputs, not `I1` as `log1p`.
    #[test]
    fn a_graphs_outputs_of_the_presets_shape_are_not_taken_for_it() {
        let sig = Signature::of(&criteo_shaped(), FeatureSource::Plan).unwrap();
        assert_eq!(sig.dense[0].feature, "dense_0");
        assert_eq!(sig.dense[0].transform, "preprocess");
        assert_eq!(sig.singles[25].feature, "sparse_25");
    }

    /// A model said to read the preset but shaped otherwise is refused, naming both shapes.
    #[test]
    fn a_model_of_another_shape_is_no_criteo_model() {
        let model = Dlrm::new(&JobConfig::default(), vec![16; 5]).unwrap();
        let err = Signature::of(&model, FeatureSource::Criteo).unwrap_err();
        assert!(err.to_string().contains("and 5 tables"), "{err}");
    }
}
