//! Simulations over elastrec's live policies: the same functions the master and parameter
//! servers call, driven by emulated time and injected failures instead of a cluster.
//!
//! * [`cpr`]: the CPR emulation (Maeng et al., MLSys 2021, §5.1): one process trains a
//!   DLRM on generated data while `N_emb` virtual parameter servers fail at seeded sample
//!   positions, and compares full recovery, partial recovery, CPR-vanilla, CPR-MFU and
//!   CPR-SSU on emulated overhead and final AUC ([`cpr::run_cpr_emulation`]). The
//!   policies come from `elastrec_control::cpr` and `elastrec_checkpoint::priority`.
//! * [`cluster`]: the cluster simulation (`elastrec simulate cluster`): batch and online
//!   jobs on simulated nodes, scheduled by the brain's and master's policy code and by the
//!   papers' baselines on one trace ([`cluster::run_cluster`]).
//! * [`cli`]: the library side of `elastrec simulate`.

pub mod cli;
pub mod cluster;
pub mod cpr;
pub mod error;

pub use error::{Result, SimError};
