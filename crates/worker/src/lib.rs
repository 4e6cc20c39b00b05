//! elastrec-worker (see Cargo.toml description).
