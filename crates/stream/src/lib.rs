//! Kafka input for online training.
//!
//! - [`client`]: the connection's settings (TLS, SASL, compression) under Kafka's
//!   property names, and the Kafka client (rskafka, no C build) on the crate's runtime.
//! - [`message`]: what a message holds (a Criteo TSV line, or elastrec's binary batch
//!   format) and its decoding with bad-message positions.
//! - [`topic`]: the brokers and the job's partitions: watermarks, start offsets, monitoring
//!   commits. The master watches the stream with it.
//! - [`reader`]: a worker reads the offset ranges the master deals it; a range that
//!   continues the previous one keeps the consumer's assignment.
//! - [`replay`]: the traffic generator behind `elastrec replay` (round robin, or with one
//!   hot partition whose click rate differs).
//!
//! Stream data is dealt like file rows: a task is an offset range of one partition, the
//! ledger records offsets, and the checkpoint's data position holds them (`docs/online.md`).

pub mod client;
pub mod error;
pub mod message;
pub mod reader;
pub mod replay;
pub mod tansu;
pub mod topic;

pub use error::{Result, StreamError};
pub use message::MessageFormat;
pub use reader::{RangeReader, StreamInput};
pub use replay::{replay, Partitioner, ReplayReport, ReplaySpec, Trace};
pub use topic::{
    create_topic, delete_topic, produce, Connection, PartitionId, StartAt, TopicWatch,
};
