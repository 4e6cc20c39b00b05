//! `elastrec bench online`: the same replayed traffic trace trained by one online job per
//! scaling policy (KALE, the reactive HPA-like rule, a fixed count), one after another on
//! this machine, and their KALE Table 3 figures side by side.
//!
//! The broker is a local Tansu (a Kafka-protocol broker, `elastrec_stream::tansu`) on a
//! loopback port; each policy gets its own topic, so every run reads exactly the traffic
//! it was sent. Workers are slowed by the `ELASTREC_FAIL_SLOW_WORKER` fail point
//! (`--slow-ms` per batch) so that the worker count, not this machine's cores, sets the
//! capacity: on a 2-core machine four real workers cannot train four times faster. Fail
//! points are in a binary built with the `fail-points` feature only.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use elastrec_common::quiet::LoadProbe;
use elastrec_stream::{replay, Connection, MessageFormat, Partitioner, ReplaySpec, Trace};
use serde::Serialize;

/// A day of traffic compressed into two minutes: night, morning ramp, a midday peak that
/// one worker cannot carry, an evening shoulder, night again.
const DIURNAL: &str =
    "t_s,qps\n0,300\n15,400\n30,1500\n45,3000\n60,3000\n75,1500\n90,2200\n100,800\n120,200\n";

/// Arguments of `elastrec bench online`.
#[derive(clap::Args)]
pub struct BenchOnlineArgs {
    /// Criteo TSV files (or directories of `day_*` files) to replay, e.g. from
    /// `elastrec gen-data --out data/bench-online --rows 200000`.
    #[arg(long, value_name = "PATH", required = true, num_args = 1..)]
    data: Vec<PathBuf>,
    /// Rates over time (`t_s,qps` CSV). Default: a compressed day, 120 s, peak 3,000/s.
    #[arg(long, value_name = "CSV")]
    qps_trace: Option<PathBuf>,
    /// Policies to compare, in order: `kale`, `hpa`, or `fixed:N` (N workers throughout),
    /// each optionally followed by `/pinned` (partition `p` only to worker `p mod w`,
    /// `stream.assignment = "pinned"`) or `/shared` (the default: one queue).
    #[arg(long, value_delimiter = ',', default_value = "kale,hpa")]
    policies: Vec<String>,
    /// Send this share of all samples to `--skew-partition`: a hot partition (see
    /// `elastrec replay --hot-share`).
    #[arg(long, default_value_t = 0.0)]
    hot_share: f64,
    /// Send this share of the positive samples to `--skew-partition`: its click rate
    /// differs from the others'.
    #[arg(long, default_value_t = 0.0)]
    skew_share: f64,
    /// The partition the skews go to.
    #[arg(long, default_value_t = 0)]
    skew_partition: i32,
    /// Partitions of each run's topic.
    #[arg(long, default_value_t = 4)]
    partitions: i32,
    /// Smallest and largest worker count the autoscalers may choose.
    #[arg(long, num_args = 2, value_names = ["MIN", "MAX"], default_values_t = [1, 4])]
    workers: Vec<u32>,
    /// Extra milliseconds per batch of `--batch-size` samples on every worker (the
    /// emulated per-worker capacity; 0 leaves the machine's own speed).
    #[arg(long, default_value_t = 100)]
    slow_ms: u64,
    /// Training batch size.
    #[arg(long, default_value_t = 128)]
    batch_size: u32,
    /// The lag SLO, seconds.
    #[arg(long, default_value_t = 5.0)]
    slo_lag_s: f64,
    /// Seconds between scaling decisions.
    #[arg(long, default_value_t = 2.0)]
    interval_s: f64,
    /// KALE's forecast horizon, seconds (scaled down with the compressed trace).
    #[arg(long, default_value_t = 10.0)]
    horizon_s: f64,
    /// KALE's `tau`: a planned level shorter than this is calibrated away, seconds.
    #[arg(long, default_value_t = 6.0)]
    tau_s: f64,
    /// Where the runs' job directories go.
    #[arg(long, default_value = "bench-online")]
    out: PathBuf,
    /// Longest a run may take to train everything it was sent after the trace ends, s.
    #[arg(long, default_value_t = 300)]
    drain_timeout_s: u64,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// One policy's figures.
#[derive(Debug, Serialize)]
struct PolicyResult {
    policy: String,
    samples: u64,
    slo_violation_rate: f64,
    accumulated_lag_s: f64,
    downtime_s: f64,
    worker_hours: f64,
    scaling_changes: u64,
    max_workers: u64,
    window_auc: Option<f64>,
    /// The largest lag any one partition reached, seconds.
    peak_partition_lag_s: f64,
    /// Each partition's lag integrated over the run, seconds.
    partition_accumulated_lag_s: Vec<f64>,
    /// Share of the machine's CPU that processes outside the benchmark used during the
    /// run (`elastrec_common::quiet`); above a few percent, the run is not comparable.
    foreign_load: Option<f64>,
    wall_s: f64,
}

/// Runs `elastrec bench online`.
pub fn run(a: BenchOnlineArgs) -> Result<()> {
    if a.slow_ms > 0 && !elastrec_common::fail_points::ENABLED {
        bail!(
            "--slow-ms {} slows the workers through a test fail point, which this binary lacks; build one with them: `cargo build --release -p elastrec-cli --features fail-points` (or pass --slow-ms 0 to measure this machine's own speed)",
            a.slow_ms
        );
    }
    let [lo, hi] = a.workers[..] else {
        bail!("--workers takes two numbers: MIN MAX");
    };
    if lo == 0 || lo > hi {
        bail!("--workers {lo} {hi}: needs 1 <= MIN <= MAX");
    }
    // Checked before any run starts.
    Partitioner::skewed(a.skew_partition, a.hot_share, a.skew_share)?;
    let trace = match &a.qps_trace {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("reading the trace {}", p.display()))?;
            Trace::parse_csv(&text, p)?
        }
        None => Trace::parse_csv(DIURNAL, Path::new("(built-in diurnal trace)"))?,
    };
    let files = crate::commands::data_files(&a.data)?;
    let policies = a
        .policies
        .iter()
        .map(|p| Policy::parse(p))
        .collect::<Result<Vec<_>>>()?;
    let place = BenchPlace::new(&a.out)?;
    let (out, exe, conn) = (&place.out, &place.exe, place.connection());
    let mut results = Vec::new();
    for (i, policy) in policies.iter().enumerate() {
        let topic = place.topic(&format!("bench-{i}"), a.partitions)?;
        eprintln!(
            "bench online: {} ({}/{}), trace {:.0} s",
            policy.name,
            i + 1,
            policies.len(),
            trace.duration_s()
        );
        let r = run_policy(&a, exe, out, &conn, &topic, policy, &files, &trace)?;
        results.push(r);
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        print_table(&results);
    }
    Ok(())
}

/// A scaling policy as the job file spells it, with its partition assignment.
struct Policy {
    name: String,
    autoscale: &'static str,
    workers: u32,
    assignment: &'static str,
}

impl Policy {
    fn parse(text: &str) -> Result<Self> {
        let (scaling, assignment) = match text.split_once('/') {
            None => (text, "shared"),
            Some((s, "pinned")) => (s, "pinned"),
            Some((s, "shared")) => (s, "shared"),
            Some((_, other)) => bail!(
                "--policies: {text:?}: the assignment after / is pinned or shared, not {other:?}"
            ),
        };
        let (autoscale, workers) = match scaling {
            "kale" => ("kale", 1),
            "hpa" => ("hpa", 1),
            _ => {
                let n: u32 = scaling
                    .strip_prefix("fixed:")
                    .and_then(|n| n.parse().ok())
                    .filter(|&n| n > 0)
                    .with_context(|| {
                        format!("--policies: {scaling:?} is not kale, hpa or fixed:N (N > 0)")
                    })?;
                ("off", n)
            }
        };
        let base = match autoscale {
            "off" => format!("fixed:{workers}"),
            _ => autoscale.to_string(),
        };
        Ok(Self {
            name: if text.contains('/') {
                format!("{base}/{assignment}")
            } else {
                base
            },
            autoscale,
            workers,
            assignment,
        })
    }
}

/// The job file of one run.
fn job_toml(a: &BenchOnlineArgs, dir: &Path, brokers: &str, topic: &str, p: &Policy) -> String {
    let [lo, hi] = [a.workers[0], a.workers[1]];
    format!(
        r#"# Written by `elastrec bench online`.
[data]
train = []
eval = []
[model]
bottom_mlp = [32, 16]
top_mlp = [32, 1]
max_table_rows = 100000
[train]
batch_size = {batch}
progress = false
[output]
dir = "{dir}"
[cluster]
ps = 1
workers = {workers}
batches_per_shard = 4
[stream]
brokers = "{brokers}"
topics = ["{topic}"]
start = "earliest"
poll_ms = 50
linger_ms = 100
slo_lag_s = {slo}
autoscale = "{autoscale}"
workers = [{lo}, {hi}]
interval_s = {interval}
horizon_s = {horizon}
tau_s = {tau}
assignment = "{assignment}"
"#,
        batch = a.batch_size,
        dir = dir.display(),
        workers = p.workers,
        slo = a.slo_lag_s,
        autoscale = p.autoscale,
        interval = a.interval_s,
        horizon = a.horizon_s,
        tau = a.tau_s,
        assignment = p.assignment,
    )
}

#[allow(clippy::too_many_arguments)]
fn run_policy(
    a: &BenchOnlineArgs,
    exe: &Path,
    out: &Path,
    conn: &Connection,
    topic: &str,
    policy: &Policy,
    files: &[PathBuf],
    trace: &Trace,
) -> Result<PolicyResult> {
    let safe = policy.name.replace([':', '/'], "-");
    let dir = out.join(&safe);
    let job = out.join(format!("{safe}.toml"));
    std::fs::write(&job, job_toml(a, &dir, &conn.brokers, topic, policy))?;
    let spec = ReplaySpec {
        conn: conn.clone(),
        topic: topic.to_string(),
        files: files.to_vec(),
        schema: None,
        repeat: true,
        format: MessageFormat::Tsv,
        samples_per_message: 1,
        trace: trace.clone(),
        partitioner: Partitioner::skewed(a.skew_partition, a.hot_share, a.skew_share)?,
        seed: 1,
    };
    let run = run_job(&JobRun {
        exe,
        name: &policy.name,
        job: &job,
        dir: &dir,
        env: &[("ELASTREC_FAIL_SLOW_WORKER", format!("*:{}", a.slow_ms))],
        replay: Some(&spec),
        drain_timeout: Duration::from_secs(a.drain_timeout_s),
    })?;
    let r = run.result;
    let online = &r["online"];
    let st = &online["stream"];
    let partitions = st["partitions"].as_array().cloned().unwrap_or_default();
    let max_workers = online["decisions"]
        .as_array()
        .and_then(|d| d.iter().filter_map(|d| d["target"].as_u64()).max())
        .unwrap_or(u64::from(policy.workers));
    Ok(PolicyResult {
        policy: policy.name.clone(),
        samples: r["ledger"]["consumed"].as_u64().unwrap_or(0),
        slo_violation_rate: st["slo_violation_rate"].as_f64().unwrap_or(f64::NAN),
        accumulated_lag_s: st["accumulated_lag_s"].as_f64().unwrap_or(f64::NAN),
        downtime_s: st["downtime_s"].as_f64().unwrap_or(f64::NAN),
        worker_hours: online["worker_hours"].as_f64().unwrap_or(f64::NAN),
        scaling_changes: online["scaling_changes"].as_u64().unwrap_or(0),
        max_workers,
        window_auc: online["progressive"]["latest"]["auc"].as_f64(),
        peak_partition_lag_s: partitions
            .iter()
            .filter_map(|p| p["peak_lag_s"].as_f64())
            .fold(0.0, f64::max),
        partition_accumulated_lag_s: partitions
            .iter()
            .map(|p| p["accumulated_lag_s"].as_f64().unwrap_or(f64::NAN))
            .collect(),
        foreign_load: run.foreign_load,
        wall_s: run.wall_s,
    })
}

/// Where a benchmark's jobs run: its output directory (absolute), a local Kafka broker,
/// and the `elastrec` binary the jobs start.
pub(crate) struct BenchPlace {
    pub out: PathBuf,
    broker: elastrec_stream::tansu::Tansu,
    pub brokers: String,
    pub exe: PathBuf,
}

impl BenchPlace {
    pub fn new(out: &Path) -> Result<Self> {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        let out = std::fs::canonicalize(out)?;
        let binary = elastrec_stream::tansu::binary().context(
            "no Kafka broker to benchmark against: install Tansu (`bash scripts/test.sh` does, \
             or `cargo install tansu --version 0.6.0 --features dynostore`) or set ELASTREC_TANSU",
        )?;
        let broker = elastrec_stream::tansu::Tansu::start(
            &binary,
            &out.join("broker.log"),
            &Default::default(),
        )?;
        Ok(Self {
            out,
            brokers: broker.address(),
            broker,
            exe: std::env::current_exe()?,
        })
    }

    /// A connection for the replays that feed the jobs.
    pub fn connection(&self) -> Connection {
        self.broker.connection()
    }

    /// Creates topic `name` with `partitions` partitions (one per run, so that every run
    /// reads exactly the traffic it was sent); returns its name.
    pub fn topic(&self, name: &str, partitions: i32) -> Result<String> {
        elastrec_stream::create_topic(&self.broker.connection(), name, partitions)
            .with_context(|| format!("creating topic {name}"))?;
        Ok(name.to_string())
    }
}

/// One benchmark job: its file (already written), where it runs, and what feeds it.
pub(crate) struct JobRun<'a> {
    pub exe: &'a Path,
    /// Name in messages.
    pub name: &'a str,
    pub job: &'a Path,
    /// The job's `output.dir` (a previous run's is removed first).
    pub dir: &'a Path,
    /// Environment of the job (fail points).
    pub env: &'a [(&'a str, String)],
    /// Traffic to send once the job answers; the job is stopped once it trained all of
    /// it. Without one the job ends by itself.
    pub replay: Option<&'a ReplaySpec>,
    /// Longest the job may take to train what it was sent after the replay ends.
    pub drain_timeout: Duration,
}

/// What a benchmark job left.
pub(crate) struct JobOutcome {
    /// Its `result.json`.
    pub result: serde_json::Value,
    pub wall_s: f64,
    /// Share of the machine other processes used meanwhile (`elastrec_common::quiet`).
    pub foreign_load: Option<f64>,
}

/// Runs one benchmark job to its end: starts `elastrec run`, replays the traffic once
/// the job answers, waits until every sample sent trained, stops it, and reads its result.
pub(crate) fn run_job(r: &JobRun) -> Result<JobOutcome> {
    let (exe, dir, name) = (r.exe, r.dir, r.name);
    if dir.exists() {
        std::fs::remove_dir_all(dir)
            .with_context(|| format!("removing the previous run {}", dir.display()))?;
    }
    let probe = LoadProbe::start();
    let log_path = r.job.with_extension("log");
    let log = std::fs::File::create(&log_path)?;
    let child = Command::new(exe)
        .args(["run", r.job.to_str().context("job path is not UTF-8")?])
        .envs(r.env.iter().map(|(k, v)| (k, v)))
        .stdout(log.try_clone()?)
        .stderr(log)
        .stdin(Stdio::null())
        .spawn()
        .context("starting the job")?;
    let mut job_proc = KillOnDrop(child);
    let started = Instant::now();
    if let Some(spec) = r.replay {
        wait_until(Duration::from_secs(120), || {
            if let Some(status) = job_proc.0.try_wait()? {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                bail!(
                    "the job exited ({status}) before it started: {}",
                    log.lines().next().unwrap_or("(empty log)")
                );
            }
            Ok(samples_done(exe, dir)?.is_some())
        })
        .with_context(|| {
            format!(
                "{name}: the job did not start; its log: {}",
                log_path.display()
            )
        })?;
        let sent = replay(spec, |p| {
            eprintln!(
                "  [{:>5.0}s] {} samples sent, trained {}",
                p.seconds,
                p.samples,
                samples_done(exe, dir).ok().flatten().unwrap_or(0)
            );
        })?
        .samples;
        wait_until(r.drain_timeout, || {
            Ok(samples_done(exe, dir)?.is_some_and(|n| n >= sent))
        })
        .with_context(|| format!("{name}: the job did not train all {sent} samples"))?;
        let stop = Command::new(exe)
            .args(["stop", dir.to_str().context("job dir is not UTF-8")?])
            .output()?;
        if !stop.status.success() {
            bail!(
                "stopping the job: {}",
                String::from_utf8_lossy(&stop.stderr)
            );
        }
    }
    let status = job_proc.0.wait()?;
    // The job and its nodes have been waited for: their CPU is the benchmark's own.
    let load = probe.and_then(|p| p.stop());
    if !status.success() {
        bail!(
            "{name}: the job failed ({status}); see its log {}",
            log_path.display()
        );
    }
    let wall_s = started.elapsed().as_secs_f64();
    let text = std::fs::read_to_string(dir.join("result.json"))?;
    Ok(JobOutcome {
        result: serde_json::from_str(&text)?,
        wall_s,
        foreign_load: load.map(|l| l.foreign_share()),
    })
}

/// Samples the job has trained, from `elastrec status --json`; `None` before it answers.
fn samples_done(exe: &Path, dir: &Path) -> Result<Option<u64>> {
    let out = Command::new(exe)
        .args([
            "status",
            dir.to_str().context("job dir is not UTF-8")?,
            "--json",
        ])
        .output()?;
    if !out.status.success() {
        return Ok(None);
    }
    let s: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    Ok(s["samples_done"].as_u64())
}

/// Polls `done` every 200 ms until it holds or `limit` passes.
fn wait_until(limit: Duration, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
    let t0 = Instant::now();
    while !done()? {
        if t0.elapsed() > limit {
            bail!("not reached within {} s", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn print_table(rows: &[PolicyResult]) {
    println!(
        "{:<16} {:>8} {:>14} {:>12} {:>10} {:>12} {:>8} {:>6} {:>10} {:>12} {:>10}",
        "policy",
        "samples",
        "SLO violation",
        "acc. lag s",
        "downtime s",
        "worker-hours",
        "changes",
        "max w",
        "window AUC",
        "peak p-lag s",
        "foreign CPU"
    );
    for r in rows {
        println!(
            "{:<16} {:>8} {:>13.1}% {:>12.1} {:>10.1} {:>12.4} {:>8} {:>6} {:>10} {:>12.1} {:>10}",
            r.policy,
            r.samples,
            100.0 * r.slo_violation_rate,
            r.accumulated_lag_s,
            r.downtime_s,
            r.worker_hours,
            r.scaling_changes,
            r.max_workers,
            r.window_auc.map_or("-".into(), |a| format!("{a:.4}")),
            r.peak_partition_lag_s,
            r.foreign_load
                .map_or("-".into(), |f| format!("{:.1}%", 100.0 * f))
        );
    }
    println!("accumulated lag per partition, s:");
    for r in rows {
        let lags: Vec<String> = r
            .partition_accumulated_lag_s
            .iter()
            .map(|l| format!("{l:.1}"))
            .collect();
        println!("  {:<16} {}", r.policy, lags.join(" / "));
    }
    if let [first, rest @ ..] = rows {
        for r in rest {
            println!(
                "{} / {}: accumulated lag {:.2}x, worker-hours {:.2}x",
                first.policy,
                r.policy,
                first.accumulated_lag_s / r.accumulated_lag_s.max(1e-9),
                first.worker_hours / r.worker_hours.max(1e-9)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_names_its_scaling_and_assignment() {
        let p = Policy::parse("fixed:4/pinned").unwrap();
        assert_eq!(
            (p.name.as_str(), p.autoscale, p.workers, p.assignment),
            ("fixed:4/pinned", "off", 4, "pinned")
        );
        let p = Policy::parse("kale").unwrap();
        assert_eq!(
            (p.name.as_str(), p.autoscale, p.workers, p.assignment),
            ("kale", "kale", 1, "shared")
        );
        assert_eq!(Policy::parse("hpa/shared").unwrap().name, "hpa/shared");
        assert!(Policy::parse("fixed:0").is_err());
        assert!(Policy::parse("kale/odd").is_err());
    }
}
