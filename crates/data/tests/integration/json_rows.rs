//! A named log's rows as JSON (what `elastrec replay --format json` sends): decoded by
//! the online job's JSON reader, every row must be the sample the file reader gives.

use super::named::{log, schema};
use elastrec_data::gen::named::{generate_named, NamedSpec};
use elastrec_data::json_rows::JsonRows;
use elastrec_data::named_json::{push_json_row, Labels};
use elastrec_data::reader::drain;
use elastrec_data::schema::infer;
use elastrec_data::{open_source, BadRowPolicy, Batch, CsvFormat, Schema};
use std::path::Path;
use std::sync::Arc;

/// The file read by its reader, and the same file read as JSON rows and decoded.
fn both_ways(path: &Path, schema: &Schema) -> (Batch, Batch, usize) {
    let shared = Arc::new(schema.clone());
    let mut r = open_source(path, None, BadRowPolicy::Fail, Some(&shared))
        .unwrap_or_else(|e| panic!("{e}"));
    let (want, _) = drain(&mut r).unwrap_or_else(|e| panic!("{e}"));
    let mut got = schema.empty_batch();
    let mut rows = JsonRows::open(path, schema).unwrap_or_else(|e| panic!("{e}"));
    let mut n = 0;
    while let Some(row) = rows.next_row().unwrap_or_else(|e| panic!("{e}")) {
        push_json_row(
            &mut got,
            schema,
            &elastrec_data::chain::Chains::of(schema),
            &row,
            Labels::Required,
        )
        .unwrap_or_else(|e| panic!("row {n} {row:?}: {e}"));
        n += 1;
    }
    (want, got, n)
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap()
}

fn assert_same(want: &Batch, got: &Batch) {
    assert_eq!(got.labels, want.labels);
    assert_eq!(got.task_labels, want.task_labels);
    assert_eq!(got.weights, want.weights);
    assert_eq!(got.dense, want.dense);
    assert_eq!(got.sparse, want.sparse);
    assert_eq!(got.bags, want.bags);
}

#[test]
fn a_parquet_log_with_nulls_and_weighted_lists_reads_back_the_same_through_json() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.parquet");
    log(&path);
    let (want, got, n) = both_ways(&path, &schema());
    assert_eq!(n, 4);
    assert_same(&want, &got);
    // Only the schema's columns are written, as the file holds them.
    let row = JsonRows::open(&path, &schema())
        .unwrap()
        .next_row()
        .unwrap()
        .unwrap();
    assert_eq!(
        serde_json::Value::Object(row),
        json(
            r#"{"click":1,"price":9.0,"user":10,"item":"x","tags":["a","b"],"tag_weights":[2.0,1.0],"hist":[1,2,3,4,5]}"#
        )
    );
}

#[test]
fn generated_logs_in_parquet_and_csv_read_back_the_same_through_json() {
    let dir = tempfile::tempdir().unwrap();
    for csv in [false, true] {
        let report = generate_named(&NamedSpec {
            out: dir.path().join(if csv { "csv" } else { "parquet" }),
            rows: 3000,
            days: 1,
            seed: 11,
            csv,
        })
        .unwrap();
        let file = &report.files[0];
        let labels = ["click".to_string()];
        let schema = infer(file, &labels, 1 << 20, &CsvFormat::default())
            .unwrap()
            .schema;
        let (want, got, n) = both_ways(file, &schema);
        assert_eq!(n, 3000, "{}", file.display());
        assert_same(&want, &got);
    }
}

#[test]
fn a_csv_log_with_empty_fields_and_items_reads_back_the_same_through_json() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.csv");
    std::fs::write(
        &path,
        "click,price,user,item,tags,tag_weights,hist,unused\n\
         1,9.5,10,x,a|b,2|1,1|2|3|4|5,u\n\
         0,,11,,,,,u\n\
         1,0,-7,007,c|,1|1,7,u\n",
    )
    .unwrap();
    let (want, got, n) = both_ways(&path, &schema());
    assert_eq!(n, 3);
    assert_same(&want, &got);
    let mut rows = JsonRows::open(&path, &schema()).unwrap();
    rows.next_row().unwrap();
    rows.next_row().unwrap();
    let third = serde_json::Value::Object(rows.next_row().unwrap().unwrap());
    // A plain integer is a number; "007" is text and stays a string; an empty item is null.
    assert_eq!(
        third,
        json(
            r#"{"click":1,"price":0.0,"user":-7,"item":"007","tags":["c",null],"tag_weights":[1.0,1.0],"hist":[7]}"#
        )
    );
}

#[test]
fn a_missing_column_or_a_bad_value_names_the_file_the_row_and_the_column() {
    let dir = tempfile::tempdir().unwrap();
    let parquet = dir.path().join("log.parquet");
    log(&parquet);
    let mut wider = schema();
    wider.labels.push("conversion".into());
    let err = JsonRows::open(&parquet, &wider).unwrap_err().to_string();
    assert!(
        err.contains("log.parquet") && err.contains("\"conversion\"") && err.contains("missing"),
        "{err}"
    );
    let csv = dir.path().join("bad.csv");
    std::fs::write(
        &csv,
        "click,price,user,item,tags,tag_weights,hist,unused\n\
         1,9.5,10,x,a,1,1,u\n\
         1,cheap,10,x,a,1,1,u\n",
    )
    .unwrap();
    let mut rows = JsonRows::open(&csv, &schema()).unwrap();
    assert!(rows.next_row().unwrap().is_some());
    let err = rows.next_row().unwrap_err().to_string();
    assert!(
        err.contains("bad.csv:3") && err.contains("price") && err.contains("cheap"),
        "{err}"
    );
}
