//! elastrec-ps (see Cargo.toml description).
