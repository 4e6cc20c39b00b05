//! The master process (`elastrec run`): validates the job, opens (or reopens) its state
//! database, serves gRPC and `/metrics`, launches nodes through the backend, runs the
//! control loop (exits, heartbeat timeouts, checkpoints, progress display) and writes the
//! result.
//!
//! * [`job_dir`]: the files of a job directory;
//! * `setup`: what a start and a resume both build from the job file (backend, TLS,
//!   addresses, sharding, policy, brain link);
//! * [`start`]: a new job, and a resumed one from its database;
//! * `serve`: the gRPC and metrics endpoints, the control loop and the wind-down;
//! * [`result`]: `result.json` and the closing summary.

pub mod job_dir;
pub mod result;
mod serve;
mod setup;
pub mod start;

pub use job_dir::{FileRows, JobDir};
pub use result::{EpochLedger, JobResult, Resources};
pub(crate) use setup::core_file_pairs;
pub use start::{resume_job, start_job, validate_job, FromCheckpoint};
