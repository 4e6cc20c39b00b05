//! Sidecar line index for TSV files: `<file>.idx`.
//!
//! Built once by [`crate::count_rows`] / [`LineIndex::load_or_build`] (a full scan), then
//! reused while the data file's size and modification time are unchanged. For plain TSV it
//! stores the byte offset of every [`STRIDE`]-th line, so opening a row range seeks
//! directly and skips fewer than `STRIDE` lines: O(1) in the file size. For gzip TSV it
//! only stores the row count (ranges scan the decompressed stream).
//!
//! Format (little-endian u64s): magic `ERIDX001`, file length, mtime (ns since epoch),
//! flags (bit 0: gzip), rows, stride, entry count, entries. Written to a temporary file
//! and renamed, so readers never see a partial index. If the directory is read-only the
//! index is simply not persisted (counting still works).

use crate::error::{DataError, Result};
use crate::reader::{detect_format, FileFormat};
use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

/// Lines between two indexed offsets.
pub const STRIDE: u64 = 1024;
const MAGIC: &[u8; 8] = b"ERIDX001";
/// Magic and the six header words.
const HEADER_BYTES: usize = 8 + 6 * 8;

/// A TSV file's line index (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineIndex {
    /// Rows (lines) in the file.
    pub rows: u64,
    /// Lines between indexed offsets.
    pub stride: u64,
    /// Byte offset of line `k * stride`, for plain TSV; empty for gzip.
    pub offsets: Vec<u64>,
    /// Whether the data file is gzip.
    pub gzip: bool,
    file_len: u64,
    mtime_ns: u64,
}

/// Path of the sidecar index of `path` (`<path>.idx`).
pub fn index_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".idx");
    PathBuf::from(p)
}

pub(crate) fn file_stamp(path: &Path) -> Result<(u64, u64)> {
    let md = std::fs::metadata(path).map_err(|e| DataError::io(path, e))?;
    let mtime = md
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as u64);
    Ok((md.len(), mtime))
}

impl LineIndex {
    /// Loads the sidecar index of `path`.
    ///
    /// `Ok(None)` when there is nothing usable to load: no sidecar, one that cannot be
    /// read, one in another format, or a stale one (the data file's size or modification
    /// time changed since it was built). [`DataError::CorruptIndex`], naming the sidecar,
    /// when a current sidecar's contents are inconsistent: its entry count is read from
    /// the file, so it is checked against the sidecar's size (with checked arithmetic)
    /// before anything is allocated, and the offsets must be increasing and inside the
    /// data file.
    pub fn load(path: &Path) -> Result<Option<LineIndex>> {
        let Ok((len, mtime)) = file_stamp(path) else {
            return Ok(None);
        };
        let idx_path = index_path(path);
        let Ok(mut file) = File::open(&idx_path) else {
            return Ok(None);
        };
        let mut header = [0u8; HEADER_BYTES];
        if file.read_exact(&mut header).is_err() || &header[..8] != MAGIC {
            return Ok(None);
        }
        let word = |i: usize| u64::from_le_bytes(header[8 + 8 * i..16 + 8 * i].try_into().unwrap());
        let (file_len, mtime_ns, flags, rows, stride, n) =
            (word(0), word(1), word(2), word(3), word(4), word(5));
        if file_len != len || mtime_ns != mtime {
            return Ok(None);
        }
        let corrupt = |reason: String| DataError::CorruptIndex {
            path: idx_path.clone(),
            reason,
        };
        let idx_len = file
            .metadata()
            .map_err(|e| DataError::io(&idx_path, e))?
            .len();
        let want_len = n
            .checked_mul(8)
            .and_then(|b| b.checked_add(HEADER_BYTES as u64))
            .ok_or_else(|| corrupt(format!("entry count {n} overflows")))?;
        if want_len != idx_len {
            return Err(corrupt(format!(
                "{n} entries need {want_len} bytes, the file has {idx_len}"
            )));
        }
        if stride == 0 {
            return Err(corrupt("stride is 0".into()));
        }
        let gzip = flags & 1 == 1;
        // Plain TSV: every line is at least one byte, so there are at most `len` rows.
        if !gzip && rows > len {
            return Err(corrupt(format!(
                "{rows} rows in a data file of {len} bytes"
            )));
        }
        let expected = if gzip { 0 } else { rows.div_ceil(stride) };
        if n != expected {
            return Err(corrupt(format!(
                "{n} entries for {rows} rows at stride {stride} (expected {expected})"
            )));
        }
        // `n` is now bounded by the data file's length and matches the sidecar's size.
        let mut bytes = vec![0u8; (idx_len - HEADER_BYTES as u64) as usize];
        file.read_exact(&mut bytes)
            .map_err(|e| DataError::io(&idx_path, e))?;
        let offsets: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
            .collect();
        let in_order = offsets.first().is_none_or(|&o| o == 0)
            && offsets.windows(2).all(|w| w[0] < w[1])
            && offsets.last().is_none_or(|&o| o < len);
        if !in_order {
            return Err(corrupt(
                "line offsets are not increasing from 0 inside the data file".into(),
            ));
        }
        Ok(Some(LineIndex {
            rows,
            stride,
            offsets,
            gzip,
            file_len,
            mtime_ns,
        }))
    }

    /// Loads the valid index of `path` or builds (and persists) a new one by scanning.
    pub fn load_or_build(path: &Path) -> Result<LineIndex> {
        match Self::load(path)? {
            Some(i) => Ok(i),
            None => Self::build(path),
        }
    }

    /// Scans `path`, counting lines and recording offsets, and writes the sidecar.
    pub fn build(path: &Path) -> Result<LineIndex> {
        let (file_len, mtime_ns) = file_stamp(path)?;
        let gzip = detect_format(path)? == FileFormat::TsvGzip;
        let file = File::open(path).map_err(|e| DataError::io(path, e))?;
        let mut input: Box<dyn Read> = if gzip {
            Box::new(flate2::read::MultiGzDecoder::new(BufReader::with_capacity(
                1 << 20,
                file,
            )))
        } else {
            Box::new(file)
        };
        let mut buf = vec![0u8; 1 << 20];
        let mut offsets = Vec::new();
        let mut rows = 0u64;
        let mut pos = 0u64; // byte offset of buf[0]
        let mut at_line_start = true;
        loop {
            let n = input.read(&mut buf).map_err(|e| DataError::io(path, e))?;
            if n == 0 {
                break;
            }
            let chunk = &buf[..n];
            if gzip {
                rows += chunk.iter().filter(|&&b| b == b'\n').count() as u64;
            } else {
                // The line starting at the beginning of this chunk, if any.
                if at_line_start && rows.is_multiple_of(STRIDE) {
                    offsets.push(pos);
                }
                for (i, _) in chunk.iter().enumerate().filter(|(_, &b)| b == b'\n') {
                    rows += 1;
                    if rows.is_multiple_of(STRIDE) && (i + 1) < n {
                        offsets.push(pos + i as u64 + 1);
                    }
                }
            }
            at_line_start = chunk[n - 1] == b'\n';
            pos += n as u64;
        }
        if !at_line_start {
            rows += 1; // final line without a newline
        }
        if !gzip {
            // A stride boundary that fell exactly at a chunk end was pushed on the next
            // chunk; a boundary at end of file is not a line and must not be indexed.
            offsets.truncate(rows.div_ceil(STRIDE) as usize);
        }
        let idx = LineIndex {
            rows,
            stride: STRIDE,
            offsets,
            gzip,
            file_len,
            mtime_ns,
        };
        idx.persist(path);
        Ok(idx)
    }

    fn persist(&self, path: &Path) {
        let mut bytes = Vec::with_capacity(HEADER_BYTES + 8 * self.offsets.len());
        bytes.extend_from_slice(MAGIC);
        let header = [
            self.file_len,
            self.mtime_ns,
            self.gzip as u64,
            self.rows,
            self.stride,
            self.offsets.len() as u64,
        ];
        for w in header.iter().chain(&self.offsets) {
            bytes.extend_from_slice(&w.to_le_bytes());
        }
        let target = index_path(path);
        let mut tmp = target.as_os_str().to_owned();
        tmp.push(format!(".tmp{}", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let ok = File::create(&tmp)
            .and_then(|mut f| f.write_all(&bytes))
            .is_ok()
            && std::fs::rename(&tmp, &target).is_ok();
        if !ok {
            let _ = std::fs::remove_file(&tmp);
        }
    }

    /// For plain TSV: the byte offset and row number of the indexed line at or before
    /// `row`. `None` for gzip files.
    pub fn seek_point(&self, row: u64) -> Option<(u64, u64)> {
        if self.gzip || self.offsets.is_empty() {
            return None;
        }
        let k = ((row / self.stride) as usize).min(self.offsets.len() - 1);
        Some((self.offsets[k], k as u64 * self.stride))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_point_at_line_starts() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.tsv");
        let mut text = String::new();
        for i in 0..5000 {
            text.push_str(&format!("{i}\n"));
        }
        text.push_str("last");
        std::fs::write(&p, &text).unwrap();
        let idx = LineIndex::build(&p).unwrap();
        assert_eq!(idx.rows, 5001);
        assert_eq!(idx.offsets.len(), 5);
        for (k, &off) in idx.offsets.iter().enumerate() {
            let line: String = text[off as usize..].lines().next().unwrap().into();
            assert_eq!(line, format!("{}", k as u64 * STRIDE));
        }
        assert_eq!(LineIndex::load(&p).unwrap(), Some(idx));
        std::fs::write(&p, "changed\n").unwrap();
        assert_eq!(LineIndex::load(&p).unwrap().map_or(1, |i| i.rows), 1);
        assert_eq!(LineIndex::load_or_build(&p).unwrap().rows, 1);
    }

    #[test]
    fn exact_stride_multiple() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("y.tsv");
        let text: String = (0..2048).map(|i| format!("{i}\n")).collect();
        std::fs::write(&p, &text).unwrap();
        let idx = LineIndex::build(&p).unwrap();
        assert_eq!((idx.rows, idx.offsets.len()), (2048, 2));
    }
}
