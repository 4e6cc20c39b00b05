//! A request's rows for a model trained on named features (`data.label`,
//! `[[data.feature]]`): JSON objects keyed by column name, lists as JSON arrays, read by
//! `elastrec_data::named_json` by the same rules as the training files, so a row sent
//! here gets the prediction `elastrec eval` gives the same row of a file. A bad row is
//! refused naming the row and the column; label columns may be sent and are ignored.

use elastrec_data::named_json::{push_json_row, Labels};
use elastrec_data::{Batch, FeatureKind, Schema};
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
    // A request's rows carry no labels: one (ignored) task.
    let mut batch = schema.empty_batch();
    batch.tasks = 1;
    let chains = elastrec_data::chain::Chains::of(schema);
    for (i, row) in req.rows.iter().enumerate() {
        push_json_row(&mut batch, schema, &chains, row, Labels::Ignored)
            .map_err(|e| format!("row {i}: {e}"))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use elastrec_data::schema::{string_key, NULL_KEY};
    use elastrec_data::{FeatureSpec, TableSpec};
    use serde_json::json;

    fn schema() -> Schema {
        let mut hist = FeatureSpec::new("hist", FeatureKind::Sequence);
        hist.max_len = Some(2);
        hist.table = Some("item".into());
        let mut price = FeatureSpec::new("price", FeatureKind::Dense);
        price.transform = elastrec_data::schema::DenseTransform::Log1p;
        Schema {
            labels: vec!["click".into()],
            weight: None,
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
