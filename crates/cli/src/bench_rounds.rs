//! Rounds of a layer benchmark against a Python reference (`elastrec bench sequence`,
//! `elastrec bench bags`): each round times every case on our side, then in the
//! reference, back to back, so both see the same machine speed; a round that other
//! processes disturbed is kept in the report but not used.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use elastrec_common::quiet::LoadProbe;
use serde::Serialize;

/// What every such benchmark takes (`#[command(flatten)]`).
#[derive(clap::Args)]
pub struct RoundArgs {
    /// Timed steps per side and round (after two warm-up steps).
    #[arg(long, default_value_t = 20)]
    pub steps: usize,
    /// Math threads of each side.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Rounds; each times every case on both sides back to back, and the median round's
    /// ratio is reported.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// A Python with torch installed: times the same in PyTorch in each round.
    #[arg(long)]
    pub pytorch: Option<PathBuf>,
    /// A round in which other processes used more than this share of the machine's CPU
    /// is disturbed: its timings are kept in the report but not used.
    #[arg(long, default_value_t = 0.05)]
    pub max_foreign_load: f64,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

impl RoundArgs {
    /// Checks the counts.
    fn check(&self) -> Result<()> {
        anyhow::ensure!(
            self.steps >= 1 && self.rounds >= 1,
            "--steps and --rounds must be at least 1"
        );
        Ok(())
    }

    /// Times `cases` in the rounds these arguments ask for: `ours(case)` on `--threads`
    /// math threads, and with `--pytorch` the reference `bench/<script>` with
    /// `reference_args(case)`.
    pub fn run_cases(
        &self,
        cases: &[String],
        script: &str,
        reference_args: impl Fn(&str) -> Vec<std::ffi::OsString>,
        ours: impl Fn(&str) -> Result<f64> + Sync,
    ) -> Result<Vec<Round>> {
        self.check()?;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(self.threads.max(1))
            .build()
            .context("starting the math threads")?;
        let reference = self
            .pytorch
            .as_ref()
            .map(|py| |case: &str| python_reference(py, script, &reference_args(case)));
        run(
            cases,
            self.rounds,
            self.max_foreign_load,
            |case| pool.install(|| ours(case)),
            reference,
        )
    }

    /// Prints `report` as JSON with `--json`, else through `table`; then fails when a
    /// case had no quiet round.
    pub fn finish<T: Serialize>(
        &self,
        report: &T,
        table: impl FnOnce(&T),
        rounds: &[Round],
        cases: &[String],
    ) -> Result<()> {
        if self.json {
            println!("{}", serde_json::to_string_pretty(report)?);
        } else {
            table(report);
        }
        require_quiet(rounds, cases, self.max_foreign_load)
    }
}

/// A number of a summary as a table cell (`-` when absent).
pub fn cell(v: &serde_json::Value, key: &str, digits: usize) -> String {
    v[key]
        .as_f64()
        .map_or("-".to_string(), |x| format!("{x:.digits$}"))
}

/// One case of one round.
#[derive(Serialize, Clone)]
pub struct Round {
    /// The case timed.
    pub case: String,
    /// Our samples per second.
    pub elastrec: f64,
    /// The reference's JSON line (its `samples_per_s` and whatever else it reports).
    pub reference: Option<serde_json::Value>,
    /// CPU other processes used, as a share of the machine.
    pub foreign_load: Option<f64>,
    /// `false`: that share was above the limit; the round is not used.
    pub quiet: Option<bool>,
}

/// Runs `rounds` rounds over `cases`: `ours(case)` gives our samples/s, `reference(case)`
/// the reference's JSON line.
pub fn run(
    cases: &[String],
    rounds: usize,
    max_foreign_load: f64,
    mut ours: impl FnMut(&str) -> Result<f64>,
    mut reference: Option<impl FnMut(&str) -> Result<serde_json::Value>>,
) -> Result<Vec<Round>> {
    let mut out = Vec::with_capacity(rounds * cases.len());
    for round in 0..rounds {
        for case in cases {
            let probe = LoadProbe::start();
            let mine = ours(case)?;
            let theirs = match reference.as_mut() {
                Some(f) => Some(f(case)?),
                None => None,
            };
            let load = probe.and_then(|p| p.stop());
            let r = Round {
                case: case.clone(),
                elastrec: mine,
                reference: theirs,
                foreign_load: load.map(|l| l.foreign_share()),
                quiet: load.map(|l| l.is_quiet(max_foreign_load)),
            };
            let other = r.reference_value("samples_per_s");
            eprintln!(
                "round {}: {case}: elastrec {mine:.0} samples/s{}{}",
                round + 1,
                other.map_or(String::new(), |t| format!(
                    ", reference {t:.0} ({:.2}x)",
                    mine / t
                )),
                if r.quiet == Some(false) {
                    " (disturbed by other processes: not used)"
                } else {
                    ""
                }
            );
            out.push(r);
        }
    }
    Ok(out)
}

impl Round {
    /// A number the reference reported.
    pub fn reference_value(&self, key: &str) -> Option<f64> {
        self.reference.as_ref().and_then(|v| v[key].as_f64())
    }
}

/// The median of `f` over the quiet rounds of `case`.
pub fn median(rounds: &[Round], case: &str, f: impl Fn(&Round) -> Option<f64>) -> Option<f64> {
    let mut v: Vec<f64> = rounds
        .iter()
        .filter(|r| r.case == case && r.quiet != Some(false))
        .filter_map(f)
        .collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// The torch version the reference reported, if it ran.
pub fn torch_version(rounds: &[Round]) -> Option<String> {
    rounds
        .iter()
        .find_map(|r| r.reference.as_ref()?["torch"].as_str().map(String::from))
}

/// Disturbed rounds, of all.
pub fn disturbed(rounds: &[Round]) -> usize {
    rounds.iter().filter(|r| r.quiet == Some(false)).count()
}

/// Fails when some case has no quiet round, saying what to do.
pub fn require_quiet(rounds: &[Round], cases: &[String], max_foreign_load: f64) -> Result<()> {
    if let Some(case) = cases
        .iter()
        .find(|c| median(rounds, c, |r| Some(r.elastrec)).is_none())
    {
        bail!(
            "other processes used more than {:.1}% of the CPU in every round of {case}; its \
             numbers are not reported (null). Stop other work and run the bench again",
            100.0 * max_foreign_load
        );
    }
    Ok(())
}

/// `(flag, value)` pairs as command-line arguments.
pub fn flags<V: Into<std::ffi::OsString>>(
    pairs: impl IntoIterator<Item = (&'static str, V)>,
) -> Vec<std::ffi::OsString> {
    pairs
        .into_iter()
        .flat_map(|(k, v)| [k.into(), v.into()])
        .collect()
}

/// Runs `bench/<script>` with `python` and `args`; its last JSON line.
pub fn python_reference(
    python: &Path,
    script: &str,
    args: &[std::ffi::OsString],
) -> Result<serde_json::Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../bench")
        .join(script);
    let out = std::process::Command::new(python)
        .arg(&script)
        .args(args)
        .output()
        .with_context(|| format!("running {} {}", python.display(), script.display()))?;
    if !out.status.success() {
        bail!(
            "the PyTorch reference failed ({}); is torch installed in that interpreter? See \
             bench/README.md.\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .context("the PyTorch reference printed no JSON line")?;
    Ok(serde_json::from_str(line)?)
}
