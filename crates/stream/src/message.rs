//! What one Kafka message holds: a Criteo TSV line (one sample), a batch of samples in
//! elastrec's binary batch format, or (a job with named features) JSON objects
//! ([`decode_json`]).
//!
//! # Binary batch format (`format = "batch"`)
//! Little-endian throughout. Version 1, one label per sample:
//! ```text
//! magic    4 bytes  "ERB1"
//! count    u32      samples in the message (1 ..= 65536)
//! count times:
//!   label    u8     0 or 1
//!   present  u64    bit i (0..13): integer feature I(i+1) is present;
//!                   bit 13+j (0..26): categorical feature C(j+1) is present; bits 39.. are 0
//!   ints     i64    one per present integer feature, in order
//!   cats     u32    one per present categorical feature, in order
//! ```
//! Version 2, several labels per sample (a multi-task model's: a click, a conversion):
//! ```text
//! magic    4 bytes  "ERB2"
//! count    u32      as in version 1
//! tasks    u8       labels per sample (1 ..= 8)
//! count times:
//!   labels   u8     bit t: task t's label (task 0 the click); bits tasks.. are 0
//!   present, ints, cats as in version 1
//! ```
//! A TSV message carries several labels as a TSV file does: one digit per task (`10`).
//!
//! An absent feature is what an empty TSV field is. A message is rejected whole when its
//! framing is wrong (magic, a count the payload cannot hold, a task count outside 1..=8,
//! trailing bytes); a sample with a bad label, or with another number of labels than the
//! job's model has tasks, is rejected alone.

use elastrec_data::{criteo, FieldError, RawRow};
use serde::{Deserialize, Serialize};

/// Magic bytes opening a binary batch message of one label per sample.
pub const BATCH_MAGIC: &[u8; 4] = b"ERB1";
/// Magic bytes opening a binary batch message of several labels per sample.
pub const BATCH_MAGIC_TASKS: &[u8; 4] = b"ERB2";
/// Most samples one binary message may hold.
pub const MAX_BATCH_SAMPLES: u32 = 65_536;
/// Smallest encoded sample: a label and an empty presence mask.
const MIN_SAMPLE_BYTES: usize = 1 + 8;
/// Most labels a sample can carry (a byte's bits; the models' `MAX_TASKS`).
const MAX_LABELS: u8 = 1 + elastrec_data::raw::MAX_EXTRA_TASKS;
/// Field index used for framing errors (see `DataError::BadMessage`).
pub const FRAME_FIELD: usize = usize::MAX;

/// How messages of a topic are encoded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MessageFormat {
    /// One Criteo TSV line per message (a trailing `\n` or `\r\n` is allowed).
    #[default]
    Tsv,
    /// elastrec's binary batch format (module docs).
    Batch,
    /// JSON objects of named features (`{"click": 1, "item_id": "i-7", "genres": ["a"]}`),
    /// one per message or an array of them, for a job with `[[data.feature]]`
    /// (`elastrec_data::named_json`).
    Json,
}

/// A sample that could not be decoded: its index in the message, the field, the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadSample {
    /// 0-based sample in the message.
    pub sample: u32,
    /// Field index as in `DataError::Malformed`, or [`FRAME_FIELD`].
    pub field: usize,
    /// What is wrong.
    pub reason: FieldError,
}

/// Decodes a message into `out` (appended), for a model of `tasks` tasks: a sample must
/// carry that many labels. Samples that decode are appended even when others in the same
/// message fail; the failures are returned in order. A framing error returns a single
/// failure and appends nothing.
pub fn decode(
    payload: &[u8],
    format: MessageFormat,
    tasks: usize,
    out: &mut Vec<RawRow>,
) -> Vec<BadSample> {
    match format {
        MessageFormat::Tsv => {
            let line = payload
                .strip_suffix(b"\n")
                .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
                .unwrap_or(payload);
            let mut row = RawRow::default();
            let parsed = elastrec_data::tsv::parse_line(line, &mut row)
                .and_then(|()| task_count(&row, tasks).map_err(|e| (0, e)));
            match parsed {
                Ok(()) => {
                    out.push(row);
                    Vec::new()
                }
                Err((field, reason)) => vec![BadSample {
                    sample: 0,
                    field,
                    reason,
                }],
            }
        }
        MessageFormat::Batch => decode_batch(payload, tasks, out),
        MessageFormat::Json => frame("JSON messages are read through the job's named features"),
    }
}

/// Decodes a JSON message (one object, or an array of objects) of `schema`'s named
/// features into `out` (laid out for `schema`, appended). Samples that fit are appended
/// even when others of the message do not; a message that is not JSON objects returns a
/// single framing failure and appends nothing.
pub fn decode_json(
    payload: &[u8],
    schema: &elastrec_data::Schema,
    out: &mut elastrec_data::Batch,
) -> Vec<BadSample> {
    use elastrec_data::named_json::{push_json_row, Labels};
    use serde_json::Value;
    let value: Value = match serde_json::from_slice(payload) {
        Ok(v) => v,
        Err(e) => return frame(format!("not JSON: {e}")),
    };
    let rows = match value {
        Value::Object(row) => vec![row],
        Value::Array(items) => {
            let mut rows = Vec::with_capacity(items.len());
            for item in items {
                match item {
                    Value::Object(row) => rows.push(row),
                    _ => return frame("a JSON array message must hold objects only"),
                }
            }
            rows
        }
        _ => return frame("a JSON message is an object of named features, or an array of them"),
    };
    let mut bad = Vec::new();
    let chains = elastrec_data::chain::Chains::of(schema);
    for (i, row) in rows.iter().enumerate() {
        if let Err(why) = push_json_row(out, schema, &chains, row, Labels::Required) {
            bad.push(BadSample {
                sample: i as u32,
                field: elastrec_data::error::JSON_FIELD,
                reason: FieldError::Json(why),
            });
        }
    }
    bad
}

/// A row of the model's task count, or why not.
fn task_count(row: &RawRow, tasks: usize) -> Result<(), FieldError> {
    if row.tasks() == tasks {
        Ok(())
    } else {
        Err(FieldError::TaskCount {
            expected: tasks,
            got: row.tasks(),
        })
    }
}

fn frame(why: impl Into<String>) -> Vec<BadSample> {
    vec![BadSample {
        sample: 0,
        field: FRAME_FIELD,
        reason: FieldError::BadFrame(why.into()),
    }]
}

/// A cursor over the payload that never reads past its end.
struct Cursor<'a> {
    rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.rest.len() < n {
            return None;
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
}

fn decode_batch(payload: &[u8], tasks: usize, out: &mut Vec<RawRow>) -> Vec<BadSample> {
    let mut c = Cursor { rest: payload };
    let version = match c.take(4) {
        Some(m) if m == BATCH_MAGIC => 1,
        Some(m) if m == BATCH_MAGIC_TASKS => 2,
        _ => return frame("does not start with \"ERB1\" or \"ERB2\" (is the topic's format tsv?)"),
    };
    let Some(count) = c.u32() else {
        return frame("truncated before the sample count");
    };
    let labels = if version == 1 {
        1
    } else {
        match c.u8() {
            Some(t @ 1..=MAX_LABELS) => t,
            Some(t) => return frame(format!("{t} labels per sample (1..={MAX_LABELS} allowed)")),
            None => return frame("truncated before the label count"),
        }
    };
    // Never trust a size read from the wire: the count must fit the bytes that follow.
    if count == 0 || count > MAX_BATCH_SAMPLES || count as usize * MIN_SAMPLE_BYTES > c.rest.len() {
        return frame(format!(
            "sample count {count} does not fit {} payload bytes (1..={MAX_BATCH_SAMPLES} allowed)",
            c.rest.len()
        ));
    }
    let start = out.len();
    let mut bad = Vec::new();
    for i in 0..count {
        let truncated = |out: &mut Vec<RawRow>| {
            out.truncate(start);
            frame(format!("truncated in sample {i} of {count}"))
        };
        let (Some(bits), Some(present)) = (c.u8(), c.u64()) else {
            return truncated(out);
        };
        if present >> (criteo::DENSE + criteo::CATEGORICAL) != 0 {
            out.truncate(start);
            return frame(format!(
                "sample {i}: presence mask {present:#x} has unknown bits"
            ));
        }
        let mut row = RawRow {
            label: bits & 1,
            extra_tasks: labels - 1,
            extra_labels: bits >> 1,
            ..RawRow::default()
        };
        for (k, slot) in row.ints.iter_mut().enumerate() {
            if present >> k & 1 == 1 {
                let Some(v) = c.u64() else {
                    return truncated(out);
                };
                *slot = Some(v as i64);
            }
        }
        for (k, slot) in row.cats.iter_mut().enumerate() {
            if present >> (criteo::DENSE + k) & 1 == 1 {
                let Some(v) = c.u32() else {
                    return truncated(out);
                };
                *slot = Some(v);
            }
        }
        // Version 1: the byte is the label, 0 or 1; version 2: a bit per label.
        let reason = if u32::from(bits) >> labels != 0 {
            Some(FieldError::BadLabel(if version == 1 {
                bits.to_string()
            } else {
                format!("{bits:#010b} (bits beyond the message's {labels} labels)")
            }))
        } else {
            task_count(&row, tasks).err()
        };
        match reason {
            Some(reason) => bad.push(BadSample {
                sample: i,
                field: 0,
                reason,
            }),
            None => out.push(row),
        }
    }
    if !c.rest.is_empty() {
        out.truncate(start);
        return frame(format!("{} bytes after the last sample", c.rest.len()));
    }
    bad
}

/// Appends `rows` to `out` as one message of `format`. A TSV message holds exactly one row
/// (without a line terminator); a batch message holds 1..=[`MAX_BATCH_SAMPLES`] rows of
/// one label count (version 1 for one label, version 2 for several). Criteo rows are
/// never written as JSON: `Json` writes the batch format.
pub fn encode(rows: &[RawRow], format: MessageFormat, out: &mut Vec<u8>) {
    match format {
        MessageFormat::Tsv => {
            assert_eq!(rows.len(), 1, "a TSV message holds one sample");
            elastrec_data::tsv::write_row(&rows[0], out);
            if out.last() == Some(&b'\n') {
                out.pop();
            }
        }
        // Criteo rows have no column names: a JSON message is written by its producer.
        MessageFormat::Batch | MessageFormat::Json => {
            assert!(!rows.is_empty() && rows.len() <= MAX_BATCH_SAMPLES as usize);
            let tasks = rows[0].extra_tasks;
            assert!(
                rows.iter().all(|r| r.extra_tasks == tasks),
                "a batch message's samples carry one label count"
            );
            if tasks == 0 {
                out.extend_from_slice(BATCH_MAGIC);
                out.extend_from_slice(&(rows.len() as u32).to_le_bytes());
            } else {
                out.extend_from_slice(BATCH_MAGIC_TASKS);
                out.extend_from_slice(&(rows.len() as u32).to_le_bytes());
                out.push(tasks + 1);
            }
            for r in rows {
                out.push(r.label | r.extra_labels << 1);
                let mut present = 0u64;
                for (k, v) in r.ints.iter().enumerate() {
                    present |= u64::from(v.is_some()) << k;
                }
                for (k, v) in r.cats.iter().enumerate() {
                    present |= u64::from(v.is_some()) << (criteo::DENSE + k);
                }
                out.extend_from_slice(&present.to_le_bytes());
                for v in r.ints.iter().flatten() {
                    out.extend_from_slice(&v.to_le_bytes());
                }
                for v in r.cats.iter().flatten() {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(i: u32) -> RawRow {
        let mut r = RawRow {
            label: (i % 2) as u8,
            ..RawRow::default()
        };
        for k in 0..criteo::DENSE {
            r.ints[k] = (k as u32 != i % 13).then_some(i as i64 * 7 - k as i64);
        }
        for k in 0..criteo::CATEGORICAL {
            r.cats[k] = (k as u32 != i % 26).then_some(i.wrapping_mul(2654435761) ^ k as u32);
        }
        r
    }

    #[test]
    fn both_formats_round_trip_rows_with_absent_fields() {
        let rows: Vec<RawRow> = (0..50).map(row).collect();
        let mut buf = Vec::new();
        encode(&rows, MessageFormat::Batch, &mut buf);
        let mut out = Vec::new();
        assert!(decode(&buf, MessageFormat::Batch, 1, &mut out).is_empty());
        assert_eq!(out, rows);
        for r in &rows {
            let mut buf = Vec::new();
            encode(std::slice::from_ref(r), MessageFormat::Tsv, &mut buf);
            buf.extend_from_slice(b"\r\n");
            let mut out = Vec::new();
            assert!(decode(&buf, MessageFormat::Tsv, 1, &mut out).is_empty());
            assert_eq!(out, vec![*r]);
        }
    }

    #[test]
    fn a_malformed_tsv_message_names_its_field() {
        let mut out = Vec::new();
        let bad = decode(b"2\t1", MessageFormat::Tsv, 1, &mut out);
        assert!(out.is_empty());
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].field, 0);
    }

    #[test]
    fn sizes_read_from_a_batch_message_are_checked_against_its_length() {
        let rows: Vec<RawRow> = (0..3).map(row).collect();
        let mut buf = Vec::new();
        encode(&rows, MessageFormat::Batch, &mut buf);
        // A count claiming more samples than the bytes can hold.
        let mut huge = buf.clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        // Every truncation of a valid message, and trailing garbage.
        let mut cases = vec![huge, b"ERB0".to_vec()];
        cases.extend((0..buf.len()).map(|n| buf[..n].to_vec()));
        let mut trailing = buf.clone();
        trailing.push(0);
        cases.push(trailing);
        for case in cases {
            let mut out = Vec::new();
            let bad = decode(&case, MessageFormat::Batch, 1, &mut out);
            assert!(out.is_empty(), "nothing of a badly framed message is kept");
            assert_eq!(bad.len(), 1);
            assert_eq!(bad[0].field, FRAME_FIELD);
        }
    }

    #[test]
    fn a_bad_label_rejects_only_its_sample() {
        let rows: Vec<RawRow> = (0..3).map(row).collect();
        let mut buf = Vec::new();
        encode(&rows, MessageFormat::Batch, &mut buf);
        // The second sample's label byte: magic, count, then sample 0's bytes.
        let mut tmp = Vec::new();
        encode(&rows[..1], MessageFormat::Batch, &mut tmp);
        let second = 8 + (tmp.len() - 8);
        buf[second] = 7;
        let mut out = Vec::new();
        let bad = decode(&buf, MessageFormat::Batch, 1, &mut out);
        assert_eq!(out, vec![rows[0], rows[2]]);
        assert_eq!(bad.len(), 1);
        assert_eq!((bad[0].sample, bad[0].field), (1, 0));
    }

    fn two_task(i: u32) -> RawRow {
        RawRow {
            extra_tasks: 1,
            extra_labels: u8::from(i.is_multiple_of(3)),
            ..row(i)
        }
    }

    /// A multi-task sample's labels travel in both formats (`10` in TSV, a bit per task
    /// in version 2 of the batch format); one-label batches stay version 1.
    #[test]
    fn multi_task_samples_round_trip_in_both_formats() {
        let rows: Vec<RawRow> = (0..30).map(two_task).collect();
        let mut buf = Vec::new();
        encode(&rows, MessageFormat::Batch, &mut buf);
        assert_eq!(&buf[..4], BATCH_MAGIC_TASKS);
        let mut out = Vec::new();
        assert!(decode(&buf, MessageFormat::Batch, 2, &mut out).is_empty());
        assert_eq!(out, rows);
        assert_eq!(out[3].task_label(1), 1);
        assert_eq!(out[4].task_label(1), 0);
        for r in &rows[..4] {
            let mut buf = Vec::new();
            encode(std::slice::from_ref(r), MessageFormat::Tsv, &mut buf);
            assert_eq!(buf[2], b'\t', "two label digits");
            let mut out = Vec::new();
            assert!(decode(&buf, MessageFormat::Tsv, 2, &mut out).is_empty());
            assert_eq!(out, vec![*r]);
        }
        let mut one = Vec::new();
        encode(&[row(1)], MessageFormat::Batch, &mut one);
        assert_eq!(&one[..4], BATCH_MAGIC);
    }

    /// A sample of another label count than the model's tasks is refused alone, naming
    /// both counts, in either format and in either direction.
    #[test]
    fn a_sample_of_another_task_count_is_rejected_alone() {
        let mut out = Vec::new();
        let mut line = Vec::new();
        encode(&[row(1)], MessageFormat::Tsv, &mut line);
        let bad = decode(&line, MessageFormat::Tsv, 2, &mut out);
        assert!(out.is_empty());
        assert_eq!(
            bad[0].reason,
            FieldError::TaskCount {
                expected: 2,
                got: 1
            }
        );
        assert!(bad[0].reason.to_string().contains("1 label(s)"));
        let mut buf = Vec::new();
        encode(&[two_task(0), two_task(1)], MessageFormat::Batch, &mut buf);
        let bad = decode(&buf, MessageFormat::Batch, 1, &mut out);
        assert!(out.is_empty());
        assert_eq!(bad.len(), 2);
        assert_eq!((bad[1].sample, bad[1].field), (1, 0));
        let mut buf = Vec::new();
        encode(&[row(0), row(1)], MessageFormat::Batch, &mut buf);
        assert_eq!(decode(&buf, MessageFormat::Batch, 3, &mut out).len(), 2);
        assert!(out.is_empty());
    }

    /// Version 2's label count is checked as framing, and a label bit beyond it rejects
    /// its sample.
    #[test]
    fn version_two_checks_its_label_count_and_bits() {
        let rows: Vec<RawRow> = (0..3).map(two_task).collect();
        let mut buf = Vec::new();
        encode(&rows, MessageFormat::Batch, &mut buf);
        for tasks in [0u8, 9, 255] {
            let mut case = buf.clone();
            case[8] = tasks;
            let mut out = Vec::new();
            let bad = decode(&case, MessageFormat::Batch, 2, &mut out);
            assert!(out.is_empty());
            assert_eq!(bad[0].field, FRAME_FIELD, "{tasks} labels");
        }
        let mut case = buf.clone();
        case[9] = 0b101; // sample 0: a third label in a two-label message
        let mut out = Vec::new();
        let bad = decode(&case, MessageFormat::Batch, 2, &mut out);
        assert_eq!(out, rows[1..].to_vec());
        assert_eq!((bad[0].sample, bad[0].field), (0, 0));
        assert!(matches!(bad[0].reason, FieldError::BadLabel(_)));
    }
}
