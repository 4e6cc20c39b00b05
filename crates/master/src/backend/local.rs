//! The local backend: nodes as child processes of the master on this machine.

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use parking_lot::Mutex;

use super::cgroup::{self, Cgroups, Limits};
use super::netns::{self, NetnsPlacement};
use super::{ClusterBackend, NodeExit, Resize};
use crate::job::Node;
use crate::launch::LaunchTemplate;

/// Role instances as child processes of this binary on this machine: the same executable
/// with the hidden `ps` / `worker` subcommands. The job token travels in the environment.
/// A worker's `cpu` becomes its compute threads only when the template caps them (the
/// autoscaler's allotment); otherwise it uses every core.
///
/// When the job's limits are enforced (`[autoscale]` or `engine.local.enforce_resources`)
/// and the host allows control groups, each node runs in its own group holding it to its
/// launch spec's cores and memory, changed in place by [`ClusterBackend::resize`];
/// otherwise the master's memory watchdog stands in.
pub struct LocalProcesses {
    template: Arc<LaunchTemplate>,
    children: Mutex<HashMap<u32, Child>>,
    cgroups: Option<Cgroups>,
    netns: Option<NetnsPlacement>,
}

impl LocalProcesses {
    /// Runs every node of the job `template` describes; logs go to its log directory.
    /// `cgroups`: the groups that hold nodes to their limits, if they are enforced so.
    pub fn new(template: Arc<LaunchTemplate>, cgroups: Option<Cgroups>) -> Self {
        Self {
            template,
            children: Mutex::new(HashMap::new()),
            cgroups,
            netns: None,
        }
    }

    /// Runs each node in its network namespace of `placement` (`engine.local.netns`).
    pub fn with_netns(mut self, placement: Option<NetnsPlacement>) -> Self {
        self.netns = placement;
        self
    }

    /// The limits of a node started from `spec`.
    fn limits(spec: &crate::launch::LaunchSpec) -> Limits {
        Limits {
            cpu: Some(spec.cpu),
            memory_bytes: Some(spec.memory_mib << 20),
        }
    }

    /// Why node `id` ended: its exit status, and the kernel's OOM kill when its group
    /// recorded one (with the limit it hit).
    fn exit_of(&self, id: u32, status: std::process::ExitStatus) -> NodeExit {
        let Some(groups) = &self.cgroups else {
            return NodeExit::new(id, status.to_string());
        };
        let oom = groups.oom_kills(id) > 0;
        let limit = groups.get(id).ok().and_then(|l| l.memory_bytes);
        groups.remove(id);
        if !oom {
            return NodeExit::new(id, status.to_string());
        }
        NodeExit {
            id,
            reason: format!(
                "{status}: killed by the kernel's OOM killer at its memory limit of {} ({})",
                limit.map_or("?".into(), |b| format!(
                    "{:.2} GiB",
                    b as f64 / (1u64 << 30) as f64
                )),
                groups.describe()
            ),
            oom: true,
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
        // Opened before anything else is made for the node, where a missing namespace is
        // an error naming it; held until the child has exec'd (the descriptor closes on
        // exec).
        let netns = self.netns.as_ref().map(|p| p.open(node)).transpose()?;
        if let Some(ns) = &netns {
            let fd = ns.fd();
            // SAFETY: the closure makes one async-signal-safe system call (setns).
            unsafe {
                cmd.pre_exec(move || netns::enter(fd));
            }
        }
        if let Some(groups) = &self.cgroups {
            let procs = groups.create(node.id, Self::limits(&spec))?;
            // The child joins its group before it runs a single instruction of the
            // node: nothing it allocates escapes the limit.
            // SAFETY: the closure only makes async-signal-safe system calls.
            unsafe {
                cmd.pre_exec(move || cgroup::join_self(&procs));
            }
        }
        let child = cmd.spawn();
        drop(netns);
        let child = match child {
            Ok(c) => c,
            Err(e) => {
                if let Some(groups) = &self.cgroups {
                    groups.remove(node.id);
                }
                return Err(match (&self.netns, e.raw_os_error()) {
                    (Some(p), Some(libc::EPERM)) => anyhow::anyhow!(
                        "starting {} {} in network namespace `{}` (engine.local.netns): {e}; \
                         entering a namespace takes root (CAP_SYS_ADMIN)",
                        crate::launch::role_name(node.role),
                        node.index,
                        p.name(node)
                    ),
                    _ => e.into(),
                });
            }
        };
        let pid = child.id();
        self.children.lock().insert(node.id, child);
        Ok(pid)
    }

    fn resize(&self, node: &Node, change: Resize) -> anyhow::Result<bool> {
        let Some(groups) = &self.cgroups else {
            return Ok(false);
        };
        let now = groups.get(node.id)?;
        groups.set(
            node.id,
            Limits {
                cpu: change.cpu.or(now.cpu),
                memory_bytes: change.memory_bytes.or(now.memory_bytes),
            },
        )?;
        Ok(true)
    }

    fn resizes_in_place(&self) -> bool {
        self.cgroups.is_some()
    }

    fn enforces_memory(&self) -> bool {
        self.cgroups.is_some()
    }

    fn set_worker_threads(&self, threads: usize) {
        self.template.set_worker_threads(threads);
    }

    fn stop(&self, node: &Node) {
        // Test fail point: the stop never reaches the node, as when its host is cut off
        // (the node must then fence itself and exit on its own).
        if elastrec_common::fail_points::for_node("ELASTREC_FAIL_LOST_STOP", node.id).is_some() {
            eprintln!("master: fail point: the stop of node {} is lost", node.id);
            return;
        }
        if let Some(mut c) = self.children.lock().remove(&node.id) {
            let _ = c.kill();
            let _ = c.wait();
            if let Some(groups) = &self.cgroups {
                groups.remove(node.id);
            }
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
                Ok(Some(status)) => Some(self.exit_of(id, status)),
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
        for (id, mut c) in self.children.lock().drain() {
            let _ = c.kill();
            let _ = c.wait();
            if let Some(groups) = &self.cgroups {
                groups.remove(id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::Role;
    use elastrec_job::resources::{ResourcesConfig, RoleResources};

    /// The job's control groups, or `None` (with the reason) where this host gives none;
    /// `ELASTREC_REQUIRE_CGROUPS=1` (CI) makes that a failure.
    fn cgroups_or_skip(job_uid: &str) -> Option<Cgroups> {
        match Cgroups::open(&format!("elastrec-{job_uid}")) {
            Ok(g) => Some(g),
            Err(why) => {
                elastrec_common::skip_test(
                    "CGROUPS",
                    &format!("no control groups on this host ({why})"),
                );
                None
            }
        }
    }

    /// A backend whose nodes run `script` (which ignores the node arguments), workers
    /// sized at `cpu` cores and `memory_mib`.
    fn script_backend(
        dir: &std::path::Path,
        script: &str,
        cpu: f64,
        memory_mib: u64,
    ) -> Option<LocalProcesses> {
        use std::os::unix::fs::PermissionsExt;
        let program = dir.join("node.sh");
        std::fs::write(&program, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        let job_uid = format!("test{:08x}", rand::random::<u32>());
        let worker = RoleResources {
            cpu,
            memory_gb: memory_mib as f64 / 1024.0,
            ..RoleResources::default()
        };
        let resources = ResourcesConfig {
            worker,
            ..ResourcesConfig::default()
        };
        let template = LaunchTemplate::new(
            program,
            "cgroup-test",
            &job_uid,
            "127.0.0.1:1",
            "secret",
            dir.join("logs"),
            resources,
        );
        let groups = cgroups_or_skip(&job_uid)?;
        Some(LocalProcesses::new(Arc::new(template), Some(groups)))
    }

    fn wait_exit(backend: &LocalProcesses) -> NodeExit {
        let t0 = std::time::Instant::now();
        loop {
            if let Some(e) = backend.exited().pop() {
                return e;
            }
            assert!(t0.elapsed().as_secs() < 60, "the node did not end");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// A node that allocates past its memory limit is killed by the kernel (not by the
    /// master), and its exit says so with the limit: the master's out-of-memory policy
    /// takes it from there.
    #[test]
    fn a_node_above_its_memory_limit_is_killed_by_the_kernel_and_reported_as_oom() {
        let dir = tempfile::tempdir().unwrap();
        // dd's 256 MiB block is one buffer, filled from /dev/zero: 4x the limit.
        let Some(backend) = script_backend(
            dir.path(),
            "exec dd if=/dev/zero of=/dev/null bs=256M count=4",
            0.5,
            64,
        ) else {
            return;
        };
        let node = Node::pending(7, Role::Worker, 0);
        let pid = backend.start(&node).unwrap();
        let limits = backend.cgroups.as_ref().unwrap().get(7);
        let exit = wait_exit(&backend);
        assert!(exit.oom, "{exit:?}");
        assert!(
            exit.reason
                .contains("OOM killer at its memory limit of 0.06 GiB"),
            "{exit:?}"
        );
        let limits = limits.expect("the node's group existed while it ran");
        assert_eq!(limits.memory_bytes, Some(64 << 20));
        assert_eq!(limits.cpu, Some(0.5));
        assert!(pid > 0);
        assert!(
            backend.cgroups.as_ref().unwrap().get(7).is_err(),
            "the node's group is removed with it"
        );
    }

    /// A running node's limits change in place: the same process, the new quota and
    /// memory limit in its group; stopping it removes the group.
    #[test]
    fn a_running_node_is_resized_in_place_and_its_group_goes_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let Some(backend) = script_backend(dir.path(), "exec sleep 60", 1.0, 128) else {
            return;
        };
        let node = Node::pending(3, Role::Worker, 0);
        let pid = backend.start(&node).unwrap();
        // The child is in its group from its first instruction (joined before exec).
        let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        assert!(own.contains("/node-3"), "{own}");
        let change = Resize {
            cpu: Some(1.5),
            memory_bytes: Some(256 << 20),
        };
        assert!(backend.resize(&node, change).unwrap());
        let groups = backend.cgroups.as_ref().unwrap();
        assert_eq!(
            groups.get(3).unwrap(),
            Limits {
                cpu: Some(1.5),
                memory_bytes: Some(256 << 20)
            }
        );
        assert!(backend.is_alive(&node), "resized without a restart");
        backend
            .resize(
                &node,
                Resize {
                    cpu: Some(0.25),
                    memory_bytes: None,
                },
            )
            .unwrap();
        assert_eq!(
            groups.get(3).unwrap().memory_bytes,
            Some(256 << 20),
            "unchanged"
        );
        backend.stop(&node);
        assert!(groups.get(3).is_err(), "the group went with the node");
    }

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
