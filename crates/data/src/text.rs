//! Line-oriented text files (Criteo TSV, CSV with a header), plain or gzip: opened at a
//! line (seeking through the sidecar [`LineIndex`] where it can), read one capped line
//! at a time within a range.

use crate::error::{DataError, Result};
use crate::index::LineIndex;
use crate::reader::FileFormat;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Longest line a text reader accepts, terminator included.
///
/// The longest well-formed Criteo line is about 510 bytes (13 integers of up to 20
/// characters, 26 × 8 hex digits, 39 tabs), so a line near this cap is already corrupt.
/// Without a cap one corrupt or hostile file with a multi-GB line (e.g. binary garbage
/// without `\n`, or a gzip bomb) would be buffered whole and could exhaust memory: the
/// reader buffers at most this many bytes of a line and skips the rest as a bad row.
pub const MAX_LINE_BYTES: usize = 1 << 20;

pub(crate) const READ_BUF: usize = 1 << 20;

/// Skips `n` lines of `input`; returns how many were actually there.
pub(crate) fn skip_lines(input: &mut dyn BufRead, n: u64) -> std::io::Result<u64> {
    let mut left = n;
    let mut partial = false;
    while left > 0 {
        let buf = input.fill_buf()?;
        if buf.is_empty() {
            if partial {
                left -= 1;
            }
            break;
        }
        let mut consumed = buf.len();
        for (i, &b) in buf.iter().enumerate() {
            if b == b'\n' {
                left -= 1;
                if left == 0 {
                    consumed = i + 1;
                    break;
                }
            }
        }
        partial = buf[consumed - 1] != b'\n';
        input.consume(consumed);
    }
    Ok(n - left)
}

pub(crate) fn open_input(path: &Path) -> Result<(Box<dyn BufRead + Send>, FileFormat)> {
    let format = crate::reader::detect_format(path)?;
    let file = File::open(path).map_err(|e| DataError::io(path, e))?;
    let input: Box<dyn BufRead + Send> = match format {
        FileFormat::TsvGzip => Box::new(BufReader::with_capacity(
            READ_BUF,
            flate2::read::MultiGzDecoder::new(BufReader::with_capacity(READ_BUF, file)),
        )),
        FileFormat::Tsv => Box::new(BufReader::with_capacity(READ_BUF, file)),
        FileFormat::Parquet => {
            return Err(DataError::parquet(
                path,
                "is a Parquet file, not TSV; use ParquetReader",
            ))
        }
    };
    Ok((input, format))
}

/// `path` (plain or gzip) positioned at 0-based line `start`, for a read of lines
/// `start..end`. A valid sidecar index lets plain text seek to the nearest indexed line
/// and says at once when `end` is past the file; otherwise (no index, or gzip) the lines
/// before `start` are skipped. Errors with [`DataError::InvalidRange`] (in lines) when
/// the file is shorter.
pub(crate) fn open_lines(path: &Path, start: u64, end: u64) -> Result<Box<dyn BufRead + Send>> {
    let invalid = |rows| DataError::InvalidRange {
        path: path.to_path_buf(),
        start,
        end,
        rows,
    };
    let (mut input, format) = open_input(path)?;
    let mut skip = start;
    if let Some(idx) = LineIndex::load(path)? {
        if end > idx.rows {
            return Err(invalid(idx.rows));
        }
        if format == FileFormat::Tsv {
            if let Some((offset, first_line)) = idx.seek_point(start) {
                drop(input);
                let mut file = File::open(path).map_err(|e| DataError::io(path, e))?;
                file.seek(SeekFrom::Start(offset))
                    .map_err(|e| DataError::io(path, e))?;
                input = Box::new(BufReader::with_capacity(READ_BUF, file));
                skip = start - first_line;
            }
        }
    }
    let skipped = skip_lines(&mut input, skip).map_err(|e| DataError::io(path, e))?;
    if skipped < skip {
        return Err(invalid(start - (skip - skipped)));
    }
    Ok(input)
}

/// The lines of a text file within a range, each at most [`MAX_LINE_BYTES`] long; one
/// buffer is reused.
pub(crate) struct Lines {
    path: PathBuf,
    input: Box<dyn BufRead + Send>,
    /// 1-based number of the next line.
    next_line: u64,
    /// Lines left in the range (`u64::MAX`: to the end of the file).
    remaining: u64,
    /// The range in the caller's units, and where its first line is, for the error of a
    /// file shorter than its range.
    range: Option<(u64, u64)>,
    buf: Vec<u8>,
}

/// One line from [`Lines::next`].
pub(crate) enum Line<'a> {
    /// Line `number` (1-based) without its `\n` or `\r\n`.
    Text(u64, &'a [u8]),
    /// Line `number` was longer than [`MAX_LINE_BYTES`]; the rest of it was skipped.
    TooLong(u64),
}

impl Lines {
    /// `input` positioned at 1-based line `next_line`; `remaining` lines to read; `range`
    /// names the caller's range in an error when the file ends early.
    pub(crate) fn new(
        path: &Path,
        input: Box<dyn BufRead + Send>,
        next_line: u64,
        remaining: u64,
        range: Option<(u64, u64)>,
    ) -> Self {
        Self {
            path: path.to_path_buf(),
            input,
            next_line,
            remaining,
            range,
            buf: Vec::with_capacity(1024),
        }
    }

    /// The next line; `None` at the end of the range or file. A file that ends before
    /// its range is an [`DataError::InvalidRange`].
    pub(crate) fn next(&mut self) -> Result<Option<Line<'_>>> {
        if self.remaining == 0 {
            return Ok(None);
        }
        self.buf.clear();
        // One byte over the cap tells "exactly at the cap" from "over it".
        let n = (&mut self.input)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut self.buf)
            .map_err(|e| DataError::io(&self.path, e))?;
        if n == 0 {
            let remaining = self.remaining;
            self.remaining = 0;
            if let (Some((start, end)), true) = (self.range, remaining != u64::MAX) {
                return Err(DataError::InvalidRange {
                    path: self.path.clone(),
                    start,
                    end,
                    rows: end - remaining,
                });
            }
            return Ok(None);
        }
        if self.remaining != u64::MAX {
            self.remaining -= 1;
        }
        let number = self.next_line;
        self.next_line += 1;
        if n > MAX_LINE_BYTES {
            if self.buf.last() != Some(&b'\n') {
                // Discard the rest of the line without buffering it.
                skip_lines(&mut self.input, 1).map_err(|e| DataError::io(&self.path, e))?;
            }
            return Ok(Some(Line::TooLong(number)));
        }
        let mut line = &self.buf[..];
        if let [rest @ .., b'\n'] = line {
            line = rest;
            if let [rest @ .., b'\r'] = line {
                line = rest;
            }
        }
        Ok(Some(Line::Text(number, line)))
    }

    /// Bytes the line buffer holds room for (stays near one line, whatever was read).
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// The file being read.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}
