//! Every scaling decision a job makes, as pure policies: they take what was observed
//! (domain types, a millisecond clock passed in) and return what to do, with the reason.
//! Nothing here runs a task, opens a socket or touches a database: the master's loops
//! measure and execute, and the cluster simulator drives the very same code, so what the
//! simulator's tables say is what the live system does (DESIGN.md, invariant 4).
//!
//! - [`autoscale`]: the batch autoscaler (DLRover-RM): profile windows, probes, the
//!   verdict on the brain's plans, undoing a growth that did not pay, hot and full PS.
//! - [`online_scale`]: worker counts for online jobs from their traffic (KALE).
//! - [`memory_limits`]: per-node memory limits that follow use (Primus Eq. 2-3).
//! - [`executor_scale`]: the number of data executors (Primus Eq. 1).

pub mod autoscale;
pub mod executor_scale;
pub mod memory_limits;
pub mod online_scale;
