//! Reading one offset range of one partition into training batches.
//!
//! The master deals stream data as offset ranges, exactly as it deals file rows: a task
//! names `kafka:topic/partition` and offsets `[start, end)` that the brokers already hold.
//! The worker fetches them from the partition's leader by offset (no consumer group: the
//! master decides who reads what). Progress is reported in offsets: [`RangeReader`]'s
//! position is the first message not wholly delivered, so a message of many samples is
//! reported only once all of them trained.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use elastrec_data::{
    BadRowPolicy, Batch, BatchReader, DataError, RawColumns, RawRow, ReadStats, RowSink,
};
use parking_lot::Mutex;
use rskafka::client::partition::PartitionClient;
use rskafka::record::RecordAndOffset;

use crate::client::{block_on, Kafka};
use crate::error::{Result, StreamError};
use crate::message::{decode, decode_json, MessageFormat};
use crate::topic::{Connection, PartitionId};

/// A reader waiting this long for a message the broker had reports it (then every
/// further such period).
const WAIT_WARN: Duration = Duration::from_secs(10);
/// Most bytes one fetch asks for (a broker returns at least one whole batch even if it is
/// larger).
const FETCH_MAX_BYTES: i32 = 4 << 20;
/// Pause between fetches that failed for a reason a retry may cure.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Messages fetched past the end of a range, kept for the range that continues it.
type Prefetched = (PartitionId, u64, VecDeque<RecordAndOffset>);

/// A worker's stream input, shared by the ranges it reads one after another.
///
/// A range that continues where the previous one ended, on the same partition, starts
/// with the messages the previous range's last fetch brought past its end: a fetch returns
/// whole batches, and dropping them would fetch them again.
#[derive(Clone)]
pub struct StreamInput {
    kafka: Arc<Kafka>,
    format: MessageFormat,
    /// Labels a sample must carry: the job's model's tasks.
    tasks: usize,
    /// The job's named features: JSON messages are read through them.
    schema: Option<Arc<elastrec_data::Schema>>,
    /// What the last range that ended cleanly fetched past its end. `None` while a range
    /// reads, and after one that stopped early.
    positioned: Arc<Mutex<Option<Prefetched>>>,
    /// Ranges that could not continue the previous one (they start with a fresh fetch).
    assignments: Arc<AtomicU64>,
}

impl StreamInput {
    /// An input for `conn`; `client_id` names it in the brokers' logs.
    pub fn new(conn: &Connection, client_id: &str, format: MessageFormat) -> Result<Self> {
        Ok(Self {
            kafka: Kafka::new(conn, client_id)?,
            format,
            tasks: 1,
            schema: None,
            positioned: Arc::new(Mutex::new(None)),
            assignments: Arc::new(AtomicU64::new(0)),
        })
    }

    /// The input for a model of `tasks` tasks (1 unless set): a sample of another label
    /// count is a bad sample ([`elastrec_data::FieldError::TaskCount`]).
    pub fn with_tasks(mut self, tasks: usize) -> Self {
        self.tasks = tasks;
        self
    }

    /// Reads JSON messages through `schema`, the job's named features.
    pub fn with_schema(mut self, schema: Option<Arc<elastrec_data::Schema>>) -> Self {
        self.schema = schema;
        self
    }

    /// How many ranges could not continue the previous one.
    pub fn assignments(&self) -> u64 {
        self.assignments.load(Ordering::Relaxed)
    }

    /// A reader of offsets `[start, end)` of `partition`.
    pub fn range(
        &self,
        partition: &PartitionId,
        start: u64,
        end: u64,
        policy: BadRowPolicy,
    ) -> Result<RangeReader> {
        let buffered = match self.positioned.lock().take() {
            Some((p, at, buf)) if p == *partition && at == start => buf,
            _ => {
                self.assignments.fetch_add(1, Ordering::Relaxed);
                VecDeque::new()
            }
        };
        let kafka = self.kafka.clone();
        let (topic, number) = (partition.topic.clone(), partition.partition);
        let client =
            block_on(async move { kafka.partition(&topic, number).await }).map_err(|e| {
                StreamError::Broker {
                    brokers: self.kafka.brokers(),
                    message: format!("reading {partition}@{start}: {e}"),
                    transient: e.is_transient(),
                }
            })?;
        Ok(RangeReader {
            positioned: self.positioned.clone(),
            kafka: self.kafka.clone(),
            client,
            buffered,
            partition: partition.clone(),
            format: self.format,
            tasks: self.tasks,
            named: self.schema.as_ref().map(|s| (s.clone(), s.empty_batch())),
            policy,
            next: start,
            end,
            pending: Vec::new(),
            pending_at: 0,
            pending_offset: start,
            stats: ReadStats::default(),
        })
    }
}

/// Reads offsets `[start, end)` of one partition (see the module docs).
pub struct RangeReader {
    kafka: Arc<Kafka>,
    client: Arc<PartitionClient>,
    /// Fetched messages not yet decoded, in offset order.
    buffered: VecDeque<RecordAndOffset>,
    /// The input's [`StreamInput::positioned`], set when this range's last message is read.
    positioned: Arc<Mutex<Option<Prefetched>>>,
    partition: PartitionId,
    format: MessageFormat,
    tasks: usize,
    /// A JSON message's samples, read through the job's named features.
    named: Option<(Arc<elastrec_data::Schema>, Batch)>,
    policy: BadRowPolicy,
    /// Offset of the next message to read.
    next: u64,
    end: u64,
    /// Decoded samples of the message at `pending_offset` not yet delivered.
    pending: Vec<RawRow>,
    pending_at: usize,
    pending_offset: u64,
    stats: ReadStats,
}

impl RangeReader {
    /// The error for an offset the broker cannot serve: says what it still holds, so a
    /// user sees that training fell behind the topic's retention.
    fn unreadable(&self, e: &StreamError) -> DataError {
        let (kafka, p) = (self.kafka.clone(), self.partition.clone());
        let held = block_on(async move {
            tokio::time::timeout(Duration::from_secs(5), crate::topic::watermarks(&kafka, &p)).await
        })
        .ok()
        .and_then(|r| r.ok());
        let message = match held {
            Some((low, high)) if self.next < low => format!(
                "offsets {}..{} were deleted by the broker's retention before training read \
                 them (it now holds {low}..{high}); the job fell further behind than the \
                 topic keeps data: raise the topic's retention or the workers' bounds",
                self.next, low
            ),
            _ => format!(
                "cannot read offset {}: {e} (was the data deleted by retention, or the topic \
                 removed?)",
                self.next
            ),
        };
        DataError::Stream {
            partition: self.partition.to_string(),
            message,
        }
    }

    fn pending_len(&self) -> usize {
        match &self.named {
            Some((_, rows)) if self.format == MessageFormat::Json => rows.len(),
            _ => self.pending.len(),
        }
    }

    fn has_pending(&self) -> bool {
        self.pending_at < self.pending_len()
    }

    /// Leaves what was fetched past the range's end for the range that continues it.
    fn keep_prefetched(&mut self) {
        let buf = std::mem::take(&mut self.buffered);
        *self.positioned.lock() = Some((self.partition.clone(), self.end, buf));
    }

    /// Fetches from `next` into `buffered`, waiting out errors a retry may cure.
    fn refill(&mut self) -> elastrec_data::Result<()> {
        let waiting_since = Instant::now();
        let mut warned_at = Duration::ZERO;
        let wait_ms = self.kafka.settings.fetch_wait_ms;
        loop {
            let (client, kafka, at) = (self.client.clone(), self.kafka.clone(), self.next);
            let got = block_on(async move {
                client
                    .fetch_records(at as i64, 1..FETCH_MAX_BYTES, wait_ms)
                    .await
                    .map_err(|e| kafka.error(e))
            });
            let why = match got {
                Ok((records, high)) => {
                    let fresh: Vec<_> = records
                        .into_iter()
                        .filter(|r| r.offset >= 0 && r.offset as u64 >= at)
                        .collect();
                    if !fresh.is_empty() {
                        self.buffered.extend(fresh);
                        return Ok(());
                    }
                    if high >= 0 && (high as u64) <= at {
                        // Ranges are dealt below a high watermark the master saw: a
                        // partition that now ends before the range lost its data (the
                        // topic deleted and made anew, an unclean leader election).
                        return Err(self.unreadable(&StreamError::Broker {
                            brokers: self.kafka.brokers(),
                            message: format!("the partition now ends at offset {high}"),
                            transient: false,
                        }));
                    }
                    String::new()
                }
                Err(e) if e.is_transient() => {
                    std::thread::sleep(RETRY_PAUSE);
                    format!(" ({e})")
                }
                Err(e) => return Err(self.unreadable(&e)),
            };
            let waited = waiting_since.elapsed();
            if waited >= warned_at + WAIT_WARN {
                warned_at = waited;
                eprintln!(
                    "{}@{}: no message for {:.0} s{why}; waiting for the broker",
                    self.partition,
                    self.next,
                    waited.as_secs_f64(),
                );
            }
        }
    }

    /// Decodes the next message of the range into `pending`. `Ok(false)`: the range is
    /// done.
    fn fetch(&mut self) -> elastrec_data::Result<bool> {
        while self.next < self.end {
            if self.buffered.is_empty() {
                self.refill()?;
            }
            let Some(msg) = self.buffered.pop_front() else {
                continue;
            };
            let offset = msg.offset as u64;
            if offset < self.next {
                continue;
            }
            if offset >= self.end {
                // The range ended in a gap (transaction markers, compaction).
                self.buffered.push_front(msg);
                self.next = self.end;
                self.keep_prefetched();
                return Ok(false);
            }
            self.pending.clear();
            self.pending_at = 0;
            self.pending_offset = offset;
            self.next = offset + 1;
            if self.next == self.end {
                // What was fetched past the end is the next range's start.
                self.keep_prefetched();
            }
            let payload = msg.record.value.as_deref().unwrap_or_default();
            let bad = match (&mut self.named, self.format) {
                (Some((schema, rows)), MessageFormat::Json) => {
                    rows.clear();
                    decode_json(payload, schema, rows)
                }
                _ => decode(payload, self.format, self.tasks, &mut self.pending),
            };
            for b in bad {
                let err = DataError::BadMessage {
                    partition: self.partition.to_string(),
                    offset,
                    sample: b.sample,
                    field: b.field,
                    reason: b.reason,
                };
                match self.policy {
                    BadRowPolicy::Skip => self.stats.record_skip(&err),
                    BadRowPolicy::Fail => {
                        // Stop at this message: it is reported neither trained nor skipped.
                        self.pending.clear();
                        if let Some((_, rows)) = &mut self.named {
                            rows.clear();
                        }
                        self.next = offset;
                        *self.positioned.lock() = None;
                        return Err(err);
                    }
                }
            }
            if self.has_pending() {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

impl RangeReader {
    fn fill<S: RowSink>(&mut self, batch: &mut S, max_rows: usize) -> elastrec_data::Result<usize> {
        batch.clear();
        while batch.len() < max_rows {
            if !self.has_pending() && !self.fetch()? {
                break;
            }
            let take = (self.pending.len() - self.pending_at).min(max_rows - batch.len());
            for row in &self.pending[self.pending_at..self.pending_at + take] {
                batch.push_row(row);
            }
            self.pending_at += take;
        }
        self.stats.rows_read += batch.len() as u64;
        Ok(batch.len())
    }
}

impl RangeReader {
    /// [`RangeReader::fill`] of JSON samples of named features.
    fn fill_named(&mut self, batch: &mut Batch, max_rows: usize) -> elastrec_data::Result<usize> {
        batch.clear();
        if let Some((_, rows)) = &self.named {
            batch.take_layout(rows);
        }
        while batch.len() < max_rows {
            if !self.has_pending() && !self.fetch()? {
                break;
            }
            let Some((_, rows)) = self.named.as_ref() else {
                break;
            };
            let take = (rows.len() - self.pending_at).min(max_rows - batch.len());
            batch.extend_from(rows, self.pending_at..self.pending_at + take);
            self.pending_at += take;
        }
        self.stats.rows_read += batch.len() as u64;
        Ok(batch.len())
    }
}

impl BatchReader for RangeReader {
    fn next_batch(&mut self, batch: &mut Batch, max_rows: usize) -> elastrec_data::Result<usize> {
        if self.format == MessageFormat::Json {
            if self.named.is_none() {
                return Err(DataError::Stream {
                    partition: self.partition.to_string(),
                    message: "JSON messages are read through the job's named features \
                              ([[data.feature]]), and the job has none"
                        .into(),
                });
            }
            return self.fill_named(batch, max_rows);
        }
        self.fill(batch, max_rows)
    }

    fn next_raw(&mut self, raw: &mut RawColumns, max_rows: usize) -> elastrec_data::Result<usize> {
        if self.format == MessageFormat::Json {
            return Err(DataError::InvalidSpec(
                "JSON messages of named features have no raw Criteo rows to preprocess".into(),
            ));
        }
        self.fill(raw, max_rows)
    }

    fn stats(&self) -> &ReadStats {
        &self.stats
    }

    fn position(&self) -> Option<u64> {
        Some(if self.has_pending() {
            self.pending_offset
        } else {
            self.next
        })
    }
}
