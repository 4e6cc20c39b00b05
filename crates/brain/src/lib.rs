//! elastrec-brain: the cluster brain.
//!
//! Owns the throughput models (DLRover-RM, KALE) fitted by NNLS, the config database of job
//! history (SQLite or PostgreSQL), warm start, NSGA-II job plans, the cluster-level
//! weighted greedy, KALE streaming plans (forecast, fewest workers, stabilization,
//! fallback), Primus scaling rules, OOM prediction and the shared plan of the jobs that use
//! one brain service. Policies are pure functions over observed state (no I/O), so the
//! simulator and the live service run the same code; the database (`db`) and the gRPC
//! service (`service`) are the only parts that do I/O.

pub mod alloc;
pub mod error;
pub mod nnls;
pub mod throughput;

pub use alloc::{Allocation, Bounds, Range, Resources};
pub use error::{BrainError, Result};
pub mod forecast;
pub mod greedy;
pub mod job;
pub mod nsga2;
pub mod oom;
pub mod plan;
pub mod planner;
pub mod primus;
pub mod shared;
pub mod streaming;
pub mod traffic;
pub mod warm_start;

pub use job::{JobFile, JobSpec, TableSpec};
pub use plan::{Plan, PlanKind, StreamPlan};
pub use planner::{plan_for_job, plan_for_job_file, BrainConfig};
#[cfg(feature = "service")]
pub mod db;
#[cfg(feature = "service")]
pub mod service;

#[cfg(feature = "service")]
pub use service::{serve, serve_with_listener, spec_from_proto, BrainServeOptions};
