//! The crate's error type: every variant says which brokers or topic, and what to do.

use rdkafka::error::KafkaError;

use crate::topic::Connection;

/// What can go wrong talking to the brokers.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The client could not be configured (a bad property).
    #[error("kafka client for {brokers}: {message} (check [stream] brokers and properties)")]
    Client {
        /// Bootstrap brokers.
        brokers: String,
        /// librdkafka's words.
        message: String,
    },
    /// The brokers did not answer (down, wrong address, firewall).
    #[error("kafka brokers {brokers} unreachable: {message} (is the broker running, and is [stream] brokers right?)")]
    Unreachable {
        /// Bootstrap brokers.
        brokers: String,
        /// librdkafka's words.
        message: String,
    },
    /// A topic the job names does not exist.
    #[error("topic {topic:?} does not exist on {brokers}: create it, or fix [stream] topics")]
    NoTopic {
        /// The topic.
        topic: String,
        /// Bootstrap brokers.
        brokers: String,
    },
    /// The broker answered with an error.
    #[error("kafka brokers {brokers}: {message}")]
    Broker {
        /// Bootstrap brokers.
        brokers: String,
        /// What failed.
        message: String,
    },
    /// A replay trace or data set that cannot be used.
    #[error("{0}")]
    Invalid(String),
}

/// Result alias for this crate.
pub type Result<T, E = StreamError> = std::result::Result<T, E>;

impl StreamError {
    pub(crate) fn client(conn: &Connection, e: KafkaError) -> Self {
        Self::Client {
            brokers: conn.brokers.clone(),
            message: e.to_string(),
        }
    }

    pub(crate) fn unreachable(conn: &Connection, e: KafkaError) -> Self {
        Self::Unreachable {
            brokers: conn.brokers.clone(),
            message: e.to_string(),
        }
    }
}
