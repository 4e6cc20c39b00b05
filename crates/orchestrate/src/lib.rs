//! Data orchestration (Primus §4): datasets partitioned by time, their windows, listings of
//! local and object storage, and the data task graph generator that turns them into data
//! tasks in chronological order.
//!
//! ```text
//! [[data.dataset]] ──compile──► Dataset (template, window, file filter, ready marker, lister)
//!        │
//!        ▼
//! TaskGraph::plan(now): timers ─► sources (parallel listings, cached) ─► joiners ─► sink
//!        │
//!        ▼
//! DataTask { partition, files first..end }, oldest time first
//! ```
//!
//! The tasks then wait in `elastrec_control::serving::Buffers`, one per source, served by
//! weight or by Primus's priority (Algorithm 2).

pub mod definition;
pub mod error;
pub mod graph;
pub mod listing;
pub mod template;
pub mod window;

pub use definition::{Dataset, DatasetConfig, DatasetRole};
pub use error::{OrchestrateError, Result};
pub use graph::{DataTask, Partition, PendingPartition, Round, TaskGraph, TaskLimits};
pub use listing::{FileList, GeneratedLister, Lister, LocalLister, NameFilter, ObjectStoreLister};
pub use template::{Granularity, PartitionTemplate};
pub use window::{parse_time, Window, WindowSpec};
