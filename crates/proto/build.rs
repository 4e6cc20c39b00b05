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
    // The status messages people and tools read as JSON (`elastrec status --json`, the
    // dashboard, `result.json`) serialize with the proto's own field names, and read back
    // (a field a file lacks takes its default).
    let mut config = tonic_prost_build::configure();
    for message in [
        "ReshardRecord",
        "ProgressiveWindow",
        "TaskWindow",
        "MixStatus",
        "Served",
        "DatasetsStatus",
        "PendingPartition",
        "StreamStatus",
        "PartitionLag",
        "OnlineDecision",
        "AutoscaleStatus",
        "AutoscaleBounds",
        "AutoscalePlan",
        "AutoscaleLimits",
        "ScalingAction",
        "MemoryLimitChange",
    ] {
        config = config.type_attribute(
            format!(".elastrec.master.v1.{message}"),
            "#[derive(serde::Serialize, serde::Deserialize)] #[serde(default)]",
        );
    }
    config.compile_fds(fds)?;
    Ok(())
}
