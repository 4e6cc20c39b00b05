//! `[[preprocess]]`: what the job file says about each feature, and the default graph
//! (the Criteo transform every job had before this section existed).

use serde::{Deserialize, Serialize};

use elastrec_data::{NUM_DENSE, NUM_SPARSE};

/// One `[[preprocess]]` entry: a chain of operators from one or more input columns to
/// one model feature (dense floats or sparse ids).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeatureSpec {
    /// The feature's name in reports; default: the input columns joined by `_`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// One column (`"I5"`) or a list (`["C3", "C7"]`, an id list).
    pub input: Input,
    /// The operators, applied in order (`docs/preprocess.md`).
    #[serde(default)]
    pub ops: Vec<String>,
    /// Embedding table rows for a sparse feature; default: what the chain produces
    /// (`sigrid_hash` mod, bucket count, ...) or the job's table size when unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<u64>,
}

/// The `input` of an entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Input {
    /// One column.
    One(String),
    /// Several columns, read as a list of ids.
    Many(Vec<String>),
}

impl Input {
    /// The column names.
    pub fn columns(&self) -> Vec<&str> {
        match self {
            Input::One(c) => vec![c.as_str()],
            Input::Many(cs) => cs.iter().map(String::as_str).collect(),
        }
    }
}

impl FeatureSpec {
    /// The entry's display name.
    pub fn display_name(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| self.input.columns().join("_"))
    }
}

/// The default graph: `I1..I13` through `fill_null(0) → clamp(min=0) → log1p` (the
/// `ln(1 + max(x, 0))` of every earlier release, bit for bit) and `C1..C26` as they are
/// (an empty field is the shared "missing" id).
pub fn default_graph() -> Vec<FeatureSpec> {
    let dense = (1..=NUM_DENSE).map(|i| FeatureSpec {
        name: None,
        input: Input::One(format!("I{i}")),
        ops: vec!["fill_null(0)".into(), "clamp(min=0)".into(), "log1p".into()],
        rows: None,
    });
    let sparse = (1..=NUM_SPARSE).map(|j| FeatureSpec {
        name: None,
        input: Input::One(format!("C{j}")),
        ops: Vec::new(),
        rows: None,
    });
    dense.chain(sparse).collect()
}
