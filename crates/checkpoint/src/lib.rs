//! Checkpoints of elastrec (CPR + DLRover-RM flash checkpoints).
//!
//! * [`format`]: the manifest and checksummed parts; a checkpoint is complete only once its
//!   manifest exists, and the manifest is written last.
//! * [`store`]: where checkpoints live, through `object_store` (a local directory by
//!   default, S3 by URL), with retention and fallback to the newest intact checkpoint.
//! * [`shm`]: a shared-memory image of one parameter server's state, so a relaunched PS on
//!   the same host reloads without reading storage.
//! * [`cpr`]: CPR's cost model (Eq. 1, 2), portion of lost samples (Eq. 3, 4), checkpoint
//!   interval choice and the full-vs-partial recovery decision. Pure functions.
//! * [`priority`]: MFU and SSU selection of the embedding rows to save first. Pure.

pub mod cpr;
pub mod error;
pub mod format;
pub mod priority;
pub mod shm;
pub mod store;

pub use error::{CheckpointError, Result};
