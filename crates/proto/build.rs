//! Compiles every `proto/*.proto` file without needing `protoc` on the machine.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from("proto");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "proto"))
        .collect();
    files.sort();
    println!("cargo:rerun-if-changed=proto");
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    if files.is_empty() {
        return Ok(());
    }
    let fds = protox::compile(&files, [&dir])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
