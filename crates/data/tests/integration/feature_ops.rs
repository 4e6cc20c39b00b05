//! A named feature's own operator chain (`data.feature.ops`): the same values from a
//! Parquet file, the same rows as CSV, and the same rows sent as JSON.

use super::named::log;
use elastrec_data::chain::Chains;
use elastrec_data::json_rows::JsonRows;
use elastrec_data::named_json::{push_json_row, Labels};
use elastrec_data::ops::kernels::{gram, sigrid_one, sigrid_salt};
use elastrec_data::reader::drain;
use elastrec_data::schema::{string_key, NULL_KEY};
use elastrec_data::{open_source, BadRowPolicy, Batch, FeatureKind, FeatureSpec, Schema};
use std::path::Path;
use std::sync::Arc;

fn feature(name: &str, column: &str, kind: FeatureKind, ops: &[&str]) -> FeatureSpec {
    let mut f = FeatureSpec::new(name, kind);
    f.column = Some(column.into());
    f.ops = ops.iter().map(|s| s.to_string()).collect();
    f
}

/// Every kind of chain over the columns of [`log`].
fn schema() -> Schema {
    let mut hist = feature("hist", "hist", FeatureKind::Sequence, &["ngram(2)"]);
    hist.max_len = Some(3);
    let mut first_tag = feature("first_tag", "tags", FeatureKind::Bag, &["first_x(1)"]);
    first_tag.weights = Some("tag_weights".into());
    Schema {
        labels: vec!["click".into()],
        weight: None,
        features: vec![
            feature(
                "price",
                "price",
                FeatureKind::Dense,
                &["fill_null(5)", "clamp(max=4)", "log1p"],
            ),
            feature(
                "price_bucket",
                "price",
                FeatureKind::Categorical,
                &["bucketize([0.5, 5])"],
            ),
            feature(
                "user",
                "user",
                FeatureKind::Categorical,
                &["map_id({10: 1, 11: 2}, default = 0)"],
            ),
            feature("item", "item", FeatureKind::Categorical, &[]),
            hist,
            first_tag,
            feature("tags", "tags", FeatureKind::Bag, &["sigrid_hash(7, 50)"]),
            feature(
                "hist_mapped",
                "hist",
                FeatureKind::Bag,
                &["map_id({1: 100, 8: 800})"],
            ),
        ],
        tables: Vec::new(),
        csv: Default::default(),
    }
}

/// [`log`]'s rows as CSV.
fn log_csv(path: &Path) {
    std::fs::write(
        path,
        "click,price,user,item,tags,tag_weights,hist,unused\n\
         1,9,10,x,a|b,2|1,1|2|3|4|5,u\n\
         0,,11,,,,,u\n\
         1,0,-7,y,c|,1|1,7,u\n\
         0,1,10,x,,,8|9,u\n",
    )
    .unwrap();
}

fn read(path: &Path, schema: &Schema) -> (Batch, elastrec_data::ReadStats) {
    let mut r = open_source(
        path,
        None,
        BadRowPolicy::Fail,
        Some(&Arc::new(schema.clone())),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    drain(&mut r).unwrap_or_else(|e| panic!("{e}"))
}

fn through_json(path: &Path, schema: &Schema) -> Batch {
    let mut got = schema.empty_batch();
    let chains = Chains::of(schema);
    let mut rows = JsonRows::open(path, schema).unwrap_or_else(|e| panic!("{e}"));
    while let Some(row) = rows.next_row().unwrap_or_else(|e| panic!("{e}")) {
        push_json_row(&mut got, schema, &chains, &row, Labels::Required)
            .unwrap_or_else(|e| panic!("{row:?}: {e}"));
    }
    got
}

fn rows(list: &elastrec_data::Jagged) -> Vec<Vec<u64>> {
    (0..list.rows()).map(|r| list.row(r).to_vec()).collect()
}

#[test]
fn each_kind_of_chain_gives_its_values_from_parquet_csv_and_json_alike() {
    let dir = tempfile::tempdir().unwrap();
    let (parquet, csv) = (dir.path().join("log.parquet"), dir.path().join("log.csv"));
    log(&parquet);
    log_csv(&csv);
    let schema = schema();
    schema.validate().unwrap();
    let (b, stats) = read(&parquet, &schema);

    // price 9, null, 0, 1: filled with 5, clamped at 4, then ln(1 + x).
    let ln = |x: f32| (1.0 + x).ln();
    assert_eq!(b.dense, vec![ln(4.0), ln(4.0), 0.0, ln(1.0)]);
    // Categorical slots per row: the price's bucket, the mapped user, the item.
    let slots: Vec<&[u64]> = b.sparse.chunks(3).collect();
    assert_eq!(
        slots.iter().map(|s| s[0]).collect::<Vec<_>>(),
        vec![2, NULL_KEY, 0, 1]
    );
    assert_eq!(
        slots.iter().map(|s| s[1]).collect::<Vec<_>>(),
        vec![1, 2, 0, 1]
    );
    assert_eq!(slots[0][2], string_key(b"x"));

    let (hist, first_tag, tags, mapped) = (&b.bags[0], &b.bags[1], &b.bags[2], &b.bags[3]);
    // The last 3 clicks, then their 2-grams: [3, 4, 5] -> (3,4), (4,5).
    let g = |a: u64, b: u64| gram([a, b]);
    assert_eq!(
        rows(hist),
        vec![vec![g(3, 4), g(4, 5)], vec![], vec![], vec![g(8, 9)]]
    );
    assert_eq!(
        rows(first_tag),
        vec![
            vec![string_key(b"a")],
            vec![],
            vec![string_key(b"c")],
            vec![]
        ]
    );
    assert_eq!(
        first_tag.weights,
        vec![2.0, 1.0],
        "weights follow the ids kept"
    );
    let salt = sigrid_salt(7);
    let hashed = |t: &[u8]| sigrid_one(string_key(t), salt, 50);
    assert_eq!(
        rows(tags),
        vec![
            vec![hashed(b"a"), hashed(b"b")],
            vec![],
            vec![hashed(b"c")],
            vec![]
        ]
    );
    assert_eq!(rows(mapped), vec![vec![100], vec![], vec![], vec![800]]);
    // Dropped as null: the file's null tag (read by two features) and the 6 history
    // ids `map_id` has no entry for.
    assert_eq!(stats.list_nulls, 2 + 6);

    let (from_csv, csv_stats) = read(&csv, &schema);
    assert_eq!(from_csv.dense, b.dense);
    assert_eq!(from_csv.sparse, b.sparse);
    assert_eq!(from_csv.bags, b.bags);
    assert_eq!(csv_stats.list_nulls, stats.list_nulls);
    for path in [&parquet, &csv] {
        let json = through_json(path, &schema);
        assert_eq!(json.dense, b.dense, "{}", path.display());
        assert_eq!(json.sparse, b.sparse, "{}", path.display());
        assert_eq!(json.bags, b.bags, "{}", path.display());
    }

    // Bounded chains size their tables (4 rows per id, 1,024 at least); the others get
    // the default.
    let rows_of: Vec<(&str, u64)> = schema
        .table_names()
        .into_iter()
        .zip(schema.table_rows())
        .collect();
    assert_eq!(
        rows_of,
        vec![
            ("price_bucket", 1024),
            ("user", 1024),
            ("item", elastrec_data::schema::DEFAULT_SCHEMA_TABLE_ROWS),
            ("hist", elastrec_data::schema::DEFAULT_SCHEMA_TABLE_ROWS),
            (
                "first_tag",
                elastrec_data::schema::DEFAULT_SCHEMA_TABLE_ROWS
            ),
            ("tags", 1024),
            // Ids up to 800: 801 · 4.
            ("hist_mapped", 3204),
        ]
    );
}

#[test]
fn a_chain_that_does_not_fit_its_feature_is_refused_naming_the_feature_and_the_operator() {
    let refused = |f: FeatureSpec| {
        let mut s = schema();
        s.features.push(f);
        s.validate().unwrap_err()
    };
    let cases = [
        (
            feature("p", "price", FeatureKind::Dense, &["sigrid_hash(1, 10)"]),
            "sigrid_hash takes id or ids",
        ),
        (
            feature("p", "price", FeatureKind::Dense, &["bucketize([1])"]),
            "ends as id",
        ),
        (
            feature("p", "price", FeatureKind::Categorical, &["onehot(4)"]),
            "onehot",
        ),
        (
            feature("u", "user", FeatureKind::Categorical, &["ngram(2)"]),
            "applies to a list feature",
        ),
        (
            feature("t", "tags", FeatureKind::Bag, &["bucketize([1])"]),
            "bucketize takes int or float",
        ),
        (
            feature("t", "tags", FeatureKind::Bag, &["lowercase"]),
            "unknown operator `lowercase`",
        ),
    ];
    for (f, why) in cases {
        let err = refused(f);
        assert!(err.contains("ops") && err.contains(why), "{err}");
    }
    let mut sized = feature("h", "hist", FeatureKind::Sequence, &["ngram(4)"]);
    sized.max_len = Some(3);
    let err = refused(sized);
    assert!(err.contains("\"h\"") && err.contains("at least 4"), "{err}");
    let mut weighted = feature("w", "tags", FeatureKind::Bag, &["ngram(2)"]);
    weighted.weights = Some("tag_weights".into());
    assert!(refused(weighted).contains("a gram has no weight"));
    let mut both = feature("p", "price", FeatureKind::Dense, &["log1p"]);
    both.transform = elastrec_data::schema::DenseTransform::Log1p;
    assert!(refused(both).contains("both `transform` and `ops`"));
}

#[test]
fn a_string_column_for_a_bucketized_feature_names_the_file_and_the_column() {
    let dir = tempfile::tempdir().unwrap();
    let parquet = dir.path().join("log.parquet");
    log(&parquet);
    let mut s = schema();
    s.features.push(feature(
        "item_bucket",
        "item",
        FeatureKind::Categorical,
        &["bucketize([1])"],
    ));
    let err = match open_source(&parquet, None, BadRowPolicy::Fail, Some(&Arc::new(s))) {
        Ok(_) => panic!("a string column was bucketized"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("log.parquet") && err.contains("\"item\"") && err.contains("bucketize"),
        "{err}"
    );
}

/// Two categorical features of one column (its ids decoded once for both): each gets
/// the column's ids through its own chain, the raw one unchanged by the other's.
#[test]
fn features_of_one_id_column_each_apply_their_own_chain() {
    let dir = tempfile::tempdir().unwrap();
    let parquet = dir.path().join("log.parquet");
    log(&parquet);
    let schema = Schema {
        labels: vec!["click".into()],
        weight: None,
        features: vec![
            feature(
                "item_hashed",
                "item",
                FeatureKind::Categorical,
                &["sigrid_hash(3, 10)"],
            ),
            feature("item", "item", FeatureKind::Categorical, &[]),
            feature("tags", "tags", FeatureKind::Bag, &[]),
            feature(
                "tag_hashed",
                "tags",
                FeatureKind::Bag,
                &["sigrid_hash(3, 10)"],
            ),
        ],
        tables: Vec::new(),
        csv: Default::default(),
    };
    schema.validate().unwrap();
    let (b, _) = read(&parquet, &schema);
    let salt = sigrid_salt(3);
    let raw: Vec<u64> = b.sparse.chunks(2).map(|s| s[1]).collect();
    assert_eq!(raw[0], string_key(b"x"));
    assert_eq!(raw[1], NULL_KEY);
    let hashed: Vec<u64> = b.sparse.chunks(2).map(|s| s[0]).collect();
    for (h, r) in hashed.iter().zip(&raw) {
        if *r != NULL_KEY {
            assert_eq!(*h, sigrid_one(*r, salt, 10));
        }
    }
    let tag_rows = rows(&b.bags[0]);
    assert_eq!(tag_rows[0], vec![string_key(b"a"), string_key(b"b")]);
    let hashed_rows: Vec<Vec<u64>> = tag_rows
        .iter()
        .map(|r| r.iter().map(|&k| sigrid_one(k, salt, 10)).collect())
        .collect();
    assert_eq!(rows(&b.bags[1]), hashed_rows);
}
