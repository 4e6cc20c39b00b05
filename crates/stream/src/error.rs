//! The crate's error type: every variant says which brokers or topic, and what to do.

use rskafka::client::error::{Error as ClientError, ProtocolError};

/// What can go wrong talking to the brokers.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The client could not be configured (a bad property, an unreadable certificate) or
    /// the brokers refused its credentials.
    #[error("kafka client for {brokers}: {message} (check [stream] brokers and properties)")]
    Client {
        /// Bootstrap brokers.
        brokers: String,
        /// What is wrong.
        message: String,
    },
    /// The brokers did not answer (down, wrong address, firewall).
    #[error("kafka brokers {brokers} unreachable: {message} (is the broker running, and is [stream] brokers right?)")]
    Unreachable {
        /// Bootstrap brokers.
        brokers: String,
        /// The client's words.
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
        /// A retry may cure it (a leader moving, the broker busy); false for data that is
        /// gone or a topic that is not there.
        transient: bool,
    },
    /// A replay trace or data set that cannot be used.
    #[error("{0}")]
    Invalid(String),
}

/// Result alias for this crate.
pub type Result<T, E = StreamError> = std::result::Result<T, E>;

impl StreamError {
    /// The error for what the Kafka client reported.
    pub(crate) fn from_client(brokers: &str, e: ClientError) -> Self {
        let brokers = brokers.to_string();
        match e {
            ClientError::ServerError {
                protocol_error,
                error_message,
                ..
            } => {
                let message = match error_message {
                    Some(m) if !m.is_empty() => format!("{protocol_error} ({m})"),
                    _ => protocol_error.to_string(),
                };
                if matches!(
                    protocol_error,
                    ProtocolError::SaslAuthenticationFailed
                        | ProtocolError::UnsupportedSaslMechanism
                        | ProtocolError::IllegalSaslState
                ) {
                    return Self::Client { brokers, message };
                }
                Self::Broker {
                    brokers,
                    message,
                    transient: !matches!(
                        protocol_error,
                        ProtocolError::UnknownTopicOrPartition
                            | ProtocolError::TopicAuthorizationFailed
                            | ProtocolError::OffsetOutOfRange
                            | ProtocolError::ClusterAuthorizationFailed
                    ),
                }
            }
            ClientError::Connection(rskafka::ConnectionError::SaslFailed(e)) => Self::Client {
                brokers,
                message: format!("SASL authentication failed: {e} (check sasl.* properties)"),
            },
            ClientError::InvalidResponse(m) => Self::Broker {
                brokers,
                message: format!("invalid response: {m}"),
                transient: true,
            },
            other => {
                let message = other.to_string();
                // A connection the broker refused at SASL is retried like any other until
                // the deadline; rskafka then reports the attempts' errors as text only.
                if message.contains("Sasl handshake failed") {
                    Self::Client {
                        brokers,
                        message: format!(
                            "SASL authentication failed (check sasl.* properties): {message}"
                        ),
                    }
                } else {
                    Self::Unreachable { brokers, message }
                }
            }
        }
    }

    /// True for errors a retry may cure (the broker is away, a leader is moving).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Unreachable { .. } => true,
            Self::Broker { transient, .. } => *transient,
            Self::Client { .. } | Self::NoTopic { .. } | Self::Invalid(_) => false,
        }
    }
}
