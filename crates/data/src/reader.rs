//! The reader seam: [`BatchReader`], the bad-row policy, read statistics and format
//! dispatch (`open_reader`, `open_reader_range`, `count_rows`).

use crate::batch::Batch;
use crate::columns::RawColumns;
use crate::error::{DataError, Result};
use crate::raw::RawRow;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex};

/// What a reader does with a malformed row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BadRowPolicy {
    /// Return the error from `next_batch` (the default: nothing is silently dropped).
    #[default]
    Fail,
    /// Skip the row, count it in [`ReadStats::rows_skipped`] and keep the first
    /// [`MAX_KEPT_ERRORS`] messages for the caller to report.
    Skip,
}

impl BadRowPolicy {
    /// Its name in a job file (`data.on_bad_row`) and on the command line (`--on-bad-row`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Fail => "fail",
            Self::Skip => "skip",
        }
    }
}

impl std::str::FromStr for BadRowPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fail" => Ok(Self::Fail),
            "skip" => Ok(Self::Skip),
            other => Err(format!("must be `fail` or `skip`, got `{other}`")),
        }
    }
}

/// Number of error messages [`ReadStats`] keeps under [`BadRowPolicy::Skip`].
pub const MAX_KEPT_ERRORS: usize = 8;

/// Counters a reader keeps while reading.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadStats {
    /// Rows delivered into batches.
    pub rows_read: u64,
    /// Malformed rows skipped (only under [`BadRowPolicy::Skip`]).
    pub rows_skipped: u64,
    /// The first [`MAX_KEPT_ERRORS`] skip messages, `file:line: field N: reason`.
    pub first_errors: Vec<String>,
    /// Lists (bags, sequences) longer than their feature's `max_len`, cut to it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lists_truncated: u64,
    /// Null items dropped from lists.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub list_nulls: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl ReadStats {
    /// A bad row under `policy`: the error under [`BadRowPolicy::Fail`], counted and
    /// `Ok` under [`BadRowPolicy::Skip`].
    pub fn refuse_or_skip(&mut self, policy: BadRowPolicy, err: DataError) -> Result<()> {
        match policy {
            BadRowPolicy::Fail => Err(err),
            BadRowPolicy::Skip => {
                self.record_skip(&err);
                Ok(())
            }
        }
    }

    /// Records a skipped row.
    pub fn record_skip(&mut self, err: &DataError) {
        self.rows_skipped += 1;
        if self.first_errors.len() < MAX_KEPT_ERRORS {
            self.first_errors.push(err.to_string());
        }
    }

    /// Adds another reader's counters (e.g. to total several files).
    pub fn merge(&mut self, other: &ReadStats) {
        self.rows_read += other.rows_read;
        self.rows_skipped += other.rows_skipped;
        self.lists_truncated += other.lists_truncated;
        self.list_nulls += other.list_nulls;
        for e in &other.first_errors {
            if self.first_errors.len() < MAX_KEPT_ERRORS {
                self.first_errors.push(e.clone());
            }
        }
    }
}

impl fmt::Display for ReadStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} rows read, {} skipped",
            self.rows_read, self.rows_skipped
        )?;
        if self.lists_truncated > 0 {
            write!(f, ", {} lists cut to max_len", self.lists_truncated)?;
        }
        if self.list_nulls > 0 {
            write!(f, ", {} null list items dropped", self.list_nulls)?;
        }
        for e in &self.first_errors {
            write!(f, "\n  skipped: {e}")?;
        }
        if self.rows_skipped > self.first_errors.len() as u64 {
            write!(
                f,
                "\n  ... and {} more",
                self.rows_skipped - self.first_errors.len() as u64
            )?;
        }
        Ok(())
    }
}

/// A source of Criteo-layout batches.
///
/// Implemented by [`crate::TsvReader`] and [`crate::ParquetReader`].
pub trait BatchReader: Send {
    /// Clears `batch` and fills it with up to `max_rows` rows. Returns the number of rows
    /// delivered; `0` means the reader (or its row range) is exhausted.
    ///
    /// Under [`BadRowPolicy::Fail`] a malformed row returns its error; the rows before it
    /// stay in `batch` and the reader is positioned after the bad row. Skipped rows do not
    /// count towards `max_rows` but do count towards the reader's row range (a range is a
    /// range of physical rows/lines).
    fn next_batch(&mut self, batch: &mut Batch, max_rows: usize) -> Result<usize>;

    /// Like [`BatchReader::next_batch`], but delivers the raw rows, untransformed, for a
    /// preprocessing plan (`elastrec-preprocess`). Readers of already preprocessed
    /// batches (a data executor's) do not have them and say so.
    fn next_raw(&mut self, raw: &mut RawColumns, max_rows: usize) -> Result<usize> {
        let _ = (raw, max_rows);
        Err(DataError::InvalidSpec(
            "this reader delivers preprocessed batches, not raw rows".into(),
        ))
    }

    /// Counters so far.
    fn stats(&self) -> &ReadStats;

    /// Where the reader stands in its own units when they are not rows: a stream reader
    /// returns the offset of the first message not wholly delivered (a message may hold
    /// many samples, and offsets may have gaps). `None` (files): the position is the
    /// range start plus rows delivered and skipped.
    fn position(&self) -> Option<u64> {
        None
    }
}

impl<R: BatchReader + ?Sized> BatchReader for Box<R> {
    fn next_batch(&mut self, batch: &mut Batch, max_rows: usize) -> Result<usize> {
        (**self).next_batch(batch, max_rows)
    }
    fn next_raw(&mut self, raw: &mut RawColumns, max_rows: usize) -> Result<usize> {
        (**self).next_raw(raw, max_rows)
    }
    fn stats(&self) -> &ReadStats {
        (**self).stats()
    }
    fn position(&self) -> Option<u64> {
        (**self).position()
    }
}

/// Where a reader puts the rows it parses: a [`Batch`] (the default transform) or
/// [`RawColumns`] (for a preprocessing plan). Readers fill either through one loop.
pub trait RowSink {
    /// Drops every row.
    fn clear(&mut self);
    /// Rows held.
    fn len(&self) -> usize;
    /// True when no row is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Appends one row.
    fn push_row(&mut self, row: &RawRow);
}

impl RowSink for Batch {
    /// Empties the batch for a Criteo reader's rows, giving it the preset's layout.
    fn clear(&mut self) {
        Batch::clear(self);
        crate::criteo::set_layout(self);
    }
    fn len(&self) -> usize {
        Batch::len(self)
    }
    #[inline]
    fn push_row(&mut self, row: &RawRow) {
        self.push_raw(row)
    }
}

impl RowSink for RawColumns {
    fn clear(&mut self) {
        RawColumns::clear(self)
    }
    fn len(&self) -> usize {
        RawColumns::len(self)
    }
    #[inline]
    fn push_row(&mut self, row: &RawRow) {
        self.push(row)
    }
}

/// On-disk format of a data file, detected from its first bytes (never its extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileFormat {
    /// Plain Criteo TSV.
    Tsv,
    /// Gzip-compressed Criteo TSV (magic `1f 8b`; multi-member files are read whole).
    TsvGzip,
    /// Parquet (magic `PAR1`).
    Parquet,
}

/// Detects the format of `path` from its magic bytes.
pub fn detect_format(path: &Path) -> Result<FileFormat> {
    let mut f = std::fs::File::open(path).map_err(|e| DataError::io(path, e))?;
    let mut magic = [0u8; 4];
    let mut n = 0;
    while n < 4 {
        let k = f
            .read(&mut magic[n..])
            .map_err(|e| DataError::io(path, e))?;
        if k == 0 {
            break;
        }
        n += k;
    }
    Ok(if n >= 2 && magic[..2] == [0x1f, 0x8b] {
        FileFormat::TsvGzip
    } else if n == 4 && &magic == b"PAR1" {
        FileFormat::Parquet
    } else {
        FileFormat::Tsv
    })
}

/// Opens any supported file (format detected by magic bytes) for a full read.
pub fn open_reader(path: &Path, policy: BadRowPolicy) -> Result<Box<dyn BatchReader>> {
    Ok(match detect_format(path)? {
        FileFormat::Parquet => Box::new(crate::ParquetReader::open(path, policy)?),
        _ => Box::new(crate::TsvReader::open(path, policy)?),
    })
}

/// Opens rows `start_row..end_row` (0-based, end exclusive) of any supported file.
pub fn open_reader_range(
    path: &Path,
    start_row: u64,
    end_row: u64,
    policy: BadRowPolicy,
) -> Result<Box<dyn BatchReader>> {
    Ok(match detect_format(path)? {
        FileFormat::Parquet => Box::new(crate::ParquetReader::open_range(
            path, start_row, end_row, policy,
        )?),
        _ => Box::new(crate::TsvReader::open_range(
            path, start_row, end_row, policy,
        )?),
    })
}

/// Opens rows `range` (all with `None`) of `path`: through `schema` when the job names
/// its features (Parquet, or CSV/TSV with a header, plain or gzip), else as the Criteo
/// layout (TSV, gzip TSV or Parquet).
pub fn open_source(
    path: &Path,
    range: Option<(u64, u64)>,
    policy: BadRowPolicy,
    schema: Option<&std::sync::Arc<crate::Schema>>,
) -> Result<Box<dyn BatchReader>> {
    let Some(schema) = schema else {
        return match range {
            None => open_reader(path, policy),
            Some((start, end)) => open_reader_range(path, start, end, policy),
        };
    };
    Ok(match detect_format(path)? {
        FileFormat::Parquet => Box::new(crate::NamedParquetReader::open(
            path,
            range,
            policy,
            schema.clone(),
        )?),
        FileFormat::Tsv | FileFormat::TsvGzip => Box::new(crate::NamedCsvReader::open(
            path,
            range,
            policy,
            schema.clone(),
        )?),
    })
}

/// Number of data rows of `path` as a job reads it: with `named` features a text file's
/// first line is its header, not a row (see [`count_rows`]).
pub fn count_source_rows(path: &Path, named: bool) -> Result<u64> {
    let (format, rows) = counted(path)?;
    Ok(match format {
        FileFormat::Tsv | FileFormat::TsvGzip if named => rows.saturating_sub(1),
        _ => rows,
    })
}

/// Number of rows in any supported file. For TSV this is the number of lines (a final
/// line without `\n` counts) and builds or reuses the sidecar index (see
/// [`crate::index`]); for Parquet it reads the footer.
pub fn count_rows(path: &Path) -> Result<u64> {
    Ok(counted(path)?.1)
}

/// Parquet counts this process already made, by file, with the file's size and
/// modification time when counted: a job's start asks for each file's rows up to three
/// times (the automatic batch size, the standardization pass, the task queue), and a
/// changed file is counted again. A text file's count is its sidecar index's, which
/// [`crate::index`] already keeps (and checks) on disk.
static COUNTED: LazyLock<Mutex<HashMap<PathBuf, Counted>>> = LazyLock::new(Default::default);

/// A file's size and modification time when it was counted, and its rows.
type Counted = ((u64, u64), u64);

/// Entries [`COUNTED`] holds at most (about 100 MB for the longest paths); past it, it
/// starts over.
const COUNTED_MAX: usize = 1 << 20;

/// A file's format and rows; a Parquet file's from [`COUNTED`] while it is unchanged.
fn counted(path: &Path) -> Result<(FileFormat, u64)> {
    let memo = || COUNTED.lock().unwrap_or_else(|p| p.into_inner());
    let known = memo().get(path).copied();
    if let Some((at, rows)) = known {
        if at == crate::index::file_stamp(path)? {
            return Ok((FileFormat::Parquet, rows));
        }
    }
    let format = detect_format(path)?;
    if format != FileFormat::Parquet {
        // The index checks the file's stamp itself.
        return Ok((format, crate::index::LineIndex::load_or_build(path)?.rows));
    }
    // Taken before the footer is read: a file that changes meanwhile is counted again.
    let stamp = crate::index::file_stamp(path)?;
    let rows = crate::parquet_io::parquet_row_count(path)?;
    let mut memo = memo();
    if memo.len() >= COUNTED_MAX {
        memo.clear();
    }
    memo.insert(path.to_path_buf(), (stamp, rows));
    Ok((format, rows))
}

/// Reads a whole file into one batch (convenience for tests, evaluation and small data).
pub fn read_all(path: &Path, policy: BadRowPolicy) -> Result<(Batch, ReadStats)> {
    let mut reader = open_reader(path, policy)?;
    drain(&mut reader)
}

/// Reads everything left in `reader` into one batch.
pub fn drain(reader: &mut dyn BatchReader) -> Result<(Batch, ReadStats)> {
    let mut all = Batch::default();
    let mut chunk = Batch::default();
    loop {
        let n = reader.next_batch(&mut chunk, 8192)?;
        // The reader's layout, which it gives even a batch of no rows.
        if all.is_empty() {
            all.take_layout(&chunk);
        }
        if n == 0 {
            break;
        }
        all.extend_from(&chunk, 0..chunk.len());
    }
    Ok((all, reader.stats().clone()))
}
