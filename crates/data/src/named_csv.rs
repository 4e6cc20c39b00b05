//! CSV and TSV files with a header line, plain or gzip, read through a named [`Schema`]
//! into the same jagged [`Batch`]es as Parquet.
//!
//! The first line names the columns; every later line is one row (a quoted field may
//! hold the delimiter, but not a line break: rows and lines coincide, so a row range
//! seeks through the sidecar line index as Criteo TSV does). Fields are read as text:
//! - labels: `0`, `1` (or `0.0`, `1.0`, `true`, `false`);
//! - dense: a decimal number; empty is 0;
//! - categorical: any text; empty is null. A plainly written integer is that integer's
//!   key, other text is hashed ([`string_key`]), so a CSV, a Parquet file and a JSON
//!   request give one id one key;
//! - bag, sequence: items separated by [`CsvFormat::list_separator`] (default `|`);
//!   empty items are dropped and counted, lists longer than `max_len` cut and counted;
//!   per-id weights: a field of numbers separated the same way, one per item.
//!
//! Spaces around a field's value are ignored. A bad value is an error naming the file,
//! line and column (or, under `data.on_bad_row = "skip"`, a skipped, counted row).

use crate::batch::{Batch, Jagged};
use crate::chain::Chains;
use crate::error::{show_bytes, DataError, FieldError, Result};
use crate::named::{conclude, missing_column, Columns};
use crate::reader::{BadRowPolicy, BatchReader, ReadStats};
use crate::schema::{
    schema_error, string_key, ColumnSample, CsvFormat, FeatureKind, FeatureSpec, Inferred, Schema,
    INFER_SAMPLE_ROWS, NULL_KEY,
};
use crate::text::{open_input, open_lines, Line, Lines};
use std::path::Path;
use std::sync::Arc;

/// Splits a line into fields: a plain split where the line has no quote, RFC 4180
/// unquoting (through `csv-core`) where it has.
pub(crate) struct Splitter {
    delimiter: u8,
    core: csv_core::Reader,
    /// The fields' bytes, back to back.
    buf: Vec<u8>,
    /// Where each field ends in `buf`.
    ends: Vec<usize>,
}

impl Splitter {
    pub(crate) fn new(delimiter: u8) -> Self {
        Self {
            delimiter,
            core: csv_core::ReaderBuilder::new().delimiter(delimiter).build(),
            buf: Vec::new(),
            ends: Vec::new(),
        }
    }

    pub(crate) fn split(&mut self, line: &[u8]) {
        self.buf.clear();
        self.ends.clear();
        if !line.contains(&b'"') {
            for field in line.split(|&b| b == self.delimiter) {
                self.buf.extend_from_slice(field);
                self.ends.push(self.buf.len());
            }
            return;
        }
        // Unquoting only shrinks a line, and it has at most one field per delimiter + 1.
        self.buf.resize(line.len() + 1, 0);
        let fields = line.iter().filter(|&&b| b == self.delimiter).count() + 1;
        self.ends.resize(fields + 1, 0);
        self.core.reset();
        let (mut input, mut out, mut end) = (line, 0, 0);
        loop {
            // Once the line is consumed, the empty input tells csv-core the record ends.
            let (res, nin, nout, nend) =
                self.core
                    .read_record(input, &mut self.buf[out..], &mut self.ends[end..]);
            input = &input[nin..];
            out += nout;
            end += nend;
            match res {
                csv_core::ReadRecordResult::InputEmpty => {}
                csv_core::ReadRecordResult::OutputFull => {
                    let grown = self.buf.len() * 2;
                    self.buf.resize(grown, 0);
                }
                csv_core::ReadRecordResult::OutputEndsFull => {
                    let grown = self.ends.len() * 2;
                    self.ends.resize(grown, 0);
                }
                csv_core::ReadRecordResult::Record | csv_core::ReadRecordResult::End => break,
            }
        }
        self.buf.truncate(out);
        self.ends.truncate(end);
    }

    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    pub(crate) fn field(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        self.buf[start..self.ends[i]].trim_ascii()
    }
}

/// The header of `path`: its column names and the delimiter (`format`'s, or a tab when
/// the header holds one, else a comma).
pub(crate) fn read_header(path: &Path, format: &CsvFormat) -> Result<(Vec<String>, u8)> {
    let (input, _) = open_input(path)?;
    let mut lines = Lines::new(path, input, 1, 1, None);
    let line = match lines.next()? {
        Some(Line::Text(_, line)) if !line.trim_ascii().is_empty() => line,
        Some(Line::TooLong(_)) => {
            return Err(schema_error(path, "the header line is longer than 1 MiB"))
        }
        _ => {
            return Err(schema_error(
                path,
                "has no header line: a CSV or TSV file with named features starts with a \
                 line of column names",
            ))
        }
    };
    // A spreadsheet's export may start with a UTF-8 byte-order mark: not part of a name.
    let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    let delimiter = match format.delimiter {
        Some(d) => d as u8,
        None if line.contains(&b'\t') => b'\t',
        None => b',',
    };
    let mut split = Splitter::new(delimiter);
    split.split(line);
    let mut names = Vec::with_capacity(split.len());
    for i in 0..split.len() {
        let name = std::str::from_utf8(split.field(i)).map_err(|_| {
            schema_error(path, format!("header column {} is not UTF-8 text", i + 1))
        })?;
        if names.iter().any(|n| n == name) {
            return Err(schema_error(
                path,
                format!("the header names column {name:?} twice"),
            ));
        }
        names.push(name.to_string());
    }
    Ok((names, delimiter))
}

/// One row parsed before it joins a batch, so a bad value leaves the batch as it was.
#[derive(Debug, Default)]
struct RowScratch {
    labels: Vec<f32>,
    /// The sample weight (1 without a weight column).
    weight: f32,
    dense: Vec<f32>,
    cats: Vec<u64>,
    lists: Vec<Jagged>,
}

/// Reads a CSV or TSV file with a header through a [`Schema`].
pub struct NamedCsvReader {
    schema: Arc<Schema>,
    lines: Lines,
    header: Vec<String>,
    columns: Columns,
    /// The features' own chains.
    chains: Chains,
    split: Splitter,
    row: RowScratch,
    /// A list field's items, before the null ones are dropped.
    items: Vec<(u64, f32)>,
    policy: BadRowPolicy,
    stats: ReadStats,
}

impl std::fmt::Debug for NamedCsvReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamedCsvReader")
            .field("path", &self.lines.path())
            .field("stats", &self.stats)
            .finish()
    }
}

impl NamedCsvReader {
    /// Opens data rows `range` (0-based, end exclusive, the header not counted; `None`:
    /// all) of `path`.
    pub fn open(
        path: &Path,
        range: Option<(u64, u64)>,
        policy: BadRowPolicy,
        schema: Arc<Schema>,
    ) -> Result<Self> {
        let (header, delimiter) = read_header(path, &schema.csv)?;
        let columns = Columns::locate(&schema, |name, role| {
            header.iter().position(|h| h == name).ok_or_else(|| {
                let have: Vec<&str> = header.iter().map(String::as_str).collect();
                missing_column(path, name, role, &have)
            })
        })?;
        let lines = match range {
            None => {
                let (input, _) = open_input(path)?;
                let mut lines = Lines::new(path, input, 1, u64::MAX, None);
                lines.next()?; // the header
                lines
            }
            Some((start, end)) => {
                if start > end {
                    return Err(DataError::InvalidRange {
                        path: path.to_path_buf(),
                        start,
                        end,
                        rows: 0,
                    });
                }
                // Line 0 is the header: data row r is line r + 1.
                let input = open_lines(path, start + 1, end + 1).map_err(|e| match e {
                    DataError::InvalidRange { rows, .. } => DataError::InvalidRange {
                        path: path.to_path_buf(),
                        start,
                        end,
                        rows: rows.saturating_sub(1),
                    },
                    other => other,
                })?;
                Lines::new(path, input, start + 2, end - start, Some((start, end)))
            }
        };
        let row = RowScratch {
            lists: vec![Jagged::default(); columns.lists.len()],
            ..RowScratch::default()
        };
        Ok(Self {
            chains: Chains::of(&schema),
            schema,
            lines,
            header,
            columns,
            split: Splitter::new(delimiter),
            row,
            items: Vec::new(),
            policy,
            stats: ReadStats::default(),
        })
    }

    /// Parses the split line into `self.row`; a bad value names its column.
    fn parse(&mut self) -> std::result::Result<(), (String, FieldError)> {
        let (split, columns, schema, row, chains) = (
            &self.split,
            &self.columns,
            &*self.schema,
            &mut self.row,
            &self.chains,
        );
        if split.len() != self.header.len() {
            let column = self
                .header
                .get(split.len())
                .map_or("(past the last)", String::as_str);
            return Err((
                column.to_string(),
                FieldError::FieldCount {
                    expected: self.header.len(),
                    found: split.len(),
                },
            ));
        }
        let named = |i: usize, e: FieldError| (self.header[i].clone(), e);
        row.labels.clear();
        for &i in &columns.labels {
            row.labels
                .push(parse_label(split.field(i)).map_err(|e| named(i, e))?);
        }
        row.weight = match columns.weight {
            Some(i) => parse_weight(split.field(i)).map_err(|e| named(i, e))?,
            None => 1.0,
        };
        row.dense.clear();
        let dense = columns.dense.iter().zip(schema.dense());
        for ((&i, f), chain) in dense.zip(&chains.dense) {
            let v = parse_number(split.field(i)).map_err(|e| named(i, e))?;
            row.dense.push(match chain {
                Some(chain) => chain.number(nullable(split.field(i), v)),
                None => f.transform.apply(v),
            });
        }
        row.cats.clear();
        for (&i, chain) in columns.cats.iter().zip(&chains.cats) {
            let t = split.field(i);
            row.cats.push(match chain {
                Some(chain) if chain.reads_numbers() => {
                    let v = parse_number(t).map_err(|e| named(i, e))?;
                    chain.id_of_number(nullable(t, v))
                }
                Some(chain) if !t.is_empty() => chain.id(string_key(t)),
                Some(chain) => chain.id(NULL_KEY),
                None if t.is_empty() => NULL_KEY,
                None => string_key(t),
            });
        }
        let lists = row.lists.iter_mut().zip(&columns.lists).zip(schema.lists());
        for (((dst, &(i, w)), f), chain) in lists.zip(&chains.lists) {
            dst.clear();
            let sep = schema.csv.list_separator as u8;
            self.items.clear();
            let field = split.field(i);
            if !field.is_empty() {
                self.items.extend(field.split(|&b| b == sep).map(|t| {
                    let t = t.trim_ascii();
                    (
                        if t.is_empty() {
                            NULL_KEY
                        } else {
                            string_key(t)
                        },
                        1.0,
                    )
                }));
            }
            if let Some(w) = w {
                let weights = split.field(w);
                let mut count = 0;
                if !weights.is_empty() {
                    for (k, t) in weights.split(|&b| b == sep).enumerate() {
                        let v = parse_number(t).map_err(|e| named(w, e))?;
                        if let Some(item) = self.items.get_mut(k) {
                            item.1 = v;
                        }
                        count += 1;
                    }
                }
                if count != self.items.len() {
                    return Err(named(
                        w,
                        FieldError::WeightCount {
                            weights: count,
                            ids: self.items.len(),
                        },
                    ));
                }
            }
            let live = self.items.iter().filter(|(k, _)| *k != NULL_KEY);
            let count = live.clone().count();
            self.stats.list_nulls += (self.items.len() - count) as u64;
            let kept = f.kept(count);
            if kept.len() < count {
                self.stats.lists_truncated += 1;
            }
            for &(k, weight) in live.skip(kept.start).take(kept.len()) {
                dst.ids.push(k);
                if w.is_some() {
                    dst.weights.push(weight);
                }
            }
            dst.end_row();
            if let Some(chain) = chain {
                self.stats.list_nulls += chain.lists(dst, 0);
            }
        }
        Ok(())
    }

    fn push_row(&self, batch: &mut Batch) {
        let r = &self.row;
        batch.labels.push(r.labels[0]);
        batch.task_labels.extend_from_slice(&r.labels[1..]);
        if self.columns.weight.is_some() {
            batch.weights.push(r.weight);
        }
        batch.dense.extend_from_slice(&r.dense);
        if r.dense.is_empty() {
            // No dense feature: the constant input of Schema::dense_width.
            batch.dense.push(0.0);
        }
        batch.sparse.extend_from_slice(&r.cats);
        for (dst, src) in batch.bags.iter_mut().zip(&r.lists) {
            dst.extend_from(src, 0..1);
        }
    }
}

impl BatchReader for NamedCsvReader {
    fn next_batch(&mut self, batch: &mut Batch, max_rows: usize) -> Result<usize> {
        batch.clear();
        batch.dense_width = self.schema.dense_width();
        batch.sparse_width = self.columns.cats.len();
        batch
            .bags
            .resize_with(self.columns.lists.len(), Jagged::default);
        batch.tasks = self.columns.labels.len();
        while batch.len() < max_rows {
            let (line, parsed) = match self.lines.next()? {
                None => break,
                Some(Line::Text(line, text)) => {
                    self.split.split(text);
                    (line, self.parse())
                }
                Some(Line::TooLong(line)) => {
                    let err = DataError::LineTooLong {
                        path: self.lines.path().to_path_buf(),
                        line,
                        limit: crate::text::MAX_LINE_BYTES,
                    };
                    self.stats.refuse_or_skip(self.policy, err)?;
                    continue;
                }
            };
            match parsed {
                Ok(()) => {
                    self.push_row(batch);
                    self.stats.rows_read += 1;
                }
                Err((column, reason)) => {
                    let err = DataError::BadField {
                        path: self.lines.path().to_path_buf(),
                        line,
                        column,
                        reason,
                    };
                    self.stats.refuse_or_skip(self.policy, err)?;
                }
            }
        }
        Ok(batch.len())
    }

    fn stats(&self) -> &ReadStats {
        &self.stats
    }
}

pub(crate) fn parse_label(t: &[u8]) -> std::result::Result<f32, FieldError> {
    match t {
        [] => Err(FieldError::EmptyLabel),
        b"true" => Ok(1.0),
        b"false" => Ok(0.0),
        _ => {
            let v = std::str::from_utf8(t)
                .ok()
                .and_then(|s| s.parse::<f64>().ok());
            if v == Some(0.0) {
                Ok(0.0)
            } else if v == Some(1.0) {
                Ok(1.0)
            } else {
                Err(FieldError::BadLabel(show_bytes(t)))
            }
        }
    }
}

/// A dense value or weight: empty is 0; NaN and infinities are refused.
/// A sample weight: a number (as [`parse_number`] reads one) >= 0, never empty.
pub(crate) fn parse_weight(t: &[u8]) -> std::result::Result<f32, FieldError> {
    let t = t.trim_ascii();
    match parse_number(t) {
        Ok(v) if !t.is_empty() && v >= 0.0 => Ok(v),
        _ => Err(FieldError::BadWeight(format!("{:?}", show_bytes(t)))),
    }
}

/// A parsed number `v` of the field `t` as a chain takes it: `None` for an empty field.
pub(crate) fn nullable(t: &[u8], v: f32) -> Option<f32> {
    (!t.trim_ascii().is_empty()).then_some(v)
}

pub(crate) fn parse_number(t: &[u8]) -> std::result::Result<f32, FieldError> {
    let t = t.trim_ascii();
    if t.is_empty() {
        return Ok(0.0);
    }
    let v: f32 = std::str::from_utf8(t)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| FieldError::BadNumber(show_bytes(t)))?;
    if v.is_finite() {
        Ok(v)
    } else {
        Err(FieldError::NotFinite(show_bytes(t)))
    }
}

/// What a sampled text column looks like.
#[derive(Debug, Default)]
struct TextSample {
    stats: ColumnSample,
    /// Values seen (non-empty).
    values: u64,
    /// Values that hold the list separator.
    lists: u64,
    /// Values that read as numbers, and of those, as plain integers.
    numbers: u64,
    integers: u64,
}

/// A schema for the CSV or TSV file `path` (see [`crate::schema::infer`]): a column
/// whose values hold the list separator is a bag; one of numbers not all integers is
/// dense; any other (integers, text) is categorical.
pub(crate) fn infer_csv(
    path: &Path,
    labels: &[String],
    max_rows: u64,
    format: &CsvFormat,
) -> Result<Inferred> {
    let (header, delimiter) = read_header(path, format)?;
    for l in labels {
        if !header.contains(l) {
            return Err(schema_error(
                path,
                format!(
                    "the label column {l:?} is missing; the header has {}",
                    header.join(", ")
                ),
            ));
        }
    }
    let sep = format.list_separator as u8;
    let mut samples: Vec<TextSample> = header
        .iter()
        .map(|_| TextSample {
            stats: ColumnSample::new(),
            ..TextSample::default()
        })
        .collect();
    let (input, _) = open_input(path)?;
    let mut lines = Lines::new(path, input, 1, 1 + INFER_SAMPLE_ROWS as u64, None);
    lines.next()?; // the header
    let mut split = Splitter::new(delimiter);
    let mut sampled = 0u64;
    while let Some(line) = lines.next()? {
        let Line::Text(_, text) = line else { continue };
        split.split(text);
        if split.len() != header.len() {
            continue;
        }
        sampled += 1;
        for (i, s) in samples.iter_mut().enumerate() {
            let t = split.field(i);
            if t.is_empty() {
                continue;
            }
            s.values += 1;
            if t.contains(&sep) {
                s.lists += 1;
                let items = t.split(|&b| b == sep).map(<[u8]>::trim_ascii);
                let items = items.filter(|t| !t.is_empty());
                let mut n = 0;
                for item in items {
                    track(&mut s.stats, string_key(item));
                    n += 1;
                }
                s.stats.longest = s.stats.longest.max(n);
                continue;
            }
            s.stats.longest = s.stats.longest.max(1);
            track(&mut s.stats, string_key(t));
            if let Some(v) = std::str::from_utf8(t)
                .ok()
                .and_then(|s| s.parse::<f64>().ok())
            {
                if v.is_finite() {
                    s.numbers += 1;
                    s.stats.number(v);
                    if t.iter().all(|b| b.is_ascii_digit() || *b == b'-') {
                        s.integers += 1;
                    }
                }
            }
        }
    }
    let mut schema = Schema {
        labels: labels.to_vec(),
        csv: format.clone(),
        ..Schema::default()
    };
    let (mut kept, mut skipped) = (Vec::new(), Vec::new());
    for (name, s) in header.iter().zip(samples) {
        if labels.contains(name) {
            continue;
        }
        let kind = if s.values == 0 {
            skipped.push((name.clone(), "empty in every sampled row".to_string()));
            continue;
        } else if s.lists > 0 {
            FeatureKind::Bag
        } else if s.numbers == s.values && s.integers < s.values {
            FeatureKind::Dense
        } else {
            FeatureKind::Categorical
        };
        schema.features.push(FeatureSpec::new(name, kind));
        kept.push(s.stats);
    }
    conclude(path, schema, &kept, skipped, sampled, max_rows)
}

fn track(s: &mut ColumnSample, key: u64) {
    if s.distinct.len() < crate::named::MAX_TRACKED_IDS {
        s.distinct.insert(key);
    }
}
