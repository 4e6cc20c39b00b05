//! End-to-end tests of the Slurm backend (`elastrec run --backend slurm`) against a real
//! Slurm (slurmctld + slurmd on loopback, see `slurm_harness`): a whole job, a worker
//! cancelled by `scancel` mid-job, and requests Slurm cannot serve, refused before any
//! job is submitted. Every test leaves no job in `squeue`.

mod common;
mod slurm_harness;

use std::path::Path;
use std::process::Command;

use common::*;
use slurm_harness::{slurm, Slurm};

/// See `cluster.rs`: multi-worker asynchronous runs land within 0.005 of single-process.
const AUC_TOLERANCE: f64 = 0.005;

const CLUSTER: &str = r#"
[cluster]
ps = 2
workers = 2
staleness = 0
batches_per_shard = 4
heartbeat_ms = 200
dead_after_ms = 4000
max_worker_restarts = 10
"#;

/// The cluster, with no job left by an earlier test; `None`: Slurm is missing (the
/// harness said so loudly).
fn cluster() -> Option<&'static Slurm> {
    let s = slurm()?;
    s.clear();
    Some(s)
}

/// `elastrec run JOB --backend slurm EXTRA...` in its own process group, with the test
/// cluster's configuration.
fn spawn_on_slurm(s: &Slurm, job: &Path, log: &Path, extra: &[&str]) -> Group {
    let mut args = vec!["run", job.to_str().unwrap(), "--backend", "slurm"];
    args.extend_from_slice(extra);
    Group::spawn_with_env(&args, log, &[("SLURM_CONF", s.conf.to_str().unwrap())])
}

/// Runs `elastrec run JOB --backend slurm` to its end; returns (succeeded, stderr).
fn run_on_slurm(s: &Slurm, job: &Path) -> (bool, String) {
    let out = Command::new(exe())
        .args(["run", job.to_str().unwrap(), "--backend", "slurm"])
        .env("SLURM_CONF", &s.conf)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// (a) 2 PS and 2 workers, each a Slurm job of its own: exactly-once ledger, AUC of the
/// single-process trainer, every node seen in `squeue` under its name while the job
/// runs (and the token on no job's command line), nothing left in Slurm afterwards.
#[test]
fn slurm_job_runs_to_the_end_exactly_once() {
    let _g = serial();
    let Some(s) = cluster() else { return };
    let (job, dir) = write_job("slurm-a", CLUSTER);
    let log = dir.with_extension("log");
    let first = (2 * fixture().train_rows / 5).to_string();
    let mut g = spawn_on_slurm(s, &job, &log, &["--pause-at-samples", &first]);
    wait_held(&dir);
    let jobs = s.jobs();
    let ours: Vec<_> = jobs
        .iter()
        .filter(|j| j.name.starts_with("elastrec-slurm-a-") && j.state == "RUNNING")
        .collect();
    let count = |role: &str| {
        ours.iter()
            .filter(|j| j.name.contains(&format!("-{role}-")))
            .count()
    };
    assert_eq!((count("ps"), count("worker")), (2, 2), "{jobs:?}");
    let token = std::fs::read_to_string(dir.join("token")).unwrap();
    for j in &ours {
        let shown = s.run("scontrol", &["show", "job", "-o", &j.id]);
        assert!(!shown.contains(token.trim()), "token visible in {shown}");
    }
    unpause(&dir);
    g.wait_success(&log);
    check_result(&dir, &log, AUC_TOLERANCE);
    s.wait_no_jobs();
}

/// (b) A worker's Slurm job cancelled with `scancel` while the job is held: the master
/// learns it from Slurm (the log names the state), declares the worker dead and starts
/// another; the job ends with an exact ledger and single-process AUC.
#[test]
fn slurm_scancel_of_a_worker_is_seen_and_the_worker_relaunched() {
    let _g = serial();
    let Some(s) = cluster() else { return };
    let (job, dir) = write_job("slurm-b", CLUSTER);
    let log = dir.with_extension("log");
    let first = (2 * fixture().train_rows / 5).to_string();
    let mut g = spawn_on_slurm(s, &job, &log, &["--pause-at-samples", &first]);
    let status = wait_held(&dir);
    let (id, _) = *running_workers(&status)
        .first()
        .unwrap_or_else(|| panic!("no running worker: {status}"));
    let suffix = format!("-worker-{id}");
    let victim = s
        .jobs()
        .into_iter()
        .find(|j| j.name.starts_with("elastrec-slurm-b-") && j.name.ends_with(&suffix))
        .unwrap_or_else(|| panic!("worker {id} not in squeue: {:?}", s.jobs()));
    s.run("scancel", &[&victim.id]);
    wait_not_running(&dir, id);
    // The replacement registers while the job is still held.
    wait_for(std::time::Duration::from_secs(120), || {
        status_json(&dir).is_some_and(|st| running_workers(&st).len() == 2)
    });
    unpause(&dir);
    let text = g.wait_success(&log);
    check_result(&dir, &log, AUC_TOLERANCE);
    let seen = format!("worker {id} ({}) ended: Slurm state CANCELLED", victim.name);
    assert!(text.contains(&seen), "no `{seen}` in:\n{text}");
    assert!(text.contains("declared dead"), "{text}");
    assert!(result(&dir)["workers_dead"].as_u64() >= Some(1), "{text}");
    s.wait_no_jobs();
}

/// SIGKILL of the master, then `run --resume`: the new master finds the PS still running
/// in Slurm by their names (`is_alive` through `squeue`) and keeps them: the job has no
/// checkpoint, so it could not go on otherwise.
#[test]
fn slurm_master_killed_and_resumed_keeps_the_running_nodes() {
    let _g = serial();
    let Some(s) = cluster() else { return };
    let (job, dir) = write_job("slurm-r", CLUSTER);
    let log = dir.with_extension("log");
    let at = (2 * fixture().train_rows / 3).to_string();
    let mut g = spawn_on_slurm(s, &job, &log, &["--pause-at-samples", &at]);
    wait_held(&dir);
    // SAFETY: plain kill(2) of the master only; its sruns and Slurm jobs keep running.
    unsafe {
        libc::kill(g.pid(), libc::SIGKILL);
    }
    let _ = g.wait(std::time::Duration::from_secs(30));
    let ps_jobs = || {
        let mut ids: Vec<String> = s
            .jobs()
            .into_iter()
            .filter(|j| j.name.contains("-ps-") && j.state == "RUNNING")
            .map(|j| j.id)
            .collect();
        ids.sort();
        ids
    };
    let before = ps_jobs();
    assert_eq!(before.len(), 2, "{:?}", s.jobs());
    let log2 = dir.with_extension("resume.log");
    let conf = s.conf.to_str().unwrap();
    let mut g2 = Group::spawn_with_env(
        &["run", "--resume", dir.to_str().unwrap()],
        &log2,
        &[("SLURM_CONF", conf)],
    );
    wait_held(&dir);
    // The same Slurm jobs serve the PS: kept, not submitted again.
    assert_eq!(ps_jobs(), before, "{:?}", s.jobs());
    unpause(&dir);
    let text = g2.wait_success(&log2);
    check_result(&dir, &log2, AUC_TOLERANCE);
    assert!(text.contains(" 0 PS recoveries"), "{text}");
    drop(g);
    s.wait_no_jobs();
}

/// Ctrl-C (SIGINT) to a master whose job is held: it stops every node, and by the time
/// it has exited none of its Slurm jobs is still pending or running.
#[test]
fn slurm_interrupted_master_leaves_no_job_running() {
    let _g = serial();
    let Some(s) = cluster() else { return };
    let (job, dir) = write_job("slurm-i", CLUSTER);
    let log = dir.with_extension("log");
    let first = (2 * fixture().train_rows / 5).to_string();
    let mut g = spawn_on_slurm(s, &job, &log, &["--pause-at-samples", &first]);
    wait_held(&dir);
    assert_eq!(s.jobs().len(), 4, "{:?}", s.jobs());
    // SAFETY: plain kill(2) of the master only, as a terminal's Ctrl-C would.
    unsafe {
        libc::kill(g.pid(), libc::SIGINT);
    }
    let st = g.wait(std::time::Duration::from_secs(60));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!st.success(), "{text}");
    let left: Vec<_> = s
        .jobs()
        .into_iter()
        .filter(|j| j.state == "RUNNING" || j.state == "PENDING")
        .collect();
    assert!(left.is_empty(), "still in Slurm: {left:?}\n{text}");
    s.wait_no_jobs();
}

/// The controller does not answer (a `slurm.conf` naming a port nobody listens on): the
/// error says so and what to do.
#[test]
fn slurm_controller_unreachable_is_reported_with_what_to_do() {
    let _g = serial();
    let Some(s) = cluster() else { return };
    let dead = s.dir.join("dead.conf");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let conf: String = std::fs::read_to_string(&s.conf)
        .unwrap()
        .lines()
        .map(|l| match l.starts_with("SlurmctldPort=") {
            true => format!("SlurmctldPort={port}\n"),
            false => format!("{l}\n"),
        })
        .collect();
    std::fs::write(&dead, conf).unwrap();
    let (job, _dir) = write_job("slurm-c4", CLUSTER);
    let out = Command::new(exe())
        .args(["run", job.to_str().unwrap(), "--backend", "slurm"])
        .env("SLURM_CONF", &dead)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!("{err}");
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("Slurm controller does not answer"), "{err}");
    assert!(err.contains("SLURM_CONF"), "{err}");
    assert!(s.jobs().is_empty(), "{:?}", s.jobs());
}

/// The master inside an allocation (`sbatch`): every node is a step of it, not a job of
/// its own; the job ends like on the local backend and the allocation completes.
#[test]
fn slurm_master_inside_an_sbatch_allocation_runs_nodes_as_steps() {
    let _g = serial();
    let Some(s) = cluster() else { return };
    let (job, dir) = write_job("slurm-d", CLUSTER);
    let log = dir.with_extension("log");
    let script = dir.with_extension("sh");
    let first = (2 * fixture().train_rows / 5).to_string();
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nexec {} run {} --backend slurm --pause-at-samples {first}\n",
            exe(),
            job.display()
        ),
    )
    .unwrap();
    // Room for 2 PS and 2 workers of 1 CPU and 2 GiB each.
    let batch = s.run(
        "sbatch",
        &[
            "--parsable",
            "--job-name=elastrec-test-master",
            "--cpus-per-task=8",
            "--mem=12000M",
            "--output",
            log.to_str().unwrap(),
            script.to_str().unwrap(),
        ],
    );
    let batch = batch.trim().to_string();
    wait_held(&dir);
    let steps = s.run("squeue", &["-s", "-h", "-j", &batch, "-o", "%i|%j"]);
    let count = |role: &str| {
        steps
            .lines()
            .filter(|l| l.starts_with(&format!("{batch}.")) && l.contains(&format!("-{role}-")))
            .count()
    };
    assert_eq!((count("ps"), count("worker")), (2, 2), "{steps}");
    let jobs = s.jobs();
    assert_eq!(jobs.len(), 1, "nodes are steps, not jobs: {jobs:?}");
    unpause(&dir);
    wait_for(std::time::Duration::from_secs(300), || {
        !s.jobs().iter().any(|j| j.id == batch)
    });
    check_result(&dir, &log, AUC_TOLERANCE);
    let shown = s.run("scontrol", &["show", "job", "-o", &batch]);
    assert!(shown.contains("JobState=COMPLETED"), "{shown}");
    s.wait_no_jobs();
}

/// (c) A partition Slurm does not have: refused before anything is submitted, naming
/// the partition and the setting.
#[test]
fn slurm_missing_partition_is_refused_before_submitting() {
    let _g = serial();
    let Some(s) = cluster() else { return };
    let extra = format!("{CLUSTER}\n[engine.slurm]\npartition = \"no-such-part\"\n");
    let (job, _dir) = write_job("slurm-c1", &extra);
    let (ok, err) = run_on_slurm(s, &job);
    eprintln!("{err}");
    assert!(!ok, "{err}");
    assert!(err.contains("engine.slurm.partition"), "{err}");
    assert!(err.contains("no-such-part"), "{err}");
    assert!(
        err.contains("debug"),
        "the known partitions are listed: {err}"
    );
    assert!(s.jobs().is_empty(), "{:?}", s.jobs());
}

/// (c) A worker asking for more memory than any node has: Slurm's refusal is reported
/// naming the role's section, and no job is left behind.
#[test]
fn slurm_request_no_node_can_grant_is_refused_before_submitting() {
    let _g = serial();
    let Some(s) = cluster() else { return };
    let extra = format!("{CLUSTER}\n[resources.worker]\nmemory_gb = 500\n");
    let (job, _dir) = write_job("slurm-c2", &extra);
    let (ok, err) = run_on_slurm(s, &job);
    eprintln!("{err}");
    assert!(!ok, "{err}");
    assert!(err.contains("resources.worker"), "{err}");
    assert!(err.contains("512000 MiB"), "{err}");
    assert!(s.jobs().is_empty(), "{:?}", s.jobs());
}

/// (c) Slurm's commands not where the job says: the error says Slurm is missing and
/// what to set.
#[test]
fn slurm_commands_missing_are_reported_with_what_to_do() {
    let _g = serial();
    let Some(s) = cluster() else { return };
    let extra = format!("{CLUSTER}\n[engine.slurm]\nbin_dir = \"/nonexistent/slurm/bin\"\n");
    let (job, _dir) = write_job("slurm-c3", &extra);
    let (ok, err) = run_on_slurm(s, &job);
    eprintln!("{err}");
    assert!(!ok, "{err}");
    assert!(err.contains("Slurm is not installed"), "{err}");
    assert!(err.contains("engine.slurm.bin_dir"), "{err}");
    assert!(s.jobs().is_empty(), "{:?}", s.jobs());
}

/// Nodes waiting in Slurm's queue are waited for, not declared dead: a job holding all
/// but two of the node's CPUs leaves room for at most two of the job's four nodes (which
/// ones is Slurm's choice), so the others pend. For several times
/// `cluster.dead_after_ms` the master sees them pending through `squeue` and keeps them; once the blocking job is cancelled they run and the job ends
/// with no worker declared dead and no relaunch.
#[test]
fn slurm_nodes_pending_in_the_queue_are_waited_for_not_declared_dead() {
    let _g = serial();
    let Some(s) = cluster() else { return };
    let cpus = (slurm_harness::CPUS - 2).to_string();
    let blocker = s.run(
        "sbatch",
        &[
            "--parsable",
            "--job-name=blocker",
            "--cpus-per-task",
            &cpus,
            "--mem=100M",
            // Not the default slurm-<id>.out in the test's working directory.
            "--output=/dev/null",
            "--wrap",
            "sleep 600",
        ],
    );
    let blocker = blocker.trim().split(';').next().unwrap().to_string();
    let t0 = std::time::Instant::now();
    while !s
        .jobs()
        .iter()
        .any(|j| j.id == blocker && j.state == "RUNNING")
    {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(120),
            "the blocking job {blocker} does not run: {:?}\n{}",
            s.jobs(),
            s.run("sinfo", &["-N", "-l"])
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let cluster = CLUSTER.replace("dead_after_ms = 4000", "dead_after_ms = 1000");
    let (job, dir) = write_job("slurm-q", &cluster);
    let log = dir.with_extension("log");
    let mut g = spawn_on_slurm(s, &job, &log, &[]);
    let pending_nodes = || {
        s.jobs()
            .iter()
            .filter(|j| j.name.starts_with("elastrec-slurm-q-") && j.state == "PENDING")
            .count()
    };
    let t0 = std::time::Instant::now();
    while pending_nodes() < 2 {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(60),
            "no two nodes pending: {:?}",
            s.jobs()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // The state is held by the blocking job; what is tested is time passing in it.
    std::thread::sleep(std::time::Duration::from_millis(4000));
    assert!(pending_nodes() >= 2, "{:?}", s.jobs());
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!text.contains("declared dead"), "{text}");
    s.run("scancel", &[&blocker]);
    let text = g.wait_success(&log);
    check_result(&dir, &log, AUC_TOLERANCE);
    assert!(!text.contains("declared dead"), "{text}");
    assert_eq!(result(&dir)["workers_launched"], 2, "{text}");
    s.wait_no_jobs();
}
