//! A real one-node Slurm cluster on loopback for the Slurm backend's tests: installed
//! when missing (`apt-get install -y slurm-wlm`), configured in a temporary directory
//! with free ports, `slurmctld` and `slurmd` started once per test binary and stopped by
//! their PIDs when it exits (after cancelling every job left).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::common::free_port;

/// The node's name in Slurm (`slurmd -N`): independent of the host's name.
pub const NODE: &str = "elastrec-test";
/// CPUs the node declares: more than this machine's cores (`config_overrides`), so that
/// 2 PS and 2-3 workers of one CPU each fit at once.
pub const CPUS: u32 = 8;
/// Memory the node declares, MiB: a node asking for more is refused.
pub const MEMORY_MIB: u64 = 16_000;

/// The running cluster.
pub struct Slurm {
    /// Directory of the configuration, state and daemon logs.
    pub dir: PathBuf,
    /// `slurm.conf`: give it to every Slurm command as `SLURM_CONF`.
    pub conf: PathBuf,
}

/// slurmd, then slurmctld (the order they are stopped in).
static DAEMONS: Mutex<Vec<Child>> = Mutex::new(Vec::new());
static CONF: OnceLock<PathBuf> = OnceLock::new();

/// The shared cluster, started on first use; `None` (after a loud message) where Slurm
/// cannot be installed.
pub fn slurm() -> Option<&'static Slurm> {
    static CLUSTER: OnceLock<Option<Slurm>> = OnceLock::new();
    let cluster = CLUSTER.get_or_init(start).as_ref();
    if cluster.is_none() {
        elastrec_common::skip_test(
            "SLURM",
            "Slurm is not installed and `apt-get install -y slurm-wlm` failed",
        );
    }
    cluster
}

fn start() -> Option<Slurm> {
    if !installed() && !install() {
        let msg = "Slurm (slurmctld/slurmd) is not installed and `apt-get install -y \
                   slurm-wlm` failed: THE SLURM BACKEND TESTS ARE SKIPPED";
        eprintln!("\n!!!!!!!! {msg} !!!!!!!!\n");
        return None;
    }
    let dir = tempfile::tempdir().unwrap().keep();
    for d in ["state", "spool"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    let conf = dir.join("slurm.conf");
    std::fs::write(&conf, config(&dir)).unwrap();
    CONF.set(conf.clone()).unwrap();
    // Registered before the daemons start, so that a failure below still stops them.
    // SAFETY: `stop_at_exit` is an `extern "C" fn()` that never unwinds.
    unsafe {
        libc::atexit(stop_at_exit);
    }
    let ctld = daemon(
        &dir,
        "slurmctld",
        &["-D", "-i", "-f", conf.to_str().unwrap()],
    );
    daemons().push(ctld);
    let slurmd = daemon(
        &dir,
        "slurmd",
        &["-D", "-f", conf.to_str().unwrap(), "-N", NODE],
    );
    // Stopped first: slurmctld would otherwise wait for it to report its jobs' ends.
    daemons().insert(0, slurmd);
    let cluster = Slurm { dir, conf };
    cluster.wait_node_idle();
    Some(cluster)
}

fn installed() -> bool {
    ["slurmctld", "slurmd", "srun"].iter().all(|p| {
        Command::new(p)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok()
    })
}

fn install() -> bool {
    eprintln!("slurm tests: installing slurm-wlm with apt-get");
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    // A fresh machine has no package lists yet: update once when the first try fails.
    (apt(&["install", "-y", "-qq", "slurm-wlm"])
        || (apt(&["update", "-qq"]) && apt(&["install", "-y", "-qq", "slurm-wlm"])))
        && installed()
}

/// A port nothing listens on now.
fn short_hostname() -> String {
    let out = Command::new("hostname").arg("-s").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A one-node cluster: no authentication (loopback only), no cgroups, no accounting,
/// consumable cores and memory.
fn config(dir: &Path) -> String {
    let d = dir.display();
    let host = short_hostname();
    let (ctld_port, slurmd_port) = (free_port(), free_port());
    format!(
        "ClusterName=elastrec-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
NodeName={NODE} NodeAddr=127.0.0.1 CPUs={CPUS} RealMemory={MEMORY_MIB} State=UNKNOWN
PartitionName=debug Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
"
    )
}

/// Starts `program args` in the foreground mode (`-D`) with its output in `dir`.
fn daemon(dir: &Path, program: &str, args: &[&str]) -> Child {
    let log = std::fs::File::create(dir.join(format!("{program}.out"))).unwrap();
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {program}: {e}"))
}

fn daemons() -> std::sync::MutexGuard<'static, Vec<Child>> {
    DAEMONS.lock().unwrap_or_else(|e| e.into_inner())
}

/// At the test binary's exit: cancels whatever jobs are left, then stops both daemons.
extern "C" fn stop_at_exit() {
    if let Some(conf) = CONF.get() {
        let _ = Command::new("scancel")
            .args(["--user", &user()])
            .env("SLURM_CONF", conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    for mut d in daemons().drain(..) {
        // SIGTERM: both daemons save their state and exit (SIGKILL would leave slurmd's
        // steps' bookkeeping behind).
        // SAFETY: kill(2) of our own child, no memory involved.
        unsafe {
            libc::kill(d.id() as i32, libc::SIGTERM);
        }
        let _ = d.wait();
    }
}

/// This process's user name (`scancel` has no `--me`).
fn user() -> String {
    // Never panics: it also runs in the exit handler.
    Command::new("id")
        .arg("-un")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|_| "root".into())
}

/// One row of `squeue`: a job of this cluster.
#[derive(Debug, Clone)]
pub struct Job {
    pub id: String,
    pub name: String,
    pub state: String,
}

impl Slurm {
    /// A Slurm command with this cluster's configuration.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", &self.conf);
        c
    }

    /// Output of `program args`, which must succeed.
    pub fn run(&self, program: &str, args: &[&str]) -> String {
        let out = self.command(program).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Jobs in `squeue` (pending, running, completing).
    pub fn jobs(&self) -> Vec<Job> {
        self.run("squeue", &["-h", "--me", "-o", "%i|%j|%T"])
            .lines()
            .filter_map(|l| {
                let mut f = l.split('|');
                Some(Job {
                    id: f.next()?.trim().into(),
                    name: f.next()?.trim().into(),
                    state: f.next()?.trim().into(),
                })
            })
            .collect()
    }

    /// Waits until no job is left in `squeue` (every one finished, or was cancelled and
    /// has completed).
    pub fn wait_no_jobs(&self) {
        let t0 = Instant::now();
        loop {
            let jobs = self.jobs();
            if jobs.is_empty() {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "jobs left in Slurm: {jobs:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Cancels every job (what a failed test left) and waits until they are gone.
    pub fn clear(&self) {
        let _ = self.command("scancel").args(["--user", &user()]).status();
        self.wait_no_jobs();
    }

    /// Waits until the node is idle: registered and not still finishing a job.
    fn wait_node_idle(&self) {
        let t0 = Instant::now();
        loop {
            let out = self
                .command("sinfo")
                .args(["-h", "-N", "-o", "%N|%T"])
                .output();
            let state = out
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .unwrap_or_default();
            if state == format!("{NODE}|idle") {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "Slurm node not idle (sinfo: `{state}`); logs in {}",
                self.dir.display()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}
