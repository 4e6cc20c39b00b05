//! elastrec-brain (see Cargo.toml description).
