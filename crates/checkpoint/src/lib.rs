//! Checkpoints of elastrec (CPR + DLRover-RM flash checkpoints).
//!
//! * [`format`]: the manifest and checksummed parts; a checkpoint is complete only once its
//!   manifest exists, and the manifest is written last.
//! * [`store`]: where checkpoints live, through `object_store` (a local directory by
//!   default, S3 by URL), with retention and fallback to the newest intact checkpoint.
//! * [`shm`]: a shared-memory image of one parameter server's state, so a relaunched PS on
//!   the same host reloads without reading storage.
//! * CPR's cost model and decisions are policy: `elastrec_control::{cpr, checkpoint}`.
//! * [`priority`]: MFU and SSU selection of the embedding rows to save first. Pure.

pub mod error;
pub mod format;
pub mod priority;
pub mod shm;
pub mod store;

pub use error::{CheckpointError, Result};
