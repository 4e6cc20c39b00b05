//! Cluster backends: how role instances (PS, workers) are started and stopped.
//!
//! One trait with few methods; the local-process engine lives here, Slurm and Kubernetes
//! engines come later behind the same trait. Job semantics never depend on the backend.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use parking_lot::Mutex;

use crate::job::{Node, Role};

/// Starts, stops and watches the processes of a job's nodes.
pub trait ClusterBackend: Send + Sync {
    /// Starts `node`'s process; returns its pid.
    fn start(&self, node: &Node) -> anyhow::Result<u32>;
    /// Stops `node`'s process forcefully (it may already be gone).
    fn stop(&self, node: &Node);
    /// Ids of nodes whose processes exited since the last call. Backends that cannot
    /// observe exits return nothing; heartbeat timeouts then detect deaths.
    fn exited(&self) -> Vec<u32>;
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
}

/// Role instances as child processes of this binary on this machine: the same executable
/// with the hidden `ps` / `worker` subcommands. The job token travels in the environment.
pub struct LocalProcesses {
    exe: PathBuf,
    job_uid: String,
    master_addr: String,
    token: String,
    log_dir: PathBuf,
    children: Mutex<HashMap<u32, Child>>,
    /// Compute threads of each worker started from now on (its allotted cores; 0: all
    /// cores).
    worker_threads: std::sync::atomic::AtomicUsize,
}

impl LocalProcesses {
    /// Runs `exe` for every node of the job with unique id `job_uid`; logs go to
    /// `log_dir/<role>-<id>.log`.
    pub fn new(
        exe: PathBuf,
        job_uid: String,
        master_addr: String,
        token: String,
        log_dir: PathBuf,
    ) -> Self {
        Self {
            exe,
            job_uid,
            master_addr,
            token,
            log_dir,
            children: Mutex::new(HashMap::new()),
            worker_threads: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Caps every worker's compute threads at `threads` (`RAYON_NUM_THREADS`): the local
    /// stand-in for a CPU limit, so that a worker uses the cores it was allotted.
    pub fn with_worker_threads(self, threads: Option<usize>) -> Self {
        self.set_worker_threads(threads.unwrap_or(0));
        self
    }
}

impl ClusterBackend for LocalProcesses {
    fn start(&self, node: &Node) -> anyhow::Result<u32> {
        std::fs::create_dir_all(&self.log_dir)?;
        let role = match node.role {
            Role::Ps => "ps",
            Role::Worker => "worker",
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_dir.join(format!("{role}-{}.log", node.id)))?;
        let mut cmd = Command::new(&self.exe);
        cmd.arg(role)
            .arg("--master")
            .arg(&self.master_addr)
            .arg("--node-id")
            .arg(node.id.to_string())
            .arg("--job")
            .arg(&self.job_uid);
        if node.role == Role::Ps {
            cmd.arg("--index").arg(node.index.to_string());
        }
        let threads = self
            .worker_threads
            .load(std::sync::atomic::Ordering::Acquire);
        if node.role == Role::Worker && threads > 0 {
            cmd.env("RAYON_NUM_THREADS", threads.to_string());
        }
        cmd.env(elastrec_worker::rpc::TOKEN_ENV, &self.token)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = cmd.spawn()?;
        let pid = child.id();
        self.children.lock().insert(node.id, child);
        Ok(pid)
    }

    fn set_worker_threads(&self, threads: usize) {
        self.worker_threads
            .store(threads, std::sync::atomic::Ordering::Release);
    }

    fn stop(&self, node: &Node) {
        if let Some(mut c) = self.children.lock().remove(&node.id) {
            let _ = c.kill();
            let _ = c.wait();
        } else if runs_node(node.pid, &self.job_uid, node.id) {
            // A process started by an earlier master (before a restart).
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe {
                libc::kill(node.pid as libc::pid_t, libc::SIGKILL);
            }
        }
    }

    fn is_alive(&self, node: &Node) -> bool {
        match self.children.lock().get_mut(&node.id) {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => runs_node(node.pid, &self.job_uid, node.id),
        }
    }

    fn exited(&self) -> Vec<u32> {
        let mut children = self.children.lock();
        let gone: Vec<u32> = children
            .iter_mut()
            .filter_map(|(&id, c)| matches!(c.try_wait(), Ok(Some(_))).then_some(id))
            .collect();
        for id in &gone {
            children.remove(id);
        }
        gone
    }
}

/// True when `pid` still runs node `id` of the job with unique id `job_uid` (its command
/// line says so): the pid of a process that died while no master watched it may have been
/// reused by another process, or by a node of another job (node ids repeat across jobs;
/// job uids do not). A zombie's command line is empty, so it does not count.
pub fn runs_node(pid: u32, job_uid: &str, id: u32) -> bool {
    if pid == 0 {
        return false;
    }
    let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
    let id = id.to_string();
    let has = |flag: &[u8], value: &[u8]| args.windows(2).any(|w| w[0] == flag && w[1] == value);
    has(b"--node-id", id.as_bytes()) && has(b"--job", job_uid.as_bytes())
}

impl Drop for LocalProcesses {
    fn drop(&mut self) {
        for (_, mut c) in self.children.lock().drain() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process with the same node id but another job's uid is not ours (before the
    /// uid, any process started with `--node-id 3` matched node 3 of every job).
    #[test]
    fn a_node_of_another_job_is_not_ours() {
        // `sh -c SCRIPT ARG0 ARGS...` keeps the arguments in its command line; the second
        // command stops the shell from replacing itself with `sleep`.
        let child = Command::new("sh")
            .args(["-c", "sleep 30; true", "--node-id", "3", "--job", "aaaa"])
            .spawn();
        let mut child = child.unwrap();
        let pid = child.id();
        // Until the child has executed `sh`, its command line is still this test's.
        let t0 = std::time::Instant::now();
        while !std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.starts_with(b"sh\0")) {
            assert!(t0.elapsed().as_secs() < 10, "sh did not start");
            std::thread::yield_now();
        }
        let ours = runs_node(pid, "aaaa", 3);
        let other_job = runs_node(pid, "bbbb", 3);
        let other_node = runs_node(pid, "aaaa", 4);
        let _ = child.kill();
        let _ = child.wait();
        assert!(ours);
        assert!(!other_job);
        assert!(!other_node);
        assert!(!runs_node(pid, "aaaa", 3), "an exited process is not ours");
    }
}
