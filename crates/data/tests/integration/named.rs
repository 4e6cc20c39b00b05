//! Parquet with named columns of any type, read through a schema or inferred from one.

use arrow_array::builder::{Float32Builder, Int64Builder, ListBuilder, StringBuilder};
use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use elastrec_data::schema::{infer, string_key, NULL_KEY};
use elastrec_data::{
    open_source, BadRowPolicy, Batch, BatchReader, FeatureKind, FeatureSpec, Schema, TableSpec,
};
use parquet::arrow::ArrowWriter;
use std::path::Path;
use std::sync::Arc;

fn write(path: &Path, columns: Vec<(&str, ArrayRef)>) {
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let mut w =
        ArrowWriter::try_new(std::fs::File::create(path).unwrap(), batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

/// Four rows: labels, a nullable price, int and string ids, a tag list with a null list
/// and a null item, a history longer than its max_len, and weighted tags.
pub(crate) fn log(path: &Path) {
    let mut tags = ListBuilder::new(StringBuilder::new());
    let mut hist = ListBuilder::new(Int64Builder::new());
    let mut weights = ListBuilder::new(Float32Builder::new());
    for (t, h, w) in [
        (
            Some(vec![Some("a"), Some("b")]),
            vec![1, 2, 3, 4, 5],
            vec![2.0, 1.0],
        ),
        (None, vec![], vec![]),
        (Some(vec![Some("c"), None]), vec![7], vec![1.0, 1.0]),
        (Some(vec![]), vec![8, 9], vec![]),
    ] {
        match t {
            Some(items) => {
                for i in items {
                    tags.values().append_option(i);
                }
                tags.append(true);
            }
            None => tags.append(false),
        }
        for v in h {
            hist.values().append_value(v);
        }
        hist.append(true);
        for v in w {
            weights.values().append_value(v);
        }
        weights.append(true);
    }
    write(
        path,
        vec![
            ("click", Arc::new(Int64Array::from(vec![1, 0, 1, 0]))),
            (
                "price",
                Arc::new(Float64Array::from(vec![
                    Some(9.0),
                    None,
                    Some(0.0),
                    Some(1.0),
                ])),
            ),
            ("user", Arc::new(Int64Array::from(vec![10, 11, -7, 10]))),
            (
                "item",
                Arc::new(StringArray::from(vec![
                    Some("x"),
                    None,
                    Some("y"),
                    Some("x"),
                ])),
            ),
            ("tags", Arc::new(tags.finish())),
            ("tag_weights", Arc::new(weights.finish())),
            ("hist", Arc::new(hist.finish())),
            ("unused", Arc::new(StringArray::from(vec!["u"; 4]))),
        ],
    );
}

pub(crate) fn schema() -> Schema {
    let mut price = FeatureSpec::new("price", FeatureKind::Dense);
    price.transform = elastrec_data::schema::DenseTransform::Log1p;
    let mut tags = FeatureSpec::new("tags", FeatureKind::Bag);
    tags.max_len = Some(8);
    let mut weighted = FeatureSpec::new("weighted_tags", FeatureKind::Bag);
    weighted.column = Some("tags".into());
    weighted.weights = Some("tag_weights".into());
    weighted.table = Some("tags".into());
    let mut hist = FeatureSpec::new("hist", FeatureKind::Sequence);
    hist.max_len = Some(3);
    let mut hist_head = FeatureSpec::new("hist_head", FeatureKind::Bag);
    hist_head.column = Some("hist".into());
    hist_head.max_len = Some(3);
    Schema {
        labels: vec!["click".into()],
        weight: None,
        features: vec![
            price,
            FeatureSpec::new("user", FeatureKind::Categorical),
            FeatureSpec::new("item", FeatureKind::Categorical),
            tags,
            weighted,
            hist,
            hist_head,
        ],
        tables: vec![TableSpec {
            name: "tags".into(),
            rows: 100,
        }],
        csv: Default::default(),
    }
}

fn read(
    path: &Path,
    range: Option<(u64, u64)>,
    schema: Schema,
) -> (Batch, elastrec_data::ReadStats) {
    let mut r = open_source(path, range, BadRowPolicy::Fail, Some(&Arc::new(schema))).unwrap();
    let mut b = Batch::default();
    let n = r.next_batch(&mut b, 100).unwrap();
    assert_eq!(n, b.len());
    assert_eq!(r.next_batch(&mut Batch::default(), 100).unwrap(), 0);
    (b, r.stats().clone())
}

#[test]
fn any_schema_reads_into_dense_ids_and_jagged_lists() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.parquet");
    log(&path);
    let (b, stats) = read(&path, None, schema());
    assert_eq!(b.labels, [1.0, 0.0, 1.0, 0.0]);
    assert_eq!((b.dense_width, b.sparse_width, b.bags.len()), (1, 2, 4));
    // log1p of the price; null is 0.
    assert_eq!(b.dense, [10f32.ln(), 0.0, 0.0, 2f32.ln()]);
    let (x, y) = (string_key(b"x"), string_key(b"y"));
    assert_eq!(
        b.sparse,
        [10, x, 11, NULL_KEY, -7i64 as u64, y, 10, x],
        "ints as they are, strings hashed, null as NULL_KEY"
    );
    let tags = &b.bags[0];
    assert_eq!(tags.row(0), [string_key(b"a"), string_key(b"b")]);
    assert!(tags.row(1).is_empty(), "a null list is empty");
    assert_eq!(tags.row(2), [string_key(b"c")], "a null item is dropped");
    assert!(tags.row(3).is_empty());
    assert!(tags.weights.is_empty());
    let weighted = &b.bags[1];
    assert_eq!(weighted.row_weights(0), [2.0, 1.0]);
    assert_eq!(
        weighted.row_weights(2),
        [1.0],
        "the null item's weight goes with it"
    );
    // A sequence keeps its most recent (last) items, a bag its first.
    assert_eq!(b.bags[2].row(0), [3, 4, 5]);
    assert_eq!(b.bags[3].row(0), [1, 2, 3]);
    assert_eq!(b.bags[2].row(3), [8, 9]);
    assert_eq!(stats.rows_read, 4);
    assert_eq!(
        stats.lists_truncated, 2,
        "hist row 0, as a sequence and as a bag"
    );
    assert_eq!(stats.list_nulls, 2, "one null tag, read by two features");
}

#[test]
fn a_row_range_reads_those_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.parquet");
    log(&path);
    let (all, _) = read(&path, None, schema());
    let (part, _) = read(&path, Some((1, 3)), schema());
    let mut want = Batch::default();
    want.take_layout(&all);
    want.extend_from(&all, 1..3);
    assert_eq!(part, want);
}

#[test]
fn a_missing_column_or_a_wrong_type_names_the_file_and_the_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.parquet");
    log(&path);
    let open = |schema: Schema| {
        open_source(&path, None, BadRowPolicy::Fail, Some(&Arc::new(schema)))
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    let mut s = schema();
    s.features.push(FeatureSpec::new("age", FeatureKind::Dense));
    let err = open(s);
    assert!(err.contains("log.parquet"), "{err}");
    assert!(err.contains("\"age\"") && err.contains("missing"), "{err}");
    assert!(
        err.contains("click, price"),
        "lists the file's columns: {err}"
    );
    let mut s = schema();
    s.features
        .push(FeatureSpec::new("unused", FeatureKind::Dense));
    let err = open(s);
    assert!(
        err.contains("\"unused\" is Utf8") && err.contains("dense"),
        "{err}"
    );
    let mut s = schema();
    s.features.push(FeatureSpec::new("user", FeatureKind::Bag));
    s.features.last_mut().unwrap().name = "user_list".into();
    s.features.last_mut().unwrap().column = Some("user".into());
    let err = open(s);
    assert!(
        err.contains("\"user\" is Int64") && err.contains("list"),
        "{err}"
    );
}

#[test]
fn a_bad_label_names_file_row_and_column_and_skip_counts_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.parquet");
    write(
        &path,
        vec![
            (
                "click",
                Arc::new(Int64Array::from(vec![Some(1), None, Some(3), Some(0)])),
            ),
            ("user", Arc::new(Int64Array::from(vec![1, 2, 3, 4]))),
        ],
    );
    let s = Arc::new(Schema {
        labels: vec!["click".into()],
        weight: None,
        features: vec![FeatureSpec::new("user", FeatureKind::Categorical)],
        tables: Vec::new(),
        csv: Default::default(),
    });
    let mut r = open_source(&path, None, BadRowPolicy::Fail, Some(&s)).unwrap();
    let mut b = Batch::default();
    let err = r.next_batch(&mut b, 10).unwrap_err().to_string();
    assert!(
        err.contains("bad.parquet") && err.contains("row 1"),
        "{err}"
    );
    assert!(err.contains("click"), "{err}");
    assert_eq!(b.sparse, [1], "the rows before it stay");
    let mut r = open_source(&path, None, BadRowPolicy::Skip, Some(&s)).unwrap();
    r.next_batch(&mut b, 10).unwrap();
    assert_eq!(b.sparse, [1, 4]);
    assert_eq!(r.stats().rows_skipped, 2);
}

#[test]
fn inference_types_the_columns_sizes_the_tables_and_shares_an_item_table() {
    let dir = tempfile::tempdir().unwrap();
    let report = elastrec_data::gen::named::generate_named(&elastrec_data::gen::named::NamedSpec {
        out: dir.path().to_path_buf(),
        rows: 3000,
        days: 1,
        seed: 5,
        csv: false,
    })
    .unwrap();
    let got = infer(
        &report.files[0],
        &["click".into()],
        1 << 20,
        &Default::default(),
    )
    .unwrap();
    let s = &got.schema;
    let kind = |n: &str| s.features.iter().find(|f| f.name == n).unwrap();
    assert_eq!(kind("price").kind, FeatureKind::Dense);
    assert_eq!(kind("user_id").kind, FeatureKind::Categorical);
    assert_eq!(kind("item_id").kind, FeatureKind::Categorical);
    assert_eq!(kind("genres").kind, FeatureKind::Bag);
    assert_eq!(kind("genres").max_len, Some(4));
    assert_eq!(
        kind("hist_items").table(),
        "item_id",
        "the history holds item ids: it shares their table"
    );
    assert_eq!(got.sampled_rows, 3000);
    assert!(got.skipped.is_empty());
    s.validate().unwrap();
    let rows = |t: &str| s.tables.iter().find(|x| x.name == t).unwrap().rows;
    assert_eq!(rows("device"), 100_000, "3 values: the smallest table");
    assert_eq!(
        rows("item_id"),
        100_000,
        "fewer than 25,000 items: the smallest table"
    );
    let big = infer(
        &report.files[0],
        &["click".into()],
        50_000,
        &Default::default(),
    )
    .unwrap()
    .schema;
    assert!(
        big.tables.iter().all(|t| t.rows == 50_000),
        "max_table_rows caps every table"
    );
    // The inferred schema reads the file.
    let mut r = open_source(
        &report.files[0],
        None,
        BadRowPolicy::Fail,
        Some(&Arc::new(s.clone())),
    )
    .unwrap();
    let mut b = Batch::default();
    assert_eq!(r.next_batch(&mut b, 5000).unwrap(), 3000);
    let missing = infer(
        &report.files[0],
        &["clicked".into()],
        1 << 20,
        &Default::default(),
    )
    .unwrap_err();
    assert!(
        missing.to_string().contains("\"clicked\" is missing"),
        "{missing}"
    );
}
