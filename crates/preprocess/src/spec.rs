//! `[[preprocess]]`: what the job file says about each feature, and the default graph
//! (the Criteo transform every job had before this section existed).

use serde::{Deserialize, Serialize};

use elastrec_data::criteo;

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
    /// One column, or a range of columns (`"I1..I13"`): one feature per column, each
    /// through the same chain and named by its column.
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

/// A range `"I1..I13"`: the prefix and the first and last numbers.
fn range_of(input: &str) -> Option<Result<(char, usize, usize), String>> {
    let (a, b) = input.split_once("..")?;
    let parse = |t: &str| {
        let mut chars = t.chars();
        let prefix = chars.next()?;
        chars.as_str().parse::<usize>().ok().map(|n| (prefix, n))
    };
    Some(match (parse(a), parse(b)) {
        (Some((p, lo)), Some((q, hi))) if p == q && lo <= hi => Ok((p, lo, hi)),
        _ => Err(format!(
            "`{input}` is not a column range; write it like \"I1..I13\" (same letter, \
             first <= last)"
        )),
    })
}

/// The entries with every column range expanded: `(entry number (1-based), entry)`.
pub fn expand(specs: &[FeatureSpec]) -> Result<Vec<(usize, FeatureSpec)>, (usize, String)> {
    let mut out = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let range = match &spec.input {
            Input::One(c) => range_of(c),
            Input::Many(_) => None,
        };
        match range {
            None => out.push((i + 1, spec.clone())),
            Some(Err(e)) => return Err((i + 1, e)),
            Some(Ok((prefix, lo, hi))) => {
                if spec.name.is_some() || spec.rows.is_some() {
                    return Err((
                        i + 1,
                        "a column range makes one feature per column, named by its column: \
                         it takes no `name` or `rows`"
                            .into(),
                    ));
                }
                out.extend((lo..=hi).map(|n| {
                    (
                        i + 1,
                        FeatureSpec {
                            input: Input::One(format!("{prefix}{n}")),
                            ..spec.clone()
                        },
                    )
                }));
            }
        }
    }
    Ok(out)
}

/// The default graph: `I1..I13` through `fill_null(0) → clamp(min=0) → log1p` (the
/// `ln(1 + max(x, 0))` of every earlier release, bit for bit) and `C1..C26` as they are
/// (an empty field is the shared "missing" id).
pub fn default_graph() -> Vec<FeatureSpec> {
    let dense = (1..=criteo::DENSE).map(|i| FeatureSpec {
        name: None,
        input: Input::One(format!("I{i}")),
        ops: vec!["fill_null(0)".into(), "clamp(min=0)".into(), "log1p".into()],
        rows: None,
    });
    let sparse = (1..=criteo::CATEGORICAL).map(|j| FeatureSpec {
        name: None,
        input: Input::One(format!("C{j}")),
        ops: Vec::new(),
        rows: None,
    });
    dense.chain(sparse).collect()
}
