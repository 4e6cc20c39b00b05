//! Job events: what the master tells people (a node declared dead, a PS recovered, a
//! checkpoint written, workers scaled) as typed `tracing` events.
//!
//! Each event has a `kind` (a stable name, listed in `docs/distributed.md`), fields
//! (numbers and names, as recorded) and a message, the line a person reads. The
//! [`EventLog`] layer prints the message on stderr, as the master's log always showed it,
//! and appends the whole event as one JSON object to `<output.dir>/events.jsonl`
//! ([`attach`]): tools and tests read the kind and fields there, never the wording.
//!
//! ```text
//! {"at_ms":1763950000000,"level":"INFO","kind":"ps_recovery","ps":[1],"mode":"partial",
//!  "message":"master: recovering PS [1] (partial) from checkpoint 3: ..."}
//! ```

use std::fs::File;
use std::io::Write;
use std::path::Path;

use parking_lot::Mutex;
use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::Context;
use tracing_subscriber::Layer;

/// The tracing target of job events.
pub const TARGET: &str = "elastrec::event";

/// Events kept in memory until the job directory is known (the first lines of a start).
const EARLY_EVENTS: usize = 1024;

/// Emits a job event: `event!("kind", field = value, ..., "message {}", args)`, or with
/// `warn` first for a failure the job survives.
macro_rules! event {
    (warn, $kind:literal, $($arg:tt)+) => {
        ::tracing::warn!(target: "elastrec::event", kind = $kind, $($arg)+)
    };
    ($kind:literal, $($arg:tt)+) => {
        ::tracing::info!(target: "elastrec::event", kind = $kind, $($arg)+)
    };
}
pub(crate) use event;

/// Where events go once the job directory is known.
enum Sink {
    /// Not attached yet: events wait here (the oldest dropped past [`EARLY_EVENTS`]).
    Early(Vec<String>),
    /// Appended to this file.
    File(File),
}

static SINK: Mutex<Sink> = Mutex::new(Sink::Early(Vec::new()));

/// Appends this process's events to `path` from now on, the ones emitted before first.
/// A resumed master appends to the same file.
pub fn attach(path: &Path) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let mut sink = SINK.lock();
    if let Sink::Early(lines) = &*sink {
        for l in lines {
            f.write_all(l.as_bytes())?;
        }
    }
    *sink = Sink::File(f);
    Ok(())
}

/// The `tracing` layer that prints job events and records them (see the module docs).
/// Install it beside the log formatter, which should leave out [`TARGET`].
pub struct EventLog;

impl<S: tracing::Subscriber> Layer<S> for EventLog {
    // No `enabled`: a layer's `enabled` filters for the whole subscriber, which would hide
    // every other event from the log formatter. Other targets are skipped here.
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != TARGET {
            return;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        let message = match fields.0.remove("message") {
            Some(Value::String(m)) => m,
            _ => String::new(),
        };
        eprintln!("{message}");
        let mut obj = Map::new();
        obj.insert("at_ms".into(), crate::core::now_ms().into());
        obj.insert("level".into(), event.metadata().level().as_str().into());
        obj.extend(fields.0);
        obj.insert("message".into(), message.into());
        let line = format!("{}\n", Value::Object(obj));
        match &mut *SINK.lock() {
            Sink::Early(lines) => {
                if lines.len() == EARLY_EVENTS {
                    lines.remove(0);
                }
                lines.push(line);
            }
            Sink::File(f) => {
                // A full disk must not stop the job; the line was printed anyway.
                let _ = f.write_all(line.as_bytes());
            }
        }
    }
}

/// An event's fields as JSON values: numbers stay numbers, and a `?x` field is
/// [`debug_value`] of its Debug text.
#[derive(Default)]
struct Fields(Map<String, Value>);

/// A `?x` field's value: its Debug text read as JSON where it is a list or a quoted
/// string (a list of PS indices `[0, 1]` stays a list, a `String` loses its Debug
/// quotes), else the text itself (`Worker`, `Some(3)`). `%x` fields arrive here too, as
/// their Display text: a bare number or word stays text, so a field keeps one type
/// whatever its value (a job id of digits is still a string).
fn debug_value(text: String) -> Value {
    match serde_json::from_str::<Value>(&text) {
        Ok(v @ (Value::Array(_) | Value::String(_))) => v,
        _ => text.into(),
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().into(), debug_value(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
}

/// Reads a job's events (for tools and tests): every line of `events.jsonl` that parses.
pub fn read(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    /// An event emitted before the job directory is known still reaches the file, with
    /// its kind, its typed fields and its message; other targets do not.
    #[test]
    fn events_reach_the_file_with_kind_and_fields() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let subscriber = tracing_subscriber::registry().with(EventLog);
        tracing::subscriber::with_default(subscriber, || {
            event!(
                "ps_recovery",
                ps = 1u32,
                mode = "partial",
                "recovering PS [1] (partial)"
            );
            tracing::info!(target: "elastrec_master::other", "not an event");
            attach(&path).unwrap();
            event!(
                warn,
                "checkpoint_failed",
                error = "disk full",
                "checkpoint failed"
            );
        });
        let events = read(&path);
        assert_eq!(events.len(), 2, "{events:?}");
        assert_eq!(events[0]["kind"], "ps_recovery");
        assert_eq!(events[0]["ps"], 1);
        assert_eq!(events[0]["mode"], "partial");
        assert_eq!(events[0]["level"], "INFO");
        assert_eq!(events[0]["message"], "recovering PS [1] (partial)");
        assert_eq!(events[1]["kind"], "checkpoint_failed");
        assert_eq!(events[1]["level"], "WARN");
        assert_eq!(events[1]["error"], "disk full");
    }

    /// Lists and strings recorded with `?` read as JSON values; other Debug text (and
    /// the Display text of `%` fields) stays text.
    #[test]
    fn debug_fields_that_are_json_stay_json() {
        let of = |v: &dyn std::fmt::Debug| debug_value(format!("{v:?}"));
        assert_eq!(of(&vec![0u32, 1]), serde_json::json!([0, 1]));
        assert_eq!(of(&Vec::<u32>::new()), serde_json::json!([]));
        assert_eq!(
            of(&0.25f64),
            serde_json::json!("0.25"),
            "numbers go by record_f64"
        );
        assert_eq!(
            of(&format_args!("{}", 1234)),
            serde_json::json!("1234"),
            "a %x field"
        );
        assert_eq!(of(&"node 3".to_string()), serde_json::json!("node 3"));
        assert_eq!(of(&Some(3u64)), serde_json::json!("Some(3)"));
        assert_eq!(of(&f64::NAN), serde_json::json!("NaN"));
        assert_eq!(of(&(1u32, 2u32)), serde_json::json!("(1, 2)"));
    }
}
