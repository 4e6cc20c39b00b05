//! Parquet input the reader must not trust: columns it does not need (never decoded) and
//! footers with row counts that are negative or do not add up.

use crate::util::{random_rows, write};
use arrow_array::UInt32Array;
use arrow_array::{ArrayRef, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use elastrec_data::{
    count_rows, criteo, open_reader_range, read_all, BadRowPolicy, DataError, ParquetOptions,
    ParquetReader, ParquetWriter,
};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader, ParquetMetaDataWriter};
use std::path::Path;
use std::sync::Arc;

/// Extra columns before `label` and between `I13` and `C1` (so the decoded batch's column
/// order differs from the file's), whose data is then overwritten with garbage: a reader
/// that decodes them fails; one that projects the Criteo columns reads every row.
#[test]
fn columns_the_reader_does_not_need_are_not_decoded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("extra.parquet");
    let raw = random_rows(500, 21);
    let n = raw.len();
    let mut fields = vec![Field::new("note", DataType::Utf8, false)];
    let mut cols: Vec<ArrayRef> = vec![Arc::new(StringArray::from_iter_values(
        (0..n).map(|r| format!("free text of row {r}")),
    ))];
    fields.push(Field::new("label", DataType::Int32, false));
    cols.push(Arc::new(Int32Array::from_iter_values(
        raw.labels.iter().map(|&l| l as i32),
    )));
    for f in 0..criteo::DENSE {
        fields.push(Field::new(format!("I{}", f + 1), DataType::Int64, true));
        cols.push(Arc::new(Int64Array::from_iter(
            (0..n).map(|r| raw.ints[r * criteo::DENSE + f]),
        )));
    }
    fields.push(Field::new("weight", DataType::Float64, false));
    cols.push(Arc::new(Float64Array::from_iter_values(
        (0..n).map(|r| r as f64 * 0.5),
    )));
    for f in 0..criteo::CATEGORICAL {
        fields.push(Field::new(format!("C{}", f + 1), DataType::UInt32, true));
        cols.push(Arc::new(UInt32Array::from_iter(
            (0..n).map(|r| raw.cats[r * criteo::CATEGORICAL + f]),
        )));
    }
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), cols).unwrap();
    let file = std::fs::File::create(&path).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(file, schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();

    // Garbage over the pages of `note` (file column 0) and `weight` (file column 15).
    let mut bytes = std::fs::read(&path).unwrap();
    let meta = footer(&path);
    for rg in meta.row_groups() {
        for c in [0, 15] {
            let (start, len) = rg.column(c).byte_range();
            bytes[start as usize..(start + len) as usize].fill(0xff);
        }
    }
    write(&path, &bytes);
    let everything = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&path).unwrap())
        .unwrap()
        .build()
        .unwrap()
        .collect::<Result<Vec<_>, _>>();
    assert!(everything.is_err(), "the garbage must break a full decode");

    let (got, stats) = read_all(&path, BadRowPolicy::Fail).unwrap();
    assert_eq!(got, raw.to_batch());
    assert_eq!(stats.rows_read, n as u64);
    let mut r = ParquetReader::open_range(&path, 100, 130, BadRowPolicy::Fail).unwrap();
    let (part, _) = elastrec_data::reader::drain(&mut r).unwrap();
    assert_eq!(part.labels, got.labels[100..130]);
}

fn footer(path: &Path) -> ParquetMetaData {
    ParquetMetaDataReader::new()
        .parse_and_finish(&std::fs::File::open(path).unwrap())
        .unwrap()
}

/// Rewrites `path`'s footer as `meta` (the data pages stay where they are).
fn replace_footer(path: &Path, meta: &ParquetMetaData) {
    let bytes = std::fs::read(path).unwrap();
    let len = bytes.len();
    let footer_len = u32::from_le_bytes(bytes[len - 8..len - 4].try_into().unwrap()) as usize;
    let mut out = bytes[..len - 8 - footer_len].to_vec();
    ParquetMetaDataWriter::new(&mut out, meta).finish().unwrap();
    write(path, &out);
}

fn two_group_file(path: &Path) {
    let mut w = ParquetWriter::create(
        path,
        ParquetOptions {
            row_group_rows: 200,
            snappy: false,
        },
    )
    .unwrap();
    w.write(&random_rows(300, 22)).unwrap();
    w.finish().unwrap();
}

fn assert_footer_error(path: &Path, reason: &str) {
    let expected = format!("{}: parquet: footer: {reason}", path.display());
    let errors = [
        count_rows(path).unwrap_err(),
        ParquetReader::open(path, BadRowPolicy::Skip).unwrap_err(),
        open_reader_range(path, 0, 1, BadRowPolicy::Skip)
            .err()
            .unwrap(),
    ];
    for e in errors {
        assert!(matches!(e, DataError::Parquet { .. }), "{e:?}");
        assert_eq!(e.to_string(), expected);
    }
}

/// Footer row counts are `i64`s: a negative one is an error naming the file, where a cast
/// made it ~2^64 rows.
#[test]
fn negative_footer_row_counts_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("negative.parquet");
    for (counts, reason) in [
        ([-1, -2], "file row count -3 is negative"),
        ([301, -1], "row group 1 row count -1 is negative"),
    ] {
        two_group_file(&path);
        let mut builder = footer(&path).into_builder();
        let groups = builder
            .take_row_groups()
            .into_iter()
            .zip(counts)
            .map(|(g, n)| g.into_builder().set_num_rows(n).build().unwrap())
            .collect();
        // The writer stores the sum of the groups' counts as the file's.
        replace_footer(&path, &builder.set_row_groups(groups).build());
        assert_footer_error(&path, reason);
    }
}

/// A file row count that is not the sum of its row groups' is an error: a range read
/// would otherwise trust rows that no row group holds.
#[test]
fn footer_row_counts_that_do_not_add_up_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mismatch.parquet");
    two_group_file(&path);
    assert_eq!(count_rows(&path).unwrap(), 300);
    // The footer is Thrift compact: the file's `num_rows` is field 3, an i64 following
    // field 2 (header byte 0x16), as a zigzag varint: 300 -> d8 04. 301 -> da 04 has the
    // same length. The row groups hold 200 (90 03) and 100 (c8 01), so the match is unique.
    let mut bytes = std::fs::read(&path).unwrap();
    let len = bytes.len();
    let footer_len = u32::from_le_bytes(bytes[len - 8..len - 4].try_into().unwrap()) as usize;
    let footer_start = len - 8 - footer_len;
    let at: Vec<usize> = bytes[footer_start..len - 8]
        .windows(3)
        .enumerate()
        .filter(|(_, w)| *w == [0x16, 0xd8, 0x04])
        .map(|(i, _)| footer_start + i)
        .collect();
    assert_eq!(
        at.len(),
        1,
        "file num_rows not found exactly once in the footer"
    );
    bytes[at[0] + 1] = 0xda;
    write(&path, &bytes);
    assert_footer_error(
        &path,
        "the file row count 301 is not the sum of its 2 row groups' counts",
    );
}
