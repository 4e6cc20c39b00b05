//! Every decision a job makes, as pure state machines and policies: they take what was
//! observed (domain types, a millisecond clock passed in) and return what to do, with the
//! reason. Nothing here runs a task, opens a socket or touches a database: the master's
//! service and loops measure, persist and execute, and the cluster simulator drives the
//! very same code, so what the simulator's tables say is what the live system does
//! (DESIGN.md, invariant 4).
//!
//! - [`job`]: the master's state machine: node table and phases, stragglers, failures and
//!   recovery, the worker count; side effects only through [`job::Context`].
//! - [`tasks`]: dynamic data sharding: the task queue handed out on demand, streams and
//!   growing datasets, positions to restore from.
//! - [`ledger`]: every consumed row range, with the proof each sample trained once.
//! - [`serving`]: the order the sources' buffers are served in (Primus Eq. 4).
//! - [`progressive`]: progressive validation's windows (AUC, logloss, NE per task).
//! - [`checkpoint`]: when a checkpoint falls due and how a lost PS is recovered, from
//!   CPR's cost model and portion of lost samples ([`cpr`]).
//! - [`autoscale`]: the batch autoscaler (DLRover-RM): profile windows, probes, the
//!   verdict on the brain's plans, undoing a growth that did not pay, hot and full PS.
//! - [`online_scale`]: worker counts for online jobs from their traffic (KALE).
//! - [`memory_limits`]: per-node memory limits that follow use (Primus Eq. 2-3).
//! - [`executor_scale`]: the number of data executors (Primus Eq. 1).

pub mod autoscale;
pub mod checkpoint;
pub mod cpr;
pub mod executor_scale;
pub mod job;
pub mod ledger;
pub mod memory_limits;
pub mod online_scale;
pub mod progressive;
pub mod serving;
pub mod tasks;
