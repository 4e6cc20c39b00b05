//! Library side of `elastrec simulate` (the binary only parses arguments and calls
//! [`dispatch`]).

use std::path::PathBuf;

use anyhow::Context as _;

use crate::cluster::trace::{self, TraceSpec};
use crate::cluster::{run_cluster, BatchPolicy, OnlinePolicy, SimSettings};
use crate::cpr::{run_cpr_emulation, CprEmulationConfig, Strategy};

/// `elastrec simulate …`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum SimulateCommand {
    /// CPR emulation: inject parameter-server failures into a single-process training run
    /// and compare full recovery, partial recovery, CPR-vanilla, CPR-MFU and CPR-SSU
    /// (emulated checkpoint overhead, PLS, final AUC) against a failure-free run.
    Cpr(CprArgs),
    /// Cluster simulation: many batch and online jobs on simulated nodes, scheduled by
    /// elastrec's live policies (brain and master) and by the papers' baselines on the same
    /// trace; prints JCT, utilization and KALE's Table 3 metrics (docs/simulator.md).
    Cluster(ClusterArgs),
}

/// Flags of `elastrec simulate cluster`; defaults are [`SimSettings::default`]'s.
#[derive(Debug, Clone, clap::Args)]
pub struct ClusterArgs {
    /// Job trace CSV (columns in docs/simulator.md); without it a trace is generated.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Generated trace: batch jobs.
    #[arg(long, default_value_t = 300)]
    pub jobs: usize,
    /// Generated trace: online jobs (streams).
    #[arg(long, default_value_t = 8)]
    pub online_jobs: usize,
    /// Generated trace: batch jobs arrive over this many hours.
    #[arg(long, default_value_t = 24.0)]
    pub span_h: f64,
    /// Generated trace: streams run this many hours.
    #[arg(long, default_value_t = 72.0)]
    pub online_h: f64,
    /// Write the (generated or read) trace here as CSV.
    #[arg(long)]
    pub write_trace: Option<PathBuf>,
    /// Nodes in the cluster.
    #[arg(long, default_value_t = SimSettings::default().nodes)]
    pub nodes: u32,
    /// Cores per node.
    #[arg(long, default_value_t = SimSettings::default().node_cpu)]
    pub node_cpu: f64,
    /// Memory per node, GiB.
    #[arg(long, default_value_t = SimSettings::default().node_mem_gb)]
    pub node_mem_gb: f64,
    /// Batch policies, comma-separated (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub policies: Vec<BatchPolicy>,
    /// Online policies, comma-separated (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub online_policies: Vec<OnlinePolicy>,
    /// Seconds between control cycles.
    #[arg(long, default_value_t = SimSettings::default().control_s)]
    pub control_s: f64,
    /// Seconds between two plans of a job.
    #[arg(long, default_value_t = SimSettings::default().plan_interval_s)]
    pub plan_interval_s: f64,
    /// Node failures per pod-hour (0: none).
    #[arg(long, default_value_t = SimSettings::default().failures_per_pod_hour)]
    pub failures_per_pod_hour: f64,
    /// Share of jobs with one slow worker (0: none).
    #[arg(long, default_value_t = SimSettings::default().straggler_prob)]
    pub straggler_prob: f64,
    /// Speed of the slow worker relative to the others.
    #[arg(long, default_value_t = SimSettings::default().straggler_factor)]
    pub straggler_factor: f64,
    /// Seconds a checkpoint-restart takes.
    #[arg(long, default_value_t = SimSettings::default().restart_s)]
    pub restart_s: f64,
    /// Seconds one scaling of an online job stops it.
    #[arg(long, default_value_t = SimSettings::default().rescale_s)]
    pub rescale_s: f64,
    /// Lag SLO of online jobs, seconds.
    #[arg(long, default_value_t = SimSettings::default().slo_lag_s)]
    pub slo_lag_s: f64,
    /// Stop simulating after this many hours.
    #[arg(long, default_value_t = SimSettings::default().max_hours)]
    pub max_hours: f64,
    /// elastrec's `autoscale.growth_efficiency`: a plan's growth is kept only if it raised
    /// throughput by this share of the cores it added (0: every plan is kept).
    #[arg(long, default_value_t = SimSettings::default().growth_efficiency)]
    pub growth_efficiency: f64,
    /// Seed: the same seed and flags give the same tables.
    #[arg(long, default_value_t = SimSettings::default().seed)]
    pub seed: u64,
    /// Write summary.json, jobs.csv and streams.csv here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the report as JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// No progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

impl ClusterArgs {
    /// The settings these flags describe.
    pub fn settings(&self) -> SimSettings {
        SimSettings {
            nodes: self.nodes,
            node_cpu: self.node_cpu,
            node_mem_gb: self.node_mem_gb,
            control_s: self.control_s,
            plan_interval_s: self.plan_interval_s,
            failures_per_pod_hour: self.failures_per_pod_hour,
            straggler_prob: self.straggler_prob,
            straggler_factor: self.straggler_factor,
            restart_s: self.restart_s,
            rescale_s: self.rescale_s,
            slo_lag_s: self.slo_lag_s,
            max_hours: self.max_hours,
            seed: self.seed,
            growth_efficiency: self.growth_efficiency,
            ..SimSettings::default()
        }
    }
}

/// Flags of `elastrec simulate cpr`; defaults are [`CprEmulationConfig::default`]'s.
#[derive(Debug, Clone, clap::Args)]
pub struct CprArgs {
    /// Job file whose data, model, optimizers and batch size are used (its
    /// `[data.generate]` creates missing data). Without it: generated Criteo-shaped data
    /// of `--rows` rows and the default model.
    #[arg(long)]
    pub job: Option<PathBuf>,
    /// Rows of generated data (7 day files: 6 train, 1 held out) when no `--job` is given.
    #[arg(long, default_value_t = 200_000)]
    pub rows: u64,
    /// Directory of the generated data (default `data/cpr-<rows>`); reused when present.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Stop each run after this many training samples (0: the whole training set).
    #[arg(long, default_value_t = 0)]
    pub max_samples: u64,
    /// Failures injected at seeded random positions (the same for every strategy).
    #[arg(long, default_value_t = CprEmulationConfig::default().failures)]
    pub failures: u32,
    /// Virtual embedding parameter servers `N_emb`.
    #[arg(long, default_value_t = CprEmulationConfig::default().n_emb)]
    pub n_emb: u32,
    /// Servers lost per failure.
    #[arg(long, default_value_t = CprEmulationConfig::default().failed_ps)]
    pub failed_ps: u32,
    /// PLS CPR may lose.
    #[arg(long, default_value_t = CprEmulationConfig::default().target_pls)]
    pub target_pls: f64,
    /// Fraction of full recovery's overhead partial recovery must save to be chosen.
    #[arg(long, default_value_t = CprEmulationConfig::default().min_benefit)]
    pub min_benefit: f64,
    /// `r` of CPR-MFU/SSU: `r·N` rows every `r·T_save` (1/r must be whole).
    #[arg(long, default_value_t = CprEmulationConfig::default().priority_ratio)]
    pub ratio: f64,
    /// Emulated job length, hours.
    #[arg(long, default_value_t = CprEmulationConfig::default().job_hours)]
    pub job_hours: f64,
    /// Emulated seconds to save a full checkpoint (`O_save`).
    #[arg(long, default_value_t = CprEmulationConfig::default().o_save_s)]
    pub o_save: f64,
    /// Emulated seconds to load a checkpoint (`O_load`).
    #[arg(long, default_value_t = CprEmulationConfig::default().o_load_s)]
    pub o_load: f64,
    /// Emulated seconds to reschedule failed servers (`O_res`).
    #[arg(long, default_value_t = CprEmulationConfig::default().o_res_s)]
    pub o_res: f64,
    /// Seed of failure positions, failed servers and SSU evictions.
    #[arg(long, default_value_t = CprEmulationConfig::default().seed)]
    pub seed: u64,
    /// Strategies to run after the failure-free reference, comma-separated
    /// (full, partial, cpr-vanilla, cpr-mfu, cpr-ssu; default: all).
    #[arg(long, value_delimiter = ',', value_parser = parse_strategy)]
    pub strategies: Vec<Strategy>,
    /// Math threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Also write the full report as JSON here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the report as JSON instead of the markdown table.
    #[arg(long)]
    pub json: bool,
    /// No progress bars.
    #[arg(long)]
    pub no_progress: bool,
}

fn parse_strategy(s: &str) -> Result<Strategy, String> {
    serde_json::from_value(serde_json::Value::String(s.trim().to_string())).map_err(|_| {
        format!("unknown strategy `{s}`; use full, partial, cpr-vanilla, cpr-mfu or cpr-ssu")
    })
}

impl CprArgs {
    /// The emulation settings these flags describe.
    pub fn to_config(&self) -> anyhow::Result<CprEmulationConfig> {
        let mut job = match &self.job {
            Some(path) => elastrec_job::JobConfig::load(path)?,
            None => CprEmulationConfig::generated_job(
                self.rows,
                self.data_dir
                    .clone()
                    .unwrap_or_else(|| PathBuf::from(format!("data/cpr-{}", self.rows))),
            ),
        };
        job.train.max_samples = self.max_samples;
        job.train.threads = self.threads;
        let defaults = CprEmulationConfig::default();
        Ok(CprEmulationConfig {
            job,
            job_hours: self.job_hours,
            failures: self.failures,
            n_emb: self.n_emb,
            failed_ps: self.failed_ps,
            o_save_s: self.o_save,
            o_load_s: self.o_load,
            o_res_s: self.o_res,
            target_pls: self.target_pls,
            min_benefit: self.min_benefit,
            priority_ratio: self.ratio,
            seed: self.seed,
            strategies: if self.strategies.is_empty() {
                defaults.strategies.clone()
            } else {
                self.strategies.clone()
            },
            progress: !self.no_progress && !self.json,
            ..defaults
        })
    }
}

/// Runs an `elastrec simulate` command and prints its result.
pub fn dispatch(cmd: SimulateCommand) -> anyhow::Result<()> {
    match cmd {
        SimulateCommand::Cpr(args) => {
            let config = args.to_config()?;
            if args.threads > 0 {
                rayon_threads(args.threads)?;
            }
            let report = run_cpr_emulation(&config).context("CPR emulation")?;
            let json = serde_json::to_string_pretty(&report)?;
            if let Some(path) = &args.out {
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir)
                        .with_context(|| format!("creating {}", dir.display()))?;
                }
                std::fs::write(path, &json)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            if args.json {
                println!("{json}");
            } else {
                print!("{}", report.to_markdown());
                if let Some(path) = &args.out {
                    println!("\nFull report: {}", path.display());
                }
            }
            Ok(())
        }
        SimulateCommand::Cluster(args) => simulate_cluster(&args),
    }
}

fn simulate_cluster(args: &ClusterArgs) -> anyhow::Result<()> {
    let settings = args.settings();
    settings.validate()?;
    let jobs = match &args.trace {
        Some(path) => trace::read_csv(path)?,
        None => {
            if args.jobs + args.online_jobs == 0 {
                anyhow::bail!("`--jobs` and `--online-jobs` are both 0: nothing to simulate");
            }
            if !(args.span_h.is_finite()
                && args.span_h > 0.0
                && args.online_h.is_finite()
                && args.online_h > 0.0)
            {
                anyhow::bail!("`--span-h` and `--online-h` must be finite and > 0");
            }
            trace::generate(&TraceSpec {
                jobs: args.jobs,
                online_jobs: args.online_jobs,
                span_h: args.span_h,
                online_h: args.online_h,
                seed: args.seed,
            })
        }
    };
    if let Some(path) = &args.write_trace {
        trace::write_csv(path, &jobs).with_context(|| format!("writing {}", path.display()))?;
    }
    let batch = if args.policies.is_empty() {
        <BatchPolicy as clap::ValueEnum>::value_variants().to_vec()
    } else {
        args.policies.clone()
    };
    let online = if args.online_policies.is_empty() {
        <OnlinePolicy as clap::ValueEnum>::value_variants().to_vec()
    } else {
        args.online_policies.clone()
    };
    let bar = (!args.no_progress && !args.json).then(|| {
        let b = indicatif::ProgressBar::new(1000);
        b.set_style(
            indicatif::ProgressStyle::with_template("{msg:>14} [{bar:40}] {percent:>3}% {elapsed}")
                .expect("a valid template")
                .progress_chars("=> "),
        );
        b
    });
    let report = run_cluster(&jobs, &batch, &online, &settings, &|policy, f| {
        if let Some(b) = &bar {
            b.set_message(policy.to_string());
            b.set_position((f * 1000.0) as u64);
        }
    });
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if let Some(dir) = &args.out {
        report
            .write(dir)
            .with_context(|| format!("writing the report into {}", dir.display()))?;
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({"report": &report, "claims": report.claims()})
            )?
        );
    } else {
        print!("{}", report.render());
        if let Some(dir) = &args.out {
            println!(
                "summary.json, jobs.csv and streams.csv in {}",
                dir.display()
            );
        }
    }
    Ok(())
}

/// Sizes the global rayon pool.
fn rayon_threads(n: usize) -> anyhow::Result<()> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global()
        .context("could not size the thread pool")
}
