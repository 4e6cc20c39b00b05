//! Reading one offset range of one partition into training batches.
//!
//! The master deals stream data as offset ranges, exactly as it deals file rows: a task
//! names `kafka:topic/partition` and offsets `[start, end)` that the brokers already hold.
//! The worker reads them with a consumer it assigns by hand (no group rebalancing: the
//! master decides who reads what). Progress is reported in offsets: [`RangeReader`]'s
//! position is the first message not wholly delivered, so a message of many samples is
//! reported only once all of them trained.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use elastrec_data::{
    BadRowPolicy, Batch, BatchReader, DataError, RawColumns, RawRow, ReadStats, RowSink,
};
use parking_lot::Mutex;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use crate::error::{Result, StreamError};
use crate::message::{decode, MessageFormat};
use crate::topic::{is_transient, Connection, PartitionId};

/// How long one poll waits before the reader checks how long it has been waiting.
const POLL: Duration = Duration::from_millis(100);
/// A reader waiting this long for a message the broker had reports it (then every
/// further such period).
const WAIT_WARN: Duration = Duration::from_secs(10);

/// How long a broker holds a fetch that found no new data. Every range re-assigns the
/// partition, and librdkafka keeps one fetch in flight per broker connection, so a range's
/// first fetch queues behind the previous fetch (often a prefetch past the partition's
/// newest message, held this long). Measured on the mock broker, 32 ranges of 256
/// messages: 7.07 s at librdkafka's default 500 ms, 1.15 s at 100 ms, 0.13 s at 10 ms.
/// Online ranges are small (a linger's worth of one partition), so even 100 ms made a
/// worker spend most of its time waiting. The price is more empty fetches: Tansu 0.6's
/// memory engine slows its produce path under them (its test sets 100 ms). A user's
/// `properties` may set it otherwise.
const FETCH_WAIT: &str = "fetch.wait.max.ms";
const FETCH_WAIT_MS: &str = "10";

/// A worker's consumer, shared by the ranges it reads one after another.
///
/// A range that continues where the previous one ended, on the same partition, reuses the
/// consumer's assignment: its messages may already be prefetched, and a new assignment
/// would drop them and queue its first fetch behind the one in flight (see
/// [`FETCH_WAIT`]).
#[derive(Clone)]
pub struct StreamInput {
    consumer: Arc<BaseConsumer>,
    format: MessageFormat,
    /// Labels a sample must carry: the job's model's tasks.
    tasks: usize,
    /// Where the consumer stands after a range that ended cleanly: its partition and the
    /// next offset it delivers. `None` while a range reads, and after one that stopped
    /// early or read past its end.
    positioned: Arc<Mutex<Option<(PartitionId, u64)>>>,
    /// Assignments made so far (ranges that could not continue the previous one).
    assignments: Arc<AtomicU64>,
}

impl StreamInput {
    /// A consumer for `conn` in consumer group `group` (offsets are never committed by
    /// workers; the group only names the client in broker logs).
    pub fn new(conn: &Connection, group: &str, format: MessageFormat) -> Result<Self> {
        let mut config = conn.client_config();
        if !conn.properties.contains_key(FETCH_WAIT) {
            config.set(FETCH_WAIT, FETCH_WAIT_MS);
        }
        let consumer: BaseConsumer = config
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            // Never jump to another offset on its own: the range says where to read, and a
            // range whose data expired must fail loudly, not silently skip.
            .set("auto.offset.reset", "error")
            .create()
            .map_err(|e| StreamError::client(conn, e))?;
        Ok(Self {
            consumer: Arc::new(consumer),
            format,
            tasks: 1,
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

    /// How many ranges needed a new assignment of the consumer.
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
        let stands = self.positioned.lock().take();
        if stands.as_ref() != Some(&(partition.clone(), start)) {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(
                &partition.topic,
                partition.partition,
                Offset::Offset(start as i64),
            )
            .and_then(|()| self.consumer.assign(&tpl))
            .map_err(|e| StreamError::Broker {
                brokers: String::new(),
                message: format!("assigning {partition}@{start}: {e}"),
            })?;
            self.assignments.fetch_add(1, Ordering::Relaxed);
        }
        Ok(RangeReader {
            positioned: self.positioned.clone(),
            consumer: self.consumer.clone(),
            partition: partition.clone(),
            format: self.format,
            tasks: self.tasks,
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
    consumer: Arc<BaseConsumer>,
    /// The input's [`StreamInput::positioned`], set when this range's last message is read.
    positioned: Arc<Mutex<Option<(PartitionId, u64)>>>,
    partition: PartitionId,
    format: MessageFormat,
    tasks: usize,
    policy: BadRowPolicy,
    /// Offset of the next message to fetch.
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
    fn unreadable(&self, e: &rdkafka::error::KafkaError) -> DataError {
        let held = self
            .consumer
            .fetch_watermarks(
                &self.partition.topic,
                self.partition.partition,
                Duration::from_secs(5),
            )
            .ok();
        let message = match held {
            Some((low, high)) if (self.next as i64) < low => format!(
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

    fn has_pending(&self) -> bool {
        self.pending_at < self.pending.len()
    }

    /// Fetches the next message of the range into `pending`. `Ok(false)`: the range is
    /// done.
    fn fetch(&mut self) -> elastrec_data::Result<bool> {
        let waiting_since = Instant::now();
        let mut warned_at = Duration::ZERO;
        let mut last_error = String::new();
        while self.next < self.end {
            let msg = match self.consumer.poll(POLL) {
                None => None,
                Some(Ok(m)) => Some(m),
                Some(Err(e)) if is_transient(&e) => {
                    last_error = e.to_string();
                    None
                }
                Some(Err(e)) => return Err(self.unreadable(&e)),
            };
            let Some(msg) = msg else {
                let waited = waiting_since.elapsed();
                if waited >= warned_at + WAIT_WARN {
                    warned_at = waited;
                    eprintln!(
                        "{}@{}: no message for {:.0} s{}; waiting for the broker",
                        self.partition,
                        self.next,
                        waited.as_secs_f64(),
                        if last_error.is_empty() {
                            String::new()
                        } else {
                            format!(" ({last_error})")
                        }
                    );
                }
                continue;
            };
            if msg.partition() != self.partition.partition || msg.topic() != self.partition.topic {
                continue; // left over from a previous assignment
            }
            let offset = msg.offset();
            if offset < 0 || (offset as u64) < self.next {
                continue; // left over from a previous assignment
            }
            let offset = offset as u64;
            if offset >= self.end {
                // The range ended in a gap (transaction markers, compaction).
                self.next = self.end;
                return Ok(false);
            }
            self.pending.clear();
            self.pending_at = 0;
            self.pending_offset = offset;
            self.next = offset + 1;
            if self.next == self.end {
                // The consumer's next message is the next range's first.
                *self.positioned.lock() = Some((self.partition.clone(), self.end));
            }
            let bad = decode(
                msg.payload().unwrap_or_default(),
                self.format,
                self.tasks,
                &mut self.pending,
            );
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

impl BatchReader for RangeReader {
    fn next_batch(&mut self, batch: &mut Batch, max_rows: usize) -> elastrec_data::Result<usize> {
        self.fill(batch, max_rows)
    }

    fn next_raw(&mut self, raw: &mut RawColumns, max_rows: usize) -> elastrec_data::Result<usize> {
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
