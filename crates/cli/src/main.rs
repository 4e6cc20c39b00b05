//! The `elastrec` binary: thin glue over the library crates.
//!
//! Each subcommand parses its flags, builds a validated configuration and calls one library
//! function; no training, data or scheduling logic lives here.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};

mod bench_bags;
mod bench_mixture;
mod bench_online;
mod bench_preprocess;
mod bench_rounds;
mod bench_sequence;
mod bench_serve;
mod bench_tasks;
mod commands;
mod export;
mod preprocess;
mod replay;
mod serve;

/// Elastic, failure-tolerant training of deep learning recommendation models (DLRM).
#[derive(Parser)]
#[command(name = "elastrec", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log filter (tracing `EnvFilter` syntax), e.g. `info` or `elastrec_worker=debug`.
    #[arg(long, global = true, env = "ELASTREC_LOG", default_value = "warn")]
    log: String,
}

#[derive(Subcommand)]
enum Command {
    /// Train a DLRM in this process (the standalone mode) from a job file.
    Train(TrainArgs),
    /// Generate Criteo-shaped data (raw Criteo layout) with a hidden teacher model.
    GenData(GenDataArgs),
    /// Evaluate a saved model on Criteo-layout files: AUC and logloss.
    Eval(EvalArgs),
    /// Write a servable model file (`model.bin`, read by `elastrec eval`) from a checkpoint
    /// of a `run` job: every parameter server's part and the delta chain, merged.
    Export(export::ExportArgs),
    /// Serve a model file: click probabilities over HTTP/JSON and gRPC, with deltas and
    /// new models pushed while serving (docs/serving.md).
    Serve(serve::ServeArgs),
    /// Apply a job's `[[preprocess]]` graph (or the default one) to its data files and
    /// write the features as Parquet; `--explain` prints the compiled graph
    /// (docs/preprocess.md).
    Preprocess(preprocess::PreprocessArgs),
    /// Measure training throughput of the Criteo-Kaggle-shaped model.
    Bench(BenchArgs),
    /// Cluster brain: serve plans over gRPC (`elastrec brain --db URL`) or print a plan
    /// for a job file (`elastrec brain plan --job job.toml`).
    Brain(BrainArgs),
    #[command(flatten)]
    Cluster(elastrec_master::cli::ClusterCommand),
    /// Replay Criteo-layout rows into a Kafka topic at the rates of a trace (the traffic
    /// generator for online jobs): `elastrec replay --to kafka://HOST:PORT/TOPIC --data DIR
    /// --qps-trace trace.csv`.
    Replay(replay::ReplayArgs),
    /// Simulations over the live policies: `elastrec simulate cpr` emulates parameter-server
    /// failures and compares CPR's recovery strategies (docs/cpr.md).
    #[command(subcommand)]
    Simulate(elastrec_sim::cli::SimulateCommand),
    /// Write PNG and SVG charts of a simulation's results (`simulate cluster --out DIR`)
    /// or of a finished job's `result.json`: `elastrec plot DIR --out charts/`.
    Plot(elastrec_viz::plot::PlotArgs),
    /// Serve a live web page over running jobs: nodes, throughput, scaling decisions with
    /// their reasons, checkpoints, online traffic and lag (`docs/dashboard.md`).
    Dashboard(elastrec_viz::dashboard::DashboardArgs),
    /// (internal) A parameter-server process, started by the master.
    #[command(hide = true)]
    Ps(elastrec_ps::PsArgs),
    /// (internal) A worker process, started by the master.
    #[command(hide = true)]
    Worker(elastrec_worker::remote::WorkerArgs),
    /// (internal) A data executor process, started by the master (`cluster.executors`).
    #[command(hide = true)]
    Executor(elastrec_worker::remote::WorkerArgs),
}

#[derive(clap::Args)]
struct TrainArgs {
    /// Job file (TOML); see docs/config.md.
    config: PathBuf,
    /// Print the fully resolved configuration and exit.
    #[arg(long)]
    print_config: bool,
}

/// On-disk format of generated files.
#[derive(Clone, Copy, ValueEnum)]
enum Format {
    /// Criteo raw TSV.
    Tsv,
    /// Apache Parquet.
    Parquet,
    /// CSV with a header line (lists joined by `|`); with --named only.
    Csv,
}

impl Format {
    fn name(self) -> &'static str {
        match self {
            Format::Tsv => "tsv",
            Format::Parquet => "parquet",
            Format::Csv => "csv",
        }
    }
}

#[derive(clap::Args)]
struct GenDataArgs {
    /// Output directory (created if missing).
    #[arg(long)]
    out: PathBuf,
    /// Total number of rows over all day files.
    #[arg(long, default_value_t = 700_000)]
    rows: u64,
    /// File format [default: tsv; with --named: parquet].
    #[arg(long, value_enum)]
    format: Option<Format>,
    /// Seed: the same seed produces the same bytes.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Number of day files.
    #[arg(long, default_value_t = 7)]
    days: u32,
    /// Factor applied to the published Criteo Kaggle per-feature cardinalities.
    #[arg(long, default_value_t = 0.01)]
    scale: f64,
    /// Click behaviour drifts: each day the click model turns this share of a quarter
    /// turn away from day 0's (0: none; 0.25: day 4 shares nothing with day 0).
    #[arg(long, default_value_t = 0.0)]
    drift: f64,
    /// A second label per row, a conversion after the click (label field `11`, `10` or
    /// `00`): the data of a two-task model (`model.type = "mmoe"`).
    #[arg(long)]
    conversions: bool,
    /// Write hourly partitions `dt=YYYYMMDD/hour=HH/part-00000.*` (with `_SUCCESS`
    /// markers) instead of day files, the first day being this UTC date (`2026-11-01`);
    /// for `[[data.dataset]]` jobs (docs/data.md).
    #[arg(long, value_name = "DATE")]
    hourly_from: Option<String>,
    /// Write a shop's click log with named columns instead (`click`, `user_id`,
    /// `item_id`, `device`, `price`, a `genres` list and a `hist_items` sequence), for
    /// jobs with named features (`data.label`, docs/data.md), as Parquet or
    /// (`--format csv`) CSV. Takes --rows, --days, --format and --seed.
    #[arg(long, conflicts_with_all = ["scale", "drift", "conversions", "hourly_from"])]
    named: bool,
}

#[derive(clap::Args)]
struct EvalArgs {
    /// Saved model (`model.bin` in a run directory).
    #[arg(long)]
    model: PathBuf,
    /// Criteo TSV/Parquet files, or directories whose `day_*` files are all read.
    #[arg(long, required = true, num_args = 1..)]
    data: Vec<PathBuf>,
    /// Malformed rows: fail (default) or skip.
    #[arg(long, default_value = "fail")]
    on_bad_row: String,
    /// Print the result as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write every row's label, weight and prediction (one column per task) to this
    /// CSV file, in the files' order: for a notebook, or a metric elastrec does not report.
    #[arg(long, value_name = "FILE")]
    predictions: Option<PathBuf>,
    /// Also write every row as the model's ONNX graph reads it (`elastrec export --format
    /// onnx`) to this safetensors file, in the files' order: feed it to ONNX Runtime to
    /// get the same predictions.
    #[arg(long, value_name = "FILE")]
    onnx_inputs: Option<PathBuf>,
}

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
struct BenchArgs {
    #[command(subcommand)]
    command: Option<BenchCommand>,
    /// Steps to time (after warm-up).
    #[arg(long, default_value_t = 30)]
    steps: usize,
    /// Batch size.
    #[arg(long, default_value_t = 2048)]
    batch_size: usize,
    /// Math threads (0: all cores, or every CPU of `--cpus`).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// CPUs both sides run on, as a kernel CPU list (`0-3,6`), or `all` (no pinning).
    /// Default: the first `--threads` CPUs this process may use (all of them with
    /// `--threads 0`); the PyTorch reference inherits them, so both sides run with the
    /// same threads on the same cores.
    #[arg(long)]
    cpus: Option<String>,
    /// Cap on every table's rows (Criteo Kaggle cardinalities are used below it).
    #[arg(long, default_value_t = 1_000_000)]
    max_table_rows: u64,
    /// Directory for the file-reading variant's data (generated if missing).
    #[arg(long, default_value = "data/bench")]
    data_dir: PathBuf,
    /// Also run the PyTorch reference (`bench/pytorch_dlrm.py`) with this Python
    /// interpreter (e.g. `.venv/bin/python`) and print the ratio.
    #[arg(long)]
    pytorch: Option<PathBuf>,
    /// With `--pytorch`: full-step rounds, elastrec then PyTorch back to back in each, so
    /// both see the same machine speed; the ratio reported is the median round's.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// With `--pytorch`: a round in which other processes used more than this share of the
    /// machine's CPU (`/proc/stat` against this process tree) is disturbed: it is repeated,
    /// and its ratio is not used.
    #[arg(long, default_value_t = 0.05)]
    max_foreign_load: f64,
    /// With `--pytorch`: disturbed rounds repeated at most this many times in all.
    #[arg(long, default_value_t = 3)]
    max_repeats: usize,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Online scaling policies side by side on one replayed traffic trace (KALE, the
    /// HPA-like rule, fixed counts): SLO violation, accumulated lag, downtime,
    /// worker-hours (docs/online.md).
    Online(bench_online::BenchOnlineArgs),
    /// Batch + stream mixture on drifting data: history only, stream only and the
    /// mixture's serving modes side by side: held-out AUC and the stream's lag
    /// (docs/data.md).
    Mixture(bench_mixture::BenchMixtureArgs),
    /// Data task graph generation at Primus scale: tasks, files, seconds, tasks/s and
    /// memory for a generated listing (docs/data.md).
    Tasks(bench_tasks::BenchTasksArgs),
    /// Input preprocessing: a Criteo-style graph over generated rows through elastrec's
    /// fused plan, and with `--polars PYTHON` the same graph in polars, side by side
    /// (docs/preprocess.md).
    Preprocess(bench_preprocess::BenchPreprocessArgs),
    /// The model server: queries per second and p50/p99 latency over HTTP/JSON and gRPC,
    /// for requests of 1 and 64 rows (docs/serving.md).
    Serve(bench_serve::BenchServeArgs),
    /// A behaviour sequence pooled against its candidate, forward and backward: DIN's
    /// target attention and the BST transformer, and with `--pytorch PYTHON` the same
    /// layers in PyTorch, side by side (docs/models.md).
    Sequence(bench_sequence::BenchSequenceArgs),
    /// Embedding bags: pooled lookups, their backward and the sparse optimizer's update
    /// for bags of several mean lengths, and with `--pytorch PYTHON` the same through
    /// `nn.EmbeddingBag`, side by side (docs/models.md).
    Bags(bench_bags::BenchBagsArgs),
}

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
struct BrainArgs {
    #[command(subcommand)]
    command: Option<BrainCommand>,
    /// Config database: `sqlite://brain.db?mode=rwc` (default) or `postgres://user@host/db`.
    /// Keep a password out of the command line, where `ps` shows it: use PGPASSWORD or
    /// ~/.pgpass, or pass the whole URL in ELASTREC_BRAIN_DB.
    // `hide_env_values`: `--help` would otherwise print the variable's value, password
    // included.
    #[arg(
        long,
        env = "ELASTREC_BRAIN_DB",
        hide_env_values = true,
        default_value = "sqlite://brain.db?mode=rwc"
    )]
    db: String,
    /// Address to listen on (loopback unless you say otherwise).
    #[arg(long, default_value = elastrec_brain::service::DEFAULT_LISTEN)]
    listen: std::net::SocketAddr,
    /// File holding the shared token every request must carry (`authorization: Bearer
    /// <token>`); without it the token comes from ELASTREC_BRAIN_TOKEN. There is no
    /// `--token`: a command-line argument is visible to every user through `ps`.
    #[arg(long, value_name = "PATH")]
    token_file: Option<PathBuf>,
    /// Address of the brain's Prometheus `/metrics` endpoint (open on loopback; on any
    /// other address it requires the brain's token).
    #[arg(long, default_value = "127.0.0.1:0")]
    metrics_addr: std::net::SocketAddr,
    /// CPU cores of the cluster the brain plans: jobs that share the service are given
    /// shares of it together (weighted greedy, DLRover-RM Eq. 11-14).
    #[arg(long, default_value_t = 1024.0)]
    cluster_cpu: f64,
    /// Memory of the cluster the brain plans, GiB.
    #[arg(long, default_value_t = 4096.0)]
    cluster_mem_gb: f64,
    /// A job that has not reported or planned for this many seconds no longer holds a
    /// share of the cluster.
    #[arg(long, default_value_t = 600.0)]
    inactive_after_s: f64,
}

#[derive(Subcommand)]
enum BrainCommand {
    /// Print the brain's resource plan for a job file (what `elastrec run` runs, planned as
    /// its master plans at start) or a brain job description (TOML, see docs/brain.md).
    Plan {
        /// Job description file.
        #[arg(long)]
        job: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// List the jobs the brain has learned from: model, scenario, user, how each ended
    /// and the allocation it ended on (what warm start starts similar jobs from).
    History {
        /// Config database (default: the one `elastrec run` jobs use when
        /// `autoscale.brain_db` is empty, `~/.local/share/elastrec/brain.db`).
        #[arg(long, env = "ELASTREC_BRAIN_DB", hide_env_values = true)]
        db: Option<String>,
        /// Most recent jobs to list.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// The log (`--log` filter, on stderr) and the master's job events, which are printed
/// whatever the filter and recorded in the job's `events.jsonl`
/// (`elastrec_master::events`).
fn init_logging(filter: &str) -> anyhow::Result<()> {
    use tracing_subscriber::filter::{filter_fn, EnvFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let events = elastrec_master::events::TARGET;
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(EnvFilter::try_new(filter).context("invalid --log filter")?)
        .with_filter(filter_fn(move |m| m.target() != events));
    let job_events = elastrec_master::events::EventLog
        .with_filter(Targets::new().with_target(events, tracing::Level::INFO));
    tracing_subscriber::registry()
        .with(log)
        .with(job_events)
        .init();
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logging(&cli.log)?;
    match cli.command {
        Command::Train(a) => commands::train(&a.config, a.print_config),
        Command::GenData(a) => commands::gen_data(commands::GenData {
            out: a.out,
            rows: a.rows,
            format: match (a.format, a.named) {
                (Some(Format::Tsv), true) => {
                    return Err(anyhow::anyhow!(
                        "--named writes parquet or csv (with a header), not Criteo's tsv"
                    ))
                }
                (Some(Format::Csv), false) => {
                    return Err(anyhow::anyhow!(
                        "--format csv is for --named data; Criteo's layout is tsv or parquet"
                    ))
                }
                (Some(f), _) => f.name(),
                (None, true) => "parquet",
                (None, false) => "tsv",
            },
            seed: a.seed,
            days: a.days,
            scale: a.scale,
            drift: a.drift,
            conversions: a.conversions,
            hourly_from: a.hourly_from,
            named: a.named,
        }),
        Command::Eval(a) => commands::eval(
            &a.model,
            &a.data,
            &a.on_bad_row,
            a.json,
            a.predictions.as_deref(),
            a.onnx_inputs.as_deref(),
        ),
        Command::Brain(a) => match a.command {
            Some(BrainCommand::Plan { job, json }) => commands::brain_plan(&job, json),
            Some(BrainCommand::History { db, limit, json }) => {
                commands::brain_history(db.as_deref(), limit, json)
            }
            None => commands::brain_serve(
                &a.db,
                a.listen,
                a.metrics_addr,
                a.token_file.as_deref(),
                commands::BrainCluster {
                    cpu: a.cluster_cpu,
                    mem_gb: a.cluster_mem_gb,
                    inactive_after_s: a.inactive_after_s,
                },
            ),
        },
        Command::Cluster(c) => {
            if let elastrec_master::cli::ClusterCommand::Run(a) = &c {
                // `[dashboard]` of the job file, or of the job a resume continues. A job
                // that cannot be read here is reported by the run itself.
                let job = match (&a.job, &a.resume) {
                    (Some(p), _) => elastrec_job::config::JobConfig::load(p)
                        .ok()
                        .map(|c| (c.output.dir.clone(), c)),
                    (None, Some(dir)) => elastrec_master::cli::stored_job(dir)
                        .ok()
                        .map(|c| (dir.clone(), c)),
                    (None, None) => None,
                };
                if let Some((dir, d)) = job.and_then(|(dir, c)| Some((dir, c.dashboard?))) {
                    elastrec_viz::dashboard::beside_run(&d, dir);
                }
            }
            elastrec_master::cli::dispatch(c)
        }
        Command::Ps(a) => commands::on_runtime(elastrec_ps::run_ps(a)),
        Command::Worker(a) => commands::on_runtime(elastrec_worker::remote::run_worker(a)),
        Command::Executor(a) => commands::on_runtime(elastrec_worker::executor::run_executor(a)),
        Command::Simulate(c) => elastrec_sim::cli::dispatch(c),
        Command::Replay(a) => replay::run(a),
        Command::Plot(a) => elastrec_viz::plot::run(&a).map(|_| ()),
        Command::Dashboard(a) => elastrec_viz::dashboard::run(&a),
        Command::Export(a) => export::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Preprocess(a) => preprocess::run(a),
        Command::Bench(BenchArgs {
            command: Some(BenchCommand::Online(o)),
            ..
        }) => bench_online::run(o),
        Command::Bench(BenchArgs {
            command: Some(BenchCommand::Mixture(m)),
            ..
        }) => bench_mixture::run(m),
        Command::Bench(BenchArgs {
            command: Some(BenchCommand::Tasks(t)),
            ..
        }) => bench_tasks::run(t),
        Command::Bench(BenchArgs {
            command: Some(BenchCommand::Preprocess(p)),
            ..
        }) => bench_preprocess::run(p),
        Command::Bench(BenchArgs {
            command: Some(BenchCommand::Serve(s)),
            ..
        }) => bench_serve::run(s),
        Command::Bench(BenchArgs {
            command: Some(BenchCommand::Sequence(s)),
            ..
        }) => bench_sequence::run(s),
        Command::Bench(BenchArgs {
            command: Some(BenchCommand::Bags(b)),
            ..
        }) => bench_bags::run(b),
        Command::Bench(a) => commands::bench(commands::Bench {
            steps: a.steps,
            batch_size: a.batch_size,
            threads: a.threads,
            cpus: a.cpus,
            max_table_rows: a.max_table_rows,
            data_dir: a.data_dir,
            pytorch: a.pytorch,
            rounds: a.rounds,
            max_foreign_load: a.max_foreign_load,
            max_repeats: a.max_repeats,
            json: a.json,
        }),
    }
}
