//! A request's rows: raw Criteo-layout features by name (`I1`..`I13`, `C1`..`C26`), checked
//! one by one so that a bad request is refused naming its row and feature.
//!
//! Every feature must be present: a missing one is more often a client bug than an empty
//! field, so an empty field is said explicitly (`null` in JSON, `empty` in gRPC). Unknown
//! names, integers that are not integers and categories that are not 8 hex digits are
//! refused the same way. The row then goes through the model's own preprocessing, as a row
//! of a training file would.

use elastrec_data::{criteo, RawRow};

/// A feature's value as a request carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    /// An integer.
    Int(i64),
    /// A string (a category's hex digits).
    Text(&'a str),
    /// Explicitly empty.
    Empty,
    /// Anything else; the name of its type, for the error.
    Other(&'static str),
}

/// Where a feature goes in a [`RawRow`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Int(usize),
    Cat(usize),
}

/// `I1`..`I13` and `C1`..`C26`.
fn slot(name: &str) -> Option<Slot> {
    let (kind, number) = name.split_at_checked(1)?;
    // No sign, no leading zero: `I01` and `I+1` are not feature names.
    if number.starts_with(['0', '+']) {
        return None;
    }
    let n: usize = number.parse().ok()?;
    match kind {
        "I" if (1..=criteo::DENSE).contains(&n) => Some(Slot::Int(n - 1)),
        "C" if (1..=criteo::CATEGORICAL).contains(&n) => Some(Slot::Cat(n - 1)),
        _ => None,
    }
}

/// Exactly 8 hex digits, as in Criteo files.
fn category(text: &str) -> Option<u32> {
    if text.len() != 8 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(text, 16).ok()
}

/// Builds row `index` of a request from its `(name, value)` pairs.
pub fn parse_row<'a>(
    index: usize,
    features: impl IntoIterator<Item = (&'a str, Value<'a>)>,
) -> Result<RawRow, String> {
    let mut row = RawRow::default();
    let mut seen_ints = [false; criteo::DENSE];
    let mut seen_cats = [false; criteo::CATEGORICAL];
    for (name, value) in features {
        let bad = |what: String| Err(format!("row {index}: feature {name}: {what}"));
        match (slot(name), value) {
            (None, _) => {
                return Err(format!(
                    "row {index}: unknown feature `{name}` (the model takes I1..I{} and C1..C{})",
                    criteo::DENSE,
                    criteo::CATEGORICAL
                ))
            }
            (Some(Slot::Int(i)), v) => {
                seen_ints[i] = true;
                row.ints[i] = match v {
                    Value::Int(x) => Some(x),
                    Value::Empty => None,
                    Value::Text(_) => return bad("must be an integer or null, got a string".into()),
                    Value::Other(t) => return bad(format!("must be an integer or null, got {t}")),
                };
            }
            (Some(Slot::Cat(j)), v) => {
                seen_cats[j] = true;
                row.cats[j] = match v {
                    Value::Text("") | Value::Empty => None,
                    Value::Text(t) => match category(t) {
                        Some(c) => Some(c),
                        None => return bad(format!("must be 8 hex digits, got \"{t}\"")),
                    },
                    Value::Int(_) => {
                        return bad("must be a string of 8 hex digits or null, got a number".into())
                    }
                    Value::Other(t) => {
                        return bad(format!("must be a string of 8 hex digits or null, got {t}"))
                    }
                };
            }
        }
    }
    let missing: Vec<String> = (0..criteo::DENSE)
        .filter(|&i| !seen_ints[i])
        .map(|i| format!("I{}", i + 1))
        .chain(
            (0..criteo::CATEGORICAL)
                .filter(|&j| !seen_cats[j])
                .map(|j| format!("C{}", j + 1)),
        )
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "row {index}: missing feature{} {} (send null for an empty field)",
            if missing.len() > 1 { "s" } else { "" },
            missing.join(", ")
        ));
    }
    Ok(row)
}

/// A JSON value as a [`Value`].
pub fn json_value(v: &serde_json::Value) -> Value<'_> {
    match v {
        serde_json::Value::Null => Value::Empty,
        serde_json::Value::String(s) => Value::Text(s),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => Value::Int(i),
            None => Value::Other("a number that is not a 64-bit integer"),
        },
        serde_json::Value::Bool(_) => Value::Other("a boolean"),
        serde_json::Value::Array(_) => Value::Other("an array"),
        serde_json::Value::Object(_) => Value::Other("an object"),
    }
}

/// The rows of a JSON request body, `{"rows": [{"I1": 3, ..., "C26": "0a1b2c3d"}, ...]}`.
pub fn rows_from_json(body: &[u8], max_rows: usize) -> Result<Vec<RawRow>, String> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Request {
        rows: Vec<serde_json::Map<String, serde_json::Value>>,
    }
    let req: Request = serde_json::from_slice(body).map_err(|e| {
        format!("the body is not a prediction request ({e}); send {{\"rows\": [{{\"I1\": 3, ..., \"C26\": \"0a1b2c3d\"}}]}}")
    })?;
    check_count(req.rows.len(), max_rows)?;
    req.rows
        .iter()
        .enumerate()
        .map(|(i, row)| parse_row(i, row.iter().map(|(k, v)| (k.as_str(), json_value(v)))))
        .collect()
}

/// The rows of a gRPC request.
pub fn rows_from_proto(
    rows: &[elastrec_proto::serve::Row],
    max_rows: usize,
) -> Result<Vec<RawRow>, String> {
    use elastrec_proto::serve::feature::Value as F;
    check_count(rows.len(), max_rows)?;
    rows.iter()
        .enumerate()
        .map(|(i, row)| {
            parse_row(
                i,
                row.features.iter().map(|(k, f)| {
                    let v = match &f.value {
                        Some(F::Int(x)) => Value::Int(*x),
                        Some(F::Category(s)) => Value::Text(s),
                        Some(F::Empty(_)) => Value::Empty,
                        None => Value::Other("a feature with no value set"),
                    };
                    (k.as_str(), v)
                }),
            )
        })
        .collect()
}

/// `row` as a JSON request row: what a client sends, the inverse of [`rows_from_json`].
pub fn json_row(row: &RawRow) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for (i, v) in row.ints.iter().enumerate() {
        m.insert(format!("I{}", i + 1), serde_json::json!(v));
    }
    for (j, c) in row.cats.iter().enumerate() {
        m.insert(
            format!("C{}", j + 1),
            serde_json::json!(c.map(|c| format!("{c:08x}"))),
        );
    }
    serde_json::Value::Object(m)
}

/// `row` as a gRPC request row, the inverse of [`rows_from_proto`].
pub fn proto_row(row: &RawRow) -> elastrec_proto::serve::Row {
    use elastrec_proto::serve::feature::Value as F;
    use elastrec_proto::serve::Feature;
    let ints = row.ints.iter().enumerate().map(|(i, v)| {
        let v = v.map_or(F::Empty(true), F::Int);
        (format!("I{}", i + 1), Feature { value: Some(v) })
    });
    let cats = row.cats.iter().enumerate().map(|(j, c)| {
        let v = c.map_or(F::Empty(true), |c| F::Category(format!("{c:08x}")));
        (format!("C{}", j + 1), Feature { value: Some(v) })
    });
    elastrec_proto::serve::Row {
        features: ints.chain(cats).collect(),
    }
}

pub(crate) fn check_count(rows: usize, max_rows: usize) -> Result<(), String> {
    if rows == 0 {
        return Err("the request has no rows".into());
    }
    if rows > max_rows {
        return Err(format!(
            "{rows} rows in one request; this server takes at most {max_rows} (--max-batch)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full_row() -> serde_json::Map<String, serde_json::Value> {
        let mut m = serde_json::Map::new();
        for i in 1..=criteo::DENSE {
            m.insert(format!("I{i}"), serde_json::json!(i as i64 * 10));
        }
        for j in 1..=criteo::CATEGORICAL {
            m.insert(
                format!("C{j}"),
                serde_json::json!(format!("{:08x}", j * 17)),
            );
        }
        m
    }

    fn request(rows: Vec<serde_json::Map<String, serde_json::Value>>) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({ "rows": rows })).unwrap()
    }

    #[test]
    fn a_full_row_parses_like_a_tsv_row() {
        let mut row = full_row();
        row.insert("I4".into(), serde_json::Value::Null);
        row.insert("C7".into(), serde_json::Value::Null);
        row.insert("C8".into(), serde_json::json!(""));
        let got = rows_from_json(&request(vec![row]), 8).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].ints[0], Some(10));
        assert_eq!(got[0].ints[3], None);
        assert_eq!(got[0].cats[0], Some(17));
        assert_eq!(got[0].cats[6], None);
        assert_eq!(got[0].cats[7], None);
        assert_eq!(got[0].cats[25], Some(26 * 17));
    }

    #[test]
    fn bad_rows_are_refused_naming_the_row_and_feature() {
        let err = |mutate: &dyn Fn(&mut serde_json::Map<String, serde_json::Value>)| {
            let mut bad = full_row();
            mutate(&mut bad);
            rows_from_json(&request(vec![full_row(), bad]), 8).unwrap_err()
        };
        assert_eq!(
            err(&|r| {
                r.remove("C3");
                r.remove("I2");
            }),
            "row 1: missing features I2, C3 (send null for an empty field)"
        );
        assert!(err(&|r| {
            r.insert("C27".into(), serde_json::json!("00000000"));
        })
        .starts_with("row 1: unknown feature `C27`"));
        assert!(err(&|r| {
            r.insert("I01".into(), serde_json::json!(1));
        })
        .starts_with("row 1: unknown feature `I01`"));
        assert_eq!(
            err(&|r| {
                r.insert("I5".into(), serde_json::json!("7"));
            }),
            "row 1: feature I5: must be an integer or null, got a string"
        );
        assert_eq!(
            err(&|r| {
                r.insert("I5".into(), serde_json::json!(1.5));
            }),
            "row 1: feature I5: must be an integer or null, got a number that is not a 64-bit integer"
        );
        assert_eq!(
            err(&|r| {
                r.insert("C2".into(), serde_json::json!("xyz"));
            }),
            "row 1: feature C2: must be 8 hex digits, got \"xyz\""
        );
        assert_eq!(
            err(&|r| {
                r.insert("C2".into(), serde_json::json!(5));
            }),
            "row 1: feature C2: must be a string of 8 hex digits or null, got a number"
        );
    }

    #[test]
    fn rows_sent_as_json_or_protobuf_come_back_unchanged() {
        let rows = rows_from_json(&request(vec![full_row()]), 8).unwrap();
        let mut row = rows[0];
        row.ints[2] = None;
        row.cats[4] = None;
        let body = serde_json::to_vec(&serde_json::json!({ "rows": [json_row(&row)] })).unwrap();
        assert_eq!(rows_from_json(&body, 8).unwrap(), vec![row]);
        assert_eq!(rows_from_proto(&[proto_row(&row)], 8).unwrap(), vec![row]);
    }

    #[test]
    fn bodies_that_are_not_requests_are_refused() {
        assert!(rows_from_json(b"{\"row\": []}", 8)
            .unwrap_err()
            .starts_with("the body is not a prediction request"));
        assert!(rows_from_json(b"not json", 8)
            .unwrap_err()
            .starts_with("the body is not a prediction request"));
        assert_eq!(
            rows_from_json(b"{\"rows\": []}", 8).unwrap_err(),
            "the request has no rows"
        );
        assert_eq!(
            rows_from_json(&request(vec![full_row(); 3]), 2).unwrap_err(),
            "3 rows in one request; this server takes at most 2 (--max-batch)"
        );
    }
}
