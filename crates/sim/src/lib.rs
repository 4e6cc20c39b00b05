//! elastrec-sim (see Cargo.toml description).
