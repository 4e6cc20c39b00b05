//! CSV and TSV files with a header, read through a schema or inferred from one: they
//! must give what the same log in Parquet gives.

use super::named::{log, schema};
use elastrec_data::gen::named::{generate_named, NamedSpec};
use elastrec_data::reader::drain;
use elastrec_data::schema::{infer, string_key};
use elastrec_data::{
    count_source_rows, open_source, BadRowPolicy, Batch, BatchReader, CsvFormat, DataError,
    FeatureKind, FeatureSpec, ReadStats, Schema,
};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

/// The rows of `super::named::log` as CSV (an `unused` column, a null price, a null
/// list, a null list item).
const LOG_CSV: &str = "\
click,price,user,item,tags,tag_weights,hist,unused
1,9.0,10,x,a|b,2|1,1|2|3|4|5,u
0,,11,,,,,u
1,0,-7,y,c|,1|1,7,u
0,1.0,10,x,,,8|9,u
";

fn read_all(path: &Path, range: Option<(u64, u64)>, schema: &Schema) -> (Batch, ReadStats) {
    let mut r = open_source(
        path,
        range,
        BadRowPolicy::Fail,
        Some(&Arc::new(schema.clone())),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    drain(&mut r).unwrap_or_else(|e| panic!("{e}"))
}

fn gzip(text: &str, path: &Path) {
    let mut gz = flate2::write::GzEncoder::new(
        std::fs::File::create(path).unwrap(),
        flate2::Compression::fast(),
    );
    gz.write_all(text.as_bytes()).unwrap();
    gz.finish().unwrap();
}

#[test]
fn csv_tsv_and_gzip_read_what_the_same_log_in_parquet_reads() {
    let dir = tempfile::tempdir().unwrap();
    let parquet = dir.path().join("log.parquet");
    log(&parquet);
    let (want, want_stats) = read_all(&parquet, None, &schema());
    let csv = dir.path().join("log.csv");
    std::fs::write(&csv, LOG_CSV).unwrap();
    let tsv = dir.path().join("log.tsv");
    std::fs::write(&tsv, LOG_CSV.replace(',', "\t")).unwrap();
    let gz = dir.path().join("log.csv.gz");
    gzip(LOG_CSV, &gz);
    // A spreadsheet's byte-order mark before the header reads the same.
    let bom = dir.path().join("bom.csv");
    std::fs::write(&bom, format!("\u{feff}{LOG_CSV}")).unwrap();
    // CRLF line ends and spaces around values read the same.
    let crlf = dir.path().join("crlf.csv");
    std::fs::write(&crlf, LOG_CSV.replace(',', " , ").replace('\n', "\r\n")).unwrap();
    for path in [&csv, &tsv, &gz, &crlf, &bom] {
        let (got, stats) = read_all(path, None, &schema());
        assert_eq!(got, want, "{}", path.display());
        assert_eq!(stats, want_stats, "{}", path.display());
    }
    assert_eq!(want.sparse[0], 10, "an integer id is its own key");
    assert_eq!(want.sparse[1], string_key(b"x"));
}

#[test]
fn a_row_range_skips_the_header_and_seeks_by_rows() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("log.csv");
    std::fs::write(&csv, LOG_CSV).unwrap();
    assert_eq!(
        count_source_rows(&csv, true).unwrap(),
        4,
        "the header is no row"
    );
    assert_eq!(count_source_rows(&csv, false).unwrap(), 5);
    let (all, _) = read_all(&csv, None, &schema());
    for (start, end) in [(0, 4), (1, 3), (3, 4)] {
        let (part, _) = read_all(&csv, Some((start, end)), &schema());
        let mut want = Batch::default();
        want.take_layout(&all);
        want.extend_from(&all, start as usize..end as usize);
        assert_eq!(part.labels, want.labels, "{start}..{end}");
        assert_eq!(part.sparse, want.sparse, "{start}..{end}");
        assert_eq!(part.bags, want.bags, "{start}..{end}");
    }
    let (empty, _) = read_all(&csv, Some((2, 2)), &schema());
    assert!(empty.is_empty());
    let past = open_source(
        &csv,
        Some((2, 5)),
        BadRowPolicy::Fail,
        Some(&Arc::new(schema())),
    )
    .and_then(|mut r| r.next_batch(&mut Batch::default(), 100))
    .unwrap_err();
    assert!(
        matches!(
            past,
            DataError::InvalidRange {
                start: 2,
                end: 5,
                rows: 4,
                ..
            }
        ),
        "{past}"
    );
}

#[test]
fn quoted_fields_hold_delimiters_and_quotes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("quoted.csv");
    std::fs::write(
        &path,
        "click,title,tags\n1,\"Hello, world\",\"a|b\"\n0,\"say \"\"hi\"\"\",\n",
    )
    .unwrap();
    let mut s = Schema {
        labels: vec!["click".into()],
        features: vec![
            FeatureSpec::new("title", FeatureKind::Categorical),
            FeatureSpec::new("tags", FeatureKind::Bag),
        ],
        ..Schema::default()
    };
    let (b, _) = read_all(&path, None, &s);
    assert_eq!(
        b.sparse,
        [string_key(b"Hello, world"), string_key(b"say \"hi\"")]
    );
    assert_eq!(b.bags[0].row(0), [string_key(b"a"), string_key(b"b")]);
    // Another list separator and delimiter, set in the schema.
    std::fs::write(&path, "click;tags\n1;a,b\n").unwrap();
    s.features.remove(0);
    s.csv = CsvFormat {
        delimiter: Some(';'),
        list_separator: ',',
    };
    let (b, _) = read_all(&path, None, &s);
    assert_eq!(b.bags[0].row(0), [string_key(b"a"), string_key(b"b")]);
}

#[test]
fn a_bad_field_names_file_line_and_column_and_skip_counts_the_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.csv");
    let cases = [
        (
            "2,1.0,3,x,a,1,7,u",
            "column click: label must be 0 or 1, got \"2\"",
        ),
        (
            "1,cheap,3,x,a,1,7,u",
            "column price: expected a number, got \"cheap\"",
        ),
        (
            "1,inf,3,x,a,1,7,u",
            "column price: a dense value must be finite",
        ),
        (
            "1,1.0,3,x,a|b,1,7,u",
            "column tag_weights: 1 weight(s) for 2 id(s)",
        ),
        (
            "1,1.0,3,x,a,z,7,u",
            "column tag_weights: expected a number, got \"z\"",
        ),
        (
            "1,1.0,3,x",
            "column tags: the row has 4 field(s) and the header 8",
        ),
        ("", "column price: the row has 1 field(s) and the header 8"),
    ];
    for (bad, want) in cases {
        let header = LOG_CSV.lines().next().unwrap();
        let text = format!("{header}\n1,1.0,3,x,a,1,7,u\n{bad}\n0,2.0,4,y,b,1,8,u\n");
        std::fs::write(&path, &text).unwrap();
        let s = Arc::new(schema());
        let mut r = open_source(&path, None, BadRowPolicy::Fail, Some(&s)).unwrap();
        let mut b = Batch::default();
        let err = r.next_batch(&mut b, 10).unwrap_err().to_string();
        assert!(
            err.contains(&format!("bad.csv:3: {want}")),
            "{bad:?}: {err}"
        );
        assert_eq!(b.sparse.len(), 2, "the row before it stays ({bad:?})");
        let mut r = open_source(&path, None, BadRowPolicy::Skip, Some(&s)).unwrap();
        r.next_batch(&mut b, 10).unwrap();
        assert_eq!(b.labels, [1.0, 0.0], "{bad:?}");
        assert_eq!(r.stats().rows_skipped, 1, "{bad:?}");
    }
}

#[test]
fn a_missing_column_or_header_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.csv");
    std::fs::write(&path, LOG_CSV).unwrap();
    let mut s = schema();
    s.features.push(FeatureSpec::new("age", FeatureKind::Dense));
    let err = open_source(&path, None, BadRowPolicy::Fail, Some(&Arc::new(s)))
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("log.csv") && err.contains("\"age\"") && err.contains("click, price"),
        "{err}"
    );
    std::fs::write(&path, "").unwrap();
    let err = open_source(&path, None, BadRowPolicy::Fail, Some(&Arc::new(schema())))
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(err.contains("no header line"), "{err}");
    let err = infer(&path, &["click".into()], 1 << 20, &CsvFormat::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("no header line"), "{err}");
}

#[test]
fn inference_from_csv_equals_inference_from_the_same_log_in_parquet() {
    let dir = tempfile::tempdir().unwrap();
    let spec = |csv: bool, sub: &str| NamedSpec {
        out: dir.path().join(sub),
        rows: 3000,
        days: 1,
        seed: 5,
        csv,
    };
    let parquet = generate_named(&spec(false, "parquet")).unwrap();
    let csv = generate_named(&spec(true, "csv")).unwrap();
    let labels = ["click".to_string()];
    let want = infer(&parquet.files[0], &labels, 1 << 20, &CsvFormat::default()).unwrap();
    let got = infer(&csv.files[0], &labels, 1 << 20, &CsvFormat::default()).unwrap();
    assert_eq!(got.schema, want.schema);
    assert_eq!(got.sampled_rows, 3000);
    let hist = got.schema.features.iter().find(|f| f.name == "hist_items");
    assert_eq!(hist.unwrap().table(), "item_id");
    // And the two files read alike through it.
    let (a, _) = read_all(&parquet.files[0], None, &want.schema);
    let (b, _) = read_all(&csv.files[0], None, &want.schema);
    assert_eq!(a.labels, b.labels);
    assert_eq!(a.sparse, b.sparse);
    assert_eq!(a.bags, b.bags);
    for (x, y) in a.dense.iter().zip(&b.dense) {
        assert!((x - y).abs() <= 1e-6 * x.abs().max(1.0), "{x} against {y}");
    }
}
