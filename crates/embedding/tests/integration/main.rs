//! Integration tests of elastrec-embedding, one module per area.

mod common;
mod config;
mod determinism;
mod dynamic;
mod gather;
mod memory;
mod optimizer;
mod routing;
mod snapshot;
