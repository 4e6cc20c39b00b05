//! Small, dependency-free helpers that more than one leaf crate needs.
//!
//! `data`, `model` and `embedding` do not depend on each other (and should not: `data`
//! pulls in Parquet/Arrow, `model` pulls in `gemm`, and `model`'s tests already use
//! `embedding`), so the one copy of each helper lives here, below all three:
//!
//! * [`splitmix`]: the SplitMix64 generator and its finalizer, which parameter init, row
//!   init and the data generator all build on. Their outputs are frozen (checkpoints and
//!   generated data depend on them).
//! * [`auc`]: exact, sort-based ROC AUC, used for evaluation and for the generator's
//!   teacher AUC.
//! * [`logloss`]: the clamped log-loss term, for evaluation and the master's
//!   progressive validation of online jobs.
//! * [`eval`]: the evaluation result workers report and the master records.
//! * [`caught`]: a dependency's panic on corrupt input, caught as an error message.
//! * [`quiet`]: the foreign CPU load while a benchmark round ran, so that no benchmark
//!   reports a ratio measured on a busy machine.
//! * [`machine`]: the CPU a benchmark ran on (model, vector extensions, the GEMM kernels
//!   picked for it) and the CPUs it was confined to.

pub mod auc;
pub mod caught;
pub mod clock;
pub mod eval;
pub mod fail_points;
pub mod logloss;
pub mod machine;
pub mod quiet;
pub mod skip;
pub mod splitmix;

pub use auc::exact_auc;
pub use caught::quiet_catch_unwind;
pub use eval::EvalResult;
pub use logloss::{logloss_term, normalized_entropy, LOGLOSS_EPS};
pub use skip::skip_test;
pub use splitmix::{mix64, splitmix64, SplitMix64};
