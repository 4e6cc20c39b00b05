//! A request's rows for a model trained on named features (`data.label`,
//! `[[data.feature]]`): JSON objects keyed by column name, lists as JSON arrays, read by
//! the same rules as the training files (`elastrec_data::named`), so a row sent here
//! gets the prediction `elastrec eval` gives the same row of a file.
//!
//! - dense: a number or `null` (0), transformed as the feature says;
//! - categorical: an integer (a 64-bit id), a string (hashed like a string column),
//!   a boolean, or `null`;
//! - bag, sequence: an array of such ids (`null` items are dropped), or `null` (empty);
//!   a bag's weights column: an array of numbers as long as the ids.
//!
//! A missing column, an unknown name or a value of the wrong type is refused, naming the
//! row and the column. Label columns may be sent (a logged row as it is) and are ignored.

use elastrec_data::schema::{string_key, NULL_KEY};
use elastrec_data::{Batch, FeatureKind, FeatureSpec, Jagged, Schema};
use serde_json::{Map, Value};

/// The rows of a JSON request body, `{"rows": [{"user_id": 7, "genres": ["a", "b"]}]}`,
/// as a batch of `schema`'s layout.
pub fn batch_from_json(body: &[u8], schema: &Schema, max_rows: usize) -> Result<Batch, String> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Request {
        rows: Vec<Map<String, Value>>,
    }
    let req: Request = serde_json::from_slice(body).map_err(|e| {
        format!(
            "the body is not a prediction request ({e}); send {{\"rows\": [{{{}}}]}}",
            example(schema)
        )
    })?;
    crate::features::check_count(req.rows.len(), max_rows)?;
    let mut batch = Batch::with_widths(req.rows.len(), schema.dense_width(), schema.sparse_width());
    batch.bags = schema.lists().map(|_| Jagged::default()).collect();
    for (i, row) in req.rows.iter().enumerate() {
        push_row(&mut batch, schema, i, row)?;
    }
    Ok(batch)
}

/// `"name": value` for each feature, to show the shape of a request.
fn example(schema: &Schema) -> String {
    let columns: Vec<String> = schema
        .features
        .iter()
        .map(|f| {
            let v = match f.kind {
                FeatureKind::Dense => "1.5",
                FeatureKind::Categorical => "\"id\"",
                FeatureKind::Bag | FeatureKind::Sequence => "[\"id\", \"id\"]",
            };
            format!("\"{}\": {v}", f.column())
        })
        .collect();
    columns.join(", ")
}

fn push_row(
    batch: &mut Batch,
    schema: &Schema,
    i: usize,
    row: &Map<String, Value>,
) -> Result<(), String> {
    let known = |name: &str| {
        schema.labels.iter().any(|l| l == name)
            || schema
                .features
                .iter()
                .any(|f| f.column() == name || f.weights.as_deref() == Some(name))
    };
    if let Some(name) = row.keys().find(|k| !known(k)) {
        let columns: Vec<&str> = schema.features.iter().map(|f| f.column()).collect();
        return Err(format!(
            "row {i}: unknown feature `{name}` (the model takes {})",
            columns.join(", ")
        ));
    }
    let get = |f: &FeatureSpec, column: &str| {
        row.get(column).ok_or_else(|| {
            format!(
                "row {i}: missing feature `{column}` ({:?}; send null for an empty value)",
                f.kind
            )
        })
    };
    let bad = |column: &str, what: &str, v: &Value| {
        format!(
            "row {i}: feature `{column}`: must be {what}, got {}",
            type_name(v)
        )
    };
    let mut dense = 0;
    for f in schema.dense() {
        let v = get(f, f.column())?;
        let x = match v {
            Value::Null => 0.0,
            Value::Bool(b) => f32::from(u8::from(*b)),
            Value::Number(n) => n.as_f64().map_or(f32::NAN, |x| x as f32),
            other => return Err(bad(f.column(), "a number or null", other)),
        };
        if !x.is_finite() {
            return Err(format!("row {i}: feature `{}`: must be finite", f.column()));
        }
        batch.dense.push(f.transform.apply(x));
        dense += 1;
    }
    if dense == 0 {
        // The constant input of a schema without dense features (Schema::dense_width).
        batch.dense.push(0.0);
    }
    for f in schema.categorical() {
        let v = get(f, f.column())?;
        let key = id_key(v)
            .ok_or_else(|| bad(f.column(), "an integer, a string, a boolean or null", v))?;
        batch.sparse.push(key);
    }
    for (f, bag) in schema.lists().zip(&mut batch.bags) {
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
                        .ok_or_else(|| {
                            format!("row {i}: feature `{w}`: must be an array of numbers")
                        })?,
                ),
                other => return Err(bad(w, "an array of numbers or null", other)),
            },
        };
        if let Some(ws) = &weights {
            if ws.len() != ids.len() {
                return Err(format!(
                    "row {i}: feature `{}`: {} weight(s) for {} id(s) of `{}`",
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
    }
    batch.labels.push(0.0);
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

#[cfg(test)]
mod tests {
    use super::*;
    use elastrec_data::TableSpec;
    use serde_json::json;

    fn schema() -> Schema {
        let mut hist = FeatureSpec::new("hist", FeatureKind::Sequence);
        hist.max_len = Some(2);
        hist.table = Some("item".into());
        let mut price = FeatureSpec::new("price", FeatureKind::Dense);
        price.transform = elastrec_data::schema::DenseTransform::Log1p;
        Schema {
            labels: vec!["click".into()],
            features: vec![
                price,
                FeatureSpec::new("item", FeatureKind::Categorical),
                hist,
            ],
            tables: vec![TableSpec {
                name: "item".into(),
                rows: 100,
            }],
            csv: Default::default(),
        }
    }

    fn body(rows: serde_json::Value) -> Vec<u8> {
        serde_json::to_vec(&json!({ "rows": rows })).unwrap()
    }

    #[test]
    fn rows_read_like_the_files_do() {
        let b = batch_from_json(
            &body(json!([
                {"price": 9.0, "item": "x", "hist": [1, null, "y", 3], "click": 1},
                {"price": null, "item": null, "hist": null},
            ])),
            &schema(),
            8,
        )
        .unwrap();
        assert_eq!(b.len(), 2);
        assert_eq!(b.dense, [10f32.ln(), 0.0]);
        assert_eq!(b.sparse, [string_key(b"x"), NULL_KEY]);
        assert_eq!(
            b.bags[0].row(0),
            [string_key(b"y"), 3],
            "the last two, nulls dropped"
        );
        assert!(b.bags[0].row(1).is_empty());
    }

    #[test]
    fn bad_rows_are_refused_naming_row_and_feature() {
        let err = |rows: serde_json::Value| batch_from_json(&body(rows), &schema(), 8).unwrap_err();
        let e = err(json!([{"price": 1, "item": "x"}]));
        assert!(e.contains("row 0: missing feature `hist`"), "{e}");
        let e = err(json!([{"price": 1, "item": "x", "hist": [], "age": 3}]));
        assert!(e.contains("unknown feature `age`"), "{e}");
        let e = err(json!([{"price": "cheap", "item": "x", "hist": []}]));
        assert!(
            e.contains("`price`: must be a number or null, got a string"),
            "{e}"
        );
        let e = err(json!([{"price": 1, "item": [1], "hist": []}]));
        assert!(e.contains("`item`") && e.contains("got an array"), "{e}");
        let e = err(json!([{"price": 1, "item": 1, "hist": 5}]));
        assert!(e.contains("`hist`: must be an array"), "{e}");
        let e = err(json!([]));
        assert!(e.contains("no rows"), "{e}");
    }
}
