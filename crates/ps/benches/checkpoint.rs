//! Checkpoint benchmark of one parameter server (issue 4): training stall of a flash
//! checkpoint against a plain memory copy of the same bytes, background persistence rate
//! to a local checkpoint directory, recovery (load) time of the PS from shared memory and
//! from storage, and the memory overhead of CPR-MFU counters and CPR-SSU lists.
//!
//! `cargo bench -p elastrec-ps --bench checkpoint [-- ROWS_PER_TABLE]` (default 200000:
//! 26 tables × 200k rows × (16 + 1) floats ≈ 354 MB).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use elastrec_checkpoint::format::{CheckpointKind, Manifest, PartMeta};
use elastrec_checkpoint::store::CheckpointStore;
use elastrec_job::config::JobConfig;
use elastrec_proto::master::RestorePlan;
use elastrec_proto::ps::CheckpointRequest;
use elastrec_ps::PsShard;
use elastrec_rpc as rpc;

fn job(rows: u64, priority: &str) -> JobConfig {
    JobConfig::from_toml(
        &format!(
            "[model]\nembedding_dim = 16\ntable_rows = {rows}\n[checkpoint]\npriority = \"{priority}\"\n"
        ),
        Path::new("bench.toml"),
    )
    .expect("bench job")
}

fn main() -> anyhow::Result<()> {
    let rows: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(200_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(rows))
}

async fn run(rows: u64) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let location = dir.path().to_string_lossy().into_owned();
    let store = CheckpointStore::open(&location)?;
    let ns = format!("bench-{}", std::process::id());
    let ps = Arc::new(PsShard::new(&job(rows, "none"), 0, 1)?);
    println!("| checkpoint | bytes | stall (ms) | memory copy (ms) | stall / copy | persist (s) | persist MB/s |");
    println!("|---|---|---|---|---|---|---|");
    let mut last = None;
    for id in 1..=3u64 {
        let r = ps
            .checkpoint(CheckpointRequest {
                version: rpc::version(),
                id,
                location: location.clone(),
                delta: false,
                ratio: 1.0,
                shm_namespace: ns.clone(),
            })
            .await?;
        println!(
            "| full {id} | {:.0} MB | {:.1} | {:.1} | {:.2}x | {:.2} | {:.0} |",
            r.bytes as f64 / 1e6,
            r.stall_us as f64 / 1e3,
            r.memcpy_us as f64 / 1e3,
            r.stall_us as f64 / r.memcpy_us.max(1) as f64,
            r.persist_us as f64 / 1e6,
            r.bytes as f64 / r.persist_us.max(1) as f64
        );
        store
            .commit(&Manifest {
                id,
                created_ms: 0,
                fingerprint: "bench".into(),
                kind: CheckpointKind::Full,
                num_ps: 1,
                step: 0,
                samples: 0,
                parts: vec![PartMeta {
                    name: r.part.clone(),
                    bytes: r.bytes,
                    checksum: r.checksum,
                }],
                info: Default::default(),
            })
            .await?;
        last = Some(id);
    }
    let id = last.expect("three checkpoints");
    for (source, shm) in [("shared memory", ns.as_str()), ("storage", "")] {
        let fresh = PsShard::new(&job(rows, "none"), 0, 1)?;
        let t0 = Instant::now();
        let (_, from_shm, from_store) = fresh
            .restore(&RestorePlan {
                location: location.clone(),
                chain: vec![id],
                num_ps: 1,
                shm_namespace: shm.to_string(),
            })
            .await?;
        println!(
            "recovery of one PS from {source}: {:.2} s (parts: {from_shm} from shm, {from_store} from storage)",
            t0.elapsed().as_secs_f64()
        );
    }
    let plain = PsShard::new(&job(rows, "none"), 0, 1)?.memory_bytes();
    for priority in ["mfu", "ssu"] {
        let bytes = PsShard::new(&job(rows, priority), 0, 1)?.memory_bytes();
        println!(
            "{priority}: +{} bytes over {} bytes of embedding state ({:.3}%), {:.3} bytes per embedding row",
            bytes - plain,
            plain,
            (bytes - plain) as f64 * 100.0 / plain as f64,
            (bytes - plain) as f64 / (26 * rows) as f64
        );
    }
    if let Ok(root) = elastrec_checkpoint::shm::ShmRoot::open_default() {
        let _ = root.remove_namespace(&ns);
    }
    Ok(())
}
