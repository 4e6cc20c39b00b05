//! Row ranges: every range equals the same slice of a full read, for plain TSV (with and
//! without the sidecar index), gzip TSV and Parquet.

use crate::util::{gzip, random_rows, tsv_bytes, write};
use elastrec_data::index::{index_path, LineIndex, STRIDE};
use elastrec_data::reader::drain;
use elastrec_data::{
    count_rows, open_reader_range, read_all, BadRowPolicy, Batch, DataError, ParquetOptions,
    ParquetWriter,
};
use std::path::Path;

const N: u64 = 3 * STRIDE + 17;

fn ranges() -> Vec<(u64, u64)> {
    let s = STRIDE;
    vec![
        (0, 0),
        (0, N),
        (0, 1),
        (N - 1, N),
        (N, N),
        (5, s + 30),
        (s - 1, s + 1),
        (s, 2 * s),
        (2 * s + 3, 2 * s + 4),
        (3 * s, N),
        (17, 18),
    ]
}

fn slice(full: &Batch, start: u64, end: u64) -> Batch {
    let mut b = Batch::default();
    b.take_layout(full);
    b.extend_from(full, start as usize..end as usize);
    b
}

fn check_all_ranges(path: &Path) {
    let (full, _) = read_all(path, BadRowPolicy::Fail).unwrap();
    assert_eq!(full.len() as u64, N);
    for (start, end) in ranges() {
        let mut r = open_reader_range(path, start, end, BadRowPolicy::Fail).unwrap();
        let (got, stats) = drain(&mut r).unwrap();
        assert_eq!(
            got,
            slice(&full, start, end),
            "range {start}..{end} of {}",
            path.display()
        );
        assert_eq!(stats.rows_read, end - start);
    }
}

#[test]
fn plain_tsv_ranges_with_and_without_index() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.tsv");
    write(&path, &tsv_bytes(&random_rows(N as usize, 7)));
    check_all_ranges(&path); // no index: scans
    assert!(!index_path(&path).exists());
    assert_eq!(count_rows(&path).unwrap(), N);
    assert!(index_path(&path).exists());
    assert_eq!(LineIndex::load(&path).unwrap().unwrap().rows, N);
    check_all_ranges(&path); // index: seeks
}

#[test]
fn stale_index_is_rebuilt_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.tsv");
    write(&path, &tsv_bytes(&random_rows(100, 8)));
    assert_eq!(count_rows(&path).unwrap(), 100);
    // Rewrite with different content and size: the old index must not be used.
    let rows = random_rows(N as usize, 9);
    write(&path, &tsv_bytes(&rows));
    assert!(LineIndex::load(&path).unwrap().is_none());
    assert_eq!(count_rows(&path).unwrap(), N);
    check_all_ranges(&path);
}

#[test]
fn gzip_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.tsv.gz");
    write(&path, &gzip(&tsv_bytes(&random_rows(N as usize, 10))));
    check_all_ranges(&path);
    assert_eq!(count_rows(&path).unwrap(), N);
    check_all_ranges(&path);
}

#[test]
fn parquet_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.parquet");
    let mut w = ParquetWriter::create(
        &path,
        ParquetOptions {
            row_group_rows: 500,
            snappy: false,
        },
    )
    .unwrap();
    w.write(&random_rows(N as usize, 11)).unwrap();
    w.finish().unwrap();
    check_all_ranges(&path);
}

#[test]
fn out_of_bounds_ranges_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let rows = random_rows(50, 12);
    let tsv = dir.path().join("d.tsv");
    write(&tsv, &tsv_bytes(&rows));
    let pq = dir.path().join("d.parquet");
    let mut w = ParquetWriter::create(&pq, ParquetOptions::default()).unwrap();
    w.write(&rows).unwrap();
    w.finish().unwrap();
    let gz = dir.path().join("d.gz");
    write(&gz, &gzip(&tsv_bytes(&rows)));

    let is_range = |r: Result<(Batch, elastrec_data::ReadStats), DataError>| {
        matches!(r, Err(DataError::InvalidRange { rows: 50, .. }))
    };
    for p in [&tsv, &gz, &pq] {
        // Without an index the TSV readers find out at end of file.
        let r = open_reader_range(p, 40, 60, BadRowPolicy::Fail).and_then(|mut r| drain(&mut r));
        assert!(is_range(r), "{}", p.display());
        assert!(open_reader_range(p, 10, 5, BadRowPolicy::Fail).is_err());
    }
    count_rows(&tsv).unwrap();
    match open_reader_range(&tsv, 40, 60, BadRowPolicy::Fail).map(|_| ()) {
        Err(e @ DataError::InvalidRange { .. }) => {
            assert!(
                e.to_string()
                    .ends_with("invalid row range 40..60 (file has 50 rows)"),
                "{e}"
            )
        }
        other => panic!("expected InvalidRange at open with an index, got {other:?}"),
    }
    assert!(open_reader_range(&tsv, 60, 70, BadRowPolicy::Fail).is_err());
}

/// A current sidecar (it matches the data file's size and modification time) with
/// inconsistent contents is an error naming the sidecar: never a panic, a huge allocation
/// or a read past its end. Entry counts come from the file, so `8 * n` must not overflow
/// and must match the sidecar's size; rows, entries and offsets must agree.
#[test]
fn corrupt_index_is_an_error_naming_the_sidecar() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.tsv");
    write(&path, &tsv_bytes(&random_rows(N as usize, 13)));
    count_rows(&path).unwrap();
    let idx = index_path(&path);
    let good = std::fs::read(&idx).unwrap();
    let entries = N.div_ceil(STRIDE);
    // Header words: 0 file length, 1 mtime, 2 flags, 3 rows, 4 stride, 5 entry count;
    // entries follow.
    let patched = |changes: &[(usize, u64)]| {
        let mut b = good.clone();
        for &(word, value) in changes {
            b[8 + 8 * word..16 + 8 * word].copy_from_slice(&value.to_le_bytes());
        }
        b
    };
    // 8 * n wraps around to the sidecar's real size, and rows = n at stride 1 agrees
    // with n: unchecked arithmetic accepted this and read 2^61 entries from a few bytes.
    let wraps = (1u64 << 61) + entries;
    let cases = [
        (patched(&[(3, wraps), (4, 1), (5, wraps)]), "overflows"),
        (patched(&[(5, entries + 1)]), "bytes, the file has"),
        (patched(&[(3, u64::MAX)]), "rows in a data file of"),
        (patched(&[(3, N + STRIDE)]), "entries for"),
        (patched(&[(4, 0)]), "stride is 0"),
        (patched(&[(6 + 2, 0)]), "not increasing"),
    ];
    for (bytes, reason) in cases {
        std::fs::write(&idx, &bytes).unwrap();
        let err = LineIndex::load(&path).unwrap_err();
        assert!(matches!(err, DataError::CorruptIndex { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!("{}: corrupt row index: ", idx.display()))
                && msg.contains(reason),
            "{msg}"
        );
        assert_eq!(count_rows(&path).unwrap_err().to_string(), msg);
        assert!(open_reader_range(&path, 0, 1, BadRowPolicy::Fail).is_err());
    }
    // The intact sidecar is used again.
    std::fs::write(&idx, &good).unwrap();
    assert_eq!(LineIndex::load(&path).unwrap().unwrap().rows, N);
}
