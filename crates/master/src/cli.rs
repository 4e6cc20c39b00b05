//! Library side of the `run`, `status`, `scale` and `bench-master` commands (the `elastrec`
//! binary only parses arguments and calls these).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use elastrec_proto::master::{
    get_task_response::Reply, GetTaskRequest, HeartbeatRequest, PauseRequest, RegisterRequest,
    ReportProgressRequest, Role as PbRole, ScaleRequest, StatusRequest, TakeCheckpointRequest,
};
use elastrec_rpc::{self as rpc, Master};

use crate::run::{resume_job, start_job, JobDir, JobResult};

/// `elastrec run`: start a distributed job (master + PS + workers as local processes).
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// The job file (TOML) with a `[cluster]` section.
    #[arg(required_unless_present = "resume")]
    pub job: Option<PathBuf>,
    /// Restart the master of the job in this directory (after the master died).
    #[arg(long, value_name = "JOB_DIR", conflicts_with = "job")]
    pub resume: Option<PathBuf>,
    /// Where role processes run: `local` (processes on this machine, the default),
    /// `slurm` (one `srun` step per node) or `kubernetes` (one pod per node). A resumed
    /// job keeps the backend it started with.
    #[arg(long, value_enum)]
    pub backend: Option<crate::backend::BackendKind>,
    /// Start the job from a checkpoint of another job (its model and data position): a
    /// checkpoint directory or s3://bucket/prefix. The number of parameter servers may
    /// differ; rows are re-routed by the stable hash.
    #[arg(long, value_name = "LOCATION", conflicts_with = "resume")]
    pub from_checkpoint: Option<String>,
    /// With --from-checkpoint: this checkpoint id instead of the newest intact one.
    #[arg(long, requires = "from_checkpoint")]
    pub checkpoint_id: Option<u64>,
    /// Pause the job once this many samples are trained (`elastrec unpause` goes on).
    #[arg(long, value_name = "SAMPLES", conflicts_with = "resume")]
    pub pause_at_samples: Option<u64>,
    /// Print the manifests of the job's Secret and first pods (YAML, the token redacted)
    /// and start nothing (with `--backend kubernetes`).
    #[arg(long, conflicts_with = "resume")]
    pub dry_run: bool,
}

/// Runs (or resumes) a job to its end.
pub async fn run(args: RunArgs) -> anyhow::Result<JobResult> {
    let exe = std::env::current_exe().context("locating the elastrec binary")?;
    match (args.resume, args.job) {
        (Some(dir), _) => resume_job(&dir, exe, args.backend).await,
        (None, Some(job)) => {
            let from = args
                .from_checkpoint
                .map(|location| crate::run::FromCheckpoint {
                    location,
                    id: args.checkpoint_id,
                });
            start_job(
                &job,
                exe,
                from,
                args.pause_at_samples,
                args.backend.unwrap_or_default(),
            )
            .await
        }
        (None, None) => anyhow::bail!("give a job file or --resume JOB_DIR"),
    }
}

fn connect(dir: &std::path::Path) -> anyhow::Result<Master> {
    connect_with_timeout(dir, rpc::MASTER_CALL_TIMEOUT)
}

/// [`connect`] with calls that may take up to `call_timeout`.
fn connect_with_timeout(
    dir: &std::path::Path,
    call_timeout: std::time::Duration,
) -> anyhow::Result<Master> {
    let dir = JobDir(dir.to_path_buf());
    let addr = std::fs::read_to_string(dir.addr())
        .with_context(|| format!("{} holds no running job (no master.addr)", dir.0.display()))?;
    let token = std::fs::read_to_string(dir.token())
        .with_context(|| format!("reading the job token {}", dir.token().display()))?;
    // A job whose channels use TLS: this command speaks TLS with the job's certificate.
    if let Some(m) = elastrec_rpc::tls::TlsMaterial::load(&dir.tls())? {
        elastrec_rpc::tls::install(m)?;
    }
    rpc::master_client_with_timeout(addr.trim(), token.trim(), 64 << 20, call_timeout).with_context(
        || {
            format!(
                "{} is corrupt: it must hold the token that the job's master wrote",
                dir.token().display()
            )
        },
    )
}

/// `elastrec status`: nodes, shards, rate of a job.
#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    /// The job directory (the job's `output.dir`).
    pub job_dir: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// A job's live status as `elastrec status --json` prints it (and the dashboard serves).
/// The job file a job directory's master stored when the job started (`run --resume`
/// reads the job from there, not from the file it was started with, which may have
/// changed or gone).
pub fn stored_job(dir: &std::path::Path) -> anyhow::Result<elastrec_job::config::JobConfig> {
    let db = JobDir(dir.to_path_buf()).db();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // Only the stored job: the master reads the whole state when it resumes.
    let text = rt
        .block_on(async {
            let store = crate::store::MasterDb::open_read_only(&db).await?;
            store.meta("job_toml").await
        })?
        .with_context(|| format!("{} lacks the stored job", db.display()))?;
    Ok(elastrec_job::config::JobConfig::from_toml(&text, &db)?)
}

pub fn status_value(
    s: &elastrec_proto::master::StatusResponse,
) -> anyhow::Result<serde_json::Value> {
    let autoscale = json_state(&s.autoscale_json, "autoscale")?;
    let datasets = json_state(&s.datasets_json, "datasets")?;
    let stream = json_state(&s.stream_json, "stream")?;
    let mix = json_state(&s.mix_json, "mix")?;
    let progressive = json_state(&s.progressive_json, "progressive")?;
    let nodes: Vec<serde_json::Value> = s
        .nodes
        .iter()
        .map(|n| {
            serde_json::json!({
                "id": n.node_id, "role": role_name(n.role),
                "state": n.state, "pid": n.pid, "addr": n.addr,
                "metrics_addr": n.metrics_addr,
                "last_heartbeat_ms_ago": n.last_heartbeat_ms_ago, "samples": n.samples,
                "restarts": n.restarts, "task": n.task_id, "step": n.step,
                "profile": n.profile.map(|p| serde_json::json!({
                    "cpu_s": p.cpu_s, "rss_bytes": p.rss_bytes, "threads": p.threads,
                    "batches": p.batches, "samples": p.samples, "compute_s": p.compute_s, "pull_s": p.pull_s,
                    "push_s": p.push_s, "master_s": p.master_s, "read_s": p.read_s,
                    "requests": p.requests, "prefetch_hits": p.prefetch_hits,
                })),
            })
        })
        .collect();
    Ok(serde_json::json!({
            "job": s.job_id, "phase": s.phase, "epoch": s.epoch, "epochs": s.epochs,
            "shards": {"todo": s.shards_todo, "doing": s.shards_doing, "done": s.shards_done},
            "samples_done": s.samples_done, "samples_total": s.samples_total,
            "samples_per_sec": s.samples_per_sec, "target_workers": s.target_workers,
            "nodes": nodes,
            "pause": s.paused_at.map(|at| serde_json::json!({"at_samples": at, "held": s.held})),
            "checkpoint": s.checkpoint.as_ref().map(|c| serde_json::json!({
                "count": c.count, "last_id": c.last_id, "last_age_s": c.last_age_s,
                "interval_s": c.interval_s, "pls": c.pls, "recovery": c.recovery,
                "stall_ms": c.stall_ms, "memcpy_ms": c.memcpy_ms,
                "recoveries": c.recoveries, "taking": c.taking,
            })),
            "autoscale": autoscale,
            "layout": {"version": s.layout_version, "ps": s.num_ps},
            "reshards": serde_json::from_str::<serde_json::Value>(&s.reshards_json).unwrap_or_default(),
            "datasets": datasets,
            "stream": stream,
            "mix": mix,
            "progressive": progressive,
    }))
}

/// Repeated status reads of one job (the dashboard's poller): the job directory's
/// address, token and TLS material are read and the channel opened once, not per read.
pub struct StatusReader {
    dir: PathBuf,
    wait: Duration,
    client: Option<Master>,
}

impl StatusReader {
    /// A reader of the job in `dir`; each call waits at most `wait`.
    pub fn new(dir: PathBuf, wait: Duration) -> Self {
        Self {
            dir,
            wait,
            client: None,
        }
    }

    /// The job's status as `status --json` prints it (`None`: no master answers within
    /// `wait`; its `result.json` or database then says how it ended).
    pub async fn read(&mut self) -> anyhow::Result<Option<serde_json::Value>> {
        let client = match &mut self.client {
            Some(c) => c,
            None => self
                .client
                .insert(connect_with_timeout(&self.dir, self.wait)?),
        };
        let call = client.status(StatusRequest {
            version: rpc::version(),
        });
        match tokio::time::timeout(self.wait, call).await {
            Ok(Ok(r)) => Ok(Some(status_value(&r.into_inner())?)),
            _ => {
                // Connect afresh next time: a resumed master serves on a new address.
                self.client = None;
                Ok(None)
            }
        }
    }
}

/// Prints a job's status, from its master or, when the master is down, from its database.
pub async fn status(args: StatusArgs) -> anyhow::Result<()> {
    let mut client = connect(&args.job_dir)?;
    let live = tokio::time::timeout(
        Duration::from_secs(3),
        client.status(StatusRequest {
            version: rpc::version(),
        }),
    )
    .await;
    let s = match live {
        Ok(Ok(r)) => r.into_inner(),
        _ => {
            let dir = JobDir(args.job_dir.clone());
            if let Ok(text) = std::fs::read_to_string(dir.result()) {
                if args.json {
                    println!("{text}");
                } else {
                    println!("master is not running; result of the job (all of it: --json):");
                    print_result(&text);
                }
                return Ok(());
            }
            let store = crate::store::MasterDb::open_read_only(&dir.db()).await?;
            let snap = store.load().await?;
            println!(
                "master is not reachable; state from {}:",
                dir.db().display()
            );
            let count = |st: crate::tasks::TaskState| {
                snap.tasks
                    .iter()
                    .filter(|t| std::mem::discriminant(&t.state) == std::mem::discriminant(&st))
                    .count()
            };
            println!(
                "shards todo {} doing {} done {}; ledger ranges {}",
                count(crate::tasks::TaskState::Todo),
                count(crate::tasks::TaskState::Doing(0)),
                count(crate::tasks::TaskState::Done),
                snap.ranges.len()
            );
            for n in snap.nodes {
                println!(
                    "  node {:>3} {:?} {:?} pid {} {}",
                    n.id, n.role, n.state, n.pid, n.addr
                );
            }
            return Ok(());
        }
    };
    if args.json {
        println!("{}", status_value(&s)?);
        return Ok(());
    }
    let autoscale = json_state(&s.autoscale_json, "autoscale")?;
    let datasets = json_state(&s.datasets_json, "datasets")?;
    let stream = json_state(&s.stream_json, "stream")?;
    let mix = json_state(&s.mix_json, "mix")?;
    println!("job {} ({})", s.job_id, s.phase);
    println!(
        "epoch {}/{}  samples {}/{}  {:.0} samples/s  shards todo {} doing {} done {}  target workers {}",
        s.epoch + 1,
        s.epochs,
        s.samples_done,
        s.samples_total,
        s.samples_per_sec,
        s.shards_todo,
        s.shards_doing,
        s.shards_done,
        s.target_workers
    );
    println!(
        "{:>5}  {:<6}  {:<8}  {:>7}  {:<21}  {:<21}  {:>12}  {:>9}  {:>8}  {:>6}  {:>8}  {:>7}  time split (read/compute/pull/push/master)",
        "node",
        "role",
        "state",
        "pid",
        "addr",
        "metrics",
        "heartbeat",
        "samples",
        "restarts",
        "task",
        "rss MB",
        "cpu s"
    );
    for n in &s.nodes {
        let p = n.profile.unwrap_or_default();
        let busy = p.read_s + p.compute_s + p.pull_s + p.push_s + p.master_s;
        let split = if busy > 0.0 {
            format!(
                "{:.0}/{:.0}/{:.0}/{:.0}/{:.0}%",
                100.0 * p.read_s / busy,
                100.0 * p.compute_s / busy,
                100.0 * p.pull_s / busy,
                100.0 * p.push_s / busy,
                100.0 * p.master_s / busy
            )
        } else {
            "-".into()
        };
        print!(
            "{:>5}  {:<6}  {:<8}  {:>7}  {:<21}  {:<21}  {:>9} ms  {:>9}  {:>8}  {:>6}",
            n.node_id,
            role_name(n.role),
            n.state,
            n.pid,
            n.addr,
            n.metrics_addr,
            n.last_heartbeat_ms_ago,
            n.samples,
            n.restarts,
            n.task_id
        );
        println!(
            "  {:>8.1}  {:>7.1}  {split}",
            p.rss_bytes as f64 / 1e6,
            p.cpu_s
        );
    }
    if let Some(at) = s.paused_at {
        println!(
            "paused at {at} samples: {}",
            if s.held {
                "held (no data handed out; `elastrec unpause` goes on)"
            } else {
                "not reached yet"
            }
        );
    }
    if let Some(c) = &s.checkpoint {
        println!(
            "checkpoints {} (last id {}, {:.1} s ago, every {:.1} s; stall {:.2} ms vs memory copy {:.2} ms)  PS recoveries {}  PLS {:.4}",
            c.count, c.last_id, c.last_age_s, c.interval_s, c.stall_ms, c.memcpy_ms, c.recoveries, c.pls
        );
        println!("recovery policy: {}", c.recovery);
    }
    if let Some(a) = &autoscale {
        print_autoscale(a);
    }
    if let Some(d) = &datasets {
        print_datasets(d);
    }
    if let Some(st) = &stream {
        print_stream(st);
    }
    if let Some(w) = json_state(&s.progressive_json, "progressive")? {
        print_progressive(&w);
    }
    if let Some(m) = &mix {
        print_mix(m);
    }
    Ok(())
}

/// A node's role as `elastrec status` names it.
fn role_name(role: i32) -> &'static str {
    match PbRole::try_from(role) {
        Ok(PbRole::Ps) => "ps",
        Ok(PbRole::Executor) => "executor",
        _ => "worker",
    }
}

/// The serving buffers of a job with several sources: one line each.
fn print_mix(mix: &serde_json::Value) {
    println!("sources ({}):", mix["serving"].as_str().unwrap_or("?"));
    for name in mix["sources"].as_array().into_iter().flatten() {
        let k = name.as_str().unwrap_or("?");
        println!(
            "  {k:<20}  {:>8} tasks queued  {:>12} rows served",
            mix["queued"][k], mix["served"][k]["rows"]
        );
    }
}

/// An online job's part of `elastrec status`.
fn print_stream(st: &serde_json::Value) {
    let num = |x: &serde_json::Value| x.as_f64().unwrap_or(f64::NAN);
    println!(
        "stream: {:.0} messages/s arriving, lag {:.1} s (SLO {:.1} s, violated {:.1}% of {:.0} s), accumulated lag {:.1} s, downtime {:.1} s",
        num(&st["arrival_rate"]),
        num(&st["lag_s"]),
        num(&st["slo_lag_s"]),
        100.0 * num(&st["slo_violation_rate"]),
        num(&st["observed_s"]),
        num(&st["accumulated_lag_s"]),
        num(&st["downtime_s"])
    );
    println!(
        "  {:<28}  {:>12}  {:>12}  {:>9}  {:>7}  {:>9}  {:>9}",
        "partition", "high", "trained", "backlog", "lag s", "peak lag", "msg/s"
    );
    for p in st["partitions"].as_array().into_iter().flatten() {
        println!(
            "  {:<28}  {:>12}  {:>12}  {:>9}  {:>7.1}  {:>9.1}  {:>9.0}",
            p["partition"].as_str().unwrap_or("?"),
            p["high"],
            p["trained"],
            p["backlog"],
            num(&p["lag_s"]),
            num(&p["peak_lag_s"]),
            num(&p["rate"])
        );
    }
    print_progressive(&st["progressive"]);
    let d = &st["last_decision"];
    if d.is_object() {
        println!(
            "  scaling at {:.0} s: {} -> {} workers ({})",
            num(&d["at_s"]),
            d["workers"],
            d["target"],
            d["reason"].as_str().unwrap_or("")
        );
    }
}

/// The progressive-validation line of `status` (nothing when `w` is not a window).
fn print_progressive(w: &serde_json::Value) {
    let num = |x: &serde_json::Value| x.as_f64().unwrap_or(f64::NAN);
    let auc = |x: &serde_json::Value| fixed(x, 4);
    if w.is_object() {
        println!(
            "  progressive validation at {:.0} s: AUC {} logloss {:.4} over the last {} samples",
            num(&w["at_s"]),
            auc(&w["auc"]),
            num(&w["logloss"]),
            w["samples"]
        );
        for (t, task) in w["tasks"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
            .skip(1)
        {
            println!(
                "    task {t}: AUC {} logloss {:.4}",
                auc(&task["auc"]),
                num(&task["logloss"])
            );
        }
    }
}

/// A JSON part of the status reply (empty: the job has none).
fn json_state(text: &str, what: &str) -> anyhow::Result<Option<serde_json::Value>> {
    if text.is_empty() {
        return Ok(None);
    }
    serde_json::from_str(text)
        .map(Some)
        .with_context(|| format!("the master sent an unreadable {what} state"))
}

/// A following job's part of `elastrec status`.
fn print_datasets(d: &serde_json::Value) {
    println!(
        "following datasets: {} files, {} partitions landed since the master started; {}",
        d["files"],
        d["landed"],
        if d["growing"].as_bool() == Some(false) {
            "every window is closed and read"
        } else {
            "more may land"
        }
    );
    for p in d["pending"].as_array().into_iter().flatten() {
        println!(
            "  waiting for {}/{} ({}, {:.0} s)",
            p["dataset"].as_str().unwrap_or("?"),
            p["dir"].as_str().unwrap_or("?"),
            if p["exists"].as_bool() == Some(true) {
                "no marker yet"
            } else {
                "not there yet"
            },
            p["waiting_s"].as_f64().unwrap_or(0.0)
        );
    }
}

/// A JSON number with `digits` decimals, `-` where there is none.
fn fixed(v: &serde_json::Value, digits: usize) -> String {
    v.as_f64()
        .map_or("-".to_string(), |x| format!("{x:.digits$}"))
}

/// A finished job's `result.json` as `elastrec status` shows it: how it ended, its ledger
/// and model, and the autoscaler's plans and actions.
fn print_result(text: &str) {
    let Ok(r) = serde_json::from_str::<serde_json::Value>(text) else {
        println!("{text}");
        return;
    };
    let num = fixed;
    println!(
        "job {}: {}{} in {} s, {} samples/s; {} workers and {} PS launched",
        r["job_id"].as_str().unwrap_or("?"),
        r["status"].as_str().unwrap_or("?"),
        r["error"]
            .as_str()
            .map_or(String::new(), |e| format!(" ({e})")),
        num(&r["wall_s"], 1),
        num(&r["samples_per_s"], 0),
        r["workers_launched"],
        r["ps_launched"]
    );
    let l = &r["ledger"];
    if l.is_object() {
        println!(
            "ledger: consumed {}, duplicated {}, missing {}",
            l["consumed"], l["duplicated"], l["missing"]
        );
    }
    if r["eval"].is_object() {
        println!(
            "eval: AUC {} logloss {}",
            num(&r["eval"]["auc"], 4),
            num(&r["eval"]["logloss"], 4)
        );
    }
    for c in r["reshards"].as_array().into_iter().flatten() {
        println!(
            "PS {} -> {}: {}",
            c["from"],
            c["to"],
            c["reason"].as_str().unwrap_or_default()
        );
    }
    if r["autoscale"].is_object() {
        print_autoscale(&r["autoscale"]);
    }
}

/// The autoscaler's part of `elastrec status`.
fn print_autoscale(a: &serde_json::Value) {
    let num = |v: &serde_json::Value| fixed(v, 0);
    println!(
        "autoscale: workers in {}, PS in {}; {} profile samples, measured {} samples/s",
        a["bounds"]["workers"],
        a["bounds"]["ps"],
        a["profile_samples"],
        num(&a["measured_samples_per_s"])
    );
    if let Some(p) = a["last_plan"].as_object() {
        println!(
            "  last plan ({}): {} workers, {} PS, predicted {} samples/s, fit MAPE {}%",
            p["kind"].as_str().unwrap_or("?"),
            p["workers"],
            p["ps"],
            num(&p["predicted_samples_per_s"]),
            fixed(&p["fit_mape_percent"], 1)
        );
        for r in p["reasons"].as_array().into_iter().flatten() {
            println!("    - {}", r.as_str().unwrap_or_default());
        }
    }
    if let Some(v) = a["last_verdict"].as_str() {
        println!("  verdict: {v}");
    }
    if let Some(e) = a["brain_error"].as_str() {
        println!("  brain: {e} (training goes on with the last plan)");
    }
    let scaling = a["scaling"].as_array().cloned().unwrap_or_default();
    if !scaling.is_empty() {
        println!(
            "  {:>8}  {:>9}  {:>9}  {:<6}  {:>10}  {:>10}  {:>10}",
            "at s", "workers", "PS", "source", "before/s", "predicted", "after/s"
        );
        for r in scaling {
            println!(
                "  {:>8.1}  {:>4} -> {:<2}  {:>4} -> {:<2}  {:<6}  {:>10}  {:>10}  {:>10}",
                r["at_s"].as_f64().unwrap_or(0.0),
                r["before"][0],
                r["after"][0],
                r["before"][1],
                r["after"][1],
                r["source"].as_str().unwrap_or(""),
                num(&r["measured_before"]),
                num(&r["predicted"]),
                num(&r["measured_after"])
            );
        }
    }
}

/// `elastrec scale`: change the number of workers of a running job.
#[derive(Debug, Clone, clap::Args)]
pub struct ScaleArgs {
    /// The job directory (the job's `output.dir`).
    pub job_dir: PathBuf,
    /// Desired number of workers.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256), required_unless_present = "ps")]
    pub workers: Option<u32>,
    /// Desired number of parameter servers: re-sharded online while the job trains
    /// (asynchronous jobs); returns once the new layout is in force.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub ps: Option<u32>,
}

/// Asks the master to scale the workers.
pub async fn scale(args: ScaleArgs) -> anyhow::Result<()> {
    // Re-sharding moves every PS's state before the reply: allow it the time the master
    // allows each of its steps.
    let timeout = if args.ps.is_some() {
        crate::reshard::STEP_TIMEOUT * 2
    } else {
        rpc::MASTER_CALL_TIMEOUT
    };
    let mut client = connect_with_timeout(&args.job_dir, timeout)?;
    let r = client
        .scale(ScaleRequest {
            version: rpc::version(),
            workers: args.workers.unwrap_or(0),
            ps: args.ps,
        })
        .await
        .map_err(|s| anyhow::anyhow!("scale refused: {}", s.message()))?
        .into_inner();
    if !r.reshard_json.is_empty() {
        let v: serde_json::Value = serde_json::from_str(&r.reshard_json)?;
        println!(
            "PS: {} -> {} (layout {}); training paused {:.1} ms, moved {:.1} MB ({:.1} MB pre-copied)",
            v["from"],
            v["to"],
            v["layout_version"],
            v["pause_ms"].as_f64().unwrap_or(0.0),
            (v["frozen_bytes"].as_f64().unwrap_or(0.0) + v["precopy_bytes"].as_f64().unwrap_or(0.0)) / 1e6,
            v["precopy_bytes"].as_f64().unwrap_or(0.0) / 1e6
        );
    }
    if args.workers.is_some() {
        println!("workers: {} -> {}", r.previous, r.target);
    }
    Ok(())
}

/// `elastrec pause`: stop handing out data at a number of samples (default: now).
#[derive(Debug, Clone, clap::Args)]
pub struct PauseArgs {
    /// The job directory (the job's `output.dir`).
    pub job_dir: PathBuf,
    /// Pause once this many samples are trained instead of now.
    #[arg(long, value_name = "SAMPLES")]
    pub at_samples: Option<u64>,
}

/// `elastrec unpause`: lift a pause.
#[derive(Debug, Clone, clap::Args)]
pub struct UnpauseArgs {
    /// The job directory (the job's `output.dir`).
    pub job_dir: PathBuf,
}

async fn set_pause(
    job_dir: &std::path::Path,
    at_samples: Option<u64>,
    release: bool,
) -> anyhow::Result<()> {
    let mut client = connect(job_dir)?;
    let r = client
        .pause(PauseRequest {
            version: rpc::version(),
            at_samples,
            release,
        })
        .await
        .map_err(|s| anyhow::anyhow!("pause refused: {}", s.message()))?
        .into_inner();
    match r.at_samples {
        Some(at) => println!(
            "paused at {at} samples ({} trained so far; workers finish the shards they hold)",
            r.samples_done
        ),
        None => println!("not paused ({} samples trained so far)", r.samples_done),
    }
    Ok(())
}

/// Asks the master to pause the job.
pub async fn pause(args: PauseArgs) -> anyhow::Result<()> {
    set_pause(&args.job_dir, args.at_samples, false).await
}

/// Asks the master to lift the pause.
pub async fn unpause(args: UnpauseArgs) -> anyhow::Result<()> {
    set_pause(&args.job_dir, None, true).await
}

/// `elastrec checkpoint`: take a checkpoint of a running job now.
#[derive(Debug, Clone, clap::Args)]
pub struct CheckpointArgs {
    /// The job directory (the job's `output.dir`).
    pub job_dir: PathBuf,
}

/// How long `checkpoint` and `stop` wait for their reply. The master bounds both the wait
/// for a checkpoint already running and its own by `checkpoint.timeout_s` (600 s by
/// default), so this deadline only guards against a master that stopped answering.
const CHECKPOINT_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3600);

/// Asks the master for a checkpoint and waits until it is committed.
pub async fn checkpoint(args: CheckpointArgs) -> anyhow::Result<()> {
    let mut client = connect_with_timeout(&args.job_dir, CHECKPOINT_CALL_TIMEOUT)?;
    let r = client
        .take_checkpoint(TakeCheckpointRequest {
            version: rpc::version(),
        })
        .await
        .map_err(|s| anyhow::anyhow!("checkpoint refused: {}", s.message()))?
        .into_inner();
    println!(
        "checkpoint {} committed: {} samples, {:.1} MB",
        r.id,
        r.samples,
        r.bytes as f64 / 1e6
    );
    Ok(())
}

/// `elastrec stop`: end a job's training (how an online job finishes).
#[derive(Debug, Clone, clap::Args)]
pub struct StopArgs {
    /// The job directory (the job's `output.dir`).
    pub job_dir: PathBuf,
}

/// Asks the master to stop training; with checkpoints on, it takes one first.
pub async fn stop(args: StopArgs) -> anyhow::Result<()> {
    // The master takes a checkpoint before it replies.
    let mut client = connect_with_timeout(&args.job_dir, CHECKPOINT_CALL_TIMEOUT)?;
    let r = client
        .stop(elastrec_proto::master::StopRequest {
            version: rpc::version(),
        })
        .await
        .map_err(|s| anyhow::anyhow!("stop refused: {}", s.message()))?
        .into_inner();
    match r.checkpoint_id {
        0 => println!(
            "stopped at {} samples (checkpoints are off)",
            r.samples_done
        ),
        id => println!(
            "stopped at {} samples; checkpoint {id} holds the model and the stream offsets",
            r.samples_done
        ),
    }
    Ok(())
}

/// `elastrec bench-master`: load test of the master's task and heartbeat service.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Simulated workers (concurrent clients).
    #[arg(long, default_value_t = 64)]
    pub clients: u32,
    /// HTTP/2 connections the clients share, round-robin (requests of clients on one
    /// connection are multiplexed); 0: one connection per client, as real workers have.
    #[arg(long, default_value_t = 0)]
    pub connections: u32,
    /// Seconds to measure (after every client registered and a 0.5 s warm-up).
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Heartbeats per progress report.
    #[arg(long, default_value_t = 1)]
    pub heartbeats_per_report: u32,
    /// Threads of the master's own runtime (the clients run on the command's runtime).
    #[arg(long, default_value_t = 2)]
    pub server_threads: usize,
    /// Durability of the master database's commits (`full`, the master's setting, fsyncs
    /// the WAL at every group commit; `process` survives only a master crash).
    #[arg(long, value_enum, default_value = "full")]
    pub durability: crate::store::Durability,
}

/// CPU seconds (user + system) used so far by this process's threads, split into the
/// master's (its runtime and the SQLite threads) and everything else (the clients).
/// `None` where `/proc` is not available.
fn cpu_split() -> Option<(f64, f64)> {
    // SAFETY: sysconf has no preconditions.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let (mut server, mut client) = (0u64, 0u64);
    for entry in std::fs::read_dir("/proc/self/task").ok()? {
        let Ok(stat) = std::fs::read_to_string(entry.ok()?.path().join("stat")) else {
            continue; // the thread exited meanwhile
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = &stat[open + 1..close];
        // After the command come the fields from 3 (state) on; utime, stime are 14, 15.
        let f: Vec<&str> = stat[close + 2..].split(' ').collect();
        let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
        if comm.starts_with(BENCH_MASTER_THREAD) || comm.starts_with("sqlx-sqlite") {
            server += ticks;
        } else {
            client += ticks;
        }
    }
    Some((server as f64 / tick, client as f64 / tick))
}

/// Name of the bench master's runtime threads.
const BENCH_MASTER_THREAD: &str = "master-server";

/// The bench master's job: one 10⁹-row file in 16 Ki-row shards, `workers` workers that
/// are never launched (the simulated clients register as them).
async fn start_bench_master(
    db: PathBuf,
    durability: crate::store::Durability,
    workers: u32,
    token: &'static str,
) -> anyhow::Result<(Arc<crate::core::MasterCore>, String)> {
    use crate::backend::ClusterBackend;
    use crate::core::{LiveCtx, MasterCore};
    use crate::job::{Job, Node, Policy};
    use crate::service::MasterService;
    use crate::store::{MasterDb, Writer};
    use crate::tasks::{DataSharding, TaskQueue};

    struct NoProcesses;
    impl ClusterBackend for NoProcesses {
        fn start(&self, _: &Node) -> anyhow::Result<u32> {
            Ok(0)
        }
        fn stop(&self, _: &Node) {}
        fn exited(&self) -> Vec<crate::backend::NodeExit> {
            Vec::new()
        }
    }

    let store = MasterDb::open_with(&db, true, durability).await?;
    let queue = TaskQueue::new(
        DataSharding {
            rows_per_shard: 64 * 256,
            min_rows: 256,
            epochs: 1,
            seed: 1,
            shuffle: true,
            shuffle_rows: false,
        },
        vec![1_000_000_000],
    );
    let policy = Policy {
        num_ps: 0,
        dead_after_ms: 60_000,
        max_worker_restarts: 0,
        straggler_ratio: 0.5,
        evaluate: false,
        recover_ps: false,
        warmup_samples: 0,
        pin_partitions: false,
        executors: 0,
    };
    let mut cx = LiveCtx::now();
    let job = Job::start(policy, queue, workers, &mut cx);
    store.apply(&cx.take_changes()).await?;
    let core = Arc::new(MasterCore::new(
        job,
        Writer::spawn(store),
        Arc::new(NoProcesses),
        String::new(),
        vec!["bench".into()],
        1000,
        "bench".into(),
    ));
    // Served as `elastrec run` serves it (`run/serve.rs`).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let svc = elastrec_proto::master::master_server::MasterServer::new(MasterService(core.clone()));
    tokio::spawn(
        elastrec_rpc::server()?
            .add_service(tonic::service::interceptor::InterceptedService::new(
                svc,
                rpc::ServerAuth::new(token),
            ))
            .serve_with_incoming(elastrec_rpc::incoming(listener)),
    );
    Ok((core, addr))
}

/// What the simulated workers share with the bench.
#[derive(Default)]
struct BenchFlags {
    /// Workers registered so far.
    registered: std::sync::atomic::AtomicU32,
    /// Set during the measured window: requests started then record their latency.
    measuring: std::sync::atomic::AtomicBool,
    /// Set at the end: workers finish their request and stop.
    stop: std::sync::atomic::AtomicBool,
    /// Replies received (every one answered by the master).
    answered: std::sync::atomic::AtomicU64,
}

/// One simulated worker: registers as node `id`, then gets a task, reports progress 256
/// rows at a time until it is done, and sends `heartbeats` heartbeats after each of those
/// requests. Returns the latencies (µs) of requests started while measuring and the rows
/// whose reports the master acknowledged.
async fn simulated_worker(
    mut c: Master,
    id: u32,
    heartbeats: u32,
    flags: Arc<BenchFlags>,
) -> anyhow::Result<(Vec<u32>, u64)> {
    use std::sync::atomic::Ordering::Relaxed;

    let mut lat: Vec<u32> = Vec::new();
    let mut acked = 0u64;
    c.register(RegisterRequest {
        version: rpc::version(),
        role: PbRole::Worker as i32,
        node_id: id,
        addr: String::new(),
        metrics_addr: String::new(),
        pid: 0,
        restore_s: 0.0,
        dense_rewound: false,
    })
    .await?;
    flags.registered.fetch_add(1, Relaxed);
    let done = |t0: Instant, measured: bool, lat: &mut Vec<u32>| {
        flags.answered.fetch_add(1, Relaxed);
        if measured {
            lat.push(t0.elapsed().as_micros() as u32);
        }
    };
    // (task id, rows reported, rows in the task)
    let mut task: Option<(u64, u64, u64)> = None;
    while !flags.stop.load(Relaxed) {
        let (t0, measured) = (Instant::now(), flags.measuring.load(Relaxed));
        match task {
            None => {
                let r = c
                    .get_task(GetTaskRequest {
                        version: rpc::version(),
                        node_id: id,
                    })
                    .await?
                    .into_inner();
                if let Some(Reply::Task(t)) = r.reply {
                    task = Some((t.task_id, t.offset, t.end_row - t.start_row));
                }
            }
            Some((tid, off, len)) => {
                let next = (off + 256).min(len);
                c.report_progress(ReportProgressRequest {
                    version: rpc::version(),
                    node_id: id,
                    task_id: tid,
                    offset: next,
                    ..ReportProgressRequest::default()
                })
                .await?;
                acked += next - off;
                task = (next < len).then_some((tid, next, len));
            }
        }
        done(t0, measured, &mut lat);
        for _ in 0..heartbeats {
            let (t0, measured) = (Instant::now(), flags.measuring.load(Relaxed));
            c.heartbeat(HeartbeatRequest {
                version: rpc::version(),
                node_id: id,
                task_id: 0,
                offset: 0,
                samples: 0,
                step: 0,
                profile: None,
            })
            .await?;
            done(t0, measured, &mut lat);
        }
    }
    Ok((lat, acked))
}

/// Starts a master (real gRPC on loopback, real SQLite, group commit) on a runtime of its
/// own, with processes that are never started, and drives it with simulated workers
/// ([`simulated_worker`]) on this runtime. Prints the requests the master answered per
/// second in the measured window, their latencies, the CPU each side used and the group
/// commits, then checks that the ledger, in memory and as reloaded from SQLite, holds
/// exactly the rows whose reports were acknowledged.
pub async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    use std::sync::atomic::Ordering::Relaxed;

    /// Shuts the master's runtime down without blocking (dropping a runtime inside
    /// another one panics), also on early returns.
    struct MasterRuntime(Option<tokio::runtime::Runtime>);
    impl Drop for MasterRuntime {
        fn drop(&mut self) {
            if let Some(rt) = self.0.take() {
                rt.shutdown_background();
            }
        }
    }

    anyhow::ensure!(args.clients > 0, "--clients must be at least 1");
    anyhow::ensure!(
        args.server_threads > 0,
        "--server-threads must be at least 1"
    );
    let connections = match args.connections {
        0 => args.clients,
        n => n.min(args.clients),
    };
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("master.db");
    let token = "benchtoken";
    let master_rt = MasterRuntime(Some(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.server_threads)
            .thread_name(BENCH_MASTER_THREAD)
            .enable_all()
            .build()?,
    ));
    let master = master_rt.0.as_ref().expect("set above").handle().clone();
    let (core, addr) = master
        .spawn(start_bench_master(
            db.clone(),
            args.durability,
            args.clients,
            token,
        ))
        .await??;

    let channels = (0..connections)
        .map(|_| rpc::master_client(&addr, token, 64 << 20))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let flags = Arc::new(BenchFlags::default());
    // Node ids 1..=clients are the workers of the job.
    let mut workers: Vec<_> = (1..=args.clients)
        .map(|id| {
            let c = channels[(id - 1) as usize % channels.len()].clone();
            tokio::spawn(simulated_worker(
                c,
                id,
                args.heartbeats_per_report,
                flags.clone(),
            ))
        })
        .collect();
    let setup = Instant::now();
    while flags.registered.load(Relaxed) < args.clients {
        anyhow::ensure!(
            setup.elapsed() < Duration::from_secs(30),
            "the clients did not register within 30 s"
        );
        if let Some(w) = workers.iter_mut().find(|w| w.is_finished()) {
            w.await??;
            anyhow::bail!("a client stopped before the measurement");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    let snapshot = || {
        (
            Instant::now(),
            flags.answered.load(Relaxed),
            core.metrics.requests_total(),
            core.writer_stats(),
            cpu_split(),
        )
    };
    let (t0, answered0, counted0, writes0, cpu0) = snapshot();
    flags.measuring.store(true, Relaxed);
    tokio::time::sleep(Duration::from_secs_f64(args.seconds)).await;
    flags.measuring.store(false, Relaxed);
    let (t1, answered1, counted1, writes1, cpu1) = snapshot();
    flags.stop.store(true, Relaxed);
    let mut lat = Vec::new();
    let mut acked = 0;
    for w in workers {
        let (l, rows) = w.await??;
        lat.extend(l);
        acked += rows;
    }

    lat.sort_unstable();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    let secs = (t1 - t0).as_secs_f64();
    let answered = answered1 - answered0;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "master bench: {} clients over {} HTTP/2 connection(s); master runtime {} thread(s); {cpus} CPU(s); durability {:?}",
        args.clients, connections, args.server_threads, args.durability,
    );
    println!(
        "  {answered} requests answered in {secs:.2} s = {:.0} req/s (the master counted {}); latency p50 {} us, p99 {} us, p99.9 {} us, max {} us",
        answered as f64 / secs,
        counted1 - counted0,
        pct(0.5),
        pct(0.99),
        pct(0.999),
        lat.last().copied().unwrap_or(0),
    );
    if let (Some((m0, c0)), Some((m1, c1))) = (cpu0, cpu1) {
        let per = |cpu: f64| cpu * 1e6 / answered.max(1) as f64;
        println!(
            "  CPU: master {:.2} s ({:.0} us/request), clients {:.2} s ({:.0} us/request); {:.0}% of {cpus} CPU(s) busy",
            m1 - m0,
            per(m1 - m0),
            c1 - c0,
            per(c1 - c0),
            100.0 * (m1 - m0 + c1 - c0) / (secs * cpus as f64),
        );
    }
    let (txs, subs) = (
        writes1.transactions - writes0.transactions,
        writes1.submissions - writes0.submissions,
    );
    println!(
        "  SQLite: {txs} transactions for {subs} requests that changed state ({:.1} per transaction)",
        subs as f64 / txs.max(1) as f64
    );

    // Every acknowledged report is in the ledger exactly once, in memory and on disk.
    let ledger = core.job.lock().tasks().ledger().summary(0);
    let on_disk: u64 = master
        .spawn(async move {
            let snap = crate::store::MasterDb::open(&db, false)
                .await?
                .load()
                .await?;
            Ok::<_, anyhow::Error>(snap.ranges.iter().map(|r| r.rows()).sum())
        })
        .await??;
    println!(
        "  ledger: rows acknowledged {acked}, reported {} (duplicated {}), in SQLite {on_disk}",
        ledger.consumed, ledger.duplicated
    );
    drop(master_rt);
    anyhow::ensure!(
        ledger.consumed == acked && ledger.duplicated == 0 && on_disk == acked,
        "the ledger is not exact"
    );
    Ok(())
}

/// The distributed-training subcommands, flattened into the `elastrec` command line.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ClusterCommand {
    /// Run a distributed job: job master + parameter servers + workers as local processes.
    Run(RunArgs),
    /// Show a job: phase, shards, samples/s, nodes with their last heartbeat.
    Status(StatusArgs),
    /// Add or remove workers of a running job.
    Scale(ScaleArgs),
    /// Pause a running job (now or at a number of samples): workers finish their shards
    /// and wait; nodes stay up, checkpoints and recoveries go on.
    Pause(PauseArgs),
    /// Lift a pause.
    Unpause(UnpauseArgs),
    /// Take a checkpoint of a running job now.
    Checkpoint(CheckpointArgs),
    /// End a job's training (an online job runs until stopped): checkpoint, then stop.
    Stop(StopArgs),
    /// Load-test the master's task and heartbeat service (requests/s, p99 latency).
    BenchMaster(BenchArgs),
}

/// Runs a [`ClusterCommand`] on a fresh multi-threaded runtime.
pub fn dispatch(cmd: ClusterCommand) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        match cmd {
            ClusterCommand::Run(a) if a.dry_run => {
                crate::backend::kubernetes::dry_run::run(a.job.as_deref(), a.backend).await
            }
            ClusterCommand::Run(a) => run(a).await.map(|_| ()),
            ClusterCommand::Status(a) => status(a).await,
            ClusterCommand::Scale(a) => scale(a).await,
            ClusterCommand::Pause(a) => pause(a).await,
            ClusterCommand::Unpause(a) => unpause(a).await,
            ClusterCommand::Checkpoint(a) => checkpoint(a).await,
            ClusterCommand::Stop(a) => stop(a).await,
            ClusterCommand::BenchMaster(a) => bench(a).await,
        }
    })
}
