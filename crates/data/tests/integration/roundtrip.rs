//! Write → read round trips for TSV, gzip TSV and Parquet.

use crate::util::{gzip, random_rows, tsv_bytes, write};
use elastrec_data::{
    count_rows, detect_format, read_all, BadRowPolicy, BatchReader, FileFormat, ParquetOptions,
    ParquetWriter, TsvReader,
};

#[test]
fn tsv_round_trip_in_small_batches() {
    let dir = tempfile::tempdir().unwrap();
    let rows = random_rows(3000, 1);
    let path = dir.path().join("a.tsv");
    write(&path, &tsv_bytes(&rows));
    let expected = rows.to_batch();
    let (all, stats) = read_all(&path, BadRowPolicy::Fail).unwrap();
    assert_eq!(all, expected);
    assert_eq!((stats.rows_read, stats.rows_skipped), (3000, 0));

    // Uneven batch sizes deliver the same rows.
    let mut r = TsvReader::open(&path, BadRowPolicy::Fail).unwrap();
    let mut b = elastrec_data::Batch::default();
    let mut got = elastrec_data::Batch::default();
    loop {
        let n = r.next_batch(&mut b, 77).unwrap();
        if n == 0 {
            break;
        }
        assert!(n <= 77);
        got.extend_from(&b, 0..n);
    }
    assert_eq!(got, expected);
    assert_eq!(count_rows(&path).unwrap(), 3000);
}

#[test]
fn gzip_detected_by_magic_not_extension() {
    let dir = tempfile::tempdir().unwrap();
    let rows = random_rows(2000, 2);
    let text = tsv_bytes(&rows);
    let path = dir.path().join("plain_looking_name.tsv");
    write(&path, &gzip(&text));
    assert_eq!(detect_format(&path).unwrap(), FileFormat::TsvGzip);
    let (all, _) = read_all(&path, BadRowPolicy::Fail).unwrap();
    assert_eq!(all, rows.to_batch());
    assert_eq!(count_rows(&path).unwrap(), 2000);

    // Multi-member gzip (e.g. concatenated .gz parts) is read whole.
    let half = text
        .iter()
        .enumerate()
        .filter(|(_, &b)| b == b'\n')
        .nth(999)
        .unwrap()
        .0
        + 1;
    let mut two = gzip(&text[..half]);
    two.extend(gzip(&text[half..]));
    let path2 = dir.path().join("two_members.gz");
    write(&path2, &two);
    assert_eq!(
        read_all(&path2, BadRowPolicy::Fail).unwrap().0,
        rows.to_batch()
    );
}

#[test]
fn crlf_and_missing_final_newline() {
    let dir = tempfile::tempdir().unwrap();
    let rows = random_rows(10, 3);
    let text = String::from_utf8(tsv_bytes(&rows)).unwrap();
    let crlf = text.replace('\n', "\r\n");
    let path = dir.path().join("crlf.tsv");
    write(&path, crlf.trim_end().as_bytes());
    assert_eq!(count_rows(&path).unwrap(), 10);
    assert_eq!(
        read_all(&path, BadRowPolicy::Fail).unwrap().0,
        rows.to_batch()
    );
}

#[test]
fn parquet_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let rows = random_rows(5000, 4);
    let path = dir.path().join("a.parquet");
    let mut w = ParquetWriter::create(
        &path,
        ParquetOptions {
            row_group_rows: 1000,
            snappy: true,
        },
    )
    .unwrap();
    // Two writes so row groups and write calls do not line up.
    let first = elastrec_data::RawBatch {
        labels: rows.labels[..1500].to_vec(),
        ints: rows.ints[..1500 * 13].to_vec(),
        cats: rows.cats[..1500 * 26].to_vec(),
        ..Default::default()
    };
    let second = elastrec_data::RawBatch {
        labels: rows.labels[1500..].to_vec(),
        ints: rows.ints[1500 * 13..].to_vec(),
        cats: rows.cats[1500 * 26..].to_vec(),
        ..Default::default()
    };
    w.write(&first).unwrap();
    w.write(&second).unwrap();
    assert_eq!(w.finish().unwrap(), 5000);
    assert_eq!(detect_format(&path).unwrap(), FileFormat::Parquet);
    assert_eq!(count_rows(&path).unwrap(), 5000);
    let (all, stats) = read_all(&path, BadRowPolicy::Fail).unwrap();
    assert_eq!(stats.rows_read, 5000);
    assert_eq!(all, rows.to_batch());
}

/// Rows of three labels (task 0 and two more, e.g. click, add-to-cart, purchase) keep
/// every label through TSV (label field `101`) and Parquet (`label_1`, `label_2`), in
/// batches of any size; a row with another label count in the same file is an error
/// naming its line.
#[test]
fn multi_task_labels_round_trip_through_tsv_and_parquet() {
    let dir = tempfile::tempdir().unwrap();
    let mut rows = random_rows(2000, 9);
    rows.extra_tasks = vec![2; rows.len()];
    rows.extra_labels = (0..rows.len()).map(|i| (i % 4) as u8).collect();
    let expected = rows.to_batch();
    assert_eq!(expected.tasks, 3);
    assert_eq!(expected.task_labels_row(3), &[1.0, 1.0]);
    assert_eq!(expected.task_labels_row(2), &[0.0, 1.0]);

    let tsv = dir.path().join("a.tsv");
    let bytes = tsv_bytes(&rows);
    assert!(bytes.starts_with(&[b'0' + rows.labels[0], b'0', b'0', b'\t']));
    write(&tsv, &bytes);
    let (all, _) = read_all(&tsv, BadRowPolicy::Fail).unwrap();
    assert_eq!(all, expected);

    let pq = dir.path().join("a.parquet");
    let mut w = ParquetWriter::create(&pq, ParquetOptions::default()).unwrap();
    w.write(&rows).unwrap();
    w.finish().unwrap();
    let mut r = elastrec_data::open_reader(&pq, BadRowPolicy::Fail).unwrap();
    let mut got = elastrec_data::Batch::default();
    let mut b = elastrec_data::Batch::default();
    while r.next_batch(&mut b, 333).unwrap() > 0 {
        got.extend_from(&b, 0..b.len());
    }
    assert_eq!(got, expected);

    // One line of a single label in the three-label file.
    let mut text = String::from_utf8(bytes).unwrap();
    let second = text.find('\n').unwrap() + 1;
    text.replace_range(second..second + 3, "1");
    write(&tsv, text.as_bytes());
    let err = read_all(&tsv, BadRowPolicy::Fail).unwrap_err().to_string();
    assert!(
        err.contains("a.tsv:2: field 0") && err.contains("holds 1 label"),
        "{err}"
    );
}
