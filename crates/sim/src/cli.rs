//! Library side of `elastrec simulate` (the binary only parses arguments and calls
//! [`dispatch`]).

use std::path::PathBuf;

use anyhow::Context as _;

use crate::cpr::{run_cpr_emulation, CprEmulationConfig, Strategy};

/// `elastrec simulate …`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum SimulateCommand {
    /// CPR emulation: inject parameter-server failures into a single-process training run
    /// and compare full recovery, partial recovery, CPR-vanilla, CPR-MFU and CPR-SSU
    /// (emulated checkpoint overhead, PLS, final AUC) against a failure-free run.
    Cpr(CprArgs),
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
    }
}

/// Sizes the global rayon pool.
fn rayon_threads(n: usize) -> anyhow::Result<()> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global()
        .context("could not size the thread pool")
}
