//! What it takes to start one node, independent of where it runs: the program and its
//! arguments, plain and secret environment, the resources its role asks for, and a name
//! every engine accepts. Backends turn a [`LaunchSpec`] into a child process, an `srun`
//! step or a pod.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use elastrec_job::resources::{ResourcesConfig, RoleResources};
use elastrec_rpc as rpc;

use crate::job::{Node, Role};

/// Environment variable carrying the master's address to a node (also on its command line).
pub const MASTER_ENV: &str = "ELASTREC_MASTER";

/// Everything needed to start the nodes of one job.
pub struct LaunchTemplate {
    /// The `elastrec` executable (on a cluster: its path on every host, or in the image).
    pub program: PathBuf,
    /// The job's name (its directory's name).
    pub job_id: String,
    /// The job's unique id: tells its processes, steps and pods from another job's.
    pub job_uid: String,
    /// The master's address as the nodes reach it.
    pub master_addr: String,
    /// The job secret: each node gets its role's token derived from it
    /// (`rpc::role_token`), in the environment or an engine secret, never argv.
    pub token: String,
    /// The job's TLS material, when its channels use TLS (an engine secret too).
    pub tls: Option<elastrec_rpc::tls::TlsMaterial>,
    /// Directory of the node logs (local and Slurm; Kubernetes keeps logs with the pods).
    pub log_dir: PathBuf,
    /// What each role asks for.
    pub resources: ResourcesConfig,
    /// Plain environment every node gets (e.g. the address to advertise).
    pub env: Vec<(String, String)>,
    /// `cluster.node_metrics_port_base`: node `N` serves `/metrics` on this port + N (0:
    /// any free port). A Kubernetes pod announces its port to Prometheus.
    pub metrics_port_base: u16,
    /// Compute threads of the workers started from now on (0: the role's `cpu`, or every
    /// core on the local backend).
    worker_threads: AtomicUsize,
    /// Memory of the PS / workers started from now on, MiB (0: the role's `memory_gb`);
    /// grows after an out-of-memory kill.
    memory_mib: [AtomicU64; 2],
    /// The most an out-of-memory kill may grow it to, MiB (0: the role's `memory_gb_max`).
    memory_max_mib: [AtomicU64; 2],
    /// Cores of the PS / workers started from now on, thousandths (0: the role's `cpu`).
    cpu_milli: [AtomicU64; 2],
}

/// How to start one node.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchSpec {
    /// The node.
    pub node: u32,
    /// Its role.
    pub role: Role,
    /// Lowercase letters, digits and `-`, at most 63 characters, unique per job and node:
    /// a Slurm job name, a pod name, a log file stem.
    pub name: String,
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Plain environment.
    pub env: Vec<(String, String)>,
    /// Secret environment (the token): an engine keeps it out of anything others can read
    /// (a Kubernetes Secret; the inherited environment of `srun`).
    pub secret_env: Vec<(String, String)>,
    /// Cores.
    pub cpu: f64,
    /// Memory, MiB.
    pub memory_mib: u64,
    /// Log file (where the engine writes logs to files).
    pub log: PathBuf,
}

impl LaunchTemplate {
    /// A template for the job `job_id` / `job_uid` whose master is at `master_addr`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        program: PathBuf,
        job_id: &str,
        job_uid: &str,
        master_addr: &str,
        token: &str,
        log_dir: PathBuf,
        resources: ResourcesConfig,
    ) -> Self {
        Self {
            program,
            job_id: job_id.to_string(),
            job_uid: job_uid.to_string(),
            master_addr: master_addr.to_string(),
            token: token.to_string(),
            log_dir,
            resources,
            tls: None,
            env: Vec::new(),
            metrics_port_base: 0,
            worker_threads: AtomicUsize::new(0),
            memory_mib: [AtomicU64::new(0), AtomicU64::new(0)],
            memory_max_mib: [AtomicU64::new(0), AtomicU64::new(0)],
            cpu_milli: [AtomicU64::new(0), AtomicU64::new(0)],
        }
    }

    /// Sizes the nodes of `role` started from now on (the autoscaler's allotment instead
    /// of `[resources]`): cores, memory and the most an out-of-memory kill may grow it to,
    /// MiB.
    pub fn set_role_size(&self, role: Role, cpu: f64, memory_mib: u64, memory_max_mib: u64) {
        let slot = role_slot(role);
        self.cpu_milli[slot].store((cpu * 1000.0).round().max(1.0) as u64, Ordering::Release);
        self.memory_mib[slot].store(memory_mib.max(1), Ordering::Release);
        self.memory_max_mib[slot].store(memory_max_mib.max(memory_mib), Ordering::Release);
    }

    /// Cores of the nodes of `role` started from now on (vertical scaling).
    pub fn set_role_cpu(&self, role: Role, cpu: f64) {
        self.cpu_milli[role_slot(role)]
            .store((cpu * 1000.0).round().max(1.0) as u64, Ordering::Release);
    }

    /// Cores a node of `role` started now asks for (a worker's thread cap aside).
    pub fn cpu(&self, role: Role) -> f64 {
        match self.cpu_milli[role_slot(role)].load(Ordering::Acquire) {
            0 => self.role_resources(role).cpu,
            m => m as f64 / 1000.0,
        }
    }

    /// Caps every worker's compute threads at `threads` (0: no cap).
    pub fn set_worker_threads(&self, threads: usize) {
        self.worker_threads.store(threads, Ordering::Release);
    }

    /// The workers' thread cap (0: none).
    pub fn worker_threads(&self) -> usize {
        self.worker_threads.load(Ordering::Acquire)
    }

    /// Memory a node of `role` started now asks for, MiB.
    pub fn memory_mib(&self, role: Role) -> u64 {
        match self.memory_mib[role_slot(role)].load(Ordering::Acquire) {
            0 => self.role_resources(role).memory_mib(),
            m => m,
        }
    }

    /// After the engine killed a node of `role` for its memory: the role's next nodes ask
    /// for 1.5 times more, up to its `memory_gb_max`. Returns (before, after) in MiB;
    /// equal when the maximum is reached.
    pub fn grow_memory(&self, role: Role) -> (u64, u64) {
        let before = self.memory_mib(role);
        let max = match self.memory_max_mib[role_slot(role)].load(Ordering::Acquire) {
            0 => self.role_resources(role).memory_max_mib(),
            m => m,
        };
        let after = (before + before / 2).min(max).max(before);
        self.memory_mib[role_slot(role)].store(after, Ordering::Release);
        (before, after)
    }

    /// What `role` asks for.
    pub fn role_resources(&self, role: Role) -> &RoleResources {
        match role {
            Role::Ps => &self.resources.ps,
            // A data executor reads and parses what a worker would: it asks as much.
            Role::Worker | Role::Executor => &self.resources.worker,
        }
    }

    /// The engine-safe name of `node`: `elastrec-<job>-<uid8>-<role>-<id>`.
    pub fn node_name(&self, role: Role, id: u32) -> String {
        let role = role_name(role);
        let tail = format!(
            "-{}-{role}-{id}",
            &self.job_uid[..self.job_uid.len().min(8)]
        );
        let job: String = self
            .job_id
            .to_ascii_lowercase()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let room = 63usize.saturating_sub("elastrec-".len() + tail.len());
        let job = job.trim_matches('-');
        let job = job[..job.len().min(room)].trim_end_matches('-');
        format!("elastrec-{job}{tail}")
    }

    /// How to start `node`.
    pub fn spec(&self, node: &Node) -> LaunchSpec {
        let role = role_name(node.role);
        let mut args = vec![
            role.to_string(),
            "--master".into(),
            self.master_addr.clone(),
            "--node-id".into(),
            node.id.to_string(),
            "--job".into(),
            self.job_uid.clone(),
        ];
        if node.role == Role::Ps {
            args.extend(["--index".into(), node.index.to_string()]);
        }
        let mut env = self.env.clone();
        env.push((MASTER_ENV.into(), self.master_addr.clone()));
        let mut cpu = self.cpu(node.role);
        let threads = self.worker_threads();
        if node.role == Role::Worker && threads > 0 {
            env.push(("RAYON_NUM_THREADS".into(), threads.to_string()));
            cpu = threads as f64;
        }
        let name = self.node_name(node.role, node.id);
        // A data executor serves workers and is served the job's data like them: it
        // holds a worker's credentials.
        let caller = match node.role {
            Role::Ps => rpc::Caller::Ps,
            Role::Worker | Role::Executor => rpc::Caller::Worker,
        };
        let mut secret_env = vec![(
            rpc::TOKEN_ENV.to_string(),
            rpc::role_token(&self.token, caller),
        )];
        if node.role == Role::Ps {
            // Digests of the tokens a PS accepts (never the tokens themselves); secret
            // all the same, as anything derived from the job secret.
            secret_env.push((rpc::ACCEPT_ENV.into(), rpc::ps_accept_list(&self.token)));
        }
        if let Some(tls) = &self.tls {
            secret_env.extend(tls.to_env());
        }
        LaunchSpec {
            node: node.id,
            role: node.role,
            log: self.log_dir.join(format!("{role}-{}.log", node.id)),
            name,
            program: self.program.clone(),
            args,
            env,
            secret_env,
            cpu,
            memory_mib: self.memory_mib(node.role),
        }
    }
}

fn role_slot(role: Role) -> usize {
    match role {
        Role::Ps => 0,
        Role::Worker | Role::Executor => 1,
    }
}

impl LaunchSpec {
    /// Opens (appending) the node's log file, creating its directory: what a backend
    /// whose processes write to this machine's files hands them as stdout and stderr.
    pub fn open_log(&self) -> std::io::Result<std::fs::File> {
        if let Some(dir) = self.log.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
    }
}

/// `ps` or `worker`: the node subcommand and the role's name in logs and labels.
pub fn role_name(role: Role) -> &'static str {
    match role {
        Role::Ps => "ps",
        Role::Worker => "worker",
        Role::Executor => "executor",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(job_id: &str) -> LaunchTemplate {
        LaunchTemplate::new(
            "/usr/bin/elastrec".into(),
            job_id,
            "0123456789abcdef",
            "10.0.0.1:5000",
            "secret",
            "/tmp/logs".into(),
            ResourcesConfig::default(),
        )
    }

    fn node(role: Role, id: u32) -> Node {
        Node::pending(id, role, 1)
    }

    #[test]
    fn an_out_of_memory_kill_grows_the_role_up_to_its_maximum() {
        let t = template("j");
        assert_eq!(t.grow_memory(Role::Worker), (2048, 3072));
        assert_eq!(t.spec(&node(Role::Worker, 3)).memory_mib, 3072);
        assert_eq!(t.spec(&node(Role::Ps, 1)).memory_mib, 2048, "per role");
        assert_eq!(
            t.grow_memory(Role::Worker),
            (3072, 4096),
            "twice memory_gb at most"
        );
        assert_eq!(t.grow_memory(Role::Worker), (4096, 4096));
    }

    /// The autoscaler's allotment sizes a role instead of `[resources]`, its maximum
    /// included.
    #[test]
    fn a_role_size_replaces_the_resources_of_nodes_started_from_then_on() {
        let t = template("j");
        t.set_role_size(Role::Ps, 1.5, 200, 300);
        let s = t.spec(&node(Role::Ps, 1));
        assert_eq!((s.cpu, s.memory_mib), (1.5, 200));
        assert_eq!(t.grow_memory(Role::Ps), (200, 300));
        assert_eq!(
            t.grow_memory(Role::Ps),
            (300, 300),
            "the allotment's maximum"
        );
        t.set_role_cpu(Role::Ps, 2.0);
        assert_eq!(t.spec(&node(Role::Ps, 1)).cpu, 2.0);
        assert_eq!(t.spec(&node(Role::Worker, 2)).memory_mib, 2048, "per role");
    }

    #[test]
    fn names_are_engine_safe_and_unique_per_node() {
        let t = template("My_Job.2026 (test)");
        let n = t.node_name(Role::Ps, 7);
        assert_eq!(n, "elastrec-my-job-2026--test-01234567-ps-7");
        let long = template(&"x".repeat(200)).node_name(Role::Worker, 123456);
        assert!(long.len() <= 63, "{long}");
        assert!(long.ends_with("-01234567-worker-123456"), "{long}");
        assert!(long
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
    }

    #[test]
    fn the_token_is_secret_and_threads_size_workers() {
        let t = template("j");
        let s = t.spec(&node(Role::Ps, 1));
        assert_eq!(
            s.args,
            [
                "ps",
                "--master",
                "10.0.0.1:5000",
                "--node-id",
                "1",
                "--job",
                "0123456789abcdef",
                "--index",
                "1"
            ]
        );
        assert!(!s
            .args
            .iter()
            .chain(s.env.iter().map(|e| &e.1))
            .any(|a| a.contains("secret")));
        // Each role gets its own token, never the job secret.
        let ps_token = rpc::role_token("secret", rpc::Caller::Ps);
        assert_eq!(s.secret_env[0], ("ELASTREC_TOKEN".to_string(), ps_token));
        assert!(s.secret_env.iter().any(|(k, _)| k == rpc::ACCEPT_ENV));
        assert_eq!((s.cpu, s.memory_mib), (1.0, 2048));
        t.set_worker_threads(3);
        let w = t.spec(&node(Role::Worker, 2));
        assert_eq!(w.cpu, 3.0);
        assert!(w.env.contains(&("RAYON_NUM_THREADS".into(), "3".into())));
        assert_eq!(
            t.spec(&node(Role::Ps, 1)).cpu,
            1.0,
            "threads size workers only"
        );
        let worker_token = rpc::role_token("secret", rpc::Caller::Worker);
        assert_eq!(w.secret_env[0].1, worker_token);
        assert!(!w.secret_env.iter().any(|(k, _)| k == rpc::ACCEPT_ENV));
    }
}
