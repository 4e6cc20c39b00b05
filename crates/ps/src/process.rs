//! The PS process (`elastrec ps`): bind, register with the master, serve, heartbeat
//! until told to stop.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use elastrec_job::register::{register_node, register_request};
use elastrec_proto::master::{HeartbeatRequest, NodeAction, RegisterRequest, Role};
use elastrec_rpc::{self as rpc, is_transient};

use crate::fail_points::{
    fail_point_block_runtime, fail_point_heartbeat_muted, fail_point_slow_build, NODE_ID,
};
use crate::service::{ps_profile, serve};
use crate::shard::PsShard;

/// Arguments of the hidden `elastrec ps` role command.
#[derive(Debug, Clone, clap::Args)]
pub struct PsArgs {
    /// Address of the job master.
    #[arg(long)]
    pub master: String,
    /// Node id the master assigned to this process.
    #[arg(long)]
    pub node_id: u32,
    /// Shard index of this PS.
    #[arg(long)]
    pub index: u32,
    /// Unique id of the job: on the command line so that the master recognizes its own
    /// processes after a restart (node ids repeat across jobs).
    #[arg(long, default_value = "")]
    pub job: String,
}

/// The PS process: bind, register with the master, serve, heartbeat until told to stop.
pub async fn run_ps(args: PsArgs) -> anyhow::Result<()> {
    let _ = NODE_ID.set(args.node_id);
    let token = rpc::token_from_env()?;
    elastrec_rpc::tls::install_from_env()?;
    let mut master = rpc::master_client(&args.master, &token, 64 << 20)?;
    // Learn the job first (bind address), then register with the real address.
    let reg = register_node(&mut master, Role::Ps, args.node_id, "", "", false).await?;
    // Building the tables and restoring a checkpoint take as long as they take: the
    // master hears from this server all along, so neither looks like a dead one.
    let keepalive = keep_beating(&args.master, &token, args.node_id, reg.heartbeat_ms)?;
    let (job, plan) = (reg.job, reg.restore);
    let (peer_addrs, dense_from_replica) = (reg.peer_addrs, reg.dense_from_replica);
    let ip = elastrec_job::resources::bind_address(&job)?;
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(ip, 0))
        .await
        .with_context(|| format!("binding {ip}"))?;
    // What the master and the workers dial: reachable from other hosts when bound to all
    // interfaces.
    let addr = elastrec_job::resources::advertise_for(&job.engine, listener.local_addr()?)?;
    let shard = build_shard(
        &job,
        args.index,
        reg.num_ps,
        reg.joining,
        reg.layout_version,
    )
    .await?;
    let mshard = shard.clone();
    let port = job
        .cluster
        .node_metrics_port(args.node_id)
        .map_err(anyhow::Error::msg)?;
    let metrics = elastrec_metrics::serve(SocketAddr::new(ip, port), &token, move || {
        mshard.metrics.render(mshard.version())
    })
    .await
    .context("binding the metrics endpoint")?;
    eprintln!(
        "PS {}: metrics on http://{}/metrics",
        args.index,
        metrics.addr()
    );
    let (restore_s, dense_rewound) = restore_state(
        &shard,
        args.index,
        plan.filter(|_| !reg.joining),
        (dense_from_replica && !reg.joining).then_some(peer_addrs.as_slice()),
        &token,
    )
    .await?;
    let server = tokio::spawn(serve(
        shard.clone(),
        listener,
        token.clone(),
        job.cluster.max_message_bytes,
    ));
    let metrics_addr = elastrec_job::resources::advertise_for(&job.engine, metrics.addr())?;
    // The lease counts from before the registration was sent (see `lease.rs`).
    let registering = std::time::Instant::now();
    let reg = register_request(
        &mut master,
        RegisterRequest {
            version: rpc::version(),
            role: Role::Ps as i32,
            node_id: args.node_id,
            addr: addr.clone(),
            metrics_addr,
            pid: std::process::id(),
            restore_s,
            dense_rewound,
        },
        false,
    )
    .await?;
    drop(keepalive);
    let hb_ms = reg.heartbeat_ms;
    shard.set_node(args.node_id);
    shard.fence_peers(&reg.peer_nodes);
    shard.lease.arm(job.cluster.lease(hb_ms), registering);
    shard.set_peers(reg.layout_version, reg.peer_addrs);
    let (replies_tx, mut replies) = tokio::sync::mpsc::unbounded_channel();
    let _beats = beat_while_serving(&args, &token, &shard, hb_ms, replies_tx)?;
    fail_point_block_runtime();
    loop {
        let Some(r) = replies.recv().await else {
            anyhow::bail!("the heartbeat thread ended");
        };
        match r {
            Ok(r) => {
                let r = r.into_inner();
                if r.action() == NodeAction::Unknown {
                    eprintln!(
                        "PS {}: the master no longer knows this node (declared dead and \
                         replaced); exiting",
                        args.index
                    );
                    break;
                }
                if r.action() == NodeAction::Stop {
                    break;
                }
                shard.fence_peers(&r.ps_nodes);
                shard.set_peers(r.layout_version, r.ps_addrs);
            }
            Err(s) if is_transient(&s) => {}
            Err(s) => anyhow::bail!("heartbeat refused: {s}"),
        }
        if server.is_finished() {
            anyhow::bail!("PS server stopped");
        }
    }
    server.abort();
    drop(metrics);
    eprintln!("{}", shard.summary());
    Ok(())
}

/// The heartbeats of a serving server, on a thread of their own (`rpc::beats`), so that
/// serving, checkpoint copies and recoveries on this runtime never hold them back; the
/// replies go to `replies`. Each acknowledged one renews the server's lease there too (a
/// busy runtime does not let the lease run out while the master answers), and the lease's
/// running out, and its renewal, are logged.
fn beat_while_serving(
    args: &PsArgs,
    token: &str,
    shard: &Arc<PsShard>,
    hb_ms: u64,
    replies: tokio::sync::mpsc::UnboundedSender<HeartbeatReply>,
) -> anyhow::Result<rpc::beats::Beats> {
    let serving_since = std::time::Instant::now();
    let shard = shard.clone();
    let (node_id, index) = (args.node_id, args.index);
    let was_fenced = std::sync::atomic::AtomicBool::new(false);
    rpc::beats::spawn(
        "heartbeats",
        &args.master,
        token,
        Duration::from_millis(hb_ms),
        move |mut m, _| {
            // Read without the state lock: a heartbeat must not wait for a checkpoint.
            let fenced = shard.lease.expired();
            if fenced.is_some() != was_fenced.swap(fenced.is_some(), Ordering::AcqRel) {
                match fenced {
                    Some(since) => eprintln!(
                        "PS {index}: fenced: the master acknowledged no heartbeat for {} ms, \
                         past the lease; serving nothing until it answers",
                        since.as_millis()
                    ),
                    None => eprintln!("PS {index}: the master answers again; serving"),
                }
            }
            let req = (!fail_point_heartbeat_muted(serving_since))
                .then(|| heartbeat(node_id, shard.version(), fenced.is_some()));
            let (tx, shard) = (replies.clone(), shard.clone());
            async move {
                if let Some(req) = req {
                    let sent = std::time::Instant::now();
                    let r = m.heartbeat(req).await;
                    if r.as_ref()
                        .is_ok_and(|r| r.get_ref().action() == NodeAction::Continue)
                    {
                        shard.lease.renew(sent);
                    }
                    let _ = tx.send(r);
                }
            }
        },
    )
}

/// A heartbeat's outcome, as the serving loop receives it.
type HeartbeatReply =
    Result<tonic::Response<elastrec_proto::master::HeartbeatResponse>, tonic::Status>;

/// Heartbeats every `every_ms` until dropped, for a server that registered and does not
/// serve yet; replies are left to the heartbeats that follow once it serves.
fn keep_beating(
    master: &str,
    token: &str,
    node_id: u32,
    every_ms: u64,
) -> anyhow::Result<rpc::beats::Beats> {
    rpc::beats::spawn(
        "heartbeats",
        master,
        token,
        Duration::from_millis(every_ms),
        move |mut m, _| async move {
            let _ = m.heartbeat(heartbeat(node_id, 0, false)).await;
        },
    )
}

/// Builds this server's tables in the layout the master places it in: the job's first
/// one, the current one (a replaced server), or one being formed by a re-sharding
/// (`joining`: the rows come from the servers of the previous layout).
async fn build_shard(
    job: &elastrec_job::config::JobConfig,
    index: u32,
    num_ps: u32,
    joining: bool,
    layout: u64,
) -> anyhow::Result<Arc<PsShard>> {
    let num_ps = if num_ps > 0 { num_ps } else { job.cluster.ps };
    if joining {
        eprintln!("PS {index}: joining layout {layout} as server {index} of {num_ps}");
    }
    // Initializing large tables is long CPU work: off the runtime's threads, so the
    // heartbeats go on even where the runtime has one.
    let job = job.clone();
    let shard = tokio::task::spawn_blocking(move || {
        fail_point_slow_build();
        if joining {
            PsShard::joining(&job, index, num_ps, layout)
        } else {
            PsShard::in_layout(&job, index, num_ps, layout)
        }
    })
    .await
    .context("building the tables")??;
    Ok(Arc::new(shard))
}

/// Loads the checkpoint `plan` names (a replaced server), then the dense slice from the
/// successor's replica when `replica_peers` are given (a partial recovery). Returns the
/// seconds it took, and whether the dense slice stayed at the checkpoint's version (no
/// replica could give it).
async fn restore_state(
    shard: &PsShard,
    index: u32,
    plan: Option<elastrec_proto::master::RestorePlan>,
    replica_peers: Option<&[String]>,
    token: &str,
) -> anyhow::Result<(f64, bool)> {
    let t0 = std::time::Instant::now();
    if let Some(plan) = plan.filter(|p| !p.chain.is_empty()) {
        let (version, shm, storage) = shard.restore(&plan).await.with_context(|| {
            format!(
                "PS {index}: restoring checkpoint {:?} from {}",
                plan.chain, plan.location
            )
        })?;
        eprintln!(
            "PS {index}: restored checkpoint {:?} (written by {} PS) in {:.3} s: {shm} parts from shared memory, {storage} from storage; dense version {version}",
            plan.chain,
            plan.num_ps,
            t0.elapsed().as_secs_f64()
        );
    }
    let mut dense_rewound = false;
    if let Some(peers) = replica_peers {
        match shard.take_dense_replica(peers, token).await {
            Ok(version) => eprintln!(
                "PS {index}: dense slice and optimizer state taken from the successor's \
                 replica: dense version {version}"
            ),
            Err(why) => {
                dense_rewound = true;
                eprintln!(
                    "PS {index}: warning: the dense slice stays at the checkpoint's version {}, \
                     behind the rest of the dense model: {why}",
                    shard.version()
                );
            }
        }
    }
    Ok((t0.elapsed().as_secs_f64(), dense_rewound))
}

/// A PS's heartbeat: its dense step and its process profile (a PS trains no task).
fn heartbeat(node_id: u32, step: u64, fenced: bool) -> HeartbeatRequest {
    HeartbeatRequest {
        version: rpc::version(),
        node_id,
        task_id: 0,
        offset: 0,
        samples: 0,
        step,
        profile: Some(ps_profile()),
        fenced,
    }
}
