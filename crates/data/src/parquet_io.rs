//! Parquet writer and reader with the same [`Batch`] semantics as the TSV reader.
//!
//! Schema written by [`ParquetWriter`] (the canonical one):
//! - `label`: `Int32`, not null, 0 or 1;
//! - `label_1`..`label_K`: only in a multi-task file (rows of `K + 1` labels, e.g. a
//!   conversion after the click): `Int32`, not null, 0 or 1 each;
//! - `I1`..`I13`: nullable `Int64`, the raw integers (null = empty field);
//! - `C1`..`C26`: nullable `UInt32`, the value of the 8 hex digits (null = empty field).
//!
//! `UInt32` was chosen over 8-hex strings: 4 bytes instead of 8+ per value, no parse, and
//! the value is exactly what the TSV reader produces. [`ParquetReader`] also accepts files
//! written by other tools: `label` as any integer or float type holding 0/1, `I*` as
//! `Int32`/`Int64`, `C*` as `UInt32`, `Int64`/`Int32` (0..2^32) or 8-hex `Utf8`/`LargeUtf8`.
//! Extra columns are ignored (not even decoded). A bad value is reported as `file: row R: column C: reason`
//! and handled by the [`BadRowPolicy`] like a malformed TSV line.
//!
//! Row ranges select the row groups that overlap the range and skip inside the first one,
//! so a range read decodes at most one row group of rows it does not deliver.

use crate::batch::Batch;
use crate::columns::RawColumns;
use crate::criteo;
use crate::error::{show_bytes, DataError, FieldError, Result};
use crate::raw::{RawBatch, RawRow};
use crate::reader::{BadRowPolicy, BatchReader, ReadStats, RowSink};
use crate::row_groups::{decode_threads, spans, Decoder};
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt32Type, UInt8Type,
};
use arrow_array::{Array, ArrayRef, Int32Array, Int64Array, RecordBatch, UInt32Array};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::arrow::{ArrowWriter, ProjectionMask};
use parquet::basic::Compression;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::properties::WriterProperties;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Name of the label column of task `t ≥ 1` of a multi-task file: `label_1`, ...
pub fn task_label_column(t: usize) -> String {
    format!("label_{t}")
}

/// The canonical Arrow schema (see the module docs).
pub fn criteo_schema() -> SchemaRef {
    schema_with_tasks(0)
}

/// The canonical schema of rows with `extra` labels after the first.
fn schema_with_tasks(extra: usize) -> SchemaRef {
    let mut fields = vec![Field::new("label", DataType::Int32, false)];
    fields.extend((1..=extra).map(|t| Field::new(task_label_column(t), DataType::Int32, false)));
    fields.extend(
        (0..criteo::DENSE).map(|i| Field::new(criteo::dense_name(i), DataType::Int64, true)),
    );
    fields.extend(
        (0..criteo::CATEGORICAL)
            .map(|i| Field::new(criteo::categorical_name(i), DataType::UInt32, true)),
    );
    Arc::new(Schema::new(fields))
}

/// Options for [`ParquetWriter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParquetOptions {
    /// Maximum rows per row group (the granularity of range reads).
    pub row_group_rows: usize,
    /// Compress pages with Snappy.
    pub snappy: bool,
}

impl Default for ParquetOptions {
    fn default() -> Self {
        Self {
            row_group_rows: 64 * 1024,
            snappy: true,
        }
    }
}

/// Writes raw Criteo rows to a Parquet file with the canonical schema.
///
/// The file is opened at [`ParquetWriter::create`] and its schema fixed by the first
/// rows written: a multi-task file gets its extra label columns then.
pub struct ParquetWriter {
    path: PathBuf,
    pending: Option<(File, WriterProperties)>,
    writer: Option<ArrowWriter<File>>,
    schema: SchemaRef,
    /// Labels per row after the first (from the first rows written).
    extra: usize,
    rows: u64,
}

impl std::fmt::Debug for ParquetWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParquetWriter")
            .field("path", &self.path)
            .field("rows", &self.rows)
            .finish()
    }
}

impl ParquetWriter {
    /// Creates (truncates) `path`.
    pub fn create(path: &Path, options: ParquetOptions) -> Result<Self> {
        let file = File::create(path).map_err(|e| DataError::io(path, e))?;
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(options.row_group_rows.max(1)))
            .set_compression(if options.snappy {
                Compression::SNAPPY
            } else {
                Compression::UNCOMPRESSED
            })
            .set_created_by("elastrec-data".to_string())
            .build();
        Ok(Self {
            path: path.to_path_buf(),
            pending: Some((file, props)),
            writer: None,
            schema: criteo_schema(),
            extra: 0,
            rows: 0,
        })
    }

    /// Opens the Arrow writer with the schema of `extra` labels after the first, unless
    /// it is open.
    fn open(&mut self, extra: usize) -> Result<()> {
        if let Some((file, props)) = self.pending.take() {
            self.extra = extra;
            self.schema = schema_with_tasks(extra);
            let w = ArrowWriter::try_new(file, self.schema.clone(), Some(props))
                .map_err(|e| DataError::parquet(&self.path, e))?;
            self.writer = Some(w);
        }
        Ok(())
    }

    /// Appends the rows of `raw`. Every row of a file carries as many labels as the
    /// first written.
    pub fn write(&mut self, raw: &RawBatch) -> Result<()> {
        let n = raw.len();
        let extra_of = |i: usize| raw.extra_tasks.get(i).map_or(0, |&x| x as usize);
        let first = if self.pending.is_some() {
            extra_of(0)
        } else {
            self.extra
        };
        if let Some(i) = (0..n).find(|&i| extra_of(i) != first) {
            return Err(DataError::InvalidSpec(format!(
                "{}: row {} carries {} label(s), the file's rows {}: a file holds rows of one task count",
                self.path.display(),
                self.rows + i as u64,
                1 + extra_of(i),
                1 + first
            )));
        }
        let mut cols: Vec<ArrayRef> =
            Vec::with_capacity(1 + first + criteo::DENSE + criteo::CATEGORICAL);
        cols.push(Arc::new(Int32Array::from_iter_values(
            raw.labels.iter().map(|&l| l as i32),
        )));
        for t in 0..first {
            cols.push(Arc::new(Int32Array::from_iter_values(
                raw.extra_labels.iter().map(|&b| i32::from((b >> t) & 1)),
            )));
        }
        for f in 0..criteo::DENSE {
            cols.push(Arc::new(Int64Array::from_iter(
                (0..n).map(|r| raw.ints[r * criteo::DENSE + f]),
            )));
        }
        for f in 0..criteo::CATEGORICAL {
            cols.push(Arc::new(UInt32Array::from_iter(
                (0..n).map(|r| raw.cats[r * criteo::CATEGORICAL + f]),
            )));
        }
        self.open(first)?;
        let batch = RecordBatch::try_new(self.schema.clone(), cols)
            .map_err(|e| DataError::parquet(&self.path, e))?;
        self.writer
            .as_mut()
            .expect("opened")
            .write(&batch)
            .map_err(|e| DataError::parquet(&self.path, e))?;
        self.rows += n as u64;
        Ok(())
    }

    /// Flushes and closes the file; returns the number of rows written.
    pub fn finish(mut self) -> Result<u64> {
        self.open(0)?;
        self.writer
            .take()
            .expect("opened")
            .close()
            .map_err(|e| DataError::parquet(&self.path, e))?;
        Ok(self.rows)
    }
}

/// Row count of a Parquet file, from its footer.
pub fn parquet_row_count(path: &Path) -> Result<u64> {
    let file = File::open(path).map_err(|e| DataError::io(path, e))?;
    // The footer alone: no Arrow schema is built, no column is touched.
    let meta = guarded(path, "reading the footer", || {
        parquet::file::metadata::ParquetMetaDataReader::new()
            .parse_and_finish(&file)
            .map_err(|e| DataError::parquet(path, e))
    })?;
    Ok(footer_rows(path, &meta)?.0)
}

/// Runs `f`, a call into the Parquet and Arrow decoders. They panic on some corrupt input
/// (an offset out of bounds, a bad bit width) instead of returning an error; such a panic
/// becomes an error naming the file and what was being read, and prints nothing.
pub(crate) fn guarded<T>(path: &Path, what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match elastrec_common::quiet_catch_unwind(f) {
        Ok(r) => r,
        Err(message) => Err(DataError::parquet(
            path,
            format!("{what}: the file is corrupt (the decoder failed: {message})"),
        )),
    }
}

/// A Parquet file opened for decoding: the decoder (`None` for an empty range) and the
/// file row number of its first row.
pub(crate) struct Opened {
    pub inner: Option<Decoder>,
    pub next_row: u64,
}

/// Opens rows `range` (all with `None`) of `path`, decoding only the root columns `select`
/// picks from the file's Arrow schema, in batches of [`DECODE_BATCH`] rows, with its row
/// groups on up to [`decode_threads`] threads.
///
/// Row ranges select the row groups that overlap the range and skip inside the first one.
pub(crate) fn open_projected(
    path: &Path,
    range: Option<(u64, u64)>,
    select: impl FnOnce(&Schema) -> Result<Vec<usize>>,
) -> Result<Opened> {
    open_projected_on(path, range, select, decode_threads())
}

/// [`open_projected`] on at most `threads` decoding threads.
pub(crate) fn open_projected_on(
    path: &Path,
    range: Option<(u64, u64)>,
    select: impl FnOnce(&Schema) -> Result<Vec<usize>>,
    threads: usize,
) -> Result<Opened> {
    let file = File::open(path).map_err(|e| DataError::io(path, e))?;
    let meta = guarded(path, "reading the footer", || {
        ArrowReaderMetadata::load(&file, ArrowReaderOptions::default())
            .map_err(|e| DataError::parquet(path, e))
    })?;
    let columns = select(meta.schema())?;
    let mask = ProjectionMask::roots(meta.parquet_schema(), columns);
    let (rows, group_rows) = footer_rows(path, meta.metadata())?;
    if let Some((start, end)) = range {
        if start > end || end > rows {
            return Err(DataError::InvalidRange {
                path: path.to_path_buf(),
                start,
                end,
                rows,
            });
        }
    }
    let next_row = range.map_or(0, |(start, _)| start);
    let spans = spans(&group_rows, range);
    let inner = if spans.is_empty() {
        None
    } else {
        Some(Decoder::open(
            path,
            file,
            meta,
            mask,
            DECODE_BATCH,
            spans,
            threads,
        )?)
    };
    Ok(Opened { inner, next_row })
}

/// The file's row count and each row group's, from the footer.
///
/// The footer stores them as `i64`s that nothing has checked: a corrupt or hostile file
/// may hold negative counts (which `as u64` would turn into ~2^64 rows) or row groups that
/// do not add up to the file's count. Either is an error naming the file.
fn footer_rows(path: &Path, meta: &ParquetMetaData) -> Result<(u64, Vec<u64>)> {
    let count = |what: &str, n: i64| {
        u64::try_from(n).map_err(|_| {
            DataError::parquet(path, format!("footer: {what} row count {n} is negative"))
        })
    };
    let total = count("file", meta.file_metadata().num_rows())?;
    let groups = meta
        .row_groups()
        .iter()
        .enumerate()
        .map(|(g, rg)| count(&format!("row group {g}"), rg.num_rows()))
        .collect::<Result<Vec<u64>>>()?;
    let sum = groups.iter().try_fold(0u64, |acc, &n| acc.checked_add(n));
    if sum != Some(total) {
        return Err(DataError::parquet(
            path,
            format!(
                "footer: the file row count {total} is not the sum of its {} row groups' counts",
                groups.len()
            ),
        ));
    }
    Ok((total, groups))
}

/// Where each Criteo column lives: first as indices into the file's schema (to build the
/// projection mask), then, after [`Projection::project`], into the decoded batches.
#[derive(Debug, Clone)]
struct Projection {
    label: usize,
    /// `label_1`, `label_2`, ... of a multi-task file (as many as are there in a row).
    extra: Vec<usize>,
    ints: [usize; criteo::DENSE],
    cats: [usize; criteo::CATEGORICAL],
}

fn check_type(path: &Path, schema: &Schema, name: &str, ok: &[DataType]) -> Result<usize> {
    let i = schema
        .index_of(name)
        .map_err(|_| DataError::parquet(path, format!("missing column {name:?}")))?;
    let dt = schema.field(i).data_type();
    if !ok.contains(dt) {
        return Err(DataError::parquet(
            path,
            format!("column {name:?} has unsupported type {dt}"),
        ));
    }
    Ok(i)
}

impl Projection {
    fn new(path: &Path, schema: &Schema) -> Result<Self> {
        use DataType::*;
        let label = check_type(
            path,
            schema,
            "label",
            &[
                Int8, Int16, Int32, Int64, UInt8, UInt32, Float32, Float64, Boolean,
            ],
        )?;
        let mut ints = [0; criteo::DENSE];
        for (i, slot) in ints.iter_mut().enumerate() {
            *slot = check_type(path, schema, &criteo::dense_name(i), &[Int32, Int64])?;
        }
        let mut cats = [0; criteo::CATEGORICAL];
        for (i, slot) in cats.iter_mut().enumerate() {
            *slot = check_type(
                path,
                schema,
                &criteo::categorical_name(i),
                &[UInt32, Int32, Int64, Utf8, LargeUtf8],
            )?;
        }
        let label_types = [
            Int8, Int16, Int32, Int64, UInt8, UInt32, Float32, Float64, Boolean,
        ];
        let mut extra = Vec::new();
        for t in 1..=crate::raw::MAX_EXTRA_TASKS as usize {
            if schema.index_of(&task_label_column(t)).is_err() {
                break;
            }
            extra.push(check_type(
                path,
                schema,
                &task_label_column(t),
                &label_types,
            )?);
        }
        Ok(Self {
            label,
            extra,
            ints,
            cats,
        })
    }

    /// The file columns to decode, in file order, and the projection that addresses them
    /// in the decoded batches (which hold only these columns, in file order).
    fn project(&self) -> (Vec<usize>, Projection) {
        let mut wanted: Vec<usize> = std::iter::once(self.label)
            .chain(self.extra.iter().copied())
            .chain(self.ints)
            .chain(self.cats)
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        let pos = |c: usize| {
            wanted
                .binary_search(&c)
                .expect("column is in the projection")
        };
        let decoded = Projection {
            label: pos(self.label),
            extra: self.extra.iter().map(|&c| pos(c)).collect(),
            ints: self.ints.map(pos),
            cats: self.cats.map(pos),
        };
        (wanted, decoded)
    }
}

/// Reads Parquet files with the Criteo columns into [`Batch`]es.
pub struct ParquetReader {
    path: PathBuf,
    inner: Option<Decoder>,
    projection: Projection,
    /// The current decoded Arrow batch, converted column-wise to raw rows.
    staged: RawBatch,
    /// First bad value of each staged row, if any.
    staged_err: Vec<Option<(String, FieldError)>>,
    cursor: usize,
    /// File row number of staged row `cursor`.
    next_row: u64,
    policy: BadRowPolicy,
    stats: ReadStats,
}

impl std::fmt::Debug for ParquetReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParquetReader")
            .field("path", &self.path)
            .field("next_row", &self.next_row)
            .field("stats", &self.stats)
            .finish()
    }
}

pub(crate) const DECODE_BATCH: usize = 8192;

impl ParquetReader {
    /// Opens a whole Parquet file.
    pub fn open(path: &Path, policy: BadRowPolicy) -> Result<Self> {
        Self::open_inner(path, None, policy)
    }

    /// Opens rows `start_row..end_row` (0-based, end exclusive).
    pub fn open_range(
        path: &Path,
        start_row: u64,
        end_row: u64,
        policy: BadRowPolicy,
    ) -> Result<Self> {
        Self::open_inner(path, Some((start_row, end_row)), policy)
    }

    fn open_inner(path: &Path, range: Option<(u64, u64)>, policy: BadRowPolicy) -> Result<Self> {
        let mut projection = None;
        // Decode only the 40 Criteo columns: a file may carry others (ids, text, nested
        // data) that would cost decoding time and memory for nothing.
        let opened = open_projected(path, range, |schema| {
            let (columns, decoded) = Projection::new(path, schema)?.project();
            projection = Some(decoded);
            Ok(columns)
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            inner: opened.inner,
            projection: projection.expect("set when the file opened"),
            staged: RawBatch::default(),
            staged_err: Vec::new(),
            cursor: 0,
            next_row: opened.next_row,
            policy,
            stats: ReadStats::default(),
        })
    }

    /// Decodes the next row into `row`; `Ok(false)` at the end. Bad rows follow the policy.
    pub fn next_raw(&mut self, row: &mut RawRow) -> Result<bool> {
        loop {
            if self.cursor >= self.staged.len() {
                let Some(inner) = self.inner.as_mut() else {
                    return Ok(false);
                };
                let what = format!("decoding the rows from {}", self.next_row);
                let (projection, staged, errs) =
                    (&self.projection, &mut self.staged, &mut self.staged_err);
                let decoded = match inner.next_batch(&self.path, &what) {
                    None => Ok(false),
                    Some(Err(e)) => Err(e),
                    Some(Ok(b)) => guarded(&self.path, &what, || {
                        stage(&b, projection, staged, errs);
                        Ok(true)
                    }),
                };
                match decoded {
                    Ok(true) => {
                        self.cursor = 0;
                        continue;
                    }
                    Ok(false) => {
                        self.inner = None;
                        return Ok(false);
                    }
                    Err(e) => {
                        // A decoder that failed (or panicked) half way is not read again.
                        self.inner = None;
                        self.staged.clear();
                        return Err(e);
                    }
                }
            }
            let i = self.cursor;
            self.cursor += 1;
            let file_row = self.next_row;
            self.next_row += 1;
            match self.staged_err[i].take() {
                None => {
                    *row = self.staged.row(i);
                    self.stats.rows_read += 1;
                    return Ok(true);
                }
                Some((column, reason)) => {
                    let err = DataError::BadValue {
                        path: self.path.clone(),
                        row: file_row,
                        column,
                        reason,
                    };
                    self.stats.refuse_or_skip(self.policy, err)?;
                }
            }
        }
    }
}

/// Converts an Arrow batch column by column (one downcast per column) into raw rows,
/// recording the first bad value of each row (label first, then `C1..C26`).
fn stage(
    b: &RecordBatch,
    p: &Projection,
    raw: &mut RawBatch,
    errs: &mut Vec<Option<(String, FieldError)>>,
) {
    let n = b.num_rows();
    raw.labels.clear();
    raw.labels.resize(n, 0);
    raw.ints.clear();
    raw.ints.resize(n * criteo::DENSE, None);
    raw.cats.clear();
    raw.cats.resize(n * criteo::CATEGORICAL, None);
    errs.clear();
    errs.resize(n, None);
    let label = b.column(p.label);
    for (r, slot) in raw.labels.iter_mut().enumerate() {
        match decode_label(label, r) {
            Ok(v) => *slot = v,
            Err(e) => errs[r] = Some(("label".to_string(), e)),
        }
    }
    raw.extra_tasks.clear();
    raw.extra_labels.clear();
    if !p.extra.is_empty() {
        raw.extra_tasks.resize(n, p.extra.len() as u8);
        raw.extra_labels.resize(n, 0);
        for (t, &c) in p.extra.iter().enumerate() {
            let col = b.column(c);
            for (r, bits) in raw.extra_labels.iter_mut().enumerate() {
                match decode_label(col, r) {
                    Ok(v) => *bits |= v << t,
                    Err(e) => {
                        if errs[r].is_none() {
                            errs[r] = Some((task_label_column(t + 1), e));
                        }
                    }
                }
            }
        }
    }
    for (f, &c) in p.ints.iter().enumerate() {
        let col = b.column(c);
        let dst = raw.ints.iter_mut().skip(f).step_by(criteo::DENSE);
        match col.data_type() {
            DataType::Int32 => {
                for (d, v) in dst.zip(col.as_primitive::<Int32Type>().iter()) {
                    *d = v.map(i64::from);
                }
            }
            _ => {
                let a = col.as_primitive::<Int64Type>();
                if a.null_count() == 0 {
                    for (d, &v) in dst.zip(a.values().iter()) {
                        *d = Some(v);
                    }
                } else {
                    for (d, v) in dst.zip(a.iter()) {
                        *d = v;
                    }
                }
            }
        }
    }
    for (f, &c) in p.cats.iter().enumerate() {
        let col = b.column(c);
        let dst = raw.cats.iter_mut().skip(f).step_by(criteo::CATEGORICAL);
        if let DataType::UInt32 = col.data_type() {
            let a = col.as_primitive::<UInt32Type>();
            if a.null_count() == 0 {
                for (d, &v) in dst.zip(a.values().iter()) {
                    *d = Some(v);
                }
            } else {
                for (d, v) in dst.zip(a.iter()) {
                    *d = v;
                }
            }
            continue;
        }
        for (r, d) in dst.enumerate() {
            match decode_cat(col, r) {
                Ok(v) => *d = v,
                Err(e) => {
                    if errs[r].is_none() {
                        errs[r] = Some((criteo::categorical_name(f), e));
                    }
                }
            }
        }
    }
}

pub(crate) fn decode_label(col: &ArrayRef, i: usize) -> Result<u8, FieldError> {
    if col.is_null(i) {
        return Err(FieldError::EmptyLabel);
    }
    let v: f64 = match col.data_type() {
        DataType::Int8 => col.as_primitive::<Int8Type>().value(i) as f64,
        DataType::Int16 => col.as_primitive::<Int16Type>().value(i) as f64,
        DataType::Int32 => col.as_primitive::<Int32Type>().value(i) as f64,
        DataType::Int64 => col.as_primitive::<Int64Type>().value(i) as f64,
        DataType::UInt8 => col.as_primitive::<UInt8Type>().value(i) as f64,
        DataType::UInt32 => col.as_primitive::<UInt32Type>().value(i) as f64,
        DataType::Float32 => col.as_primitive::<Float32Type>().value(i) as f64,
        DataType::Float64 => col.as_primitive::<Float64Type>().value(i),
        DataType::Boolean => col.as_boolean().value(i) as u8 as f64,
        _ => unreachable!("type checked at open"),
    };
    if v == 0.0 {
        Ok(0)
    } else if v == 1.0 {
        Ok(1)
    } else {
        Err(FieldError::BadLabel(v.to_string()))
    }
}

fn decode_cat(col: &ArrayRef, i: usize) -> Result<Option<u32>, FieldError> {
    if col.is_null(i) {
        return Ok(None);
    }
    let wide = |v: i64| u32::try_from(v).map_err(|_| FieldError::BadCategory(v.to_string()));
    match col.data_type() {
        DataType::UInt32 => Ok(Some(col.as_primitive::<UInt32Type>().value(i))),
        DataType::Int32 => wide(col.as_primitive::<Int32Type>().value(i) as i64).map(Some),
        DataType::Int64 => wide(col.as_primitive::<Int64Type>().value(i)).map(Some),
        DataType::Utf8 => hex8(col.as_string::<i32>().value(i).as_bytes()),
        DataType::LargeUtf8 => hex8(col.as_string::<i64>().value(i).as_bytes()),
        _ => unreachable!("type checked at open"),
    }
}

fn hex8(s: &[u8]) -> Result<Option<u32>, FieldError> {
    if s.is_empty() {
        return Ok(None);
    }
    if s.len() == 8 && s.iter().all(u8::is_ascii_hexdigit) {
        let text = std::str::from_utf8(s).expect("ascii");
        return Ok(Some(u32::from_str_radix(text, 16).expect("8 hex digits")));
    }
    Err(FieldError::BadCategory(show_bytes(s)))
}

impl ParquetReader {
    fn fill<S: RowSink>(&mut self, batch: &mut S, max_rows: usize) -> Result<usize> {
        batch.clear();
        let mut row = RawRow::default();
        while batch.len() < max_rows && self.next_raw(&mut row)? {
            batch.push_row(&row);
        }
        Ok(batch.len())
    }
}

impl BatchReader for ParquetReader {
    fn next_batch(&mut self, batch: &mut Batch, max_rows: usize) -> Result<usize> {
        self.fill(batch, max_rows)
    }

    fn next_raw(&mut self, raw: &mut RawColumns, max_rows: usize) -> Result<usize> {
        self.fill(raw, max_rows)
    }

    fn stats(&self) -> &ReadStats {
        &self.stats
    }
}
