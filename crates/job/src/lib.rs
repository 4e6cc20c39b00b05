//! A training job's file: the format `elastrec train` and `elastrec run` read.
//!
//! One TOML file describes a job, from the single-process trainer's `[data]`, `[model]`,
//! `[train]`, `[optimizer]` and `[output]` (`config`) to the distributed sections:
//! `[cluster]` and `[checkpoint]` (`distributed`), `[resources]` and `[engine]`
//! (`resources`), `[autoscale]` (`autoscale`). Every role (trainer, master, parameter
//! server, worker) reads it through this crate, and resolves it the same way (`prepare`:
//! the job's data, the rows of its embedding tables, its dense model). A parameter server
//! or worker learns its job from the master (`register`). `fsio` writes the run
//! directory's files crash-safely. `selection`: the validation slice, model selection and
//! early stopping both `train` and `run` apply. `split`: the typed rows of a task (a
//! file's row range or a partition's offset range), as master and workers exchange them.

pub mod autoscale;
mod checks;
pub mod config;
pub mod datasets;
pub mod distributed;
pub mod error;
pub mod fsio;
pub mod join;
pub mod mix;
pub mod prepare;
pub mod register;
pub mod resources;
pub mod selection;
pub mod split;
pub mod stream;

pub use config::JobConfig;
pub use error::{JobError, Result};
