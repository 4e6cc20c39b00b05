//! A node's registration with the job master: how a parameter server or a worker, started
//! with only the master's address and its node id, learns its job (the job file, the PS
//! layout, the heartbeat interval and, for a PS, the checkpoint to load).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;
use elastrec_proto::master::{RegisterRequest, RestorePlan, Role};
use elastrec_rpc::{self as rpc, is_transient, Master};

use crate::JobConfig;

/// What the master tells a node that registers.
#[derive(Debug)]
pub struct Registration {
    /// The job.
    pub job: JobConfig,
    /// PS addresses by index (empty until every PS registered, when not waited for).
    pub ps_addrs: Vec<String>,
    /// Heartbeat interval, ms.
    pub heartbeat_ms: u64,
    /// PS: the checkpoint to load before serving.
    pub restore: Option<RestorePlan>,
    /// Version of the PS layout `ps_addrs` belongs to (0: the job's first one).
    pub layout_version: u64,
    /// PS count of that layout (0: `cluster.ps` of the job).
    pub num_ps: u32,
    /// PS: this server joins a re-sharding in progress (starts empty, receives its rows).
    pub joining: bool,
    /// PS: the running servers' addresses by index ("" where one is not running).
    pub peer_addrs: Vec<String>,
    /// PS: the node ids of `peer_addrs` (0 where one is not running).
    pub peer_nodes: Vec<u32>,
    /// PS: relaunched by a partial recovery, it takes its dense slice from the replica its
    /// successor keeps.
    pub dense_from_replica: bool,
}

/// Registers a node (serving PS RPCs on `addr` and metrics on `metrics_addr`, either
/// empty when not bound yet) with the master, retrying while it is unreachable. Returns the job,
/// the PS addresses (waiting until every PS is up when `need_ps`), the heartbeat interval
/// and, for a parameter server, the checkpoint it must load before serving.
pub async fn register(
    master: &mut Master,
    role: Role,
    node_id: u32,
    addr: &str,
    metrics_addr: &str,
    need_ps: bool,
) -> anyhow::Result<(JobConfig, Vec<String>, u64, Option<RestorePlan>)> {
    let r = register_node(master, role, node_id, addr, metrics_addr, need_ps).await?;
    Ok((r.job, r.ps_addrs, r.heartbeat_ms, r.restore))
}

/// [`register`], with everything the master answers (the PS layout included).
pub async fn register_node(
    master: &mut Master,
    role: Role,
    node_id: u32,
    addr: &str,
    metrics_addr: &str,
    need_ps: bool,
) -> anyhow::Result<Registration> {
    let req = RegisterRequest {
        version: rpc::version(),
        role: role as i32,
        node_id,
        addr: addr.to_string(),
        metrics_addr: metrics_addr.to_string(),
        pid: std::process::id(),
        restore_s: 0.0,
        dense_rewound: false,
    };
    register_request(master, req, need_ps).await
}

/// [`register_node`] with the whole request (a PS reports its restore time in it).
pub async fn register_request(
    master: &mut Master,
    req: RegisterRequest,
    need_ps: bool,
) -> anyhow::Result<Registration> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let r = master.register(req.clone()).await;
        match r {
            Ok(r) => {
                let r = r.into_inner();
                if !need_ps || !r.ps_addrs.is_empty() {
                    let job = JobConfig::from_toml(&r.job_toml, Path::new("<master>"))?;
                    return Ok(Registration {
                        job,
                        ps_addrs: r.ps_addrs,
                        heartbeat_ms: r.heartbeat_ms as u64,
                        restore: r.restore,
                        layout_version: r.layout_version,
                        num_ps: r.num_ps,
                        joining: r.joining,
                        peer_addrs: r.peer_addrs,
                        peer_nodes: r.peer_nodes,
                        dense_from_replica: r.dense_from_replica,
                    });
                }
            }
            Err(s) if is_transient(&s) => {}
            Err(s) => bail!("master refused registration: {s}"),
        }
        if Instant::now() > deadline {
            bail!("could not register with the master in 120 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
