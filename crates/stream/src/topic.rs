//! Where a stream stands: the partitions of the job's topics, their watermarks, offsets by
//! time, and the consumer group's committed offsets (written for monitoring only: the
//! checkpoint holds the truth).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use crate::error::{Result, StreamError};

/// Prefix of a partition's name where the job names data (`kafka:topic/partition`).
pub const PARTITION_PREFIX: &str = "kafka:";

/// How to reach the brokers.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Connection {
    /// Bootstrap brokers, `host:port[,host:port...]`.
    pub brokers: String,
    /// Extra librdkafka properties (security, timeouts), passed through as they are.
    pub properties: BTreeMap<String, String>,
}

impl Connection {
    /// A connection to `brokers` with no extra properties.
    pub fn new(brokers: impl Into<String>) -> Self {
        Self {
            brokers: brokers.into(),
            properties: BTreeMap::new(),
        }
    }

    /// A librdkafka client configuration for this connection.
    pub fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers);
        // librdkafka logs every failed connection attempt at error level on its own; the
        // readers report what the job should know, once, with what to do.
        c.set("log_level", "3");
        for (k, v) in &self.properties {
            c.set(k, v);
        }
        c
    }
}

/// One partition of one topic.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PartitionId {
    /// Topic name.
    pub topic: String,
    /// Partition number.
    pub partition: i32,
}

impl PartitionId {
    /// Parses `kafka:topic/partition`; `None` for anything else (a file path).
    pub fn parse(name: &str) -> Option<Self> {
        let rest = name.strip_prefix(PARTITION_PREFIX)?;
        let (topic, p) = rest.rsplit_once('/')?;
        let partition: i32 = p.parse().ok()?;
        (!topic.is_empty() && partition >= 0).then(|| Self {
            topic: topic.to_string(),
            partition,
        })
    }
}

impl fmt::Display for PartitionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PARTITION_PREFIX}{}/{}", self.topic, self.partition)
    }
}

/// Where a job starts reading partitions it has no checkpointed position for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartAt {
    /// The oldest message the broker still keeps.
    Earliest,
    /// Only messages produced after the job starts.
    Latest,
    /// The first message at or after this time (milliseconds since the epoch).
    Timestamp(i64),
}

/// Metadata and offset queries against the brokers (the master's view of the stream).
pub struct TopicWatch {
    consumer: BaseConsumer,
    conn: Connection,
    timeout: Duration,
}

impl TopicWatch {
    /// A watcher; `group` is the consumer group offsets are committed under for
    /// monitoring. Connecting is lazy: errors show on the first query.
    pub fn new(conn: &Connection, group: &str, timeout: Duration) -> Result<Self> {
        let consumer: BaseConsumer = conn
            .client_config()
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create()
            .map_err(|e| StreamError::client(conn, e))?;
        Ok(Self {
            consumer,
            conn: conn.clone(),
            timeout,
        })
    }

    /// The partitions of `topics`, in topic order then partition order.
    pub fn partitions(&self, topics: &[String]) -> Result<Vec<PartitionId>> {
        let mut out = Vec::new();
        for topic in topics {
            let md = self
                .consumer
                .fetch_metadata(Some(topic), self.timeout)
                .map_err(|e| StreamError::unreachable(&self.conn, e))?;
            let t = md
                .topics()
                .iter()
                .find(|t| t.name() == topic)
                .ok_or_else(|| StreamError::NoTopic {
                    topic: topic.clone(),
                    brokers: self.conn.brokers.clone(),
                })?;
            if let Some(err) = t.error() {
                let code: RDKafkaErrorCode = err.into();
                return Err(match code {
                    RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic => {
                        StreamError::NoTopic {
                            topic: topic.clone(),
                            brokers: self.conn.brokers.clone(),
                        }
                    }
                    other => StreamError::Broker {
                        brokers: self.conn.brokers.clone(),
                        message: format!("metadata of topic {topic}: {other}"),
                    },
                });
            }
            if t.partitions().is_empty() {
                return Err(StreamError::NoTopic {
                    topic: topic.clone(),
                    brokers: self.conn.brokers.clone(),
                });
            }
            let mut ps: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
            ps.sort_unstable();
            out.extend(ps.into_iter().map(|partition| PartitionId {
                topic: topic.clone(),
                partition,
            }));
        }
        Ok(out)
    }

    /// `(low, high)` watermarks of every partition: the oldest offset kept and the offset
    /// the next message will get.
    pub fn watermarks(&self, partitions: &[PartitionId]) -> Result<Vec<(u64, u64)>> {
        partitions
            .iter()
            .map(|p| {
                let (lo, hi) = self
                    .consumer
                    .fetch_watermarks(&p.topic, p.partition, self.timeout)
                    .map_err(|e| StreamError::unreachable(&self.conn, e))?;
                Ok((lo.max(0) as u64, hi.max(0) as u64))
            })
            .collect()
    }

    /// The offset each partition starts at for `start`.
    pub fn start_offsets(&self, partitions: &[PartitionId], start: StartAt) -> Result<Vec<u64>> {
        let marks = self.watermarks(partitions)?;
        match start {
            StartAt::Earliest => Ok(marks.iter().map(|m| m.0).collect()),
            StartAt::Latest => Ok(marks.iter().map(|m| m.1).collect()),
            StartAt::Timestamp(ms) => {
                let mut tpl = TopicPartitionList::new();
                for p in partitions {
                    tpl.add_partition_offset(&p.topic, p.partition, Offset::Offset(ms))
                        .map_err(|e| StreamError::unreachable(&self.conn, e))?;
                }
                let found = self
                    .consumer
                    .offsets_for_times(tpl, self.timeout)
                    .map_err(|e| StreamError::unreachable(&self.conn, e))?;
                partitions
                    .iter()
                    .zip(&marks)
                    .map(|(p, m)| {
                        let e = found
                            .find_partition(&p.topic, p.partition)
                            .map(|e| e.offset());
                        Ok(match e {
                            Some(Offset::Offset(o)) if o >= 0 => (o as u64).clamp(m.0, m.1),
                            // No message at or after the time: start at the end.
                            _ => m.1,
                        })
                    })
                    .collect()
            }
        }
    }

    /// Commits `offsets` (the next offset to train, per partition) to the consumer group,
    /// so that Kafka's own tools show the job's progress. Never read back by elastrec.
    pub fn commit(&self, partitions: &[PartitionId], offsets: &[u64]) -> Result<()> {
        let mut tpl = TopicPartitionList::new();
        for (p, &o) in partitions.iter().zip(offsets) {
            tpl.add_partition_offset(&p.topic, p.partition, Offset::Offset(o as i64))
                .map_err(|e| StreamError::unreachable(&self.conn, e))?;
        }
        self.consumer
            .commit(&tpl, rdkafka::consumer::CommitMode::Sync)
            .map_err(|e| StreamError::unreachable(&self.conn, e))
    }
}

/// True for errors a retry may cure (the broker is away, a leader is moving).
pub fn is_transient(e: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    !matches!(
        e.rdkafka_error_code(),
        Some(
            C::UnknownTopicOrPartition
                | C::UnknownTopic
                | C::TopicAuthorizationFailed
                | C::OffsetOutOfRange
                // What librdkafka reports for an out-of-range offset when
                // `auto.offset.reset = error`: the data is gone, waiting cannot help.
                | C::AutoOffsetReset
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_names_round_trip_and_reject_paths() {
        let p = PartitionId {
            topic: "clicks.v2".into(),
            partition: 3,
        };
        assert_eq!(p.to_string(), "kafka:clicks.v2/3");
        assert_eq!(PartitionId::parse(&p.to_string()), Some(p));
        for bad in [
            "day_0.tsv",
            "kafka:/3",
            "kafka:t/-1",
            "kafka:t/x",
            "kafka:t",
        ] {
            assert_eq!(PartitionId::parse(bad), None, "{bad}");
        }
    }
}
