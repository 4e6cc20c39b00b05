//! The training worker.
//!
//! Owns the training step (embedding lookup → dense DLRM forward/backward → sparse and
//! dense updates), the single-process trainer behind `elastrec train` (the standalone mode
//! of the whole system), saved-model files for `elastrec eval`, and the distributed worker
//! process. The job file it trains is `elastrec-job`'s.

pub mod bench;
pub mod error;
pub mod executor;
mod executor_reader;
mod fail_points;
pub mod layout;
pub mod mixing;
pub mod model_file;
pub mod placement;
pub mod pooling;
pub mod remote;
/// Model selection lives in the job crate: the master applies it in `elastrec run` too.
pub use elastrec_job::selection;
pub mod shuffle;
mod split_source;
pub mod step;
pub mod trainer;

pub use error::{Result, WorkerError};
pub use step::{Dlrm, Predictor, TrainStep};
pub use trainer::{evaluate, train, EvalResult, Summary};
