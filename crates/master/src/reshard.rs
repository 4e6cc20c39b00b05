//! Changing the number of parameter servers while the job trains (seamless migration).
//!
//! The master drives the servers' re-sharding protocol (`crates/proto/proto/ps.proto`):
//! 1. the job state machine starts the servers of the new layout that do not exist yet
//!    (they join empty) and holds checkpoints and scaling back;
//! 2. once they registered, every server of the old layout gets `Reshard`: with pre-copy it
//!    first sends every row while still serving, then freezes and sends only the rows
//!    updated meanwhile and the dense values to their new owners;
//! 3. every server of both layouts gets `CommitLayout`; the state machine puts the new
//!    layout in force (heartbeat and register replies publish it, workers re-route without
//!    restarting) and stops the servers beyond the new count;
//! 4. on any failure, `AbortLayout` everywhere: the old servers resume with the state they
//!    froze (nothing was applied meanwhile) and the joining servers are stopped.
//!
//! Training pauses only from the first freeze to the commit: the time to move the rows
//! updated during the pre-copy. Each change is recorded with its pause and bytes moved.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use elastrec_proto::ps::{AbortRequest, CommitRequest, ReshardRequest, ReshardResponse};
use elastrec_rpc as rpc;
use serde::{Deserialize, Serialize};

use crate::core::MasterCore;
use crate::events::event;
use crate::job::Role;

/// How the master reaches the parameter servers.
#[derive(Debug, Clone)]
pub struct PsAccess {
    /// The job token.
    pub token: String,
    /// The job's gRPC message limit.
    pub max_bytes: usize,
}

/// Longest a re-sharding step may take before it is rolled back (moving a large shard
/// between machines takes a while; a hung server must not hold the job forever).
pub const STEP_TIMEOUT: Duration = Duration::from_secs(300);
/// Longest the new layout's servers may take to start and register.
const JOIN_TIMEOUT: Duration = Duration::from_secs(120);

/// One change of the PS count, for `status` and `result.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReshardRecord {
    /// PS count before and after.
    pub from: u32,
    /// See `from`.
    pub to: u32,
    /// Layout version after.
    pub layout_version: u64,
    /// Why (the autoscaler's reason, or `requested`).
    pub reason: String,
    /// Samples trained when it was committed.
    pub samples: u64,
    /// Seconds from the request to the commit (new servers starting included).
    pub total_s: f64,
    /// Training pause: from the first server's freeze to the commit, milliseconds.
    pub pause_ms: f64,
    /// Bytes moved while frozen, and by the pre-copy before.
    pub frozen_bytes: u64,
    /// See `frozen_bytes`.
    pub precopy_bytes: u64,
    /// Rows moved while frozen and by the pre-copy.
    pub frozen_rows: u64,
    /// See `frozen_rows`.
    pub precopy_rows: u64,
    /// Pause per GB moved in all (pre-copy included), milliseconds.
    pub pause_ms_per_gb: f64,
}

/// Changes the job's PS count to `num_ps`; returns once the new layout is in force (or
/// rolled back, with the reason).
pub async fn change_ps(
    core: &MasterCore,
    num_ps: u32,
    reason: &str,
) -> anyhow::Result<ReshardRecord> {
    let access = core
        .ps_access
        .get()
        .cloned()
        .context("the master has no PS access configured")?;
    let t0 = Instant::now();
    let (version, from) = core
        .run(|job, cx| {
            let from = job.policy().num_ps;
            job.begin_reshard(num_ps, cx).map(|v| (v, from))
        })
        .await
        .context("master state")?
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    event!(
        "reshard_started",
        from,
        to = num_ps,
        version,
        reason = %reason,
        "master: changing the PS count {from} -> {num_ps} (layout {version}): {reason}",
    );
    match run_protocol(core, &access, version, from, num_ps).await {
        Ok((responses, pause)) => {
            let pause_ms = pause.as_secs_f64() * 1e3;
            let samples = core
                .run(|job, cx| {
                    job.commit_reshard(cx);
                    job.samples_done()
                })
                .await
                .context("master state")?;
            if let Some(c) = core.checkpoints() {
                c.layout_changed(num_ps);
            }
            let sum = |f: fn(&ReshardResponse) -> u64| responses.iter().map(f).sum::<u64>();
            let (frozen_bytes, precopy_bytes) = (sum(|r| r.bytes), sum(|r| r.precopy_bytes));
            let gb = (frozen_bytes + precopy_bytes) as f64 / 1e9;
            let record = ReshardRecord {
                from,
                to: num_ps,
                layout_version: version,
                reason: reason.to_string(),
                samples,
                total_s: t0.elapsed().as_secs_f64(),
                pause_ms,
                frozen_bytes,
                precopy_bytes,
                frozen_rows: sum(|r| r.rows),
                precopy_rows: sum(|r| r.precopy_rows),
                pause_ms_per_gb: if gb > 0.0 { pause_ms / gb } else { 0.0 },
            };
            event!(
                "reshard_done",
                from,
                to = num_ps,
                version,
                seconds = record.total_s,
                pause_ms = record.pause_ms,
                "master: PS count {from} -> {num_ps} in force (layout {version}) after {:.2} s; training paused {:.1} ms; moved {:.1} MB frozen + {:.1} MB pre-copied ({:.0} ms per GB)",
                record.total_s,
                record.pause_ms,
                frozen_bytes as f64 / 1e6,
                precopy_bytes as f64 / 1e6,
                record.pause_ms_per_gb
            );
            core.reshards.lock().push(record.clone());
            Ok(record)
        }
        Err(e) => {
            let _ = core.run(|job, cx| job.abort_reshard(cx)).await;
            bail!("changing the PS count {from} -> {num_ps} failed and was rolled back: {e:#}")
        }
    }
}

/// Waits until no checkpoint copies a server's state (new ones are held back by the state
/// machine from now on; one already running is waited for), then until the new layout's
/// servers registered. Their addresses, by index.
async fn new_layout_ready(core: &MasterCore) -> anyhow::Result<Vec<String>> {
    if let Some(c) = core.checkpoints() {
        let deadline = Instant::now() + STEP_TIMEOUT;
        while c.busy() {
            anyhow::ensure!(Instant::now() < deadline, "a checkpoint did not finish");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let deadline = Instant::now() + JOIN_TIMEOUT;
    loop {
        let t = core.job.lock().reshard_targets();
        match t {
            Ok(Some(t)) => return Ok(t),
            Ok(None) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Ok(None) => bail!("the new servers did not register within {JOIN_TIMEOUT:?}"),
            Err(e) => bail!("{e}"),
        }
    }
}

/// Tells every server in `addrs` to drop layout `version`; one that cannot be told is
/// reported.
async fn abort_layout_on(addrs: &[String], access: &PsAccess, version: u64) {
    let calls = addrs.iter().map(|a| {
        let c = rpc::ps_client(a, &access.token, access.max_bytes, STEP_TIMEOUT);
        let req = AbortRequest {
            version: rpc::version(),
            layout_version: version,
        };
        async move { c?.abort_layout(req).await.map_err(anyhow::Error::from) }
    });
    for (a, r) in addrs.iter().zip(rpc::join_all(calls).await) {
        if let Err(e) = r {
            event!(
                warn,
                "reshard_abort_failed",
                version,
                ps = %a,
                error = %format!("{e:#}"),
                "master: aborting layout {version} on {a}: {e:#}",
            );
        }
    }
}

/// Steps 2 and 3 (and 4 on failure). Returns the Reshard replies and the training
/// pause.
async fn run_protocol(
    core: &MasterCore,
    access: &PsAccess,
    version: u64,
    from: u32,
    to: u32,
) -> anyhow::Result<(Vec<ReshardResponse>, Duration)> {
    let targets = new_layout_ready(core).await?;
    let olds: Vec<String> = {
        let job = core.job.lock();
        let mut addrs = vec![String::new(); from as usize];
        for n in job.nodes() {
            if n.role == Role::Ps && n.state.is_live() && n.index < from && !job.is_joining(n.id) {
                addrs[n.index as usize] = n.addr.clone();
            }
        }
        addrs
    };
    anyhow::ensure!(
        olds.iter().all(|a| !a.is_empty()),
        "not every server of the current layout is up"
    );
    let client = |addr: &str| rpc::ps_client(addr, &access.token, access.max_bytes, STEP_TIMEOUT);
    let targets_ref = &targets;
    let reshard_round = |precopy: bool| {
        let calls = olds.iter().map(move |a| {
            let c = client(a);
            let req = ReshardRequest {
                version: rpc::version(),
                layout_version: version,
                num_ps: to,
                addrs: targets_ref.clone(),
                precopy,
            };
            async move { c?.reshard(req).await.map_err(anyhow::Error::from) }
        });
        rpc::join_all(calls)
    };
    // Round 1, while the servers go on serving: every row to its new owner. Round 2,
    // frozen: only the rows updated since, and the dense values.
    let mut failed = None;
    let mut precopied = Vec::with_capacity(olds.len());
    for (i, r) in reshard_round(true).await.into_iter().enumerate() {
        match r {
            Ok(r) => precopied.push(r.into_inner()),
            Err(e) => {
                failed.get_or_insert(format!("pre-copy of PS {i} ({}): {e:#}", olds[i]));
            }
        }
    }
    let mut responses = Vec::with_capacity(olds.len());
    if failed.is_none() {
        for (i, r) in reshard_round(false).await.into_iter().enumerate() {
            match r {
                Ok(r) => {
                    let mut r = r.into_inner();
                    if let Some(p) = precopied.get(i) {
                        r.precopy_rows = p.precopy_rows.max(p.rows);
                        r.precopy_bytes = p.precopy_bytes.max(p.bytes);
                        r.precopy_us = p.precopy_us;
                    }
                    responses.push(r);
                }
                Err(e) => {
                    failed.get_or_insert(format!("PS {i} ({}): {e:#}", olds[i]));
                }
            }
        }
    }
    let mut everyone: Vec<String> = olds.clone();
    for a in &targets {
        if !everyone.contains(a) {
            everyone.push(a.clone());
        }
    }
    if let Some(why) = failed {
        abort_layout_on(&everyone, access, version).await;
        bail!("re-sharding failed: {why}");
    }
    hold_for_test().await;
    let commit_started = Instant::now();
    let calls = everyone.iter().map(|a| {
        let c = client(a);
        let req = CommitRequest {
            version: rpc::version(),
            layout_version: version,
            addrs: targets.clone(),
        };
        async move { c?.commit_layout(req).await.map_err(anyhow::Error::from) }
    });
    for (a, r) in everyone.iter().zip(rpc::join_all(calls).await) {
        // Past this point the servers hold the moved state: a commit that did not arrive
        // is retried rather than rolled back.
        if let Err(e) = r {
            let mut ok = false;
            for _ in 0..10 {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let req = CommitRequest {
                    version: rpc::version(),
                    layout_version: version,
                    addrs: targets.clone(),
                };
                if client(a)?.commit_layout(req).await.is_ok() {
                    ok = true;
                    break;
                }
            }
            anyhow::ensure!(ok, "committing layout {version} on {a}: {e:#}");
        }
    }
    // A server refuses requests from its freeze until its commit: the longest frozen span
    // of any server (reported by the server) plus the commit round.
    let frozen_us = responses.iter().map(|r| r.frozen_us).max().unwrap_or(0);
    let pause = Duration::from_micros(frozen_us) + commit_started.elapsed();
    Ok((responses, pause))
}

/// After a master restart: tells every live server of the layout in force to abort the
/// next layout, in case the previous master froze them for it and died before its commit
/// (a server with nothing to abandon answers Ok).
pub async fn abort_uncommitted(core: &MasterCore) {
    let Some(access) = core.ps_access.get().cloned() else {
        return;
    };
    let (next, addrs) = {
        let job = core.job.lock();
        let addrs: Vec<String> = job
            .nodes()
            .filter(|n| n.role == Role::Ps && n.state.is_live() && !n.addr.is_empty())
            .map(|n| n.addr.clone())
            .collect();
        (job.layout_version() + 1, addrs)
    };
    for a in addrs {
        let Ok(mut c) = rpc::ps_client(&a, &access.token, access.max_bytes, Duration::from_secs(5))
        else {
            continue;
        };
        let req = AbortRequest {
            version: rpc::version(),
            layout_version: next,
        };
        // A server with nothing to abandon answers Ok; one that committed it refuses
        // (a change whose commit reached only some servers is not repaired here).
        if let Err(s) = c.abort_layout(req).await {
            tracing::debug!(addr = %a, error = %s, "abort of an uncommitted layout refused");
        }
    }
}

/// Fail point `ELASTREC_FAIL_HOLD_RESHARD`: the master holds the re-sharding after the
/// freezing round, with every old server frozen and nothing committed, the worst moment
/// to lose it; a test kills it there and resumes the job.
async fn hold_for_test() {
    if elastrec_common::fail_points::is_set("ELASTREC_FAIL_HOLD_RESHARD") {
        event!(
            "fail_point",
            name = "reshard_before_commit",
            "fail point: holding the re-sharding before its commit"
        );
        std::future::pending::<()>().await;
    }
}
