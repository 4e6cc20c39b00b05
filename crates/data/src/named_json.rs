//! Rows of named features as JSON objects keyed by column name (a `serve` request's
//! rows, an online job's Kafka messages), read by the same rules as the training files
//! (`crate::named`, `crate::named_csv`), so a row sent as JSON gets the key, the value
//! and the list a file's row gets:
//!
//! - dense: a number or `null` (0), transformed as the feature says (its `transform`
//!   or its own chain, [`crate::chain`]);
//! - categorical: an integer (a 64-bit id), a string (hashed like a string column, a
//!   plainly written integer being that integer), a boolean, or `null`;
//! - bag, sequence: an array of such ids (`null` items are dropped), or `null` (empty);
//!   a bag's weights column: an array of numbers as long as the ids;
//! - labels: 0/1 numbers or booleans, required of a training sample, ignored in a
//!   request.
//!
//! A missing column, an unknown name or a value of the wrong type is refused naming the
//! column; the batch is left as it was.

use crate::batch::Batch;
use crate::chain::Chains;
use crate::schema::{string_key, FeatureSpec, Schema, NULL_KEY};
use serde_json::{Map, Value};

/// What a row's label columns are for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Labels {
    /// A training sample: every label column must hold 0 or 1.
    Required,
    /// A prediction request: label columns may be sent (a logged row as it is) and are
    /// ignored.
    Ignored,
}

/// Appends `row` to `batch` (laid out for `schema`, bags included; `chains` are
/// [`Chains::of`] `schema`); on an error, naming the column, `batch` is left as it was.
pub fn push_json_row(
    batch: &mut Batch,
    schema: &Schema,
    chains: &Chains,
    row: &Map<String, Value>,
    labels: Labels,
) -> Result<(), String> {
    let before = batch.len();
    let pushed = push_features(batch, schema, chains, row, labels);
    if pushed.is_err() {
        batch.truncate(before);
    }
    pushed
}

fn push_features(
    batch: &mut Batch,
    schema: &Schema,
    chains: &Chains,
    row: &Map<String, Value>,
    labels: Labels,
) -> Result<(), String> {
    let known = |name: &str| {
        schema.labels.iter().any(|l| l == name)
            || schema.weight.as_deref() == Some(name)
            || schema
                .features
                .iter()
                .any(|f| f.column() == name || f.weights.as_deref() == Some(name))
    };
    if let Some(name) = row.keys().find(|k| !known(k)) {
        let columns: Vec<&str> = schema.features.iter().map(|f| f.column()).collect();
        return Err(format!(
            "unknown feature `{name}` (the model takes {})",
            columns.join(", ")
        ));
    }
    let get = |f: &FeatureSpec, column: &str| {
        row.get(column).ok_or_else(|| {
            format!(
                "missing feature `{column}` ({:?}; send null for an empty value)",
                f.kind
            )
        })
    };
    let bad = |column: &str, what: &str, v: &Value| {
        format!("feature `{column}`: must be {what}, got {}", type_name(v))
    };
    let number = |f: &FeatureSpec| -> Result<Option<f32>, String> {
        let x = match get(f, f.column())? {
            Value::Null => return Ok(None),
            Value::Bool(b) => f32::from(u8::from(*b)),
            Value::Number(n) => n.as_f64().map_or(f32::NAN, |x| x as f32),
            other => return Err(bad(f.column(), "a number or null", other)),
        };
        if !x.is_finite() {
            return Err(format!("feature `{}`: must be finite", f.column()));
        }
        Ok(Some(x))
    };
    let mut dense = 0;
    for (f, chain) in schema.dense().zip(&chains.dense) {
        let x = number(f)?;
        batch.dense.push(match chain {
            Some(chain) => chain.number(x),
            None => f.transform.apply(x.unwrap_or(0.0)),
        });
        dense += 1;
    }
    if dense == 0 {
        // The constant input of a schema without dense features (Schema::dense_width).
        batch.dense.push(0.0);
    }
    for (f, chain) in schema.categorical().zip(&chains.cats) {
        if let Some(chain) = chain.as_ref().filter(|c| c.reads_numbers()) {
            batch.sparse.push(chain.id_of_number(number(f)?));
            continue;
        }
        let v = get(f, f.column())?;
        let key = id_key(v)
            .ok_or_else(|| bad(f.column(), "an integer, a string, a boolean or null", v))?;
        batch.sparse.push(chain.as_ref().map_or(key, |c| c.id(key)));
    }
    let lists = schema.lists().zip(&chains.lists);
    for ((f, chain), bag) in lists.zip(&mut batch.bags) {
        let ids = match get(f, f.column())? {
            Value::Null => &Vec::new(),
            Value::Array(items) => items,
            other => return Err(bad(f.column(), "an array of ids or null", other)),
        };
        let weights = match &f.weights {
            None => None,
            Some(w) => match get(f, w)? {
                Value::Null => Some(Vec::new()),
                Value::Array(ws) => Some(
                    ws.iter()
                        .map(|w| w.as_f64().map(|w| w as f32))
                        .collect::<Option<Vec<f32>>>()
                        .ok_or_else(|| format!("feature `{w}`: must be an array of numbers"))?,
                ),
                other => return Err(bad(w, "an array of numbers or null", other)),
            },
        };
        if let Some(ws) = &weights {
            if ws.len() != ids.len() {
                return Err(format!(
                    "feature `{}`: {} weight(s) for {} id(s) of `{}`",
                    f.weights.as_deref().unwrap_or_default(),
                    ws.len(),
                    ids.len(),
                    f.column()
                ));
            }
        }
        let mut live = Vec::with_capacity(ids.len());
        for (k, v) in ids.iter().enumerate() {
            if v.is_null() {
                continue;
            }
            let key =
                id_key(v).ok_or_else(|| bad(f.column(), "an array of integers or strings", v))?;
            live.push((key, weights.as_ref().map_or(1.0, |w| w[k])));
        }
        for &(key, w) in &live[f.kept(live.len())] {
            bag.ids.push(key);
            if weights.is_some() {
                bag.weights.push(w);
            }
        }
        bag.end_row();
        if let Some(chain) = chain {
            // Ids a chain makes null are dropped, as the file readers drop them.
            chain.lists(bag, bag.rows() - 1);
        }
    }
    push_labels(batch, schema, row, labels)
}

/// A row's labels and sample weight (a request's are ignored: one label of 0).
fn push_labels(
    batch: &mut Batch,
    schema: &Schema,
    row: &Map<String, Value>,
    labels: Labels,
) -> Result<(), String> {
    match labels {
        Labels::Ignored => batch.labels.push(0.0),
        Labels::Required => {
            for (t, name) in schema.labels.iter().enumerate() {
                let y = match row.get(name) {
                    None | Some(Value::Null) => {
                        return Err(format!(
                            "label `{name}` is missing; a training sample needs it"
                        ))
                    }
                    Some(Value::Bool(b)) => f32::from(u8::from(*b)),
                    Some(Value::Number(n)) if n.as_f64() == Some(0.0) => 0.0,
                    Some(Value::Number(n)) if n.as_f64() == Some(1.0) => 1.0,
                    Some(other) => {
                        return Err(format!("label `{name}`: must be 0 or 1, got {other}"))
                    }
                };
                if t == 0 {
                    batch.labels.push(y);
                } else {
                    batch.task_labels.push(y);
                }
            }
            if let Some(name) = &schema.weight {
                let w = match row.get(name) {
                    Some(Value::Number(n)) => n.as_f64().filter(|w| w.is_finite() && *w >= 0.0),
                    _ => None,
                };
                match w {
                    Some(w) => batch.weights.push(w as f32),
                    None => {
                        let got = row
                            .get(name)
                            .map_or("nothing".to_string(), |v| v.to_string());
                        return Err(format!(
                            "sample weight `{name}`: must be a number >= 0, got {got}"
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// The key of a JSON id, as the readers key the same value in a file; `None` for a
/// value that is not an id.
fn id_key(v: &Value) -> Option<u64> {
    match v {
        Value::Null => Some(NULL_KEY),
        Value::Bool(b) => Some(u64::from(*b)),
        Value::String(s) => Some(string_key(s.as_bytes())),
        Value::Number(n) => n.as_i64().map(|x| x as u64).or_else(|| n.as_u64()),
        _ => None,
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
