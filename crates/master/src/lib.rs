//! elastrec-master (see Cargo.toml description).
