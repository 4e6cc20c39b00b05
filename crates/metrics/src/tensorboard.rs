//! TensorBoard event files: a job's scalars (loss, AUC, throughput, workers, lag) written
//! where `tensorboard --logdir` finds them, with no TensorFlow or Python in the job.
//!
//! The format is TensorFlow's: a file named `events.out.tfevents.<seconds>.<host>...`
//! holding TFRecord records (`u64` length, masked CRC-32C of the length, the bytes,
//! masked CRC-32C of the bytes), each an `Event` protocol buffer. The first event names
//! the file version (`brain.Event:2`); each later one carries a `Summary` of scalar values
//! at one step. The two messages are declared here with the fields used (their numbers
//! are TensorFlow's `event.proto` and `summary.proto`).

use std::fs::File;
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use prost::Message as _;

/// `tensorflow.Event`, the fields a scalar log uses. `file_version` and `summary` share a
/// `oneof` in TensorFlow's declaration; an event sets one of them, which encodes the same.
#[derive(Clone, PartialEq, prost::Message)]
struct Event {
    #[prost(double, tag = "1")]
    wall_time: f64,
    #[prost(int64, tag = "2")]
    step: i64,
    #[prost(string, optional, tag = "3")]
    file_version: Option<String>,
    #[prost(message, optional, tag = "5")]
    summary: Option<Summary>,
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, prost::Message)]
struct Summary {
    #[prost(message, repeated, tag = "1")]
    value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value` holding a scalar (`simple_value`).
#[derive(Clone, PartialEq, prost::Message)]
struct SummaryValue {
    #[prost(string, tag = "1")]
    tag: String,
    #[prost(float, optional, tag = "2")]
    simple_value: Option<f32>,
}

/// TFRecord's CRC: CRC-32C, rotated right by 15 bits and offset, so that a CRC of data
/// that holds CRCs is not degenerate.
fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Appends scalars to one new event file in a directory. Every write is flushed, so a
/// TensorBoard watching the directory, or a job killed mid-run, keeps what was written.
pub struct EventWriter {
    out: BufWriter<File>,
    path: PathBuf,
}

impl EventWriter {
    /// A new event file in `dir` (created if missing), named as TensorBoard expects:
    /// `events.out.tfevents.<seconds>.<host>.<pid>.elastrec`. A resumed job writes a new
    /// file beside its earlier ones; TensorBoard reads them all, in order.
    pub fn create(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let host = hostname();
        let name = format!(
            "events.out.tfevents.{}.{host}.{}.elastrec",
            now.as_secs(),
            std::process::id()
        );
        let path = dir.join(name);
        let mut w = Self {
            out: BufWriter::new(File::create(&path)?),
            path,
        };
        w.event(&Event {
            wall_time: now.as_secs_f64(),
            step: 0,
            file_version: Some("brain.Event:2".into()),
            summary: None,
        })?;
        Ok(w)
    }

    /// The file written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `values` (`(tag, value)`, e.g. `("eval/auc", 0.79)`) at `step`; a value
    /// that is not finite is left out (TensorBoard would draw it as a spike).
    pub fn scalars(&mut self, step: u64, values: &[(&str, f64)]) -> std::io::Result<()> {
        let value: Vec<SummaryValue> = values
            .iter()
            .filter(|(_, v)| v.is_finite())
            .map(|&(tag, v)| SummaryValue {
                tag: tag.to_string(),
                simple_value: Some(v as f32),
            })
            .collect();
        if value.is_empty() {
            return Ok(());
        }
        let wall_time = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        self.event(&Event {
            wall_time,
            step: i64::try_from(step).unwrap_or(i64::MAX),
            file_version: None,
            summary: Some(Summary { value }),
        })
    }

    fn event(&mut self, e: &Event) -> std::io::Result<()> {
        let data = e.encode_to_vec();
        let len = (data.len() as u64).to_le_bytes();
        self.out.write_all(&len)?;
        self.out.write_all(&masked_crc(&len).to_le_bytes())?;
        self.out.write_all(&data)?;
        self.out.write_all(&masked_crc(&data).to_le_bytes())?;
        self.out.flush()
    }
}

/// This machine's name, for the file name (TensorBoard shows it); `localhost` when the
/// system does not say.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| {
            h.trim()
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect::<String>()
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Splits an event file into its records, checking both CRCs of each.
    fn records(bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let len_bytes = &bytes[at..at + 8];
            let len = u64::from_le_bytes(len_bytes.try_into().unwrap()) as usize;
            let crc = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap());
            assert_eq!(crc, masked_crc(len_bytes));
            let data = &bytes[at + 12..at + 12 + len];
            let crc = u32::from_le_bytes(bytes[at + 12 + len..at + 16 + len].try_into().unwrap());
            assert_eq!(crc, masked_crc(data));
            out.push(data.to_vec());
            at += 16 + len;
        }
        out
    }

    /// The CRC TFRecord readers check: CRC-32C's check value, masked as TensorFlow's
    /// `crc32c::Mask` writes it (shifts, not a rotation, to compare with the spec).
    #[test]
    #[allow(clippy::manual_rotate)]
    fn the_mask_is_tfrecords() {
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        let crc = 0xe306_9283u32;
        assert_eq!(
            masked_crc(b"123456789"),
            ((crc >> 15) | (crc << 17)).wrapping_add(0xa282_ead8)
        );
    }

    #[test]
    fn scalars_are_framed_records_of_events() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(dir.path()).unwrap();
        w.scalars(100, &[("eval/auc", 0.75), ("eval/ne", f64::NAN)])
            .unwrap();
        w.scalars(200, &[("eval/auc", 0.8)]).unwrap();
        w.scalars(300, &[("eval/ne", f64::INFINITY)]).unwrap();
        let name = w.path().file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with("events.out.tfevents."), "{name}");
        let bytes = std::fs::read(w.path()).unwrap();
        let events: Vec<Event> = records(&bytes)
            .iter()
            .map(|r| Event::decode(r.as_slice()).unwrap())
            .collect();
        assert_eq!(
            events.len(),
            3,
            "the version, then two steps with a finite value"
        );
        assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
        let values = &events[1].summary.as_ref().unwrap().value;
        assert_eq!((events[1].step, values.len()), (100, 1));
        assert_eq!(values[0].tag, "eval/auc");
        assert_eq!(values[0].simple_value, Some(0.75));
        assert_eq!(events[2].step, 200);
    }
}
