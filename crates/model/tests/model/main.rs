//! Integration tests of elastrec-model, one module per area.

mod common;
mod dlrm;
mod gradcheck;
mod metrics;
mod optim;
