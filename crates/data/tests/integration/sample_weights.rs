//! The sample-weight column (`data.weight`) in every reader of named features: its
//! values fill `Batch::weights`, and a weight that is missing, negative or not a number
//! is a bad row naming the column.

use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch};
use elastrec_data::named_json::{push_json_row, Labels};
use elastrec_data::reader::drain;
use elastrec_data::{
    open_source, BadRowPolicy, Batch, BatchReader, FeatureKind, FeatureSpec, Schema,
};
use parquet::arrow::ArrowWriter;
use std::sync::Arc;

fn schema() -> Schema {
    Schema {
        labels: vec!["click".into()],
        weight: Some("w".into()),
        features: vec![FeatureSpec::new("user", FeatureKind::Categorical)],
        ..Schema::default()
    }
}

#[test]
fn csv_weights_fill_the_batch_and_a_bad_one_names_its_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.csv");
    std::fs::write(&path, "click,user,w\n1,10,0.5\n0,11,2\n1,12,0\n").unwrap();
    let s = Arc::new(schema());
    let mut r = open_source(&path, None, BadRowPolicy::Fail, Some(&s)).unwrap();
    let (b, _) = drain(&mut r).unwrap();
    assert_eq!(b.weights, [0.5, 2.0, 0.0]);
    for bad in ["-1", "", "x", "nan", "inf"] {
        std::fs::write(&path, format!("click,user,w\n1,10,1\n0,11,{bad}\n")).unwrap();
        let mut r = open_source(&path, None, BadRowPolicy::Fail, Some(&s)).unwrap();
        let mut b = Batch::default();
        let err = r.next_batch(&mut b, 10).unwrap_err().to_string();
        assert!(
            err.contains("w.csv:3: column w: a sample weight must be a finite number >= 0"),
            "{bad:?}: {err}"
        );
        let mut r = open_source(&path, None, BadRowPolicy::Skip, Some(&s)).unwrap();
        r.next_batch(&mut b, 10).unwrap();
        assert_eq!(
            (b.labels.as_slice(), b.weights.as_slice()),
            (&[1.0][..], &[1.0][..])
        );
    }
    // A log without the column is refused by name.
    std::fs::write(&path, "click,user\n1,10\n").unwrap();
    let err = open_source(&path, None, BadRowPolicy::Fail, Some(&s))
        .err()
        .expect("the weight column is missing")
        .to_string();
    assert!(err.contains("\"w\" (sample weight) is missing"), "{err}");
}

#[test]
fn parquet_weights_fill_the_batch_and_a_null_or_negative_one_is_a_bad_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.parquet");
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("click", Arc::new(Int64Array::from(vec![1, 0, 1, 0]))),
        ("user", Arc::new(Int64Array::from(vec![10, 11, 12, 13]))),
        (
            "w",
            Arc::new(Float64Array::from(vec![
                Some(0.5),
                None,
                Some(-2.0),
                Some(3.0),
            ])),
        ),
    ];
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let mut w =
        ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let s = Arc::new(schema());
    let mut r = open_source(&path, None, BadRowPolicy::Skip, Some(&s)).unwrap();
    let (b, stats) = drain(&mut r).unwrap();
    assert_eq!(b.weights, [0.5, 3.0]);
    assert_eq!(b.labels, [1.0, 0.0]);
    assert_eq!(stats.rows_skipped, 2);
    let mut r = open_source(&path, None, BadRowPolicy::Fail, Some(&s)).unwrap();
    let mut b = Batch::default();
    let err = r.next_batch(&mut b, 10).unwrap_err().to_string();
    assert!(
        err.contains("column w: a sample weight must be a finite number >= 0, got null"),
        "{err}"
    );
}

#[test]
fn a_json_sample_needs_its_weight_and_a_request_does_not() {
    let s = schema();
    let mut b = s.empty_batch();
    let row = |text: &str| -> serde_json::Map<String, serde_json::Value> {
        serde_json::from_str(text).unwrap()
    };
    push_json_row(
        &mut b,
        &s,
        &elastrec_data::chain::Chains::of(&s),
        &row(r#"{"click": 1, "user": 7, "w": 2.5}"#),
        Labels::Required,
    )
    .unwrap();
    assert_eq!(b.weights, [2.5]);
    for bad in [
        r#"{"click": 1, "user": 7}"#,
        r#"{"click": 1, "user": 7, "w": -1}"#,
        r#"{"click": 1, "user": 7, "w": "x"}"#,
    ] {
        let err = push_json_row(
            &mut b,
            &s,
            &elastrec_data::chain::Chains::of(&s),
            &row(bad),
            Labels::Required,
        )
        .unwrap_err();
        assert!(
            err.contains("sample weight `w`: must be a number >= 0"),
            "{bad}: {err}"
        );
        assert_eq!(
            (b.len(), b.weights.len()),
            (1, 1),
            "{bad}: the batch is as it was"
        );
    }
    // A prediction request carries no label and no weight.
    let mut b = s.empty_batch();
    push_json_row(
        &mut b,
        &s,
        &elastrec_data::chain::Chains::of(&s),
        &row(r#"{"user": 7}"#),
        Labels::Ignored,
    )
    .unwrap();
    assert!(b.weights.is_empty());
}
