//! elastrec-model (see Cargo.toml description).
