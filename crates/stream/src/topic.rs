//! Where a stream stands: the partitions of the job's topics, their watermarks and
//! offsets by time. The job's own progress is not committed to Kafka: the checkpoint holds
//! it, and the master reports each partition's lag on `/metrics`.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use rskafka::client::partition::OffsetAt;
use serde::{Deserialize, Serialize};

use crate::client::{block_on, Kafka};
use crate::error::{Result, StreamError};

/// Prefix of a partition's name where the job names data (`kafka:topic/partition`).
pub const PARTITION_PREFIX: &str = "kafka:";

/// How to reach the brokers.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Connection {
    /// Bootstrap brokers, `host:port[,host:port...]`.
    pub brokers: String,
    /// Client properties under the names Kafka clients use (security, timeouts,
    /// compression): [`crate::client::PROPERTIES`] lists those understood; any other is
    /// refused.
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

    /// Checks the properties without connecting (a job is refused before it starts).
    pub fn check(&self) -> Result<()> {
        crate::client::Settings::parse(self).map(|_| ())
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
    kafka: Arc<Kafka>,
    timeout: Duration,
}

impl TopicWatch {
    /// A watcher; `client_id` names it in the brokers' logs. Connecting is lazy: errors
    /// show on the first query, and a query that cannot reach the brokers within
    /// `timeout` fails.
    pub fn new(conn: &Connection, client_id: &str, timeout: Duration) -> Result<Self> {
        Ok(Self {
            kafka: Kafka::new(conn, client_id)?,
            timeout,
        })
    }

    /// Runs `f` with the watcher's client, failing it after the watcher's timeout.
    fn query<T, F, Fut>(&self, f: F) -> Result<T>
    where
        F: FnOnce(Arc<Kafka>) -> Fut,
        Fut: std::future::Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let fut = f(self.kafka.clone());
        let (timeout, brokers) = (self.timeout, self.kafka.brokers());
        block_on(async move {
            tokio::time::timeout(timeout, fut)
                .await
                .unwrap_or_else(|_| {
                    Err(StreamError::Unreachable {
                        brokers,
                        message: format!("no answer within {:.0} s", timeout.as_secs_f64()),
                    })
                })
        })
    }

    /// The partitions of `topics`, in topic order then partition order.
    pub fn partitions(&self, topics: &[String]) -> Result<Vec<PartitionId>> {
        let topics = topics.to_vec();
        self.query(|kafka| async move {
            let listed = kafka
                .client()
                .await?
                .list_topics()
                .await
                .map_err(|e| kafka.error(e))?;
            let mut out = Vec::new();
            for topic in topics {
                let t = listed
                    .iter()
                    .find(|t| t.name == topic && !t.partitions.is_empty())
                    .ok_or_else(|| StreamError::NoTopic {
                        topic: topic.clone(),
                        brokers: kafka.brokers(),
                    })?;
                let mut ps: Vec<i32> = t.partitions.iter().copied().collect();
                ps.sort_unstable();
                out.extend(ps.into_iter().map(|partition| PartitionId {
                    topic: topic.clone(),
                    partition,
                }));
            }
            Ok(out)
        })
    }

    /// `(low, high)` watermarks of every partition: the oldest offset kept and the offset
    /// the next message will get.
    pub fn watermarks(&self, partitions: &[PartitionId]) -> Result<Vec<(u64, u64)>> {
        let partitions = partitions.to_vec();
        self.query(|kafka| async move {
            let marks = partitions.iter().map(|p| watermarks(&kafka, p));
            futures::future::try_join_all(marks).await
        })
    }

    /// The offset each partition starts at for `start`.
    pub fn start_offsets(&self, partitions: &[PartitionId], start: StartAt) -> Result<Vec<u64>> {
        let marks = self.watermarks(partitions)?;
        match start {
            StartAt::Earliest => Ok(marks.iter().map(|m| m.0).collect()),
            StartAt::Latest => Ok(marks.iter().map(|m| m.1).collect()),
            StartAt::Timestamp(ms) => {
                let at = chrono::DateTime::from_timestamp_millis(ms).ok_or_else(|| {
                    StreamError::Invalid(format!("start time {ms} ms is out of range"))
                })?;
                let partitions = partitions.to_vec();
                self.query(move |kafka| async move {
                    let found = partitions.iter().zip(marks).map(|(p, (low, high))| {
                        let kafka = kafka.clone();
                        async move {
                            let client = kafka.partition(&p.topic, p.partition).await?;
                            let o = client
                                .get_offset(OffsetAt::Timestamp(at))
                                .await
                                .map_err(|e| kafka.error(e))?;
                            // -1: no message at or after the time; start at the end.
                            Ok(if o >= 0 {
                                (o as u64).clamp(low, high)
                            } else {
                                high
                            })
                        }
                    });
                    futures::future::try_join_all(found).await
                })
            }
        }
    }
}

/// Creates `topic` with `partitions` partitions (replication factor 1): benchmarks and
/// tests make the topics they feed.
pub fn create_topic(conn: &Connection, topic: &str, partitions: i32) -> Result<()> {
    let topic = topic.to_string();
    admin(conn, move |c| async move {
        c.create_topic(&topic, partitions, 1, 10_000).await
    })
}

/// Deletes `topic` and its messages.
pub fn delete_topic(conn: &Connection, topic: &str) -> Result<()> {
    let topic = topic.to_string();
    admin(conn, move |c| async move {
        c.delete_topic(&topic, 10_000).await
    })
}

/// Runs one call of the cluster's controller.
fn admin<F, Fut>(conn: &Connection, call: F) -> Result<()>
where
    F: FnOnce(rskafka::client::controller::ControllerClient) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = rskafka::client::error::Result<()>> + Send,
{
    let kafka = Kafka::new(conn, "elastrec-admin")?;
    block_on(async move {
        let controller = kafka
            .client()
            .await?
            .controller_client()
            .map_err(|e| kafka.error(e))?;
        call(controller).await.map_err(|e| kafka.error(e))
    })
}

/// Appends `payloads` to one partition as messages, in one produce request; returns the
/// offset of the first. For tests and tools that write messages of their own.
pub fn produce(conn: &Connection, p: &PartitionId, payloads: Vec<Vec<u8>>) -> Result<u64> {
    let kafka = Kafka::new(conn, "elastrec-produce")?;
    let p = p.clone();
    block_on(async move {
        let client = kafka.partition(&p.topic, p.partition).await?;
        let records = payloads
            .into_iter()
            .map(|value| rskafka::record::Record {
                key: None,
                value: Some(value),
                headers: Default::default(),
                timestamp: chrono::Utc::now(),
            })
            .collect();
        let offsets = client
            .produce(records, kafka.settings.compression)
            .await
            .map_err(|e| kafka.error(e))?;
        Ok(offsets.first().copied().unwrap_or(-1).max(0) as u64)
    })
}

/// `(low, high)` watermarks of one partition.
pub(crate) async fn watermarks(kafka: &Kafka, p: &PartitionId) -> Result<(u64, u64)> {
    let client = kafka.partition(&p.topic, p.partition).await?;
    let low = client
        .get_offset(OffsetAt::Earliest)
        .await
        .map_err(|e| kafka.error(e))?;
    let high = client
        .get_offset(OffsetAt::Latest)
        .await
        .map_err(|e| kafka.error(e))?;
    Ok((low.max(0) as u64, high.max(0) as u64))
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
