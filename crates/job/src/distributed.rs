//! The distributed sections of a job file: `[cluster]` (parameter servers, workers,
//! sharding, failure policy) and `[checkpoint]` (flash checkpoints, recovery, CPR), read by
//! `elastrec run` and ignored by the single-process `elastrec train`. Typo-proof like the
//! rest: unknown keys are errors naming the key.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::{ConfigError, JobConfig};

/// How gradients from several workers meet on the PS.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SyncMode {
    /// Every push is applied at once; a worker's dense copy lags the PS by at most
    /// `cluster.staleness` updates.
    #[default]
    Async,
    /// Gradients of one global step from every active worker are averaged, then applied.
    Sync,
}

/// The `[cluster]` section.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// Number of parameter servers.
    pub ps: u32,
    /// Number of workers at start (change at runtime with `elastrec scale`).
    pub workers: u32,
    /// Data executors (Primus's data workers): processes that read and parse the
    /// workers' file tasks and serve them ready batches (`docs/data.md`). 0: every worker
    /// reads its own tasks.
    pub executors: u32,
    /// Scale the data executors between 1 and this many by Primus Eq. 1
    /// (`docs/data.md`, "Data executors"); 0: keep `executors` fixed.
    pub max_executors: u32,
    /// Eq. 1's weights `w` of the executors' utilization `u = [serving-buffer hit rate,
    /// CPU utilization, memory utilization]`: `L_u = w · u`.
    pub executor_weights: [f64; 3],
    /// Eq. 1's `L_θ`: below `threshold − band` an executor is added (the workers wait for
    /// parsing), above `threshold + band` one is removed (data waits for the workers).
    pub executor_threshold: f64,
    /// Half-width of the band around `executor_threshold` where the count stays.
    pub executor_band: f64,
    /// Seconds between two executor scaling decisions.
    pub executor_interval_s: f64,
    /// `"async"` (bounded staleness) or `"sync"`.
    pub mode: SyncMode,
    /// Async mode: dense-parameter updates a worker may lag behind before it re-pulls.
    pub staleness: u32,
    /// Async mode: the job's first this-many batches are trained by one worker while the
    /// others wait, so the workers do not all take their first (largest, for Adagrad)
    /// steps from the same initial parameters.
    pub warmup_steps: u32,
    /// Sync mode: how long a PS waits for the missing gradients of a step (ms) before it
    /// applies the ones it has (a worker may have died).
    pub sync_timeout_ms: u64,
    /// Batches per data shard (task).
    pub batches_per_shard: u32,
    /// Shuffle the order of shards in every epoch.
    pub shuffle: bool,
    /// Seed of the shard shuffle.
    pub seed: u64,
    /// Heartbeat interval of every node (ms).
    pub heartbeat_ms: u64,
    /// A node silent this long is declared dead (ms).
    pub dead_after_ms: u64,
    /// A worker slower than this fraction of its peers' median rate gets half-size shards.
    pub straggler_ratio: f64,
    /// Dead workers relaunched over the whole job.
    pub max_worker_restarts: u32,
    /// Address the master and the PS bind to.
    pub bind: String,
    /// Port of the master's gRPC service (0: any free port).
    pub master_port: u16,
    /// Port of the master's Prometheus `/metrics` endpoint (0: any free port).
    pub metrics_port: u16,
    /// Fixed `/metrics` ports for the other nodes: node `N` (PS, worker) serves on this
    /// port + N (0: any free port). Node ids grow as nodes are replaced or added, so keep
    /// room above it. Prometheus finds either kind through `prometheus-targets.json`.
    pub node_metrics_port_base: u16,
    /// Largest gRPC message accepted (bytes).
    pub max_message_bytes: usize,
    /// Deadline of a worker's call to a parameter server (pull, push), ms: a hung server
    /// makes the call fail and be retried instead of blocking the worker forever. Must
    /// exceed `sync_timeout_ms` (a sync push waits that long for the step).
    pub rpc_timeout_ms: u64,
}

/// Upper bound of `cluster.max_message_bytes`: gRPC frames carry a 32-bit length, and
/// one message that large is already more than a node should buffer.
pub const MAX_MESSAGE_BYTES_LIMIT: usize = 1 << 30;
/// Upper bound of `cluster.sync_timeout_ms` and `cluster.rpc_timeout_ms` (10 minutes).
pub const MAX_TIMEOUT_MS: u64 = 600_000;

impl ClusterConfig {
    /// The lease a worker or PS holds from the master, counted from the send of its last
    /// acknowledged heartbeat (`heartbeat_ms`: the interval the master gave it). Past it the
    /// node stops changing anything. Two heartbeats short of `dead_after_ms`, the silence
    /// after which the master declares a node dead (timer slack), so the lease runs out
    /// before that verdict can come; never under one heartbeat, or no renewal could keep it.
    pub fn lease(&self, heartbeat_ms: u64) -> std::time::Duration {
        std::time::Duration::from_millis(
            self.dead_after_ms
                .saturating_sub(2 * heartbeat_ms)
                .max(heartbeat_ms),
        )
    }

    /// The deadline of a worker's PS call.
    pub fn rpc_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.rpc_timeout_ms)
    }

    /// The `/metrics` port of node `node_id` (`node_metrics_port_base` + id; 0: any).
    pub fn node_metrics_port(&self, node_id: u32) -> Result<u16, String> {
        if self.node_metrics_port_base == 0 {
            return Ok(0);
        }
        u16::try_from(u32::from(self.node_metrics_port_base) + node_id).map_err(|_| {
            format!(
                "node {node_id}'s metrics port would be {} + {node_id}, above 65535: lower \
                 cluster.node_metrics_port_base",
                self.node_metrics_port_base
            )
        })
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            ps: 1,
            workers: 2,
            executors: 0,
            max_executors: 0,
            executor_weights: [1.0, 0.0, 0.0],
            executor_threshold: 0.5,
            executor_band: 0.25,
            executor_interval_s: 5.0,
            mode: SyncMode::Async,
            staleness: 0,
            warmup_steps: 100,
            sync_timeout_ms: 2000,
            batches_per_shard: 16,
            shuffle: true,
            seed: 7,
            heartbeat_ms: 500,
            dead_after_ms: 5000,
            straggler_ratio: 0.5,
            max_worker_restarts: 8,
            bind: "127.0.0.1".into(),
            master_port: 0,
            metrics_port: 0,
            node_metrics_port_base: 0,
            max_message_bytes: 64 << 20,
            rpc_timeout_ms: 30_000,
        }
    }
}

// The recovery modes and save priorities are the checkpoint policy's own types.
pub use elastrec_control::checkpoint::{RecoveryChoice, SavePriority};

/// The `[checkpoint]` section: flash checkpoints, recovery, CPR policies.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointConfig {
    /// Take checkpoints at all. Without them a dead PS stops the job.
    pub enabled: bool,
    /// Where checkpoints go: a directory (relative to the job file) or `s3://bucket/prefix`;
    /// empty means `<output.dir>/checkpoints`.
    pub location: String,
    /// Seconds between checkpoints; 0 chooses it: `sqrt(2 · O_save · T_fail)` for full
    /// recovery, `2 · target_pls · N_ps · T_fail` for partial (CPR Eq. 4).
    pub interval_s: f64,
    /// Checkpoints kept (older ones are deleted once a newer one is committed).
    pub keep: usize,
    /// `"full"`, `"partial"` or `"auto"`.
    pub recovery: RecoveryChoice,
    /// Keep each PS's dense slice replicated on the next PS, so that a partial recovery
    /// does not rewind it (ignored with `recovery = "full"`).
    pub dense_replica: bool,
    /// Target portion of lost samples for partial recovery (CPR's PLS).
    pub target_pls: f64,
    /// Mean time between PS failures assumed until failures are observed (s).
    pub mtbf_s: f64,
    /// Partial recovery must save at least this fraction of full recovery's expected
    /// overhead to be chosen by `auto`.
    pub min_benefit: f64,
    /// `"none"`, `"mfu"` or `"ssu"`: delta checkpoints of the hottest rows.
    pub priority: SavePriority,
    /// CPR's r: a delta saves this fraction of each large table's rows, `1/ratio` times as
    /// often as full checkpoints.
    pub ratio: f64,
    /// Tables covering this fraction of all rows count as large (the rest are saved whole).
    pub large_table_coverage: f64,
    /// Keep a shared-memory image of every PS so a relaunched PS reloads without storage.
    pub shm: bool,
    /// Take a checkpoint when the master receives SIGTERM or Ctrl-C, before stopping.
    pub on_sigterm: bool,
    /// A checkpoint not committed within this many seconds (a PS hung or storage stalled)
    /// is abandoned, so that the next one can start.
    pub timeout_s: f64,
}

impl CheckpointConfig {
    /// What the checkpoint policy reads of this section.
    pub fn policy_settings(&self) -> elastrec_control::checkpoint::CheckpointSettings {
        elastrec_control::checkpoint::CheckpointSettings {
            enabled: self.enabled,
            interval_s: self.interval_s,
            recovery: self.recovery,
            target_pls: self.target_pls,
            mtbf_s: self.mtbf_s,
            min_benefit: self.min_benefit,
            priority: self.priority,
            ratio: self.ratio,
        }
    }

    /// The deadline of one checkpoint.
    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.timeout_s)
    }
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            location: String::new(),
            interval_s: 0.0,
            keep: 3,
            recovery: RecoveryChoice::Auto,
            dense_replica: true,
            target_pls: 0.1,
            mtbf_s: 3600.0,
            min_benefit: 0.1,
            priority: SavePriority::None,
            ratio: 0.125,
            large_table_coverage: 0.98,
            shm: true,
            on_sigterm: true,
            timeout_s: 600.0,
        }
    }
}

/// Range checks of the `[cluster]`, `[engine.network]` and `[checkpoint]` sections (part
/// of [`JobConfig::validate`]).
pub(crate) fn validate_distributed(job: &JobConfig, path: &Path) -> Result<(), ConfigError> {
    validate_cluster(&job.cluster, path)?;
    validate_network(job, path)?;
    validate_checkpoint(&job.checkpoint, path)
}

/// The error of `field` in the job file at `path`.
fn invalid(path: &Path) -> impl Fn(&'static str, &str) -> ConfigError + '_ {
    move |field, reason| ConfigError::Invalid {
        path: path.to_path_buf(),
        field,
        reason: reason.to_string(),
    }
}

fn validate_cluster(c: &ClusterConfig, path: &Path) -> Result<(), ConfigError> {
    let bad = invalid(path);
    if c.ps == 0 || c.ps > 64 {
        return Err(bad("cluster.ps", "must be between 1 and 64"));
    }
    if c.workers == 0 || c.workers > 256 {
        return Err(bad("cluster.workers", "must be between 1 and 256"));
    }
    if c.batches_per_shard == 0 {
        return Err(bad("cluster.batches_per_shard", "must be at least 1"));
    }
    if c.executors > 256 || c.max_executors > 256 {
        return Err(bad(
            "cluster.executors",
            "executors and max_executors must be at most 256",
        ));
    }
    if c.max_executors > 0 && (c.executors == 0 || c.max_executors < c.executors) {
        return Err(bad(
            "cluster.max_executors",
            "scaling starts from cluster.executors: needs 1 <= executors <= max_executors",
        ));
    }
    let w = c.executor_weights;
    if w.iter().any(|x| !(x.is_finite() && *x >= 0.0)) || w.iter().sum::<f64>() <= 0.0 {
        return Err(bad(
            "cluster.executor_weights",
            "three weights >= 0, not all zero (buffer hit rate, CPU, memory)",
        ));
    }
    let (t, b) = (c.executor_threshold, c.executor_band);
    if !(t.is_finite() && b.is_finite() && b >= 0.0 && t - b >= 0.0 && t > 0.0) {
        return Err(bad(
            "cluster.executor_threshold",
            "threshold and band must be finite, with 0 <= threshold - band and threshold > 0",
        ));
    }
    if !(c.executor_interval_s.is_finite() && c.executor_interval_s > 0.0) {
        return Err(bad(
            "cluster.executor_interval_s",
            "must be a positive number of seconds",
        ));
    }
    if c.heartbeat_ms == 0 {
        return Err(bad("cluster.heartbeat_ms", "must be at least 1"));
    }
    if c.dead_after_ms < 2 * c.heartbeat_ms {
        return Err(bad(
            "cluster.dead_after_ms",
            "must be at least twice cluster.heartbeat_ms",
        ));
    }
    if !(c.straggler_ratio.is_finite() && (0.0..=1.0).contains(&c.straggler_ratio)) {
        return Err(bad("cluster.straggler_ratio", "must be between 0 and 1"));
    }
    if c.bind.parse::<std::net::IpAddr>().is_err() {
        return Err(bad(
            "cluster.bind",
            "must be an IP address such as 127.0.0.1",
        ));
    }
    if !(1 << 20..=MAX_MESSAGE_BYTES_LIMIT).contains(&c.max_message_bytes) {
        return Err(bad(
            "cluster.max_message_bytes",
            "must be between 1 MiB and 1 GiB",
        ));
    }
    if c.sync_timeout_ms == 0 || c.sync_timeout_ms > MAX_TIMEOUT_MS {
        return Err(bad(
            "cluster.sync_timeout_ms",
            "must be between 1 and 600000 (10 minutes)",
        ));
    }
    if c.rpc_timeout_ms <= c.sync_timeout_ms || c.rpc_timeout_ms > MAX_TIMEOUT_MS {
        return Err(bad(
            "cluster.rpc_timeout_ms",
            "must exceed cluster.sync_timeout_ms and be at most 600000 (10 minutes)",
        ));
    }
    Ok(())
}

/// The nodes' addresses, and the network namespaces of `[engine.local]`.
fn validate_network(job: &JobConfig, path: &Path) -> Result<(), ConfigError> {
    let bad = invalid(path);
    let c = &job.cluster;
    let n = &job.engine.network;
    for (field, value) in [
        ("engine.network.bind", &n.bind),
        ("engine.network.advertise", &n.advertise),
        ("engine.network.master_advertise", &n.master_advertise),
    ] {
        if !value.is_empty() && value.parse::<std::net::IpAddr>().is_err() {
            return Err(bad(
                field,
                "must be an IP address such as 10.0.0.5 (or empty)",
            ));
        }
    }
    let netns = &job.engine.local.netns;
    if !netns.is_empty() {
        crate::resources::check_netns_template(netns).map_err(|why| ConfigError::Invalid {
            path: path.to_path_buf(),
            field: "engine.local.netns",
            reason: why,
        })?;
        // Each node is a host of its own: loopback is its own, which no peer reaches.
        let node_bind = if n.bind.is_empty() { &c.bind } else { &n.bind };
        for (field, value) in [
            ("cluster.bind", &c.bind),
            ("engine.network.bind", node_bind),
        ] {
            if value
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
            {
                return Err(bad(
                    field,
                    "is a loopback address, which nodes in their own network namespaces \
                     (engine.local.netns) cannot reach: bind 0.0.0.0 or an address of the \
                     namespace's interface",
                ));
            }
        }
    }
    Ok(())
}

fn validate_checkpoint(k: &CheckpointConfig, path: &Path) -> Result<(), ConfigError> {
    let bad = invalid(path);
    let positive = |v: f64| v.is_finite() && v > 0.0;
    if !(k.interval_s.is_finite() && k.interval_s >= 0.0) {
        return Err(bad(
            "checkpoint.interval_s",
            "must be 0 (chosen by the policy) or a positive number of seconds",
        ));
    }
    if !(positive(k.timeout_s) && k.timeout_s <= 24.0 * 3600.0) {
        return Err(bad(
            "checkpoint.timeout_s",
            "must be a positive number of seconds, at most a day",
        ));
    }
    if k.keep == 0 {
        return Err(bad("checkpoint.keep", "must be at least 1"));
    }
    if !(positive(k.target_pls) && k.target_pls <= 1.0) {
        return Err(bad("checkpoint.target_pls", "must be in (0, 1]"));
    }
    if !positive(k.mtbf_s) {
        return Err(bad(
            "checkpoint.mtbf_s",
            "must be a positive number of seconds",
        ));
    }
    if !(k.min_benefit.is_finite() && (0.0..1.0).contains(&k.min_benefit)) {
        return Err(bad("checkpoint.min_benefit", "must be in [0, 1)"));
    }
    if !(positive(k.ratio) && k.ratio <= 1.0) {
        return Err(bad("checkpoint.ratio", "must be in (0, 1]"));
    }
    if !(positive(k.large_table_coverage) && k.large_table_coverage <= 1.0) {
        return Err(bad("checkpoint.large_table_coverage", "must be in (0, 1]"));
    }
    if let Some(rest) = k.location.strip_prefix("s3://") {
        if rest.split('/').next().unwrap_or("").is_empty() {
            return Err(bad(
                "checkpoint.location",
                "an S3 location needs a bucket: s3://bucket/prefix",
            ));
        }
    } else if k.location.contains("://") && !k.location.starts_with("file://") {
        return Err(bad(
            "checkpoint.location",
            "must be a directory, file://path or s3://bucket/prefix",
        ));
    }
    Ok(())
}

/// Resolves `checkpoint.location` against the job file's directory (`base`): empty means
/// `<output.dir>/checkpoints`; URLs are kept.
pub(crate) fn resolve_checkpoint_location(job: &mut JobConfig, base: &Path) {
    let loc = &job.checkpoint.location;
    job.checkpoint.location = if loc.is_empty() {
        job.output
            .dir
            .join("checkpoints")
            .to_string_lossy()
            .into_owned()
    } else if loc.contains("://") {
        loc.clone()
    } else {
        absolute(&base.join(loc)).to_string_lossy().into_owned()
    };
}

pub(crate) fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<JobConfig, ConfigError> {
        JobConfig::from_toml(text, Path::new("job.toml"))
    }

    #[test]
    fn the_lease_ends_before_the_masters_verdict_can_come() {
        let lease = |dead_after_ms, heartbeat_ms| {
            ClusterConfig {
                dead_after_ms,
                ..ClusterConfig::default()
            }
            .lease(heartbeat_ms)
        };
        assert_eq!(lease(5000, 1000), std::time::Duration::from_millis(3000));
        assert_eq!(lease(3000, 500), std::time::Duration::from_millis(2000));
        // Never under a heartbeat, or no renewal could keep it.
        assert_eq!(lease(1000, 500), std::time::Duration::from_millis(500));
    }

    #[test]
    fn defaults_and_cluster_section() {
        let c = parse("[cluster]\nps = 2\nworkers = 3\nmode = \"sync\"\n").unwrap();
        assert_eq!((c.cluster.ps, c.cluster.workers), (2, 3));
        assert_eq!(c.cluster.mode, SyncMode::Sync);
        assert_eq!(c.train.batch_size, 2048);
    }

    #[test]
    fn bad_fields_are_named() {
        let e = parse("[cluster]\nworkerz = 3\n").unwrap_err().to_string();
        assert!(e.contains("workerz"), "{e}");
        let e = parse("[cluster]\nworkers = -1\n").unwrap_err().to_string();
        assert!(e.contains("workers"), "{e}");
        let e = parse("[cluster]\nps = 0\n").unwrap_err().to_string();
        assert!(e.contains("cluster.ps"), "{e}");
        let e = parse("[train]\nbatch_size = 0\n").unwrap_err().to_string();
        assert!(e.contains("train.batch_size"), "{e}");
    }

    #[test]
    fn sizes_and_timeouts_are_bounded() {
        for (text, field) in [
            (
                "[cluster]\nmax_message_bytes = 4294967296\n",
                "cluster.max_message_bytes",
            ),
            (
                "[cluster]\nsync_timeout_ms = 0\n",
                "cluster.sync_timeout_ms",
            ),
            (
                "[cluster]\nsync_timeout_ms = 86400000\n",
                "cluster.sync_timeout_ms",
            ),
            (
                "[cluster]\nrpc_timeout_ms = 1000\n",
                "cluster.rpc_timeout_ms",
            ),
            (
                "[cluster]\nrpc_timeout_ms = 86400000\n",
                "cluster.rpc_timeout_ms",
            ),
            ("[checkpoint]\ntimeout_s = 0\n", "checkpoint.timeout_s"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(field), "{text}: {e}");
        }
        let c = parse("[cluster]\nrpc_timeout_ms = 5000\nsync_timeout_ms = 500\n").unwrap();
        assert_eq!(c.cluster.rpc_timeout().as_millis(), 5000);
    }

    #[test]
    fn nodes_in_network_namespaces_must_bind_an_address_peers_reach() {
        let ok =
            parse("[cluster]\nbind = \"0.0.0.0\"\n[engine.local]\nnetns = \"h-{role}{index}\"\n")
                .unwrap();
        assert_eq!(
            crate::resources::netns_name(&ok.engine.local.netns, "ps", 1),
            "h-ps1"
        );
        for (text, field) in [
            ("[engine.local]\nnetns = \"h-{index}\"\n", "cluster.bind"),
            (
                "[cluster]\nbind = \"0.0.0.0\"\n[engine.network]\nbind = \"127.0.0.1\"\n\
                 [engine.local]\nnetns = \"h-{index}\"\n",
                "engine.network.bind",
            ),
            (
                "[cluster]\nbind = \"0.0.0.0\"\n[engine.local]\nnetns = \"../h{index}\"\n",
                "engine.local.netns",
            ),
            (
                "[cluster]\nbind = \"0.0.0.0\"\n[engine.local]\nnetns = \"h {index}\"\n",
                "engine.local.netns",
            ),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(field), "{text}: {e}");
        }
    }

    #[test]
    fn missing_data_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("job.toml");
        std::fs::write(
            &p,
            "[data]\ndir = \"nowhere\"\ntrain = [\"a.tsv\"]\neval = []\n",
        )
        .unwrap();
        let c = JobConfig::load(&p).unwrap();
        let e = c.check_data(&p).unwrap_err().to_string();
        assert!(e.contains("data.train") && e.contains("a.tsv"), "{e}");
    }
}
