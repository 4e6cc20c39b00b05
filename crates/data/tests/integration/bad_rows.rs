//! Every malformed-row case under `Fail` (exact `file:line: field N: reason` message) and
//! `Skip` (counted, every good row delivered), for TSV and Parquet.

use crate::util::{gzip, write};
use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use elastrec_data::reader::{drain, MAX_KEPT_ERRORS};
use elastrec_data::tsv::MAX_LINE_BYTES;
use elastrec_data::{
    open_reader_range, read_all, BadRowPolicy, DataError, FieldError, ParquetReader,
    MISSING_CATEGORY,
};
use std::sync::Arc;

fn good_fields(k: u32) -> Vec<Vec<u8>> {
    let mut f = vec![b"1".to_vec()];
    f.extend((1..=13).map(|i| (i * 10 + k).to_string().into_bytes()));
    f.extend((0..26).map(|i| format!("{:08x}", 0xabc00 + i + k).into_bytes()));
    f
}

fn join(fields: &[Vec<u8>]) -> Vec<u8> {
    fields.join(&b'\t')
}

/// (bad line, field, reason text).
fn cases() -> Vec<(Vec<u8>, usize, String)> {
    let mut out = Vec::new();
    let mut add = |field: usize, value: &[u8], reason: &str| {
        let mut f = good_fields(0);
        f[field] = value.to_vec();
        out.push((join(&f), field, reason.to_string()));
    };
    add(0, b"2", r#"label must be 0 or 1, got "2""#);
    add(0, b"", "empty label");
    add(0, b"0.5", r#"label must be 0 or 1, got "0.5""#);
    add(3, b"12a", r#"expected an integer, got "12a""#);
    add(13, b"1e5", r#"expected an integer, got "1e5""#);
    add(15, b"zz12", r#"expected 8 hex digits, got "zz12""#);
    add(20, b"1234567", r#"expected 8 hex digits, got "1234567""#);
    add(
        39,
        b"123456789",
        r#"expected 8 hex digits, got "123456789""#,
    );
    add(
        14,
        b"\xff\xfe123456",
        r#"non-ASCII bytes (invalid UTF-8 or binary garbage): "\xff\xfe123456""#,
    );
    add(
        5,
        "é".as_bytes(),
        r#"non-ASCII bytes (invalid UTF-8 or binary garbage): "\xc3\xa9""#,
    );
    let f = good_fields(0);
    out.push((
        join(&f[..39]),
        39,
        "missing field: line has 39 fields, expected 40".into(),
    ));
    out.push((
        join(&f[..3]),
        3,
        "missing field: line has 3 fields, expected 40".into(),
    ));
    let mut extra = f.clone();
    extra.push(b"".to_vec());
    out.push((
        join(&extra),
        40,
        "unexpected extra field: expected 40 fields".into(),
    ));
    out
}

#[test]
fn every_case_fails_with_exact_message() {
    let dir = tempfile::tempdir().unwrap();
    for (i, (bad, field, reason)) in cases().into_iter().enumerate() {
        let path = dir.path().join(format!("case{i}.tsv"));
        let mut text = join(&good_fields(1));
        text.push(b'\n');
        text.extend_from_slice(&bad);
        text.push(b'\n');
        text.extend_from_slice(&join(&good_fields(2)));
        text.push(b'\n');
        write(&path, &text);
        let err = read_all(&path, BadRowPolicy::Fail).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("{}:2: field {field}: {reason}", path.display())
        );
        match err {
            DataError::Malformed { line, field: f, .. } => assert_eq!((line, f), (2, field)),
            other => panic!("expected Malformed, got {other:?}"),
        }
    }
}

#[test]
fn skip_counts_and_delivers_all_good_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mixed.tsv");
    let cases = cases();
    let mut text = Vec::new();
    let mut good = 0u32;
    let mut bad_lines = Vec::new();
    let mut line = 0;
    for (bad, field, reason) in &cases {
        for _ in 0..2 {
            good += 1;
            text.extend_from_slice(&join(&good_fields(good)));
            text.push(b'\n');
            line += 1;
        }
        text.extend_from_slice(bad);
        text.push(b'\n');
        line += 1;
        bad_lines.push(format!(
            "{}:{line}: field {field}: {reason}",
            path.display()
        ));
    }
    write(&path, &text);
    let (batch, stats) = read_all(&path, BadRowPolicy::Skip).unwrap();
    assert_eq!(batch.len() as u32, good);
    assert_eq!(stats.rows_read, good as u64);
    assert_eq!(stats.rows_skipped, cases.len() as u64);
    assert_eq!(stats.first_errors, bad_lines[..MAX_KEPT_ERRORS].to_vec());
    // The good rows are the right ones, in order (I1 = 10 + k).
    for k in 0..good as usize {
        let want = elastrec_data::Batch::transform_dense(10 + k as i64 + 1);
        assert_eq!(batch.dense_row(k)[0], want);
    }
    let summary = stats.to_string();
    assert!(
        summary.contains(&format!("{} skipped", cases.len())),
        "{summary}"
    );

    // A range reports absolute line numbers too.
    let mut r = open_reader_range(&path, 1, 4, BadRowPolicy::Fail).unwrap();
    let err = drain(&mut r).unwrap_err();
    assert!(err.to_string().starts_with(&bad_lines[0]), "{err}");
}

/// A line over `MAX_LINE_BYTES` (terminator included) is a bad row named `file:line`: it
/// fails the read under `Fail` and is counted under `Skip` with the lines around it
/// delivered, in plain and gzip files, also as a final line without `\n`. A line exactly
/// at the cap is still parsed, so its error names the field.
#[test]
fn overlong_lines_are_bad_rows() {
    let good = |k| {
        let mut l = join(&good_fields(k));
        l.push(b'\n');
        l
    };
    let mut at_cap = b"1\t".to_vec();
    at_cap.resize(MAX_LINE_BYTES - 1, b'5');
    at_cap.push(b'\n');
    let mut over_cap = vec![b'x'; MAX_LINE_BYTES];
    over_cap.push(b'\n');
    let mut text = good(1);
    text.extend(at_cap); // line 2
    text.extend(good(2));
    text.extend(over_cap); // line 4
    text.extend(good(3));
    text.resize(text.len() + 3 * MAX_LINE_BYTES, b'y'); // line 6, no terminator

    let dir = tempfile::tempdir().unwrap();
    for (name, bytes) in [("long.tsv", text.clone()), ("long.tsv.gz", gzip(&text))] {
        let path = dir.path().join(name);
        write(&path, &bytes);
        let too_long = |line: u64| {
            format!(
                "{}:{line}: line longer than {MAX_LINE_BYTES} bytes (a Criteo line is under 1 KiB: corrupt file?)",
                path.display()
            )
        };

        match read_all(&path, BadRowPolicy::Fail).unwrap_err() {
            DataError::Malformed { line, field, .. } => assert_eq!((line, field), (2, 1)),
            other => panic!("{name}: expected Malformed at line 2, got {other:?}"),
        }
        let mut r = open_reader_range(&path, 3, 6, BadRowPolicy::Fail).unwrap();
        let err = drain(&mut r).unwrap_err();
        assert!(err.is_bad_row());
        assert_eq!(err.to_string(), too_long(4));

        let (batch, stats) = read_all(&path, BadRowPolicy::Skip).unwrap();
        assert_eq!(batch.len(), 3, "{name}: lines 1, 3 and 5 are delivered");
        assert_eq!(
            batch.dense_row(2)[0],
            elastrec_data::Batch::transform_dense(13)
        );
        assert_eq!((stats.rows_read, stats.rows_skipped), (3, 3));
        assert_eq!(stats.first_errors[1..], [too_long(4), too_long(6)]);
    }
}

#[test]
fn empty_fields_are_legal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.tsv");
    let mut f = good_fields(0);
    for v in f.iter_mut().skip(1) {
        v.clear();
    }
    f[0] = b"0".to_vec();
    write(&path, &join(&f));
    let (b, _) = read_all(&path, BadRowPolicy::Fail).unwrap();
    assert_eq!(b.labels, vec![0.0]);
    assert!(b.dense.iter().all(|&x| x == 0.0));
    assert!(b.sparse.iter().all(|&x| x == MISSING_CATEGORY));
}

fn string_parquet(path: &std::path::Path, labels: Vec<Option<i64>>, c3: Vec<Option<&str>>) {
    let n = labels.len();
    let mut fields = vec![Field::new("label", DataType::Int64, true)];
    let mut cols: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(labels))];
    for i in 1..=13 {
        fields.push(Field::new(format!("I{i}"), DataType::Int64, true));
        cols.push(Arc::new(Int64Array::from(
            (0..n as i64).map(Some).collect::<Vec<_>>(),
        )));
    }
    for i in 1..=26 {
        fields.push(Field::new(format!("C{i}"), DataType::Utf8, true));
        let col: Vec<Option<&str>> = if i == 3 {
            c3.clone()
        } else {
            vec![Some("0000abcd"); n]
        };
        cols.push(Arc::new(StringArray::from(col)));
    }
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), cols).unwrap();
    let file = std::fs::File::create(path).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(file, schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

#[test]
fn parquet_bad_values() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("strings.parquet");
    string_parquet(
        &path,
        vec![Some(1), Some(2), None, Some(0), Some(0), Some(1)],
        vec![
            Some("deadbeef"),
            Some("00000000"),
            Some("00000000"),
            Some("zz12"),
            None,
            Some("123456789"),
        ],
    );
    let err = read_all(&path, BadRowPolicy::Fail).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            r#"{}: row 1: column label: label must be 0 or 1, got "2""#,
            path.display()
        )
    );
    let mut r = ParquetReader::open(&path, BadRowPolicy::Skip).unwrap();
    let (b, stats) = drain(&mut r).unwrap();
    assert_eq!(b.len(), 2);
    assert_eq!(b.sparse_row(0)[2], 0xdeadbeef);
    assert_eq!(b.sparse_row(0)[0], 0xabcd);
    assert_eq!(b.sparse_row(1)[2], MISSING_CATEGORY);
    assert_eq!(b.dense_row(1)[0], elastrec_data::Batch::transform_dense(4));
    assert_eq!(stats.rows_skipped, 4);
    let p = path.display();
    assert_eq!(
        stats.first_errors,
        vec![
            format!(r#"{p}: row 1: column label: label must be 0 or 1, got "2""#),
            format!("{p}: row 2: column label: empty label"),
            format!(r#"{p}: row 3: column C3: expected 8 hex digits, got "zz12""#),
            format!(r#"{p}: row 5: column C3: expected 8 hex digits, got "123456789""#),
        ]
    );
    // A range keeps file row numbers.
    let mut r = ParquetReader::open_range(&path, 3, 4, BadRowPolicy::Fail).unwrap();
    match drain(&mut r) {
        Err(DataError::BadValue {
            row: 3,
            column,
            reason: FieldError::BadCategory(_),
            ..
        }) => {
            assert_eq!(column, "C3")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn parquet_missing_column_is_schema_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nolabel.parquet");
    let schema = Arc::new(Schema::new(vec![Field::new("I1", DataType::Int64, true)]));
    let batch =
        RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(vec![1i64]))]).unwrap();
    let mut w =
        parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema, None)
            .unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let err = ParquetReader::open(&path, BadRowPolicy::Skip).unwrap_err();
    assert!(matches!(err, DataError::Parquet { .. }));
    assert!(
        err.to_string().contains("missing column \"label\""),
        "{err}"
    );
}
