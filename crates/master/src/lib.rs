//! The job master: node table (membership, heartbeats), dynamic data sharding (task queue
//! and sample ledger), elastic scaling and failure policy, persisted in SQLite.
//!
//! Layout follows logic / service / process: [`ledger`], [`tasks`] and [`job`] are pure
//! state machines (side effects reach them through [`job::Context`]), as are checkpoints'
//! decisions ([`checkpoint::CheckpointPolicy`]); the scalers' policies live in
//! `elastrec-control`, and [`wire`] turns the brain's answers into its types; [`store`] persists the state machine's changes; [`core`] is what handlers and
//! loops share; [`service`] holds the thin gRPC handlers, [`error`] what they refuse with;
//! [`events`] records the job's events; [`run`] wires the process (`elastrec run`),
//! [`backend`] starts role processes, [`cli`] backs the subcommands.

pub mod autoscale_loop;
pub mod backend;
pub mod brain_link;
pub mod checkpoint;
pub mod cli;
pub mod core;
pub mod dataset_watch;
pub mod error;
pub mod events;
pub mod export;
pub mod history;
pub mod job;
pub mod launch;
pub mod ledger;
pub mod metrics;
pub mod online_scale_loop;
pub mod progressive;
pub mod prometheus_sd;
pub mod push;
pub mod reshard;
pub mod run;
pub mod service;
pub mod store;
pub mod stream_stats;
pub mod stream_watch;
pub mod tasks;
pub mod validation;
pub mod wire;

pub use elastrec_orchestrate::serving;
