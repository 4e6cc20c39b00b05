//! elastrec-embedding (see Cargo.toml description).
