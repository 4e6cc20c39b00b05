//! The job master: node table (membership, heartbeats), dynamic data sharding (task queue
//! and sample ledger), elastic scaling and failure policy, persisted in SQLite.
//!
//! Layout follows logic / service / node: [`ledger`], [`tasks`] and [`job`] are pure state
//! machines; side effects reach them through [`job::Context`].

pub mod job;
pub mod ledger;
pub mod tasks;
