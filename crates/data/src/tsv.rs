//! Criteo TSV: the hand-written line parser, [`TsvReader`] (plain or gzip, full or row
//! range) and the row formatter used by the generator.
//!
//! A line is `label \t I1..I13 \t C1..C26` (40 fields, 39 tabs). The label is `0` or `1`
//! (a multi-task file's is one such digit per task, at most 8: `10` is a click without a
//! conversion; every row of a file carries the same number);
//! integers are optional-minus decimal `i64` (no `+`, no spaces); categoricals are exactly
//! 8 hex digits (either case). Integer and categorical fields may be empty. A line ends at
//! `\n`; a `\r` right before it is part of the line terminator (CRLF files read the same).
//! A line longer than [`MAX_LINE_BYTES`] is a bad row ([`DataError::LineTooLong`]) and is
//! never buffered whole.

use crate::batch::Batch;
use crate::columns::RawColumns;
use crate::criteo;
use crate::error::{show_bytes, show_escaped, DataError, FieldError, Result};
use crate::index::LineIndex;
use crate::raw::RawRow;
use crate::reader::{BadRowPolicy, BatchReader, ReadStats, RowSink};
use crate::text::{open_input, open_lines, Line, Lines};
use std::path::Path;

/// Fields per line: label + 13 integers + 26 categoricals.
pub const NUM_FIELDS: usize = 1 + criteo::DENSE + criteo::CATEGORICAL;

pub use crate::text::MAX_LINE_BYTES;

const fn hex_table() -> [u8; 256] {
    let mut t = [0xffu8; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        t[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
}

static HEX: [u8; 256] = hex_table();

/// Splits a line into fields without allocating.
struct Fields<'a> {
    rest: &'a [u8],
    done: bool,
}

impl<'a> Fields<'a> {
    #[inline]
    fn next(&mut self) -> Option<&'a [u8]> {
        if self.done {
            return None;
        }
        match self.rest.iter().position(|&b| b == b'\t') {
            Some(i) => {
                let f = &self.rest[..i];
                self.rest = &self.rest[i + 1..];
                Some(f)
            }
            None => {
                self.done = true;
                Some(self.rest)
            }
        }
    }

    /// Fast path for the common case: the next field is exactly 8 valid hex digits. Only
    /// advances on success.
    #[inline]
    fn try_hex8(&mut self) -> Option<u32> {
        if self.done || self.rest.len() < 8 {
            return None;
        }
        let last = self.rest.len() == 8;
        if !last && self.rest[8] != b'\t' {
            return None;
        }
        let v = hex8(&self.rest[..8])?;
        if last {
            self.done = true;
            self.rest = &[];
        } else {
            self.rest = &self.rest[9..];
        }
        Some(v)
    }
}

/// Value of exactly 8 hex digits; `None` if any byte is not a hex digit.
#[inline]
fn hex8(f: &[u8]) -> Option<u32> {
    let mut v: u32 = 0;
    let mut bad: u8 = 0;
    for &b in &f[..8] {
        let d = HEX[b as usize];
        bad |= d;
        v = (v << 4) | (d & 0xf) as u32;
    }
    (bad & 0xf0 == 0).then_some(v)
}

/// Reads a label field of 1 to 8 `0`/`1` digits into `row`'s labels; `None` otherwise.
#[inline]
fn label_digits(f: &[u8], row: &mut RawRow) -> Option<()> {
    if f.is_empty() || f.len() > 1 + crate::raw::MAX_EXTRA_TASKS as usize {
        return None;
    }
    let mut bits = 0u16;
    for (i, &b) in f.iter().enumerate() {
        let d = b.wrapping_sub(b'0');
        if d > 1 {
            return None;
        }
        bits |= u16::from(d) << i;
    }
    row.label = (bits & 1) as u8;
    row.extra_tasks = (f.len() - 1) as u8;
    row.extra_labels = (bits >> 1) as u8;
    Some(())
}

#[inline]
fn parse_label(f: &[u8], row: &mut RawRow) -> Result<(), FieldError> {
    match label_digits(f, row) {
        Some(()) => Ok(()),
        None if f.is_empty() => Err(FieldError::EmptyLabel),
        None => Err(bad_field(f, FieldError::BadLabel)),
    }
}

#[inline]
fn parse_int(f: &[u8]) -> Result<Option<i64>, FieldError> {
    if f.is_empty() {
        return Ok(None);
    }
    let (neg, digits) = match f[0] {
        b'-' => (true, &f[1..]),
        _ => (false, f),
    };
    if digits.is_empty() || digits.len() > 19 {
        return Err(bad_field(f, FieldError::BadInteger));
    }
    let mut v: u64 = 0;
    for &b in digits {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return Err(bad_field(f, FieldError::BadInteger));
        }
        v = v * 10 + d as u64; // 19 digits cannot overflow u64
    }
    if neg {
        if v > i64::MAX as u64 + 1 {
            return Err(bad_field(f, FieldError::BadInteger));
        }
        Ok(Some((v as i64).wrapping_neg()))
    } else if v > i64::MAX as u64 {
        Err(bad_field(f, FieldError::BadInteger))
    } else {
        Ok(Some(v as i64))
    }
}

#[inline]
fn parse_cat(f: &[u8]) -> Result<Option<u32>, FieldError> {
    if f.is_empty() {
        return Ok(None);
    }
    if f.len() == 8 {
        if let Some(v) = hex8(f) {
            return Ok(Some(v));
        }
    }
    Err(bad_field(f, FieldError::BadCategory))
}

#[cold]
fn bad_field(f: &[u8], kind: fn(String) -> FieldError) -> FieldError {
    if f.iter().any(|&b| b >= 0x80) {
        FieldError::NonAscii(show_escaped(f))
    } else {
        kind(show_bytes(f))
    }
}

/// Parses one line (without its terminator) into `row`.
///
/// On error returns the 0-based field index and the reason; `row` is then unspecified.
#[inline]
pub fn parse_line(line: &[u8], row: &mut RawRow) -> Result<(), (usize, FieldError)> {
    if parse_line_fast(line, row).is_some() {
        return Ok(());
    }
    parse_line_checked(line, row)
}

/// Single-pass parser for well-formed lines. Returns `None` on anything unusual (errors,
/// integers of 19+ digits), and the checked parser then decides; it never accepts a line
/// the checked parser would reject, nor parses one differently.
#[inline]
fn parse_line_fast(line: &[u8], row: &mut RawRow) -> Option<()> {
    let n = line.len();
    let p = line.iter().take(10).position(|&b| b == b'\t')?;
    label_digits(&line[..p], row)?;
    let mut p = p + 1;
    for slot in row.ints.iter_mut() {
        let neg = line.get(p) == Some(&b'-');
        p += usize::from(neg);
        let start = p;
        let mut v: u64 = 0;
        while p < n {
            let d = line[p].wrapping_sub(b'0');
            if d > 9 {
                break;
            }
            v = v.wrapping_mul(10).wrapping_add(d as u64); // > 18 digits is rejected below
            p += 1;
        }
        let len = p - start;
        // Integer fields are always followed by a tab (categoricals come after).
        if len > 18 || p >= n || line[p] != b'\t' {
            return None;
        }
        *slot = match (len, neg) {
            (0, true) => return None,
            (0, false) => None,
            (_, true) => Some(-(v as i64)),
            (_, false) => Some(v as i64),
        };
        p += 1;
    }
    for (i, slot) in row.cats.iter_mut().enumerate() {
        let last = i == criteo::CATEGORICAL - 1;
        let end = if last {
            n
        } else {
            line[p..].iter().take(9).position(|&b| b == b'\t')? + p
        };
        *slot = match end - p {
            0 => None,
            8 => Some(hex8(&line[p..end])?),
            _ => return None,
        };
        p = end + 1;
    }
    Some(())
}

fn parse_line_checked(line: &[u8], row: &mut RawRow) -> Result<(), (usize, FieldError)> {
    let mut fields = Fields {
        rest: line,
        done: false,
    };
    let missing = |found: usize| (found, FieldError::MissingField { found });
    let f = fields.next().ok_or(missing(0))?;
    parse_label(f, row).map_err(|e| (0, e))?;
    for i in 0..criteo::DENSE {
        let f = fields.next().ok_or(missing(1 + i))?;
        row.ints[i] = parse_int(f).map_err(|e| (1 + i, e))?;
    }
    for i in 0..criteo::CATEGORICAL {
        let field = 1 + criteo::DENSE + i;
        if let Some(v) = fields.try_hex8() {
            row.cats[i] = Some(v);
            continue;
        }
        let f = fields.next().ok_or(missing(field))?;
        row.cats[i] = parse_cat(f).map_err(|e| (field, e))?;
    }
    if !fields.done {
        return Err((NUM_FIELDS, FieldError::ExtraField));
    }
    Ok(())
}

/// Appends `row` to `out` as one Criteo TSV line, `\n` included.
pub fn write_row(row: &RawRow, out: &mut Vec<u8>) {
    const HEXD: &[u8; 16] = b"0123456789abcdef";
    for t in 0..row.tasks() {
        out.push(b'0' + row.task_label(t));
    }
    for v in &row.ints {
        out.push(b'\t');
        if let Some(v) = *v {
            write_i64(v, out);
        }
    }
    for c in &row.cats {
        out.push(b'\t');
        if let Some(c) = *c {
            let mut buf = [0u8; 8];
            for (k, b) in buf.iter_mut().enumerate() {
                *b = HEXD[((c >> (28 - 4 * k)) & 0xf) as usize];
            }
            out.extend_from_slice(&buf);
        }
    }
    out.push(b'\n');
}

#[inline]
fn write_i64(v: i64, out: &mut Vec<u8>) {
    if v < 0 {
        out.push(b'-');
    }
    let mut u = v.unsigned_abs();
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (u % 10) as u8;
        u /= 10;
        if u == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

/// Reads Criteo TSV (plain or gzip, detected by magic bytes) into [`Batch`]es.
///
/// One line buffer is reused; lines are parsed as bytes, so reading allocates nothing per
/// row. See [`crate::index`] for how plain-TSV row ranges seek in O(1).
pub struct TsvReader {
    lines: Lines,
    policy: BadRowPolicy,
    row: RawRow,
    stats: ReadStats,
    /// Labels per row, from the first row read: every later row must carry as many.
    tasks: Option<usize>,
}

impl std::fmt::Debug for TsvReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TsvReader")
            .field("path", &self.lines.path())
            .field("stats", &self.stats)
            .finish()
    }
}

impl TsvReader {
    /// Opens a whole TSV file (plain or gzip).
    pub fn open(path: &Path, policy: BadRowPolicy) -> Result<Self> {
        let (input, _) = open_input(path)?;
        Ok(Self::new(
            Lines::new(path, input, 1, u64::MAX, None),
            policy,
        ))
    }

    /// Opens lines `start_row..end_row` (0-based rows, end exclusive).
    ///
    /// Plain TSV with a valid sidecar index (built by [`crate::count_rows`] or
    /// [`LineIndex::load_or_build`]) seeks to the nearest indexed line and skips fewer than
    /// [`crate::index::STRIDE`] lines; otherwise (no index, or gzip) it scans from the
    /// start. Errors with [`DataError::InvalidRange`] if the range is inverted or (known
    /// from the index, or found at end of file) exceeds the file.
    pub fn open_range(
        path: &Path,
        start_row: u64,
        end_row: u64,
        policy: BadRowPolicy,
    ) -> Result<Self> {
        if start_row > end_row {
            return Err(DataError::InvalidRange {
                path: path.to_path_buf(),
                start: start_row,
                end: end_row,
                // Only to word the error: a corrupt index must not hide the caller's mistake.
                rows: LineIndex::load(path).ok().flatten().map_or(0, |i| i.rows),
            });
        }
        let input = open_lines(path, start_row, end_row)?;
        let lines = Lines::new(
            path,
            input,
            start_row + 1,
            end_row - start_row,
            Some((start_row, end_row)),
        );
        Ok(Self::new(lines, policy))
    }

    fn new(lines: Lines, policy: BadRowPolicy) -> Self {
        Self {
            lines,
            policy,
            row: RawRow::default(),
            stats: ReadStats::default(),
            tasks: None,
        }
    }

    /// Reads the next line as a raw row into `row`. `Ok(false)` at end of input/range.
    /// Malformed lines follow the policy (skipped ones are not returned).
    pub fn next_raw(&mut self, row: &mut RawRow) -> Result<bool> {
        loop {
            let (line_no, line) = match self.lines.next()? {
                None => return Ok(false),
                Some(Line::Text(n, line)) => (n, line),
                Some(Line::TooLong(line)) => {
                    let err = DataError::LineTooLong {
                        path: self.lines.path().to_path_buf(),
                        line,
                        limit: MAX_LINE_BYTES,
                    };
                    self.stats.refuse_or_skip(self.policy, err)?;
                    continue;
                }
            };
            let parsed = parse_line(line, row).and_then(|()| {
                let first = *self.tasks.get_or_insert(row.tasks());
                if row.tasks() == first {
                    Ok(())
                } else {
                    Err((
                        0,
                        FieldError::LabelCount {
                            expected: first,
                            got: row.tasks(),
                        },
                    ))
                }
            });
            match parsed {
                Ok(()) => {
                    self.stats.rows_read += 1;
                    return Ok(true);
                }
                Err((field, reason)) => {
                    let err = DataError::Malformed {
                        path: self.lines.path().to_path_buf(),
                        line: line_no,
                        field,
                        reason,
                    };
                    self.stats.refuse_or_skip(self.policy, err)?;
                }
            }
        }
    }

    /// The file being read.
    pub fn path(&self) -> &Path {
        self.lines.path()
    }
}

impl TsvReader {
    fn fill<S: RowSink>(&mut self, batch: &mut S, max_rows: usize) -> Result<usize> {
        batch.clear();
        let mut row = self.row;
        while batch.len() < max_rows {
            match self.next_raw(&mut row) {
                Ok(true) => batch.push_row(&row),
                Ok(false) => break,
                Err(e) => {
                    self.row = row;
                    return Err(e);
                }
            }
        }
        self.row = row;
        Ok(batch.len())
    }
}

impl BatchReader for TsvReader {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn line(label: &str, ints: &[&str], cats: &[&str]) -> String {
        let mut s = label.to_string();
        for i in 0..criteo::DENSE {
            s.push('\t');
            s.push_str(ints.get(i).copied().unwrap_or(""));
        }
        for i in 0..criteo::CATEGORICAL {
            s.push('\t');
            s.push_str(cats.get(i).copied().unwrap_or(""));
        }
        s
    }

    #[test]
    fn parses_values_and_empties() {
        let l = line(
            "1",
            &["5", "", "-2", "9223372036854775807"],
            &["68fd1e64", "", "DEADBEEF"],
        );
        let mut r = RawRow::default();
        parse_line(l.as_bytes(), &mut r).unwrap();
        assert_eq!(r.label, 1);
        assert_eq!(r.ints[..4], [Some(5), None, Some(-2), Some(i64::MAX)]);
        assert_eq!(r.ints[4], None);
        assert_eq!(r.cats[..3], [Some(0x68fd1e64), None, Some(0xdeadbeef)]);
        let mut out = Vec::new();
        write_row(&r, &mut out);
        let mut r2 = RawRow::default();
        parse_line(&out[..out.len() - 1], &mut r2).unwrap();
        assert_eq!(r, r2);
    }

    #[test]
    fn field_errors() {
        let mut r = RawRow::default();
        let err = |s: &str| parse_line(s.as_bytes(), &mut RawRow::default()).unwrap_err();
        assert_eq!(err(&line("2", &[], &[])).0, 0);
        assert_eq!(err(&line("", &[], &[])), (0, FieldError::EmptyLabel));
        assert_eq!(err(&line("0", &["1x"], &[])).0, 1);
        assert_eq!(err(&line("0", &["+1"], &[])).0, 1);
        assert_eq!(err(&line("0", &["-"], &[])).0, 1);
        assert_eq!(err(&line("0", &["99999999999999999999"], &[])).0, 1);
        assert_eq!(
            err(&line("0", &[], &["0000000a", "zz12"])),
            (15, FieldError::BadCategory("zz12".into()))
        );
        assert_eq!(err(&line("0", &[], &["123456789"])).0, 14);
        let mut l = line("0", &[], &[]);
        l.push('\t');
        assert_eq!(err(&l), (40, FieldError::ExtraField));
        let l = line("0", &[], &[]);
        let short = &l[..l.len() - 1];
        assert_eq!(err(short), (39, FieldError::MissingField { found: 39 }));
        assert!(parse_line(b"", &mut r).is_err());
        let bytes = [b"0\t\xff\xfe".as_slice(), &[b'\t'; 38]].concat();
        let e = parse_line(&bytes, &mut r).unwrap_err();
        assert_eq!(e.0, 1);
        assert!(matches!(e.1, FieldError::NonAscii(_)));
    }

    /// The fast path never disagrees with the checked parser, on valid lines and on
    /// randomly mutated ones.
    #[test]
    fn fast_path_agrees_with_checked_parser() {
        let mut seed = 0x1234_5678_u64;
        let mut next = move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            seed >> 33
        };
        let alphabet = b"0123456789abcdefABCDEF\t-x \xff";
        let (mut fast_hits, mut fallbacks) = (0, 0);
        for _ in 0..20_000 {
            let mut row = RawRow {
                label: (next() % 2) as u8,
                ..RawRow::default()
            };
            for v in row.ints.iter_mut() {
                *v = match next() % 6 {
                    0 => None,
                    1 => Some(-(next() as i64 % 3)),
                    2 => Some((((next() << 31) | next()) as i64).wrapping_mul(1_000_003)),
                    _ => Some(next() as i64 % 500),
                };
            }
            for c in row.cats.iter_mut() {
                *c = (next() % 5 != 0).then(|| next() as u32);
            }
            let mut line = Vec::new();
            write_row(&row, &mut line);
            line.pop();
            for _ in 0..(next() % 3) {
                let i = next() as usize % line.len();
                match next() % 3 {
                    0 => line[i] = alphabet[next() as usize % alphabet.len()],
                    1 => {
                        line.remove(i);
                    }
                    _ => line.insert(i, alphabet[next() as usize % alphabet.len()]),
                }
            }
            let (mut a, mut b) = (RawRow::default(), RawRow::default());
            let checked = parse_line_checked(&line, &mut b);
            if parse_line_fast(&line, &mut a).is_some() {
                fast_hits += 1;
                assert_eq!(checked, Ok(()), "{:?}", String::from_utf8_lossy(&line));
                assert_eq!(a, b);
            } else {
                fallbacks += 1;
            }
        }
        assert!(
            fast_hits > 500 && fallbacks > 5000,
            "{fast_hits} {fallbacks}"
        );
    }

    /// A line far over the cap is never buffered whole: the reader holds at most the cap,
    /// skips the line as a bad row and reads on after it.
    #[test]
    fn overlong_line_is_capped_not_buffered() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("long.tsv");
        let good = line("1", &["5"], &["68fd1e64"]);
        let mut text = format!("{good}\n").into_bytes();
        text.resize(text.len() + 8 * MAX_LINE_BYTES, b'7');
        text.push(b'\n');
        text.extend_from_slice(good.as_bytes());
        std::fs::write(&p, &text).unwrap();
        let mut r = TsvReader::open(&p, BadRowPolicy::Skip).unwrap();
        let mut row = RawRow::default();
        assert!(r.next_raw(&mut row).unwrap());
        assert!(
            r.next_raw(&mut row).unwrap(),
            "line 3 follows the skipped line 2"
        );
        assert_eq!(row.cats[0], Some(0x68fd1e64));
        assert!(!r.next_raw(&mut row).unwrap());
        assert_eq!((r.stats.rows_read, r.stats.rows_skipped), (2, 1));
        assert!(
            r.stats.first_errors[0].contains(":2: line longer than"),
            "{:?}",
            r.stats.first_errors
        );
        // Vec growth may round up, but never to the 8 MiB line.
        assert!(
            r.lines.capacity() <= 2 * (MAX_LINE_BYTES + 1),
            "line buffer grew to {} bytes",
            r.lines.capacity()
        );
    }

    #[test]
    fn int_edges() {
        assert_eq!(parse_int(b"-9223372036854775808").unwrap(), Some(i64::MIN));
        assert!(parse_int(b"9223372036854775808").is_err());
        assert!(parse_int(b"-9223372036854775809").is_err());
        assert_eq!(parse_int(b"0").unwrap(), Some(0));
        let mut out = Vec::new();
        write_i64(i64::MIN, &mut out);
        assert_eq!(out, b"-9223372036854775808");
    }
}
