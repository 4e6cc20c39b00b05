//! Kernel-enforced limits for local nodes: every node process runs in a control group of
//! its own, under one group per job inside the master's own group, with a memory limit
//! (the kernel's OOM killer stops it above the limit, as on a Kubernetes node) and a CPU
//! quota. Limits change in place by rewriting the group's files, so vertical scaling of a
//! running node needs no restart.
//!
//! Both cgroup versions are handled. v2 (one unified hierarchy) needs the memory and cpu
//! controllers delegated to the master's group; v1 needs writable `memory` and `cpu`
//! hierarchies. [`Cgroups::open`] says why neither can be used, so `engine.local.cgroups =
//! "auto"` can fall back to threads and the watchdog with the reason logged.

use std::ffi::CString;
use std::io;
use std::path::{Path, PathBuf};

/// CFS period of every quota, microseconds (the kernel's default).
const PERIOD_US: u64 = 100_000;

/// What a node is held to; `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Limits {
    /// Cores (a CPU quota of `cpu` periods per period).
    pub cpu: Option<f64>,
    /// Memory, bytes (above it the kernel kills the node).
    pub memory_bytes: Option<u64>,
}

/// Which hierarchy and where the job's groups live.
#[derive(Debug, Clone, PartialEq)]
enum Layout {
    /// One directory holds both controllers' files.
    V2 { job: PathBuf },
    /// A directory per controller.
    V1 { memory: PathBuf, cpu: PathBuf },
}

/// The control groups of one job's nodes.
#[derive(Debug)]
pub struct Cgroups {
    layout: Layout,
}

/// The hierarchies this process sees: `(mount root, mount point, fs type, super options)`.
fn cgroup_mounts(mountinfo: &str) -> Vec<(String, PathBuf, String, String)> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (pre, post) = line.split_once(" - ")?;
            let pre: Vec<&str> = pre.split(' ').collect();
            let post: Vec<&str> = post.split(' ').collect();
            let fstype = *post.first()?;
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            Some((
                pre.get(3)?.to_string(),
                PathBuf::from(pre.get(4)?),
                fstype.to_string(),
                post.get(2).copied().unwrap_or("").to_string(),
            ))
        })
        .collect()
}

/// This process's group in the hierarchy holding `controller` (`""`: the v2 hierarchy).
fn own_group(proc_cgroup: &str, controller: &str) -> Option<String> {
    proc_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (hier, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let hit = if controller.is_empty() {
            hier == "0" && controllers.is_empty()
        } else {
            controllers.split(',').any(|c| c == controller)
        };
        hit.then(|| path.to_string())
    })
}

/// The directory of `group` under a mount of `root` at `mount`.
fn group_dir(mount: &Path, root: &str, group: &str) -> PathBuf {
    let rel = group.strip_prefix(root).unwrap_or(group);
    mount.join(rel.trim_start_matches('/'))
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    std::fs::write(path, value).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("writing {value:?} to {}: {e}", path.display()),
        )
    })
}

/// `job` made a group (an existing one of a crashed master is reused).
fn make_dir(dir: &Path) -> Result<(), String> {
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!("cannot create {}: {e}", dir.display())),
    }
}

impl Cgroups {
    /// The groups of job `name` (a file-name-safe unique name), created under this
    /// process's own groups; an error says why this host does not allow it.
    pub fn open(name: &str) -> Result<Self, String> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
        let proc_cgroup = std::fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
        let mounts = cgroup_mounts(&mountinfo);
        let v2 = Self::open_v2(&mounts, &proc_cgroup, name);
        match v2 {
            Ok(c) => Ok(c),
            Err(why_v2) => Self::open_v1(&mounts, &proc_cgroup, name)
                .map_err(|why_v1| format!("cgroup v2: {why_v2}; cgroup v1: {why_v1}")),
        }
    }

    fn open_v2(
        mounts: &[(String, PathBuf, String, String)],
        proc_cgroup: &str,
        name: &str,
    ) -> Result<Self, String> {
        let (root, mount, _, _) = mounts
            .iter()
            .find(|m| m.2 == "cgroup2")
            .ok_or("not mounted")?;
        let group = own_group(proc_cgroup, "").ok_or("this process is in no v2 group")?;
        let own = group_dir(mount, root, &group);
        let available = std::fs::read_to_string(own.join("cgroup.controllers")).map_err(|e| {
            format!(
                "cannot read {}: {e}",
                own.join("cgroup.controllers").display()
            )
        })?;
        for c in ["memory", "cpu"] {
            if !available.split_whitespace().any(|a| a == c) {
                return Err(format!(
                    "the {c} controller is not available in {} (controllers: {:?})",
                    own.display(),
                    available.trim()
                ));
            }
        }
        // Sub-groups get the controllers only when this group passes them on; a group
        // that holds processes (this one) may do so only at the root or when delegated.
        write(&own.join("cgroup.subtree_control"), "+memory +cpu").map_err(|e| {
            format!("{e} (run the master in a delegated group, e.g. `systemd-run --user -p Delegate=yes`)")
        })?;
        let job = own.join(name);
        make_dir(&job)?;
        write(&job.join("cgroup.subtree_control"), "+memory +cpu").map_err(|e| e.to_string())?;
        Ok(Self {
            layout: Layout::V2 { job },
        })
    }

    fn open_v1(
        mounts: &[(String, PathBuf, String, String)],
        proc_cgroup: &str,
        name: &str,
    ) -> Result<Self, String> {
        let dir = |controller: &str| -> Result<PathBuf, String> {
            let (root, mount, _, _) = mounts
                .iter()
                .find(|m| m.2 == "cgroup" && m.3.split(',').any(|o| o == controller))
                .ok_or_else(|| format!("no {controller} hierarchy is mounted"))?;
            let group = own_group(proc_cgroup, controller)
                .ok_or_else(|| format!("this process is in no {controller} group"))?;
            let job = group_dir(mount, root, &group).join(name);
            make_dir(&job)?;
            Ok(job)
        };
        let memory = dir("memory")?;
        let cpu = match dir("cpu") {
            Ok(cpu) => cpu,
            Err(e) => {
                let _ = std::fs::remove_dir(&memory);
                return Err(e);
            }
        };
        Ok(Self {
            layout: Layout::V1 { memory, cpu },
        })
    }

    /// `v2` or `v1` and where the job's groups are, for the log.
    pub fn describe(&self) -> String {
        match &self.layout {
            Layout::V2 { job } => format!("cgroup v2 at {}", job.display()),
            Layout::V1 { memory, cpu } => {
                format!("cgroup v1 at {} and {}", memory.display(), cpu.display())
            }
        }
    }

    fn node_dirs(&self, id: u32) -> Vec<PathBuf> {
        let node = format!("node-{id}");
        match &self.layout {
            Layout::V2 { job } => vec![job.join(node)],
            Layout::V1 { memory, cpu } => vec![memory.join(&node), cpu.join(node)],
        }
    }

    /// Creates node `id`'s group with `limits`; returns the files a process writes `0` to
    /// in order to join it ([`join_self`], between fork and exec).
    pub fn create(&self, id: u32, limits: Limits) -> io::Result<Vec<CString>> {
        for dir in self.node_dirs(id) {
            match std::fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("creating {}: {e}", dir.display()),
                    ))
                }
            }
        }
        self.set(id, limits)?;
        self.node_dirs(id)
            .into_iter()
            .map(|d| {
                CString::new(d.join("cgroup.procs").into_os_string().into_encoded_bytes())
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
            })
            .collect()
    }

    /// Sets node `id`'s limits (the running process keeps running under the new ones).
    pub fn set(&self, id: u32, limits: Limits) -> io::Result<()> {
        let quota = limits
            .cpu
            .map(|c| ((c * PERIOD_US as f64).round() as u64).max(1_000));
        match &self.layout {
            Layout::V2 { .. } => {
                let dir = &self.node_dirs(id)[0];
                let memory = limits
                    .memory_bytes
                    .map_or("max".to_string(), |b| b.to_string());
                write(&dir.join("memory.max"), &memory)?;
                // No swap: above the limit the node is killed, not slowed to a crawl.
                let _ = std::fs::write(dir.join("memory.swap.max"), "0");
                let cpu = quota.map_or("max".to_string(), |q| q.to_string());
                write(&dir.join("cpu.max"), &format!("{cpu} {PERIOD_US}"))
            }
            Layout::V1 { .. } => {
                let dirs = self.node_dirs(id);
                let memory = limits
                    .memory_bytes
                    .map_or("-1".to_string(), |b| b.to_string());
                write(&dirs[0].join("memory.limit_in_bytes"), &memory)?;
                let _ = std::fs::write(dirs[0].join("memory.swappiness"), "0");
                write(&dirs[1].join("cpu.cfs_period_us"), &PERIOD_US.to_string())?;
                let quota = quota.map_or("-1".to_string(), |q| q.to_string());
                write(&dirs[1].join("cpu.cfs_quota_us"), &quota)
            }
        }
    }

    /// Node `id`'s limits as the kernel holds them now.
    pub fn get(&self, id: u32) -> io::Result<Limits> {
        let read = |p: PathBuf| std::fs::read_to_string(p).map(|s| s.trim().to_string());
        let dirs = self.node_dirs(id);
        let (memory, quota) = match &self.layout {
            Layout::V2 { .. } => {
                let cpu = read(dirs[0].join("cpu.max"))?;
                let quota = cpu.split_whitespace().next().unwrap_or("max").to_string();
                (read(dirs[0].join("memory.max"))?, quota)
            }
            Layout::V1 { .. } => (
                read(dirs[0].join("memory.limit_in_bytes"))?,
                read(dirs[1].join("cpu.cfs_quota_us"))?,
            ),
        };
        // v1 reads back an unlimited memory as a page-rounded maximum, not -1.
        let memory_bytes = memory.parse::<u64>().ok().filter(|&b| b < (1u64 << 62));
        let cpu = quota
            .parse::<i64>()
            .ok()
            .filter(|&q| q > 0)
            .map(|q| q as f64 / PERIOD_US as f64);
        Ok(Limits { cpu, memory_bytes })
    }

    /// How many times the kernel's OOM killer has killed a process of node `id`'s group.
    pub fn oom_kills(&self, id: u32) -> u64 {
        let dir = &self.node_dirs(id)[0];
        let file = match &self.layout {
            Layout::V2 { .. } => "memory.events",
            Layout::V1 { .. } => "memory.oom_control",
        };
        std::fs::read_to_string(dir.join(file))
            .ok()
            .and_then(|text| {
                text.lines().find_map(|l| {
                    let (key, value) = l.split_once(' ')?;
                    (key == "oom_kill").then(|| value.trim().parse().ok())?
                })
            })
            .unwrap_or(0)
    }

    /// Removes node `id`'s group once its process is gone.
    pub fn remove(&self, id: u32) {
        for dir in self.node_dirs(id) {
            let _ = std::fs::remove_dir(dir);
        }
    }

    fn job_dirs(&self) -> Vec<&Path> {
        match &self.layout {
            Layout::V2 { job } => vec![job],
            Layout::V1 { memory, cpu } => vec![memory, cpu],
        }
    }
}

impl Drop for Cgroups {
    /// The job's groups go with it; groups of nodes still running (an interrupted master
    /// leaves them to a resumed one) keep it, and removing it then fails harmlessly.
    fn drop(&mut self) {
        for dir in self.job_dirs() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Moves the calling process into the groups whose `cgroup.procs` files are `procs`.
/// Called between fork and exec, so it only makes system calls: no allocation, no lock.
///
/// # Safety
/// Only async-signal-safe calls are made; `procs` must stay alive across the call.
pub fn join_self(procs: &[CString]) -> io::Result<()> {
    for path in procs {
        // SAFETY: `path` is a valid NUL-terminated string; open/write/close are
        // async-signal-safe and touch no memory of ours but the two buffers passed.
        unsafe {
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            let n = libc::write(fd, b"0".as_ptr().cast(), 1);
            let err = io::Error::last_os_error();
            libc::close(fd);
            if n != 1 {
                return Err(err);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 /kube /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const PROC_CGROUP: &str = "\
4:memory:/kube/pod7
2:cpuacct:/
1:cpu:/
0::/
";

    #[test]
    fn hierarchies_and_own_groups_are_read_from_proc() {
        let mounts = cgroup_mounts(MOUNTINFO);
        assert_eq!(mounts.len(), 4, "{mounts:?}");
        let memory = mounts.iter().find(|m| m.3.contains("memory")).unwrap();
        assert_eq!(memory.0, "/kube");
        // `cpu` is matched as a whole option, not inside `cpuacct`.
        let cpu: Vec<_> = mounts
            .iter()
            .filter(|m| m.3.split(',').any(|o| o == "cpu"))
            .collect();
        assert_eq!(cpu.len(), 1);
        assert_eq!(cpu[0].1, Path::new("/sys/fs/cgroup/cpu"));
        assert_eq!(own_group(PROC_CGROUP, "memory").unwrap(), "/kube/pod7");
        assert_eq!(own_group(PROC_CGROUP, "cpu").unwrap(), "/");
        assert_eq!(own_group(PROC_CGROUP, "").unwrap(), "/");
        // A mount whose root is a group: paths below it are relative to that group.
        assert_eq!(
            group_dir(&memory.1, &memory.0, "/kube/pod7"),
            Path::new("/sys/fs/cgroup/memory/pod7")
        );
    }

    /// The files of a v2 group (a plain directory stands in for the kernel's).
    #[test]
    fn v2_limits_are_written_and_read_back_in_the_kernel_formats() {
        let dir = tempfile::tempdir().unwrap();
        let c = Cgroups {
            layout: Layout::V2 {
                job: dir.path().to_path_buf(),
            },
        };
        let limits = Limits {
            cpu: Some(1.5),
            memory_bytes: Some(256 << 20),
        };
        let procs = c.create(3, limits).unwrap();
        let node = dir.path().join("node-3");
        assert_eq!(
            procs,
            [CString::new(node.join("cgroup.procs").to_str().unwrap()).unwrap()]
        );
        assert_eq!(
            std::fs::read_to_string(node.join("cpu.max")).unwrap(),
            "150000 100000"
        );
        assert_eq!(
            std::fs::read_to_string(node.join("memory.max")).unwrap(),
            "268435456"
        );
        assert_eq!(c.get(3).unwrap(), limits);
        c.set(3, Limits::default()).unwrap();
        assert_eq!(
            std::fs::read_to_string(node.join("cpu.max")).unwrap(),
            "max 100000"
        );
        assert_eq!(c.get(3).unwrap(), Limits::default());
        std::fs::write(
            node.join("memory.events"),
            "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n",
        )
        .unwrap();
        assert_eq!(c.oom_kills(3), 1);
        assert_eq!(c.oom_kills(4), 0, "no group, no kill");
    }
}
