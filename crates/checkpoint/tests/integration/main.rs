//! Integration tests of elastrec-checkpoint: one binary, a module per area.

mod local;
mod moto;
mod s3;
mod scenarios;
mod shm;
mod util;
