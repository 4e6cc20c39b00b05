//! The traffic generator: replays a log into a topic at the rates of a trace (`elastrec
//! replay`), so online jobs can be tested and benchmarked on a known load: Criteo-layout
//! rows as TSV or binary batch messages, or a named log (Parquet, CSV) as JSON objects of
//! its schema's columns, what a service that logs its impressions sends.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use elastrec_data::json_rows::JsonRows;
use elastrec_data::{BadRowPolicy, RawRow, Schema, TsvReader};
use rskafka::client::partition::PartitionClient;
use rskafka::record::Record;
use serde_json::{Map, Value};

use crate::client::{block_on, Kafka};
use crate::error::{Result, StreamError};
use crate::message::{encode, MessageFormat, MAX_BATCH_SAMPLES};
use crate::topic::{Connection, TopicWatch};

/// Samples per second over time: `(t_s, qps)` points, linear in between, ending at the
/// last point.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    points: Vec<(f64, f64)>,
}

impl Trace {
    /// A constant rate for `seconds`.
    pub fn constant(qps: f64, seconds: f64) -> Self {
        Self {
            points: vec![(0.0, qps), (seconds, qps)],
        }
    }

    /// Parses a CSV of `t_s,qps` lines (a header line and `#` comments are allowed).
    /// Times must increase from 0; rates must be finite and non-negative.
    pub fn parse_csv(text: &str, path: &Path) -> Result<Self> {
        let bad = |line: usize, why: String| {
            StreamError::Invalid(format!("{}:{line}: {why}", path.display()))
        };
        let mut points: Vec<(f64, f64)> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut cols = line.split(',').map(str::trim);
            let (Some(t), Some(q), None) = (cols.next(), cols.next(), cols.next()) else {
                return Err(bad(i + 1, format!("expected `t_s,qps`, got {line:?}")));
            };
            let (Ok(t), Ok(q)) = (t.parse::<f64>(), q.parse::<f64>()) else {
                if points.is_empty() && i == 0 {
                    continue; // the header
                }
                return Err(bad(i + 1, format!("expected two numbers, got {line:?}")));
            };
            if !(t.is_finite() && q.is_finite() && q >= 0.0) {
                return Err(bad(
                    i + 1,
                    format!("time {t} and rate {q} must be finite, rate ≥ 0"),
                ));
            }
            match points.last() {
                None if t != 0.0 => {
                    return Err(bad(i + 1, "the first point must be at t_s = 0".into()))
                }
                Some(&(prev, _)) if t <= prev => {
                    return Err(bad(
                        i + 1,
                        format!("time {t} does not increase (after {prev})"),
                    ))
                }
                _ => points.push((t, q)),
            }
        }
        if points.len() < 2 {
            return Err(StreamError::Invalid(format!(
                "{}: a trace needs at least two points (t_s = 0 and an end)",
                path.display()
            )));
        }
        Ok(Self { points })
    }

    /// Seconds the trace lasts.
    pub fn duration_s(&self) -> f64 {
        self.points.last().map_or(0.0, |p| p.0)
    }

    /// The rate at `t` seconds (0 after the end).
    pub fn rate_at(&self, t: f64) -> f64 {
        let i = self.points.partition_point(|p| p.0 <= t);
        if i == 0 || i >= self.points.len() {
            return if t == self.duration_s() {
                self.points[self.points.len() - 1].1
            } else {
                0.0
            };
        }
        let (t0, q0) = self.points[i - 1];
        let (t1, q1) = self.points[i];
        q0 + (q1 - q0) * (t - t0) / (t1 - t0)
    }

    /// Samples due by `t` seconds: the integral of the rate from 0 to `t`.
    pub fn due_by(&self, t: f64) -> f64 {
        let mut total = 0.0;
        for w in self.points.windows(2) {
            let ((t0, q0), (t1, q1)) = (w[0], w[1]);
            if t <= t0 {
                break;
            }
            let end = t.min(t1);
            let q_end = q0 + (q1 - q0) * (end - t0) / (t1 - t0);
            total += (q0 + q_end) / 2.0 * (end - t0);
        }
        total
    }

    /// The same trace played `factor` times faster (rates scaled up, times down).
    pub fn faster(&self, factor: f64) -> Self {
        Self {
            points: self
                .points
                .iter()
                .map(|&(t, q)| (t / factor, q * factor))
                .collect(),
        }
    }
}

/// Where samples go.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Partitioner {
    /// Message `i` to partition `i mod n`.
    RoundRobin,
    /// Round robin, except for one partition `partition` that is hot and whose click rate
    /// differs (the skews KALE's global shuffling is measured against): every sample goes
    /// there with probability `traffic_share`, and a positive one not sent there by that
    /// coin with probability `positive_share`.
    Skewed {
        /// The skewed partition.
        partition: i32,
        /// Probability any sample is sent there (more traffic than its peers).
        traffic_share: f64,
        /// Probability a positive sample is sent there (a higher click rate).
        positive_share: f64,
    },
}

impl Partitioner {
    /// Round robin with `partition` skewed by `traffic_share` and `positive_share` (see
    /// [`Partitioner::Skewed`]); plain round robin when both are 0. Shares outside [0, 1]
    /// are refused, naming `--hot-share` / `--skew-share`.
    pub fn skewed(partition: i32, traffic_share: f64, positive_share: f64) -> Result<Self> {
        for (flag, share) in [
            ("--hot-share", traffic_share),
            ("--skew-share", positive_share),
        ] {
            if !(0.0..=1.0).contains(&share) {
                return Err(StreamError::Invalid(format!(
                    "{flag} must be in [0, 1], got {share}"
                )));
            }
        }
        Ok(if traffic_share > 0.0 || positive_share > 0.0 {
            Self::Skewed {
                partition,
                traffic_share,
                positive_share,
            }
        } else {
            Self::RoundRobin
        })
    }
}

/// What to replay, where, and how fast.
#[derive(Debug, Clone)]
pub struct ReplaySpec {
    /// The brokers.
    pub conn: Connection,
    /// Destination topic (it must exist).
    pub topic: String,
    /// The files, replayed in order: Criteo TSV (plain or gzip), or with `schema` a named
    /// log (Parquet, CSV or TSV with a header).
    pub files: Vec<PathBuf>,
    /// The named log's features, for [`MessageFormat::Json`]: the columns each message
    /// carries (labels, sample weight, features, per-id weights).
    pub schema: Option<Arc<Schema>>,
    /// Start over from the first file when the data runs out before the trace.
    pub repeat: bool,
    /// Message encoding.
    pub format: MessageFormat,
    /// Samples per message with [`MessageFormat::Batch`], and with
    /// [`MessageFormat::Json`] (more than one: a JSON array of objects).
    pub samples_per_message: u32,
    /// The rates.
    pub trace: Trace,
    /// Where samples go.
    pub partitioner: Partitioner,
    /// Seed of the partitioner's coin.
    pub seed: u64,
}

/// What a replay did.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ReplayReport {
    /// Samples sent.
    pub samples: u64,
    /// Messages sent.
    pub messages: u64,
    /// Samples per partition.
    pub per_partition: Vec<u64>,
    /// Positive samples per partition.
    pub positives_per_partition: Vec<u64>,
    /// Wall-clock seconds.
    pub seconds: f64,
}

/// Replays `spec`, calling `progress` about once a second. Returns once the trace ends
/// (or the data, without `repeat`) and every message is acknowledged by the broker.
pub fn replay(spec: &ReplaySpec, mut progress: impl FnMut(&ReplayReport)) -> Result<ReplayReport> {
    if spec.files.is_empty() {
        return Err(StreamError::Invalid("no data files to replay".into()));
    }
    let per_msg = match spec.format {
        MessageFormat::Tsv => 1,
        MessageFormat::Batch | MessageFormat::Json => {
            spec.samples_per_message.clamp(1, MAX_BATCH_SAMPLES) as usize
        }
    };
    let mut rows = match (spec.format, &spec.schema) {
        (MessageFormat::Json, Some(schema)) => {
            Samples::Named(NamedSource::new(&spec.files, spec.repeat, schema.clone()))
        }
        (MessageFormat::Json, None) => {
            return Err(StreamError::Invalid(
                "JSON messages carry a named log's features: give its schema (the job file \
                 whose [data] names the label and features)"
                    .into(),
            ))
        }
        (_, Some(_)) => {
            return Err(StreamError::Invalid(
                "a named log is replayed as JSON messages (format json); tsv and batch \
                 messages carry Criteo-layout rows"
                    .into(),
            ))
        }
        (_, None) => Samples::Criteo(RowSource::new(&spec.files, spec.repeat)?),
    };
    let watch = TopicWatch::new(&spec.conn, "elastrec-replay", Duration::from_secs(10))?;
    let partitions = watch.partitions(std::slice::from_ref(&spec.topic))?;
    let n = partitions.len();
    let mut producer = Producer::new(&spec.conn, &spec.topic, &partitions)?;
    let mut report = ReplayReport {
        per_partition: vec![0; n],
        positives_per_partition: vec![0; n],
        ..ReplayReport::default()
    };
    let mut dealer = Dealer::new(spec.partitioner, spec.seed, n);
    // Samples waiting for their partition's next message (batch and JSON arrays).
    let mut open: Vec<Vec<Sample>> = (0..n).map(|_| Vec::new()).collect();
    let started = Instant::now();
    let mut last_progress = Instant::now();
    let end = spec.trace.duration_s();
    'outer: loop {
        let t = started.elapsed().as_secs_f64();
        let due = spec.trace.due_by(t.min(end)).floor() as u64;
        while report.samples < due {
            let Some((row, positive)) = rows.next()? else {
                break 'outer;
            };
            let p = dealer.partition(positive);
            report.samples += 1;
            report.per_partition[p] += 1;
            report.positives_per_partition[p] += u64::from(positive);
            open[p].push(row);
            if open[p].len() >= per_msg {
                report.messages += producer.queue(p, spec.format, &mut open[p]);
            }
        }
        producer.send()?;
        if last_progress.elapsed() >= Duration::from_secs(1) {
            report.seconds = t;
            progress(&report);
            last_progress = Instant::now();
        }
        if t >= end {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    for (p, rows) in open.iter_mut().enumerate() {
        if !rows.is_empty() {
            report.messages += producer.queue(p, spec.format, rows);
        }
    }
    producer.send()?;
    report.seconds = started.elapsed().as_secs_f64();
    if producer.acked != report.messages {
        return Err(StreamError::Broker {
            brokers: spec.conn.brokers.clone(),
            message: format!(
                "{} of {} messages were acknowledged",
                producer.acked, report.messages
            ),
            transient: false,
        });
    }
    Ok(report)
}

/// Sends the replay's messages: each partition's queued messages go in produce requests
/// of at most `batch.num.messages` records, one request in flight per partition, so each
/// partition keeps the trace's order; every request is acknowledged before the next
/// round (`acks = all`, rskafka's default).
struct Producer {
    kafka: Arc<Kafka>,
    clients: Vec<Arc<PartitionClient>>,
    queued: Vec<Vec<Record>>,
    acked: u64,
}

impl Producer {
    fn new(conn: &Connection, topic: &str, partitions: &[crate::PartitionId]) -> Result<Self> {
        let kafka = Kafka::new(conn, "elastrec-replay")?;
        let clients = partitions
            .iter()
            .map(|p| {
                let (kafka, topic, number) = (kafka.clone(), topic.to_string(), p.partition);
                block_on(async move { kafka.partition(&topic, number).await })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            kafka,
            queued: vec![Vec::new(); clients.len()],
            clients,
            acked: 0,
        })
    }

    /// Queues `rows` as messages of partition index `p` (one per sample in TSV, one in
    /// all in the batch format, an object or an array of them in JSON); returns how many.
    fn queue(&mut self, p: usize, format: MessageFormat, rows: &mut Vec<Sample>) -> u64 {
        let record = |buf: Vec<u8>| Record {
            key: None,
            value: Some(buf),
            headers: Default::default(),
            timestamp: chrono::Utc::now(),
        };
        let before = self.queued[p].len();
        // A source gives one kind of sample, the kind its format sends.
        let samples = std::mem::take(rows);
        let criteo = |samples: Vec<Sample>| -> Vec<RawRow> {
            samples
                .into_iter()
                .filter_map(|s| match s {
                    Sample::Row(r) => Some(r),
                    Sample::Named(_) => None,
                })
                .collect()
        };
        match format {
            MessageFormat::Tsv => {
                for r in criteo(samples) {
                    let mut buf = Vec::new();
                    encode(std::slice::from_ref(&r), MessageFormat::Tsv, &mut buf);
                    self.queued[p].push(record(buf));
                }
            }
            MessageFormat::Batch => {
                let mut buf = Vec::new();
                encode(&criteo(samples), MessageFormat::Batch, &mut buf);
                self.queued[p].push(record(buf));
            }
            MessageFormat::Json => {
                let mut objects: Vec<Value> = samples
                    .into_iter()
                    .filter_map(|s| match s {
                        Sample::Named(m) => Some(Value::Object(m)),
                        Sample::Row(_) => None,
                    })
                    .collect();
                let value = if objects.len() == 1 {
                    objects.pop().expect("one object")
                } else {
                    Value::Array(objects)
                };
                let buf = serde_json::to_vec(&value).expect("JSON values serialize");
                self.queued[p].push(record(buf));
            }
        }
        (self.queued[p].len() - before) as u64
    }

    /// Sends everything queued and waits for the acknowledgements.
    fn send(&mut self) -> Result<()> {
        if self.queued.iter().all(Vec::is_empty) {
            return Ok(());
        }
        let per_request = self.kafka.settings.batch_messages;
        let compression = self.kafka.settings.compression;
        let work: Vec<_> = self
            .clients
            .iter()
            .zip(self.queued.iter_mut())
            .filter(|(_, q)| !q.is_empty())
            .map(|(c, q)| (c.clone(), std::mem::take(q)))
            .collect();
        let kafka = self.kafka.clone();
        let sent = block_on(async move {
            let sends = work.into_iter().map(|(client, records)| {
                let kafka = kafka.clone();
                async move {
                    let mut n = 0u64;
                    let mut records = records.into_iter().peekable();
                    while records.peek().is_some() {
                        let chunk: Vec<Record> = records.by_ref().take(per_request).collect();
                        let len = chunk.len() as u64;
                        client
                            .produce(chunk, compression)
                            .await
                            .map_err(|e| kafka.error(e))?;
                        n += len;
                    }
                    Ok::<u64, StreamError>(n)
                }
            });
            futures::future::try_join_all(sends).await
        })?;
        self.acked += sent.iter().sum::<u64>();
        Ok(())
    }
}

/// Picks each sample's partition by a [`Partitioner`].
struct Dealer {
    partitioner: Partitioner,
    coin: elastrec_common::SplitMix64,
    next: usize,
    partitions: usize,
}

impl Dealer {
    fn new(partitioner: Partitioner, seed: u64, partitions: usize) -> Self {
        Self {
            partitioner,
            coin: elastrec_common::SplitMix64::new(seed),
            next: 0,
            partitions,
        }
    }

    /// The partition (index into the topic's partitions) of the next sample.
    fn partition(&mut self, positive: bool) -> usize {
        if let Partitioner::Skewed {
            partition,
            traffic_share,
            positive_share,
        } = self.partitioner
        {
            if self.flip(traffic_share) || (positive && self.flip(positive_share)) {
                return partition as usize % self.partitions;
            }
        }
        let p = self.next % self.partitions;
        self.next = self.next.wrapping_add(1);
        p
    }

    fn flip(&mut self, share: f64) -> bool {
        share > 0.0 && ((self.coin.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < share
    }
}

/// One sample to send: a Criteo row, or a named log's row as a JSON object. A replay
/// queues one kind only, each by value as the message encoders take it.
#[allow(clippy::large_enum_variant)]
enum Sample {
    Row(RawRow),
    Named(Map<String, Value>),
}

/// Where the samples come from.
enum Samples {
    Criteo(RowSource),
    Named(NamedSource),
}

impl Samples {
    /// The next sample, and whether its (first) label is a click.
    fn next(&mut self) -> Result<Option<(Sample, bool)>> {
        Ok(match self {
            Samples::Criteo(rows) => rows.next()?.map(|r| {
                let positive = r.label == 1;
                (Sample::Row(r), positive)
            }),
            Samples::Named(rows) => rows.next()?.map(|m| {
                // `JsonRows` writes every label as the number 0 or 1.
                let positive =
                    rows.schema.labels.first().and_then(|l| m.get(l)) == Some(&Value::from(1u8));
                (Sample::Named(m), positive)
            }),
        })
    }
}

/// The replayed files in order; with `repeat`, over again once a pass read rows.
struct FileCycle {
    files: Vec<PathBuf>,
    at: usize,
    repeat: bool,
    rows_this_pass: u64,
}

impl FileCycle {
    fn new(files: &[PathBuf], repeat: bool) -> Self {
        Self {
            files: files.to_vec(),
            at: 0,
            repeat,
            rows_this_pass: 0,
        }
    }

    /// The file to open next; `None` when the data is done.
    fn next_file(&mut self) -> Option<&Path> {
        if self.at == self.files.len() {
            if !self.repeat || self.rows_this_pass == 0 {
                return None;
            }
            self.at = 0;
            self.rows_this_pass = 0;
        }
        Some(&self.files[self.at])
    }

    /// The file being read.
    fn current(&self) -> &Path {
        &self.files[self.at]
    }

    fn row_read(&mut self) {
        self.rows_this_pass += 1;
    }

    fn file_done(&mut self) {
        self.at += 1;
    }
}

/// A named log's files, row by row as JSON objects of the schema's columns.
struct NamedSource {
    files: FileCycle,
    reader: Option<JsonRows>,
    schema: Arc<Schema>,
}

impl NamedSource {
    fn new(files: &[PathBuf], repeat: bool, schema: Arc<Schema>) -> Self {
        Self {
            files: FileCycle::new(files, repeat),
            reader: None,
            schema,
        }
    }

    fn next(&mut self) -> Result<Option<Map<String, Value>>> {
        loop {
            if self.reader.is_none() {
                let Some(path) = self.files.next_file() else {
                    return Ok(None);
                };
                self.reader = Some(
                    JsonRows::open(path, &self.schema)
                        .map_err(|e| StreamError::Invalid(e.to_string()))?,
                );
            }
            let r = self.reader.as_mut().expect("opened above");
            if let Some(row) = r
                .next_row()
                .map_err(|e| StreamError::Invalid(e.to_string()))?
            {
                self.files.row_read();
                return Ok(Some(row));
            }
            self.reader = None;
            self.files.file_done();
        }
    }
}

/// Criteo rows of the data files in order, optionally starting over.
struct RowSource {
    files: FileCycle,
    reader: Option<TsvReader>,
    /// Labels per row of the first file: every file must carry as many (a topic's
    /// consumers expect one count, and a batch message holds one).
    tasks: Option<usize>,
}

impl RowSource {
    fn new(files: &[PathBuf], repeat: bool) -> Result<Self> {
        Ok(Self {
            files: FileCycle::new(files, repeat),
            reader: None,
            tasks: None,
        })
    }

    fn next(&mut self) -> Result<Option<RawRow>> {
        let mut row = RawRow::default();
        loop {
            if self.reader.is_none() {
                let Some(path) = self.files.next_file() else {
                    return Ok(None);
                };
                self.reader = Some(
                    TsvReader::open(path, BadRowPolicy::Fail)
                        .map_err(|e| StreamError::Invalid(e.to_string()))?,
                );
            }
            let r = self.reader.as_mut().expect("opened above");
            if r.next_raw(&mut row)
                .map_err(|e| StreamError::Invalid(e.to_string()))?
            {
                let first = *self.tasks.get_or_insert(row.tasks());
                if row.tasks() != first {
                    return Err(StreamError::Invalid(format!(
                        "{}: rows carry {} label(s), the files before it {first}: replay \
                         files of one label count into a topic",
                        self.files.current().display(),
                        row.tasks()
                    )));
                }
                self.files.row_read();
                return Ok(Some(row));
            }
            self.reader = None;
            self.files.file_done();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Files of different label counts are refused when the first row of another count
    /// comes, naming its file: a topic's messages carry one count.
    #[test]
    fn files_of_another_label_count_are_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, label: &str| {
            let path = dir.path().join(name);
            let features = vec![""; 39].join("\t");
            std::fs::write(&path, format!("{label}\t{features}\n{label}\t{features}\n")).unwrap();
            path
        };
        let files = [write("two.tsv", "10"), write("one.tsv", "1")];
        let mut rows = RowSource::new(&files, false).unwrap();
        for _ in 0..2 {
            assert_eq!(rows.next().unwrap().unwrap().tasks(), 2);
        }
        let err = rows.next().unwrap_err().to_string();
        assert!(
            err.contains("one.tsv: rows carry 1 label(s), the files before it 2"),
            "{err}"
        );
    }

    #[test]
    fn a_trace_integrates_its_piecewise_linear_rate() {
        let t = Trace::parse_csv("t_s,qps\n0,100\n10,300\n20,300\n", Path::new("t.csv")).unwrap();
        assert_eq!(t.duration_s(), 20.0);
        assert_eq!(t.rate_at(5.0), 200.0);
        assert_eq!(t.rate_at(15.0), 300.0);
        assert_eq!(t.due_by(10.0), 2000.0);
        assert_eq!(t.due_by(20.0), 5000.0);
        assert_eq!(t.due_by(99.0), 5000.0);
        let f = t.faster(10.0);
        assert_eq!(f.duration_s(), 2.0);
        assert!((f.due_by(2.0) - 5000.0).abs() < 1e-9);
    }

    #[test]
    fn a_skewed_dealer_sends_the_hot_partition_its_shares() {
        let skewed = Partitioner::Skewed {
            partition: 1,
            traffic_share: 0.4,
            positive_share: 0.5,
        };
        let mut d = Dealer::new(skewed, 7, 4);
        let (mut all, mut pos) = ([0u32; 4], [0u32; 4]);
        for i in 0..100_000 {
            let positive = i % 5 == 0;
            let p = d.partition(positive);
            all[p] += 1;
            pos[p] += u32::from(positive);
        }
        // Partition 1: 40% of everything, half of the other positives (0.6 x 0.2 x 0.5),
        // and a quarter of what is left by round robin.
        let rest = 0.6 - 0.06;
        let share = f64::from(all[1]) / 100_000.0;
        assert!((share - (0.4 + 0.06 + rest / 4.0)).abs() < 0.01, "{all:?}");
        // Its click rate is far above the others'.
        let ctr = |p: usize| f64::from(pos[p]) / f64::from(all[p]);
        assert!(
            ctr(1) > 1.4 * ctr(0) && ctr(1) > 1.4 * ctr(2),
            "{pos:?} of {all:?}"
        );
        let mut rr = Dealer::new(Partitioner::RoundRobin, 7, 3);
        let seq: Vec<usize> = (0..6).map(|_| rr.partition(true)).collect();
        assert_eq!(seq, vec![0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn a_bad_trace_names_its_line() {
        for (text, line) in [
            ("0,1\n0,2\n", ":2:"),
            ("1,5\n2,5\n", ":1:"),
            ("0,1\n5,-1\n", ":2:"),
            ("0,1\n5,x\n", ":2:"),
        ] {
            let e = Trace::parse_csv(text, Path::new("trace.csv")).unwrap_err();
            assert!(e.to_string().contains(&format!("trace.csv{line}")), "{e}");
        }
        assert!(Trace::parse_csv("0,1\n", Path::new("t.csv")).is_err());
    }
}
