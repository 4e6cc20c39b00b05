//! Peak memory of a parameter server's full checkpoint, measured as the process's resident
//! high-water mark (`VmHWM` in `/proc/self/status`, reset through `/proc/self/clear_refs`).
//!
//! Besides the live shard, a checkpoint needs its copy, which the encoding consumes while it
//! grows: about one more shard's worth of bytes. Extra copies of the shard (a second copy
//! to time a plain `memcpy`, an encoding buffer that grows by doubling, an encoding per
//! destination) each add another shard's worth. The shared-memory image is a tmpfs file:
//! host memory, but not the process's resident set, so it is not part of this number.
//!
//! This file holds one test so that the process measures nothing else. Linux only; elsewhere
//! it says so and passes.

use std::path::Path;
use std::sync::Arc;

use elastrec_job::config::JobConfig;
use elastrec_proto::ps::CheckpointRequest;
use elastrec_ps::PsShard;
use elastrec_rpc as rpc;

/// A field of `/proc/self/status` in bytes (`VmHWM`, `VmRSS`).
fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Makes glibc serve every allocation of 1 MiB or more with its own mapping, returned to the
/// system when freed. A production shard's tables are far larger than glibc's dynamic
/// threshold (at most 32 MiB), so they are mapped anyway; this test's tables are smaller,
/// and without this the freed copy of a table would stay resident in the heap and hide
/// when it was freed.
fn map_large_allocations() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; called before the measured work.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

/// Sets the high-water mark back to the current resident set (Linux 4.0 and later).
fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_checkpoint_needs_about_one_extra_shard_of_memory() {
    if status_bytes("VmHWM:").is_none() || !reset_peak() {
        eprintln!("no /proc/self/status or clear_refs: peak memory not measured");
        return;
    }
    map_large_allocations();
    let rows: u64 = std::env::var("PS_MEMORY_TEST_ROWS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(40_000);
    // 26 tables x 40k rows x (16 weights + 1 optimizer float) x 4 bytes: about 71 MB.
    let job = JobConfig::from_toml(
        &format!("[model]\nembedding_dim = 16\ntable_rows = {rows}\n"),
        Path::new("job.toml"),
    )
    .unwrap();
    let ps = Arc::new(PsShard::new(&job, 0, 1).unwrap());
    let shard = ps.memory_bytes() as u64;
    let dir = tempfile::tempdir().unwrap();
    let ns = format!("ps-memory-test-{}", std::process::id());
    let request = CheckpointRequest {
        version: rpc::version(),
        id: 1,
        location: dir.path().to_string_lossy().into_owned(),
        delta: false,
        ratio: 1.0,
        shm_namespace: ns.clone(),
    };
    assert!(reset_peak());
    let before = status_bytes("VmRSS:").unwrap();
    let r = ps.checkpoint(request).await.unwrap();
    let peak = status_bytes("VmHWM:").unwrap();
    if let Ok(root) = elastrec_checkpoint::shm::ShmRoot::open_default() {
        let _ = root.remove_namespace(&ns);
    }
    let extra = peak.saturating_sub(before);
    let ratio = extra as f64 / shard as f64;
    eprintln!(
        "shard {:.1} MB, part {:.1} MB: resident before {:.1} MB, peak {:.1} MB, \
         extra {:.1} MB = {ratio:.2} x the shard",
        shard as f64 / 1e6,
        r.bytes as f64 / 1e6,
        before as f64 / 1e6,
        peak as f64 / 1e6,
        extra as f64 / 1e6
    );
    // The copy and its encoding overlap by one table (2.7 MB here), and the encoding carries
    // 8 bytes of row id per 68 bytes of row: about 1.15 x. A second full copy of the shard
    // (as the plain-copy timing used to make) reaches 2 x.
    assert!(
        ratio < 1.5,
        "a checkpoint of a {shard}-byte shard raised the resident set by {extra} bytes ({ratio:.2} x)"
    );
}
