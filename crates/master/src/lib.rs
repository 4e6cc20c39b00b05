//! The job master: the `elastrec run` process around the job's state machine.
//!
//! The decisions are `elastrec-control`'s: the node table ([`job`], side effects through
//! [`job::Context`]), the task queue ([`tasks`]), the ledger ([`ledger`]) and the scalers'
//! policies; checkpoints' decisions are [`checkpoint::CheckpointPolicy`]. Here: [`store`]
//! persists the state machine's changes in SQLite; [`core`] is what handlers and loops
//! share; [`service`] holds the thin gRPC handlers, [`error`] what they refuse with, and
//! [`wire`] turns the brain's answers into `control`'s types; [`events`] records the
//! job's events; [`run`] wires the process, [`backend`] starts role processes, [`cli`]
//! backs the subcommands.

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
pub mod file_count;
pub mod launch;
pub mod metrics;
pub mod online_scale_loop;
pub mod probe;
pub mod progressive;
pub mod prometheus_sd;
pub mod push;
pub mod reshard;
pub mod run;
pub mod service;
pub mod store;
pub mod stream_stats;
pub mod stream_watch;
pub mod validation;
pub mod wire;

// The state machine the master serves, at the paths its modules name it by.
pub use elastrec_control::{job, ledger, serving, tasks};
