//! The `[resources]` and `[engine]` sections of a job file: what each role asks of the
//! cluster engine (cores, memory, count) and how to reach the engine. Every backend turns
//! the same `[resources]` into its own requests: local threads and an RSS watchdog, Slurm
//! `--cpus-per-task` / `--mem`, Kubernetes `resources.requests` / `limits`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::config::{ConfigError, JobConfig};

/// The `[resources]` section: one entry per role.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ResourcesConfig {
    /// The job master (the `elastrec run` process; sized only where the engine runs it).
    pub master: RoleResources,
    /// Each parameter server.
    pub ps: RoleResources,
    /// Each worker.
    pub worker: RoleResources,
}

/// What one node of a role asks for.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RoleResources {
    /// Number of nodes of this role; 0 takes `cluster.ps` / `cluster.workers` (giving
    /// both with different values is an error). Not used for the master.
    pub count: u32,
    /// Cores (fractions allowed: Kubernetes millicores; Slurm rounds up).
    pub cpu: f64,
    /// Memory, GiB: the request and the limit (Kubernetes), `--mem` (Slurm), the RSS
    /// watchdog's limit (local, with `[autoscale]`).
    pub memory_gb: f64,
    /// Most memory a node of this role may be given, GiB: after the engine kills one for
    /// exceeding its memory (OOMKilled, Slurm OUT_OF_MEMORY), the role's nodes start with
    /// 1.5 times more, up to this; 0: twice `memory_gb`.
    pub memory_gb_max: f64,
}

impl Default for RoleResources {
    fn default() -> Self {
        Self {
            count: 0,
            cpu: 1.0,
            memory_gb: 2.0,
            memory_gb_max: 0.0,
        }
    }
}

impl RoleResources {
    /// Memory in MiB, rounded up (Slurm `--mem` and Kubernetes `Mi` quantities).
    pub fn memory_mib(&self) -> u64 {
        (self.memory_gb * 1024.0).ceil() as u64
    }

    /// The most memory a node of this role may be given, MiB.
    pub fn memory_max_mib(&self) -> u64 {
        let max = if self.memory_gb_max > 0.0 {
            self.memory_gb_max
        } else {
            2.0 * self.memory_gb
        };
        (max * 1024.0).ceil() as u64
    }

    /// Cores as whole CPUs, rounded up, at least 1 (Slurm `--cpus-per-task`).
    pub fn whole_cpus(&self) -> u32 {
        (self.cpu.ceil() as u32).max(1)
    }

    /// Cores in Kubernetes millicores (at least 1m).
    pub fn millicores(&self) -> u64 {
        ((self.cpu * 1000.0).round() as u64).max(1)
    }
}

/// Checks `[resources]` and folds the counts into `[cluster]`, naming the field at fault.
/// `given` is the job file's own table, to tell a `cluster.workers` the file gives from the
/// default.
pub fn resolve_resources(
    cfg: &mut JobConfig,
    given: &toml::Table,
    path: &Path,
) -> Result<(), ConfigError> {
    let in_cluster = |key: &str| {
        given
            .get("cluster")
            .and_then(|c| c.as_table())
            .is_some_and(|c| c.contains_key(key))
    };
    let bad = |field: &'static str, reason: String| ConfigError::Invalid {
        path: path.to_path_buf(),
        field,
        reason,
    };
    let roles = [
        ("resources.master", &cfg.resources.master),
        ("resources.ps", &cfg.resources.ps),
        ("resources.worker", &cfg.resources.worker),
    ];
    for (field, r) in roles {
        if !(r.cpu.is_finite() && r.cpu > 0.0) {
            return Err(bad(field, format!("cpu must be > 0 (got {})", r.cpu)));
        }
        if !(r.memory_gb.is_finite() && r.memory_gb > 0.0) {
            return Err(bad(
                field,
                format!("memory_gb must be > 0 (got {})", r.memory_gb),
            ));
        }
        if !(r.memory_gb_max == 0.0 || r.memory_gb_max >= r.memory_gb) {
            return Err(bad(
                field,
                format!(
                    "memory_gb_max ({}) must be 0 or at least memory_gb ({})",
                    r.memory_gb_max, r.memory_gb
                ),
            ));
        }
    }
    if cfg.engine.slurm.poll_ms == 0 {
        return Err(bad("engine.slurm.poll_ms", "must be > 0".into()));
    }
    if cfg.resources.master.count != 0 {
        return Err(bad(
            "resources.master.count",
            "a job has one master; leave count out".into(),
        ));
    }
    for (field, count, cluster, given, name) in [
        (
            "resources.ps.count",
            cfg.resources.ps.count,
            &mut cfg.cluster.ps,
            in_cluster("ps"),
            "cluster.ps",
        ),
        (
            "resources.worker.count",
            cfg.resources.worker.count,
            &mut cfg.cluster.workers,
            in_cluster("workers"),
            "cluster.workers",
        ),
    ] {
        if count == 0 {
            continue;
        }
        if given && *cluster != count {
            return Err(bad(
                field,
                format!("{count} contradicts {name} = {cluster}; give one of them"),
            ));
        }
        *cluster = count;
    }
    Ok(())
}

/// The `[engine]` section: settings of the cluster engines (`elastrec run --backend`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// Where nodes bind and what address they advertise (every backend).
    pub network: NetworkConfig,
    /// Transport security of the job's channels.
    pub tls: elastrec_rpc::tls::TlsConfig,
    /// How nodes are placed on Slurm (`--backend slurm`).
    pub slurm: SlurmConfig,
    /// Pods: image, namespace, identity (`--backend kubernetes`).
    pub kubernetes: KubernetesConfig,
    /// How the local backend enforces nodes' limits (`--backend local`).
    pub local: LocalConfig,
}

/// How the local backend (`--backend local`) holds nodes to their CPU and memory.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LocalConfig {
    /// Where limits are enforced by the kernel (a control group per node) or by the
    /// master (compute threads and a resident-memory watchdog).
    pub cgroups: CgroupMode,
    /// Hold every node to its role's `[resources]` (cores and memory) even without
    /// `[autoscale]`; by default a local job without autoscaling uses the machine freely.
    pub enforce_resources: bool,
    /// The Linux network namespace each node runs in, as a hosts' stand-in: a name
    /// template where `{role}` becomes `ps`, `worker` or `executor` and `{index}` the
    /// node's index (a PS's shard, a worker's launch number), e.g. `"h-{role}{index}"`.
    /// The namespaces must exist (`ip netns add`, root only); a relaunched PS returns to
    /// its shard's. Empty (the default): every node shares the master's network stack.
    pub netns: String,
}

/// Longest network namespace name: a file name under `/run/netns`.
pub const MAX_NETNS_NAME: usize = 255;

/// The network namespace `template` (`engine.local.netns`) names for the node `index` of
/// `role` (`ps`, `worker`, `executor`).
pub fn netns_name(template: &str, role: &str, index: u32) -> String {
    template
        .replace("{role}", role)
        .replace("{index}", &index.to_string())
}

/// Why `template` cannot be `engine.local.netns`: a name it makes must be one file name
/// under `/run/netns` (letters, digits, `.`, `-`, `_`).
pub fn check_netns_template(template: &str) -> Result<(), String> {
    let sample = netns_name(template, "executor", u32::MAX);
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
    if let Some(c) = sample.chars().find(|&c| !plain(c)) {
        return Err(format!(
            "`{template}` makes names with {c:?}: a namespace name has letters, digits, \
             `.`, `-` and `_`, and `{{role}}` and `{{index}}` where the node's go"
        ));
    }
    if sample.starts_with('.') || sample.len() > MAX_NETNS_NAME {
        return Err(format!(
            "`{template}` makes names that are not a file name under /run/netns (a leading \
             `.`, or over {MAX_NETNS_NAME} bytes)"
        ));
    }
    Ok(())
}

/// `engine.local.cgroups`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum CgroupMode {
    /// A control group per node where this host lets the master create them (cgroup v2
    /// with the memory and cpu controllers delegated, or cgroup v1 hierarchies it may
    /// write); otherwise threads and the watchdog.
    #[default]
    Auto,
    /// Control groups or no job: the job refuses to start, saying what is missing.
    On,
    /// Never: threads and the watchdog.
    Off,
}

/// How the Kubernetes backend runs nodes as pods. Every field but `image` has a default
/// that works on a stock cluster; what each one becomes in a pod manifest is shown by
/// `elastrec run JOB --backend kubernetes --dry-run`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesConfig {
    /// Namespace of the job's pods and Secret; empty: the kubeconfig context's namespace
    /// (in a pod: the pod's own namespace), else `default`.
    pub namespace: String,
    /// Container image holding the `elastrec` binary (required by the backend).
    pub image: String,
    /// `Always`, `IfNotPresent` or `Never`; empty: the cluster's default for the image.
    pub image_pull_policy: String,
    /// Service account the node pods run as; empty: the namespace's `default`.
    pub service_account: String,
    /// Path of the `elastrec` executable inside the image.
    pub program: String,
    /// Extra labels on every pod and the Secret (the backend's own labels take precedence).
    pub labels: std::collections::BTreeMap<String, String>,
    /// Kubeconfig file of the master; empty: `KUBECONFIG`, `~/.kube/config`, or the
    /// in-cluster service account when the master runs in a pod.
    pub kubeconfig: String,
    /// Node labels a pod's node must have (`nodeSelector`), e.g. `{ pool = "training" }`.
    pub node_selector: std::collections::BTreeMap<String, String>,
    /// Taints the pods tolerate (`[[engine.kubernetes.tolerations]]`).
    pub tolerations: Vec<Toleration>,
    /// Secrets holding the registry credentials of `image` (`imagePullSecrets`).
    pub image_pull_secrets: Vec<String>,
    /// The pods' `priorityClassName`; empty: the cluster's default priority.
    pub priority_class: String,
    /// Run the pods under the "restricted" Pod Security profile: not as root (as
    /// `run_as_user`), no privilege escalation, every capability dropped, the runtime's
    /// default seccomp profile. `false`: the image's own user and the runtime's defaults.
    pub restricted: bool,
    /// The user id the containers run as when `restricted` (the image's files must be
    /// readable by it); 65532 is the `nonroot` user of distroless images.
    pub run_as_user: i64,
    /// Volumes mounted into every pod (`[[engine.kubernetes.volumes]]`): where the data
    /// files, a local checkpoint directory and the job directory live on the cluster.
    pub volumes: Vec<Volume>,
    /// Seconds a pod may wait to run (unscheduled, its image pulled, its container
    /// created) before the master gives up on it as on a failed node; while it waits it
    /// is queued, not silent, so `cluster.dead_after_ms` does not apply to it.
    pub pending_timeout_s: u64,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        Self {
            namespace: String::new(),
            image: String::new(),
            image_pull_policy: String::new(),
            service_account: String::new(),
            program: "/usr/local/bin/elastrec".into(),
            labels: Default::default(),
            kubeconfig: String::new(),
            node_selector: Default::default(),
            tolerations: Vec::new(),
            image_pull_secrets: Vec::new(),
            priority_class: String::new(),
            restricted: true,
            run_as_user: 65532,
            volumes: Vec::new(),
            pending_timeout_s: 600,
        }
    }
}

/// A taint the job's pods tolerate (Kubernetes `Toleration`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Toleration {
    /// The taint's key; empty with `operator = "Exists"`: every taint.
    pub key: String,
    /// `Equal` (the default: the taint's value must be `value`) or `Exists`.
    pub operator: String,
    /// The taint's value (`Equal` only).
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`; empty: every effect.
    pub effect: String,
    /// With `NoExecute`: seconds a pod stays after the taint appears; none: for ever.
    pub toleration_seconds: Option<i64>,
}

/// A volume mounted into every pod of the job.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Volume {
    /// Its name in the pod (a DNS label: lowercase letters, digits, `-`).
    pub name: String,
    /// Where the containers see it (an absolute path).
    pub mount_path: String,
    /// Mounted read-only.
    pub read_only: bool,
    /// A PersistentVolumeClaim of the job's namespace: its name.
    pub claim: String,
    /// A directory of the node (`hostPath`): its path.
    pub host_path: String,
    /// An `emptyDir` (scratch for the pod's life, e.g. `/dev/shm` for a PS's flash
    /// checkpoints): set `empty_dir = true`.
    pub empty_dir: bool,
    /// `emptyDir` only: `Memory` for a tmpfs (what `/dev/shm` needs); empty: the node's
    /// disk.
    pub medium: String,
    /// `emptyDir` only: its size limit, as Kubernetes writes quantities (`2Gi`); empty:
    /// none.
    pub size: String,
}

/// The `[engine.slurm]` section: where the Slurm backend submits its steps and which
/// Slurm commands it runs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SlurmConfig {
    /// `--partition` of every node; empty: the cluster's default partition (or, inside an
    /// allocation, the allocation's).
    pub partition: String,
    /// `--account` every node is charged to; empty: the user's default account.
    pub account: String,
    /// More `srun` options for every node (e.g. `--constraint=avx512`, `--time=2:00:00`),
    /// placed before the program.
    pub extra_args: Vec<String>,
    /// Directory holding `srun`, `squeue`, `sacct`, `scancel`, `sinfo` and `sbatch`;
    /// empty: found on `PATH`.
    pub bin_dir: String,
    /// How often the backend asks Slurm about its steps, milliseconds.
    pub poll_ms: u64,
}

impl Default for SlurmConfig {
    fn default() -> Self {
        Self {
            partition: String::new(),
            account: String::new(),
            extra_args: Vec::new(),
            bin_dir: String::new(),
            poll_ms: 500,
        }
    }
}

/// How nodes are reached across hosts. The master binds `cluster.bind` (its port
/// `cluster.master_port`); these settings place the parameter servers and workers, which
/// on a cluster run on other hosts than the master.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkConfig {
    /// Address the PS and workers bind their servers to; empty: `cluster.bind`
    /// (loopback by default, which only the local backend can use; `0.0.0.0` on a
    /// cluster).
    pub bind: String,
    /// Address peers reach a PS or worker at; empty: the bind address when it is a
    /// specific one, otherwise the host's own address (`ELASTREC_ADVERTISE` in a node's
    /// environment overrides it, e.g. a pod IP from the downward API).
    pub advertise: String,
    /// Address the nodes reach the master at, when the master binds all interfaces;
    /// empty: the host's own address.
    pub master_advertise: String,
}

/// This host's address as other hosts reach it: the source address of a route to a
/// public address (no packet is sent: connecting a UDP socket only picks the route), or
/// loopback on a machine with no route at all.
pub fn host_address() -> std::io::Result<String> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0")?;
    Ok(match socket.connect("192.0.2.1:9") {
        Ok(()) => socket.local_addr()?.ip().to_string(),
        Err(_) => "127.0.0.1".into(),
    })
}

/// Why an address to bind or advertise cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AddressError {
    /// `engine.network.master_advertise` names neither an IP address nor a host.
    #[error("engine.network.master_advertise: `{0}` is neither an IP address nor a host name")]
    NotAHostName(String),
    /// No route tells this host's own address.
    #[error("finding this host's address: {0}")]
    NoHostAddress(#[source] std::io::Error),
    /// An advertised address (`ELASTREC_ADVERTISE`, `[engine.network] advertise`) that is
    /// not an IP address.
    #[error("advertised address `{0}` is not an IP address")]
    NotAnAdvertisedIp(String),
    /// An address to bind that is not an IP address, and where it was set.
    #[error("{setting}: `{value}` is not an IP address")]
    NotABindIp {
        /// The environment variable or job file key.
        setting: &'static str,
        /// Its value.
        value: String,
    },
}

/// Environment variable overriding the address a node advertises.
pub const ADVERTISE_ENV: &str = "ELASTREC_ADVERTISE";

/// The address a PS or worker started on this host advertises for a server bound to
/// `bound`: `ELASTREC_ADVERTISE` when set (a pod IP from the downward API, a Slurm node's
/// address), else `[engine.network] advertise`, else the bound address when it is a
/// specific one, else this host's address.
pub fn advertise_for(
    cfg: &EngineConfig,
    bound: std::net::SocketAddr,
) -> Result<String, AddressError> {
    let from_env = std::env::var(ADVERTISE_ENV).ok().filter(|v| !v.is_empty());
    let configured = (!cfg.network.advertise.is_empty()).then(|| cfg.network.advertise.clone());
    advertise(from_env.or(configured), bound)
}

/// The address the nodes reach a master bound to `bound` at: `[engine.network]
/// master_advertise` (an IP address or a DNS name, e.g. a Kubernetes Service that still
/// names the master after it restarts in a new pod), else the bound address when
/// specific, else this host's address.
pub fn master_advertise(
    cfg: &EngineConfig,
    bound: std::net::SocketAddr,
) -> Result<String, AddressError> {
    let name = &cfg.network.master_advertise;
    if !name.is_empty() && name.parse::<std::net::IpAddr>().is_err() {
        if !is_dns_name(name) {
            return Err(AddressError::NotAHostName(name.clone()));
        }
        return Ok(format!("{name}:{}", bound.port()));
    }
    let configured = (!name.is_empty()).then(|| name.clone());
    advertise(configured, bound)
}

/// True for a host name: dot-separated labels of letters, digits and `-`.
pub fn is_dns_name(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

fn advertise(host: Option<String>, bound: std::net::SocketAddr) -> Result<String, AddressError> {
    let host = match host {
        Some(h) => h,
        None if !bound.ip().is_unspecified() => return Ok(bound.to_string()),
        None => host_address().map_err(AddressError::NoHostAddress)?,
    };
    let ip: std::net::IpAddr = host
        .parse()
        .map_err(|_| AddressError::NotAnAdvertisedIp(host.clone()))?;
    Ok(std::net::SocketAddr::new(ip, bound.port()).to_string())
}

/// Environment variable overriding the address a node binds to (a pod binds every
/// interface of its own network namespace while the master outside keeps its address).
pub const BIND_ENV: &str = "ELASTREC_BIND";

/// The address a PS or worker binds its servers to: `ELASTREC_BIND` when set, else
/// `[engine.network] bind`, else `cluster.bind`.
pub fn bind_address(cfg: &JobConfig) -> Result<std::net::IpAddr, AddressError> {
    let (setting, bind) = match std::env::var(BIND_ENV).ok().filter(|v| !v.is_empty()) {
        Some(bind) => (BIND_ENV, bind),
        None if cfg.engine.network.bind.is_empty() => ("cluster.bind", cfg.cluster.bind.clone()),
        None => ("engine.network.bind", cfg.engine.network.bind.clone()),
    };
    bind.parse().map_err(|_| AddressError::NotABindIp {
        setting,
        value: bind,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<JobConfig, ConfigError> {
        JobConfig::from_toml(text, Path::new("job.toml"))
    }

    #[test]
    fn counts_fold_into_cluster_and_contradictions_are_named() {
        let cfg = parse("[resources.worker]\ncount = 4\n[resources.ps]\ncount = 3\n").unwrap();
        assert_eq!((cfg.cluster.workers, cfg.cluster.ps), (4, 3));
        let err = parse("[cluster]\nworkers = 2\n[resources.worker]\ncount = 4\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("resources.worker.count"), "{err}");
        assert!(err.contains("cluster.workers = 2"), "{err}");
    }

    #[test]
    fn bad_sizes_name_the_role() {
        let err = parse("[resources.ps]\ncpu = 0\n").unwrap_err().to_string();
        assert!(err.contains("resources.ps"), "{err}");
        let err = parse("[resources.worker]\nmemory_gb = -1\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("resources.worker"), "{err}");
        let err = parse("[resources.master]\ncount = 2\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("resources.master.count"), "{err}");
    }

    #[test]
    fn the_master_may_be_advertised_by_name_nodes_by_address() {
        let bound: std::net::SocketAddr = "0.0.0.0:7070".parse().unwrap();
        let mut e = EngineConfig::default();
        e.network.master_advertise = "job-master.ml.svc".into();
        assert_eq!(
            master_advertise(&e, bound).unwrap(),
            "job-master.ml.svc:7070"
        );
        e.network.master_advertise = "10.1.2.3".into();
        assert_eq!(master_advertise(&e, bound).unwrap(), "10.1.2.3:7070");
        e.network.master_advertise = "bad name!".into();
        assert!(master_advertise(&e, bound).is_err());
        let specific: std::net::SocketAddr = "127.0.0.2:5".parse().unwrap();
        assert_eq!(
            advertise_for(&EngineConfig::default(), specific).unwrap(),
            "127.0.0.2:5"
        );
        let err = parse("[engine.network]\nadvertise = \"node-1\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("engine.network.advertise"), "{err}");
    }

    #[test]
    fn slurm_settings_parse_and_unknown_keys_are_refused() {
        let cfg = parse("[engine.slurm]\npartition = \"gpu\"\nextra_args = [\"--time=1:00:00\"]\n")
            .unwrap();
        assert_eq!(cfg.engine.slurm.partition, "gpu");
        assert_eq!(cfg.engine.slurm.extra_args, ["--time=1:00:00"]);
        assert_eq!(cfg.engine.slurm.poll_ms, 500);
        let err = parse("[engine.slurm]\nqueue = \"x\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("queue"), "{err}");
        let err = parse("[engine.slurm]\npoll_ms = 0\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("engine.slurm.poll_ms"), "{err}");
    }

    #[test]
    fn engine_units() {
        let r = RoleResources {
            count: 0,
            cpu: 1.5,
            memory_gb: 0.5,
            memory_gb_max: 0.0,
        };
        assert_eq!(r.memory_max_mib(), 1024);
        assert_eq!(
            (r.whole_cpus(), r.millicores(), r.memory_mib()),
            (2, 1500, 512)
        );
    }
}
