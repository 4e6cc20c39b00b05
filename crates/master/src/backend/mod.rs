//! Where nodes run: one trait, one implementation per cluster engine. Every backend starts
//! a node from the same [`LaunchSpec`] (command, environment, secrets, resources), so a job
//! behaves the same on local processes, Slurm or Kubernetes; only how a process is placed,
//! watched and stopped differs.

pub mod cgroup;
pub mod kubernetes;
mod local;
pub mod netns;
mod slurm;

pub use kubernetes::KubernetesPods;
pub use local::{runs_node, LocalProcesses};
pub use slurm::SlurmSteps;

use crate::events::event;
use crate::job::Node;
use crate::launch::LaunchTemplate;

/// Launches and stops the role processes of a job.
pub trait ClusterBackend: Send + Sync {
    /// Starts `node`'s process; returns its pid (0 where the engine hides it).
    fn start(&self, node: &Node) -> anyhow::Result<u32>;
    /// Stops `node`'s process forcefully (it may already be gone).
    fn stop(&self, node: &Node);
    /// Nodes whose processes ended since the last call, with the engine's reason. Backends
    /// that cannot observe exits return nothing; heartbeat timeouts then detect deaths.
    fn exited(&self) -> Vec<NodeExit>;
    /// True when `node`'s process still runs, including one started by an earlier master
    /// of the same job (after `run --resume`). Backends that cannot tell say `true` and
    /// leave the verdict to heartbeat timeouts.
    fn is_alive(&self, node: &Node) -> bool {
        let _ = node;
        true
    }
    /// Cores (compute threads) of the workers started from now on (vertical scaling).
    /// Backends that size nodes otherwise ignore it.
    fn set_worker_threads(&self, threads: usize) {
        let _ = threads;
    }
    /// Changes a running node's limits in place (`None`: unchanged): vertical scaling
    /// without a restart. `Ok(false)`: this engine cannot (the caller replaces the node or
    /// keeps its limits).
    fn resize(&self, node: &Node, change: Resize) -> anyhow::Result<bool> {
        let _ = (node, change);
        Ok(false)
    }
    /// [`ClusterBackend::resize`] changes running nodes (a plan may then change a PS's
    /// cores without a restart).
    fn resizes_in_place(&self) -> bool {
        false
    }
    /// The engine holds each node to its memory limit itself (a kernel control group, a
    /// pod's limit): the master's resident-memory watchdog is not needed.
    fn enforces_memory(&self) -> bool {
        false
    }
    /// Releases what the engine holds for the job once none of its nodes runs any more
    /// (the job ended, or an interrupted master stopped every node): Kubernetes deletes
    /// the job's pods and Secret. Backends with nothing to release ignore it.
    fn finish(&self) {}
    /// Nodes the engine still holds in its queue (submitted, waiting for resources): they
    /// are not silent, so their heartbeat timeout starts only once they run. Backends
    /// without a queue return nothing.
    fn queued(&self) -> Vec<u32> {
        Vec::new()
    }
}

/// A backend that launches nothing: the nodes of `elastrec bench-master` are simulated
/// clients that register themselves, and tests drive a master without processes.
pub struct NoProcesses;

impl ClusterBackend for NoProcesses {
    fn start(&self, _: &Node) -> anyhow::Result<u32> {
        Ok(0)
    }
    fn stop(&self, _: &Node) {}
    fn exited(&self) -> Vec<NodeExit> {
        Vec::new()
    }
}

/// A change of a running node's limits; `None` leaves one as it is.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Resize {
    /// Cores.
    pub cpu: Option<f64>,
    /// Memory, bytes.
    pub memory_bytes: Option<u64>,
}

/// A node process that ended, as the engine reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeExit {
    /// The node.
    pub id: u32,
    /// The engine's words: an exit status, a Slurm state, a pod's termination reason.
    pub reason: String,
    /// The engine killed it for exceeding its memory (OOMKilled, Slurm OUT_OF_MEMORY).
    pub oom: bool,
}

impl NodeExit {
    /// An exit with `reason`, not for memory.
    pub fn new(id: u32, reason: impl Into<String>) -> Self {
        Self {
            id,
            reason: reason.into(),
            oom: false,
        }
    }
}

/// The cluster engines `elastrec run --backend` knows.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// Child processes of the master on this machine.
    #[default]
    Local,
    /// One Slurm job step (`srun`) per node.
    Slurm,
    /// One pod per node through the Kubernetes API.
    Kubernetes,
}

impl BackendKind {
    /// The name used on the command line and in the job's state.
    pub fn name(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Slurm => "slurm",
            Self::Kubernetes => "kubernetes",
        }
    }
}

/// The backend of `kind` for a job whose nodes start from `template`; `engine` is the
/// job's `[engine]` section, `enforce_limits` whether nodes are held to their launch
/// specs' cores and memory on the local backend. Engines check here, before any node
/// starts, that they can run the job.
pub fn open(
    kind: BackendKind,
    template: std::sync::Arc<LaunchTemplate>,
    engine: &elastrec_job::resources::EngineConfig,
    enforce_limits: bool,
) -> anyhow::Result<std::sync::Arc<dyn ClusterBackend>> {
    match kind {
        BackendKind::Local => {
            let groups = if enforce_limits {
                local_cgroups(&template, engine.local.cgroups)?
            } else {
                None
            };
            let placement = netns::NetnsPlacement::new(&engine.local.netns);
            Ok(std::sync::Arc::new(
                LocalProcesses::new(template, groups).with_netns(placement),
            ))
        }
        BackendKind::Slurm => Ok(std::sync::Arc::new(SlurmSteps::open(
            template,
            &engine.slurm,
        )?)),
        BackendKind::Kubernetes => Ok(std::sync::Arc::new(KubernetesPods::open(
            template,
            &engine.kubernetes,
        )?)),
    }
}

/// The job's control groups on this host per `engine.local.cgroups`: `auto` falls back
/// to threads and the watchdog (saying why), `on` refuses the job.
fn local_cgroups(
    template: &LaunchTemplate,
    mode: elastrec_job::resources::CgroupMode,
) -> anyhow::Result<Option<cgroup::Cgroups>> {
    use elastrec_job::resources::CgroupMode;
    if mode == CgroupMode::Off {
        return Ok(None);
    }
    match cgroup::Cgroups::open(&format!("elastrec-{}", template.job_uid)) {
        Ok(groups) => {
            event!("cgroups", enforced = true,
                "master: nodes' cores and memory are enforced by the kernel ({})",
                groups.describe()
            );
            Ok(Some(groups))
        }
        Err(why) if mode == CgroupMode::On => anyhow::bail!(
            "engine.local.cgroups = \"on\", but this host gives the master no control groups: {why}; set it to \"auto\" to enforce limits with threads and a memory watchdog"
        ),
        Err(why) => {
            event!("cgroups", enforced = false, why = %why,
                "master: no control groups on this host ({why}); nodes' memory is enforced by the master's watchdog, a worker's cores by its threads"
            );
            Ok(None)
        }
    }
}
