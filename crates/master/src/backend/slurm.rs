//! The Slurm backend: every node is one `srun` with one task. Outside an allocation each
//! `srun` is a Slurm job of its own; inside one (the master runs in an `sbatch` script,
//! `SLURM_JOB_ID` is set) each is a step of that allocation. Nodes are found again by
//! their name (`--job-name`, unique per job and node), so a restarted master can tell
//! which of its nodes still run.
//!
//! The trait's methods are called from the master's async control loop and must return
//! quickly: `start` only spawns `srun`; a watcher thread notices ended `srun`s, asks Slurm
//! why they ended (which may take a few polls while the job is `COMPLETING`) and queues
//! the verdicts that `exited` hands out.

mod commands;
mod preflight;

use std::collections::HashMap;
use std::process::{Child, ExitStatus, Stdio};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use elastrec_job::resources::SlurmConfig;
use parking_lot::{Condvar, Mutex};

use self::commands::{is_live, is_transient, SlurmTools};
use super::{ClusterBackend, NodeExit};
use crate::events::event;
use crate::job::{Node, Role};
use crate::launch::{role_name, LaunchSpec, LaunchTemplate};

/// How long the watcher waits for an ended job to reach its final state in Slurm
/// (`COMPLETING` lasts until every process of the job is gone).
const FINAL_STATE_WAIT: Duration = Duration::from_secs(30);

/// The allocation the master runs in (`sbatch` / `salloc`), read from its environment.
#[derive(Debug, Clone)]
pub struct Allocation {
    /// `SLURM_JOB_ID`.
    pub job_id: String,
    /// `SLURM_CPUS_ON_NODE`.
    pub cpus_per_node: Option<u32>,
    /// `SLURM_MEM_PER_NODE`, or `SLURM_MEM_PER_CPU` times the CPUs (MiB).
    pub memory_mib_per_node: Option<u64>,
}

impl Allocation {
    /// The allocation this process runs in, if any.
    pub fn from_env() -> Option<Self> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let job_id = var("SLURM_JOB_ID")?;
        let cpus_per_node = var("SLURM_CPUS_ON_NODE").and_then(|v| v.parse().ok());
        let per_cpu: Option<u64> = var("SLURM_MEM_PER_CPU").and_then(|v| v.parse().ok());
        let memory_mib_per_node = var("SLURM_MEM_PER_NODE")
            .and_then(|v| v.parse().ok())
            .or_else(|| Some(per_cpu? * u64::from(cpus_per_node?)));
        Some(Self {
            job_id,
            cpus_per_node,
            memory_mib_per_node,
        })
    }
}

/// The job's nodes as Slurm jobs or steps.
pub struct SlurmSteps {
    template: Arc<LaunchTemplate>,
    cfg: SlurmConfig,
    tools: SlurmTools,
    allocation: Option<Allocation>,
    shared: Arc<Shared>,
    watcher: Option<JoinHandle<()>>,
}

/// What the control loop and the watcher thread share.
struct Shared {
    tools: SlurmTools,
    allocation: Option<Allocation>,
    poll: Duration,
    steps: Mutex<HashMap<u32, Step>>,
    /// `srun`s of stopped nodes, reaped by the watcher (no verdict wanted).
    stopped: Mutex<Vec<Child>>,
    ended: Mutex<Vec<NodeExit>>,
    /// Nodes whose Slurm job is still pending in the queue (outside an allocation).
    queued: Mutex<Vec<u32>>,
    shutdown: Mutex<bool>,
    wake: Condvar,
}

/// One node's step.
struct Step {
    name: String,
    role: Role,
    /// Our `srun`; `None` for a node an earlier master started (found by `is_alive`).
    srun: Option<Child>,
}

impl SlurmSteps {
    /// Checks that Slurm can run the job `template` describes (see
    /// [`preflight::check`]) and starts watching.
    pub fn open(template: Arc<LaunchTemplate>, cfg: &SlurmConfig) -> anyhow::Result<Self> {
        let tools = SlurmTools::new(&cfg.bin_dir);
        let allocation = Allocation::from_env();
        let res = &template.resources;
        preflight::check(
            &tools,
            cfg,
            allocation.as_ref(),
            &[("ps", &res.ps), ("worker", &res.worker)],
        )?;
        let shared = Arc::new(Shared {
            tools: tools.clone(),
            allocation: allocation.clone(),
            poll: Duration::from_millis(cfg.poll_ms.max(1)),
            steps: Mutex::new(HashMap::new()),
            stopped: Mutex::new(Vec::new()),
            ended: Mutex::new(Vec::new()),
            queued: Mutex::new(Vec::new()),
            shutdown: Mutex::new(false),
            wake: Condvar::new(),
        });
        let watcher = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("slurm-watch".into())
                .spawn(move || shared.watch())?
        };
        Ok(Self {
            template,
            cfg: cfg.clone(),
            tools,
            allocation,
            shared,
            watcher: Some(watcher),
        })
    }

    /// `srun`'s options and command for `spec`. Inside an allocation, partition and
    /// account are the allocation's, and `--exact` keeps a step to its own CPUs so that
    /// steps run side by side.
    fn srun_args(&self, spec: &LaunchSpec) -> Vec<String> {
        let cpus = (spec.cpu.ceil() as u32).max(1);
        let mut args = vec![format!("--job-name={}", spec.name)];
        match &self.allocation {
            None => args.extend(request_args(&self.cfg, cpus, spec.memory_mib)),
            Some(_) => {
                let inside = SlurmConfig {
                    partition: String::new(),
                    account: String::new(),
                    ..self.cfg.clone()
                };
                args.extend(request_args(&inside, cpus, spec.memory_mib));
                args.push("--exact".into());
            }
        }
        args.push(spec.program.to_string_lossy().into_owned());
        args.extend(spec.args.iter().cloned());
        args
    }

    /// Cancels every Slurm job or step of this job (names carry its uid), whoever
    /// started it.
    fn cancel_all(&self) {
        let ours = |name: &str| is_ours(&self.template, name);
        let targets: Vec<String> = self
            .shared
            .listed()
            .into_iter()
            .filter(|(_, name, _)| ours(name))
            .map(|(id, _, _)| id)
            .collect();
        self.tools.scancel(&targets);
    }
}

/// Resource options of one node's `srun` (and of the `--test-only` probe).
pub(crate) fn request_args(cfg: &SlurmConfig, cpus: u32, memory_mib: u64) -> Vec<String> {
    let mut args = vec![
        "--ntasks=1".to_string(),
        "--nodes=1".to_string(),
        format!("--cpus-per-task={cpus}"),
        format!("--mem={memory_mib}M"),
    ];
    if !cfg.partition.is_empty() {
        args.push(format!("--partition={}", cfg.partition));
    }
    if !cfg.account.is_empty() {
        args.push(format!("--account={}", cfg.account));
    }
    args.extend(cfg.extra_args.iter().cloned());
    args
}

/// A node's end as Slurm states it, and whether Slurm killed it for its memory.
fn in_slurm_words(state: &str, detail: &str, srun: &str) -> (String, bool) {
    let oom = state.starts_with("OUT_OF_MEMORY");
    (format!("Slurm state {state}{detail}{srun}"), oom)
}

/// True for the name of a node of the job `template` describes: every node name ends
/// `-<uid8>-<role>-<id>` (see [`LaunchTemplate::node_name`]).
/// The nodes whose Slurm job `squeue` lists as pending (`(id, name, state)` rows).
fn pending_nodes(listed: &[(String, String, String)], steps: &HashMap<u32, Step>) -> Vec<u32> {
    steps
        .iter()
        .filter(|(_, step)| {
            listed
                .iter()
                .any(|(_, name, state)| *name == step.name && state == "PENDING")
        })
        .map(|(&id, _)| id)
        .collect()
}

fn is_ours(template: &LaunchTemplate, name: &str) -> bool {
    let uid = &template.job_uid[..template.job_uid.len().min(8)];
    name.starts_with("elastrec-")
        && ["ps", "worker"].iter().any(|role| {
            name.rsplit_once('-').is_some_and(|(head, id)| {
                id.parse::<u32>().is_ok() && head.ends_with(&format!("-{uid}-{role}"))
            })
        })
}

impl ClusterBackend for SlurmSteps {
    /// The job is over: nothing of it stays in Slurm, even a step whose `srun` this
    /// master no longer follows.
    fn finish(&self) {
        self.cancel_all();
    }

    fn start(&self, node: &Node) -> anyhow::Result<u32> {
        let spec = self.template.spec(node);
        let log = spec.open_log()?;
        // The token travels in srun's environment, which srun passes on to the task
        // (`--export=ALL`, its default); never in its arguments.
        let child = self
            .tools
            .command("srun")
            .args(self.srun_args(&spec))
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .envs(spec.secret_env.iter().map(|(k, v)| (k, v)))
            .stdout(log.try_clone()?)
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| {
                anyhow::anyhow!(
                    "starting {} with `{}`: {e}",
                    spec.name,
                    self.tools.program("srun").display()
                )
            })?;
        let pid = child.id();
        let old = self.shared.steps.lock().insert(
            node.id,
            Step {
                name: spec.name,
                role: node.role,
                srun: Some(child),
            },
        );
        if let Some(Step { srun: Some(c), .. }) = old {
            self.shared.stopped.lock().push(c);
        }
        Ok(pid)
    }

    fn stop(&self, node: &Node) {
        let name = self.template.node_name(node.role, node.id);
        let step = self.shared.steps.lock().remove(&node.id);
        // srun first: once it is gone it cannot submit the job after the cancel below.
        let srun = step.and_then(|s| s.srun).map(|mut c| {
            let _ = c.kill();
            c
        });
        let targets: Vec<String> = self
            .shared
            .listed()
            .into_iter()
            .filter(|(_, n, _)| *n == name)
            .map(|(id, _, _)| id)
            .collect();
        self.tools.scancel(&targets);
        if let Some(c) = srun {
            self.shared.stopped.lock().push(c);
        }
    }

    fn queued(&self) -> Vec<u32> {
        self.shared.queued.lock().clone()
    }

    fn exited(&self) -> Vec<NodeExit> {
        std::mem::take(&mut *self.shared.ended.lock())
    }

    fn is_alive(&self, node: &Node) -> bool {
        if let Some(step) = self.shared.steps.lock().get_mut(&node.id) {
            return match &mut step.srun {
                Some(c) => matches!(c.try_wait(), Ok(None)),
                None => true,
            };
        }
        let name = self.template.node_name(node.role, node.id);
        let alive = self
            .shared
            .listed()
            .iter()
            .any(|(_, n, state)| *n == name && is_live(state));
        if alive {
            // Started by an earlier master: the watcher follows it through squeue.
            self.shared.steps.lock().insert(
                node.id,
                Step {
                    name,
                    role: node.role,
                    srun: None,
                },
            );
        }
        alive
    }

    fn set_worker_threads(&self, threads: usize) {
        self.template.set_worker_threads(threads);
    }
}

impl Shared {
    /// `(id, name, state)` of this user's jobs, or inside an allocation its steps (a
    /// listed step is running). Empty when Slurm does not answer.
    fn listed(&self) -> Vec<(String, String, String)> {
        let rows = match &self.allocation {
            None => self.tools.squeue("%i|%j|%T", &[]),
            Some(a) => self.tools.squeue("%i|%j", &["-s", "-j", &a.job_id]),
        };
        match rows {
            Ok(rows) => rows
                .into_iter()
                .filter(|r| r.len() >= 2)
                .map(|r| {
                    let state = r.get(2).cloned().unwrap_or_else(|| "RUNNING".into());
                    (r[0].clone(), r[1].clone(), state)
                })
                .collect(),
            Err(e) => {
                tracing::warn!(%e, "listing Slurm jobs failed");
                Vec::new()
            }
        }
    }

    /// The backend is being dropped: waits for Slurm are cut short.
    fn shutting_down(&self) -> bool {
        *self.shutdown.lock()
    }

    /// The watcher thread: every poll interval, reaps `srun`s and notices adopted steps
    /// that are gone, until shut down.
    fn watch(&self) {
        loop {
            {
                let mut down = self.shutdown.lock();
                if !*down {
                    self.wake.wait_for(&mut down, self.poll);
                }
                if *down {
                    return;
                }
            }
            self.stopped
                .lock()
                .retain_mut(|c| matches!(c.try_wait(), Ok(None)));
            if self.allocation.is_none() && !self.steps.lock().is_empty() {
                let listed = self.listed();
                let pending = pending_nodes(&listed, &self.steps.lock());
                *self.queued.lock() = pending;
            }
            for (id, step, status) in self.ended_steps() {
                let (reason, oom) = self.verdict(&step.name, status);
                event!(
                    "node_ended",
                    node = id,
                    role = role_name(step.role),
                    step = %step.name,
                    reason = %reason,
                    oom,
                    "master: slurm: {} {id} ({}) ended: {reason}",
                    role_name(step.role),
                    step.name
                );
                self.ended.lock().push(NodeExit { id, reason, oom });
            }
        }
    }

    /// Steps whose `srun` exited (with its status), and adopted steps Slurm no longer
    /// runs.
    fn ended_steps(&self) -> Vec<(u32, Step, Option<ExitStatus>)> {
        let mut gone = Vec::new();
        let adopted: Vec<String> = {
            let mut steps = self.steps.lock();
            let done: Vec<(u32, ExitStatus)> = steps
                .iter_mut()
                .filter_map(|(&id, s)| match s.srun.as_mut()?.try_wait() {
                    Ok(Some(status)) => Some((id, status)),
                    _ => None,
                })
                .collect();
            for (id, status) in done {
                if let Some(s) = steps.remove(&id) {
                    gone.push((id, s, Some(status)));
                }
            }
            steps
                .values()
                .filter(|s| s.srun.is_none())
                .map(|s| s.name.clone())
                .collect()
        };
        if !adopted.is_empty() {
            let listed = self.listed();
            let running = |name: &String| listed.iter().any(|(_, n, st)| n == name && is_live(st));
            let mut steps = self.steps.lock();
            let ids: Vec<u32> = steps
                .iter()
                .filter(|(_, s)| s.srun.is_none() && !running(&s.name))
                .map(|(&id, _)| id)
                .collect();
            for id in ids {
                if let Some(s) = steps.remove(&id) {
                    gone.push((id, s, None));
                }
            }
        }
        gone
    }

    /// Why the node `name` ended, in Slurm's words (`CANCELLED`, `OUT_OF_MEMORY`,
    /// `FAILED` with its exit code, ...), and whether Slurm killed it for memory.
    fn verdict(&self, name: &str, srun: Option<ExitStatus>) -> (String, bool) {
        let srun = srun.map_or_else(String::new, |s| format!("; srun {s}"));
        let word = match &self.allocation {
            None => self.job_verdict(name),
            Some(a) => self.step_verdict(&a.job_id, name),
        };
        match word {
            Some((state, detail)) => in_slurm_words(&state, &detail, &srun),
            None if self.allocation.is_some() => (
                format!(
                    "step ended (without Slurm accounting no state is kept for ended steps){srun}"
                ),
                false,
            ),
            None => (format!("Slurm no longer knows the job{srun}"), false),
        }
    }

    /// The final state of the newest Slurm job named `name`, waiting while it completes.
    fn job_verdict(&self, name: &str) -> Option<(String, String)> {
        let rows = self
            .tools
            .squeue("%i", &["-t", "all", "--name", name])
            .ok()?;
        let id = rows
            .iter()
            .filter_map(|r| r.first()?.parse::<u64>().ok())
            .max()?
            .to_string();
        let t0 = Instant::now();
        loop {
            let fields = self.tools.job_fields(&id);
            let get = |k: &str| {
                fields
                    .as_ref()?
                    .iter()
                    .find(|(key, _)| key == k)
                    .map(|(_, v)| v.clone())
            };
            let Some(state) = get("JobState") else {
                // Slurm forgot the job already; accounting may still know it.
                let rows = self.tools.sacct(&id)?;
                let row = rows.iter().find(|r| r.first() == Some(&id))?;
                return Some((
                    row.get(2)?.clone(),
                    format!(" (job {id}, exit code {})", row.get(3)?),
                ));
            };
            if !is_transient(&state) || t0.elapsed() > FINAL_STATE_WAIT || self.shutting_down() {
                let reason = get("Reason").filter(|r| r != "None");
                let exit = get("ExitCode").unwrap_or_default();
                let detail = match reason {
                    Some(r) => format!(" (job {id}, reason {r}, exit code {exit})"),
                    None => format!(" (job {id}, exit code {exit})"),
                };
                return Some((state, detail));
            }
            std::thread::sleep(self.poll);
        }
    }

    /// The final state of the step `name` of `allocation`, from accounting (steps leave
    /// `squeue` when they end; without accounting only srun's status remains).
    fn step_verdict(&self, allocation: &str, name: &str) -> Option<(String, String)> {
        let t0 = Instant::now();
        loop {
            let rows = self.tools.sacct(allocation)?;
            let row = rows
                .iter()
                .rev()
                .find(|r| r.get(1).map(String::as_str) == Some(name))?;
            let state = row.get(2)?.clone();
            if !is_transient(&state) || t0.elapsed() > FINAL_STATE_WAIT || self.shutting_down() {
                let detail = format!(" (step {}, exit code {})", row[0], row.get(3)?);
                return Some((state, detail));
            }
            std::thread::sleep(self.poll);
        }
    }
}

impl Drop for SlurmSteps {
    /// No step outlives its master: whatever of this job still runs in Slurm is
    /// cancelled, and the watcher stops.
    fn drop(&mut self) {
        let sruns: Vec<Child> = self
            .shared
            .steps
            .lock()
            .drain()
            .filter_map(|(_, s)| s.srun)
            .collect();
        self.cancel_all();
        for mut c in sruns
            .into_iter()
            .chain(self.shared.stopped.lock().drain(..))
        {
            let _ = c.kill();
            let _ = c.wait();
        }
        *self.shared.shutdown.lock() = true;
        self.shared.wake.notify_all();
        if let Some(w) = self.watcher.take() {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use elastrec_job::resources::ResourcesConfig;

    fn template() -> LaunchTemplate {
        LaunchTemplate::new(
            "/opt/elastrec".into(),
            "job",
            "0123456789abcdef",
            "10.0.0.1:5000",
            "tok",
            "/tmp/logs".into(),
            ResourcesConfig::default(),
        )
    }

    #[test]
    fn only_steps_squeue_lists_as_pending_are_queued() {
        let step = |name: &str| Step {
            name: name.into(),
            role: Role::Worker,
            srun: None,
        };
        let steps = HashMap::from([(3, step("a-worker-3")), (4, step("a-worker-4"))]);
        let listed = vec![
            (
                "10".to_string(),
                "a-worker-3".to_string(),
                "PENDING".to_string(),
            ),
            (
                "11".to_string(),
                "a-worker-4".to_string(),
                "RUNNING".to_string(),
            ),
            (
                "12".to_string(),
                "other-job".to_string(),
                "PENDING".to_string(),
            ),
        ];
        assert_eq!(pending_nodes(&listed, &steps), vec![3]);
    }

    #[test]
    fn names_of_this_job_are_told_from_others() {
        let t = template();
        assert!(is_ours(&t, &t.node_name(Role::Ps, 1)));
        assert!(is_ours(&t, &t.node_name(Role::Worker, 12)));
        assert!(!is_ours(&t, "elastrec-job-fedcba98-worker-12"));
        assert!(!is_ours(&t, "elastrec-job-01234567-worker-x"));
        assert!(!is_ours(&t, "batch"));
    }

    #[test]
    fn out_of_memory_is_a_memory_kill_and_other_states_are_not() {
        let (reason, oom) = in_slurm_words("OUT_OF_MEMORY", " (job 7, exit code 0:125)", "");
        assert!(oom, "{reason}");
        assert_eq!(reason, "Slurm state OUT_OF_MEMORY (job 7, exit code 0:125)");
        for state in ["CANCELLED", "TIMEOUT", "NODE_FAIL", "FAILED", "PREEMPTED"] {
            assert!(!in_slurm_words(state, "", "").1, "{state}");
        }
    }

    #[test]
    fn requests_carry_partition_account_and_extra_args() {
        let cfg = SlurmConfig {
            partition: "gpu".into(),
            account: "ml".into(),
            extra_args: vec!["--time=1:00:00".into()],
            ..SlurmConfig::default()
        };
        assert_eq!(
            request_args(&cfg, 2, 512),
            [
                "--ntasks=1",
                "--nodes=1",
                "--cpus-per-task=2",
                "--mem=512M",
                "--partition=gpu",
                "--account=ml",
                "--time=1:00:00"
            ]
        );
    }
}
