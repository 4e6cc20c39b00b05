//! The local backend: nodes as child processes of the master on this machine.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use parking_lot::Mutex;

use super::{ClusterBackend, NodeExit};
use crate::job::Node;
use crate::launch::LaunchTemplate;

/// Role instances as child processes of this binary on this machine: the same executable
/// with the hidden `ps` / `worker` subcommands. The job token travels in the environment.
/// A worker's `cpu` becomes its compute threads only when the template caps them (the
/// autoscaler's allotment); otherwise it uses every core.
pub struct LocalProcesses {
    template: Arc<LaunchTemplate>,
    children: Mutex<HashMap<u32, Child>>,
}

impl LocalProcesses {
    /// Runs every node of the job `template` describes; logs go to its log directory.
    pub fn new(template: Arc<LaunchTemplate>) -> Self {
        Self {
            template,
            children: Mutex::new(HashMap::new()),
        }
    }
}

impl ClusterBackend for LocalProcesses {
    fn start(&self, node: &Node) -> anyhow::Result<u32> {
        let spec = self.template.spec(node);
        let log = spec.open_log()?;
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .envs(spec.secret_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = cmd.spawn()?;
        let pid = child.id();
        self.children.lock().insert(node.id, child);
        Ok(pid)
    }

    fn set_worker_threads(&self, threads: usize) {
        self.template.set_worker_threads(threads);
    }

    fn stop(&self, node: &Node) {
        if let Some(mut c) = self.children.lock().remove(&node.id) {
            let _ = c.kill();
            let _ = c.wait();
        } else if runs_node(node.pid, &self.template.job_uid, node.id) {
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
            None => runs_node(node.pid, &self.template.job_uid, node.id),
        }
    }

    fn exited(&self) -> Vec<NodeExit> {
        let mut children = self.children.lock();
        let gone: Vec<NodeExit> = children
            .iter_mut()
            .filter_map(|(&id, c)| match c.try_wait() {
                Ok(Some(status)) => Some(NodeExit::new(id, status.to_string())),
                _ => None,
            })
            .collect();
        for e in &gone {
            children.remove(&e.id);
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
