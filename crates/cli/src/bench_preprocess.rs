//! `elastrec bench preprocess`: the Criteo-style graph of issue 15 over generated rows,
//! elastrec's fused plan and (with `--polars PYTHON`) the same graph in polars
//! (`bench/preprocess_polars.py`), side by side in one run.
//!
//! The graph: `I1..I13` through `fill_null(0) → clamp(0, 1e6) → log1p → bucketize` (20
//! borders), `C1..C26` through `sigrid_hash`, and 3 crosses `ngram(2) → sigrid_hash` over
//! column pairs. Both sides start from the rows in memory, read from the same Parquet file
//! before the clock starts, and produce every feature of every row.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use elastrec_common::quiet::{Load, LoadProbe};
use elastrec_data::{Batch, BatchReader, GenSpec, OutputFormat, RawColumns};
use elastrec_preprocess::{FeatureSpec, Input, Plan};
use serde::{Deserialize, Serialize};

/// Arguments of `elastrec bench preprocess`.
#[derive(clap::Args)]
pub struct BenchPreprocessArgs {
    /// Generated rows.
    #[arg(long, default_value_t = 1_000_000)]
    rows: u64,
    /// Threads for each side (elastrec's plan and polars' pool).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Timed rounds per side; the best and the median are reported.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// A Python with polars installed: runs the same graph in polars in the same run.
    #[arg(long)]
    polars: Option<PathBuf>,
    /// Where the generated Parquet file is written (default: a temporary directory).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Also measure the training step with and without preprocessing on the same
    /// cores (batches of `--batch-size`; the default model), per placement.
    #[arg(long)]
    train: bool,
    /// `--train`: rows per batch.
    #[arg(long, default_value_t = 2048)]
    batch_size: usize,
    /// `--train`: batches per round.
    #[arg(long, default_value_t = 60)]
    batches: usize,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// The graph, in the form both sides read.
#[derive(Serialize)]
struct GraphSpec {
    ints: Vec<String>,
    clamp: (f64, f64),
    borders: Vec<f64>,
    cats: Vec<String>,
    #[serde(rename = "mod")]
    modulus: u64,
    crosses: Vec<Vec<String>>,
    cross_mod: u64,
}

impl GraphSpec {
    fn criteo() -> Self {
        Self {
            ints: (1..=13).map(|i| format!("I{i}")).collect(),
            clamp: (0.0, 1e6),
            // ln(1 + x) from 0.5 to 10 in steps of 0.5: x from 0.65 to 22025.
            borders: (1..=20).map(|i| f64::from(i) * 0.5).collect(),
            cats: (1..=26).map(|j| format!("C{j}")).collect(),
            modulus: 1 << 20,
            crosses: [("C1", "C2"), ("C3", "C4"), ("C5", "C6")]
                .iter()
                .map(|(a, b)| vec![a.to_string(), b.to_string()])
                .collect(),
            cross_mod: 1 << 22,
        }
    }

    /// The graph's entries; with `bucketize_ints` false the integers stop at `log1p`
    /// and are dense inputs (the training measurement's model needs some).
    fn features(&self, bucketize_ints: bool) -> Vec<FeatureSpec> {
        let borders: Vec<String> = self.borders.iter().map(f64::to_string).collect();
        let ints = self.ints.iter().map(|c| {
            let mut ops = vec![
                "fill_null(0)".into(),
                format!("clamp({}, {})", self.clamp.0, self.clamp.1),
                "log1p".into(),
            ];
            if bucketize_ints {
                ops.push(format!("bucketize([{}])", borders.join(", ")));
            }
            FeatureSpec {
                name: None,
                input: Input::One(c.clone()),
                ops,
                rows: None,
            }
        });
        let cats = self.cats.iter().enumerate().map(|(i, c)| FeatureSpec {
            name: None,
            input: Input::One(c.clone()),
            ops: vec![format!("sigrid_hash(salt={i}, mod={})", self.modulus)],
            rows: None,
        });
        let crosses = self
            .crosses
            .iter()
            .enumerate()
            .map(|(i, cols)| FeatureSpec {
                name: None,
                input: Input::Many(cols.clone()),
                ops: vec![
                    "ngram(2)".into(),
                    format!("sigrid_hash(salt={}, mod={})", 1000 + i, self.cross_mod),
                ],
                rows: None,
            });
        ints.chain(cats).chain(crosses).collect()
    }
}

/// One side's timings.
#[derive(Serialize, Deserialize, Clone)]
struct Side {
    rows: u64,
    features: usize,
    threads: usize,
    best_s: f64,
    median_s: f64,
    #[serde(default)]
    rows_per_s_per_core: f64,
    #[serde(default)]
    foreign_load: Option<f64>,
}

impl Side {
    fn finish(mut self, load: Option<Load>) -> Self {
        self.rows_per_s_per_core = self.rows as f64 / self.best_s / self.threads as f64;
        self.foreign_load = load.map(|l| l.foreign_share());
        self
    }
}

#[derive(Serialize)]
struct Report {
    elastrec: Side,
    steps: Vec<(String, usize)>,
    polars: Option<Side>,
    polars_version: Option<String>,
    /// elastrec's rows/s over polars' (best rounds).
    ratio: Option<f64>,
    /// `--train`: the step with and without preprocessing.
    train: Option<train_overhead::Overhead>,
    /// `--train`: foreign load while it was measured.
    train_foreign_load: Option<f64>,
}

/// Runs the benchmark and prints its report.
pub fn run(a: BenchPreprocessArgs) -> Result<()> {
    ensure!(a.rows >= 1, "--rows must be at least 1");
    ensure!(
        a.threads >= 1 && a.rounds >= 1,
        "--threads and --rounds must be at least 1"
    );
    let temp;
    let dir = match &a.data_dir {
        Some(d) => d.clone(),
        None => {
            temp = tempfile::tempdir().context("creating a temporary directory")?;
            temp.path().to_path_buf()
        }
    };
    eprintln!("generating {} rows (Parquet) in {}", a.rows, dir.display());
    let file = generate(&dir, a.rows)?;
    let input = read_columns(&file)?;

    let graph = GraphSpec::criteo();
    let plan = Arc::new(Plan::compile(&graph.features(true))?);
    eprintln!(
        "elastrec: {} features, {} dense and {} sparse columns, {} fused steps, {} round(s) on {} thread(s)",
        plan.features().len(),
        plan.dense_width(),
        plan.sparse_width(),
        plan.steps().len(),
        a.rounds,
        a.threads
    );
    let mut out = Batch::default();
    plan.run_parallel(&input, &mut out, a.threads); // warm up: page in the output
    let probe = LoadProbe::start();
    let mut times = Vec::with_capacity(a.rounds);
    for _ in 0..a.rounds {
        let t0 = Instant::now();
        plan.run_parallel(&input, &mut out, a.threads);
        times.push(t0.elapsed().as_secs_f64());
    }
    let load = probe.and_then(|p| p.stop());
    ensure!(out.len() == input.len(), "the plan lost rows");
    let ours = Side {
        rows: input.len() as u64,
        features: plan.features().len(),
        threads: a.threads,
        best_s: times.iter().copied().fold(f64::INFINITY, f64::min),
        median_s: median(&mut times),
        rows_per_s_per_core: 0.0,
        foreign_load: None,
    }
    .finish(load);

    let (polars, version) = match &a.polars {
        Some(python) => {
            let (side, version) = run_polars(python, &file, &graph, &a)?;
            (Some(side), Some(version))
        }
        None => (None, None),
    };
    let (train, train_foreign_load) = if a.train {
        eprintln!(
            "training: {} batches of {} rows per round, {} round(s), 3 placements",
            a.batches, a.batch_size, a.rounds
        );
        let probe = LoadProbe::start();
        let o = train_overhead::measure(&input, a.batch_size, a.batches, a.rounds, a.threads)?;
        (
            Some(o),
            probe.and_then(|p| p.stop()).map(|l| l.foreign_share()),
        )
    } else {
        (None, None)
    };
    let report = Report {
        train,
        train_foreign_load,
        ratio: polars.as_ref().map(|p| p.best_s / ours.best_s),
        elastrec: ours,
        steps: plan
            .steps()
            .into_iter()
            .map(|(k, n)| (k.to_string(), n))
            .collect(),
        polars,
        polars_version: version,
    };
    print_report(&report, a.json)
}

fn generate(dir: &Path, rows: u64) -> Result<PathBuf> {
    let spec = GenSpec {
        format: OutputFormat::Parquet,
        ..GenSpec::new(dir, rows)
    };
    let report = elastrec_data::generate(&spec).context("generating the rows")?;
    Ok(dir.join(&report.files[0].name))
}

fn read_columns(file: &Path) -> Result<RawColumns> {
    let mut reader = elastrec_data::open_reader(file, elastrec_data::BadRowPolicy::Fail)?;
    let mut all = RawColumns::default();
    reader.next_raw(&mut all, usize::MAX)?;
    Ok(all)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn run_polars(
    python: &Path,
    file: &Path,
    graph: &GraphSpec,
    a: &BenchPreprocessArgs,
) -> Result<(Side, String)> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/preprocess_polars.py");
    eprintln!("polars: {} round(s) on {} thread(s)", a.rounds, a.threads);
    let probe = LoadProbe::start();
    let output = Command::new(python)
        .arg(&script)
        .arg("--parquet")
        .arg(file)
        .arg("--spec")
        .arg(serde_json::to_string(graph)?)
        .arg("--threads")
        .arg(a.threads.to_string())
        .arg("--rounds")
        .arg(a.rounds.to_string())
        .output()
        .with_context(|| format!("running {} {}", python.display(), script.display()))?;
    // The child has been waited for, so its CPU time counts as ours, not as foreign.
    let load = probe.and_then(|p| p.stop());
    if !output.status.success() {
        bail!(
            "{} {} failed ({}): {}\n(install polars into that Python: `{} -m pip install polars`)",
            python.display(),
            script.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim(),
            python.display()
        );
    }
    let line = String::from_utf8_lossy(&output.stdout);
    let v: serde_json::Value = serde_json::from_str(line.trim())
        .with_context(|| format!("reading the polars script's output: {line}"))?;
    let version = v["polars"].as_str().unwrap_or("?").to_string();
    let side: Side = serde_json::from_value(v)?;
    Ok((side.finish(load), version))
}

fn print_report(r: &Report, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(r)?);
        return Ok(());
    }
    let load = |l: Option<f64>| l.map_or("n/a".to_string(), |s| format!("{:.1}%", s * 100.0));
    println!(
        "preprocessing {} rows, {} features ({} int chains of 4 ops, {} hashed, {} crosses)",
        r.elastrec.rows, r.elastrec.features, 13, 26, 3
    );
    println!(
        "{:<10} {:>8} {:>10} {:>10} {:>16} {:>13}",
        "", "threads", "best s", "median s", "rows/s per core", "foreign load"
    );
    let row = |name: &str, s: &Side| {
        println!(
            "{:<10} {:>8} {:>10.4} {:>10.4} {:>16.0} {:>13}",
            name,
            s.threads,
            s.best_s,
            s.median_s,
            s.rows_per_s_per_core,
            load(s.foreign_load)
        )
    };
    row("elastrec", &r.elastrec);
    if let Some(p) = &r.polars {
        row("polars", p);
    }
    if let (Some(ratio), Some(v)) = (r.ratio, &r.polars_version) {
        println!("elastrec / polars {v}: {ratio:.2}x rows/s (best rounds)");
    }
    let steps: Vec<String> = r.steps.iter().map(|(k, n)| format!("{k}×{n}")).collect();
    println!("fused steps: {}", steps.join(", "));
    if let Some(t) = &r.train {
        println!(
            "\ntraining step, {} rows per batch, {} thread(s) (median of rounds; foreign load {}):",
            t.batch_size,
            t.threads,
            load(r.train_foreign_load)
        );
        println!(
            "  {:<44} {:>9.2} ms",
            "batches preprocessed in advance",
            t.step_s * 1e3
        );
        println!(
            "  {:<44} {:>9.2} ms  {:>+6.1}%",
            "plan on the reader thread (overlapped)",
            t.reader_thread_s * 1e3,
            t.reader_thread_overhead * 100.0
        );
        println!(
            "  {:<44} {:>9.2} ms  {:>+6.1}%",
            "plan between steps, on the training threads",
            t.between_steps_s * 1e3,
            t.between_steps_overhead * 100.0
        );
        println!(
            "  {:<44} {:>9.2} ms",
            "one batch through the plan, 1 thread",
            t.plan_s * 1e3
        );
        let costs: Vec<String> = t
            .costs
            .iter()
            .map(|(k, s)| format!("{k} {:.3}", s * 1e3))
            .collect();
        println!("  cost model, ms per batch: {}", costs.join(", "));
    }
    Ok(())
}

/// `--train`: the training step with and without preprocessing on the same cores.
mod train_overhead {
    use std::sync::mpsc::sync_channel;
    use std::sync::Arc;
    use std::time::Instant;

    use anyhow::Result;
    use elastrec_data::{Batch, RawColumns};
    use elastrec_job::config::JobConfig;
    use elastrec_preprocess::{FeatureSpec, Plan};
    use elastrec_worker::{Dlrm, TrainStep};

    use super::median;
    use serde::Serialize;

    /// Seconds per training step, median of the rounds, per placement.
    #[derive(Serialize)]
    pub struct Overhead {
        pub batch_size: usize,
        pub batches: usize,
        pub threads: usize,
        /// Batches preprocessed in advance: the training step alone.
        pub step_s: f64,
        /// The plan on the reader thread, overlapping the step (what `train` does).
        pub reader_thread_s: f64,
        /// The plan between steps, on the training threads (no overlap).
        pub between_steps_s: f64,
        /// One batch through the plan on one thread.
        pub plan_s: f64,
        pub reader_thread_overhead: f64,
        pub between_steps_overhead: f64,
        /// The cost model: seconds per batch of each part of the plan (one thread).
        pub costs: Vec<(String, f64)>,
    }

    /// The training graph: the benchmark's, with the integers as dense inputs
    /// (`fill_null → clamp → log1p`, as a DLRM needs some) and every hash reduced to
    /// 100,000 ids, so that the model's tables stay a few hundred MB.
    pub fn graph() -> Vec<FeatureSpec> {
        super::GraphSpec {
            modulus: 100_000,
            cross_mod: 100_000,
            ..super::GraphSpec::criteo()
        }
        .features(false)
    }

    fn slice(input: &RawColumns, rows: std::ops::Range<usize>) -> RawColumns {
        let x = input.tasks - 1;
        RawColumns {
            labels: input.labels[rows.clone()].to_vec(),
            tasks: input.tasks,
            task_labels: input.task_labels[rows.start * x..rows.end * x].to_vec(),
            ints: input
                .ints
                .iter()
                .map(|c| c[rows.clone()].to_vec())
                .collect(),
            cats: input
                .cats
                .iter()
                .map(|c| c[rows.clone()].to_vec())
                .collect(),
        }
    }

    pub fn measure(
        input: &RawColumns,
        batch_size: usize,
        batches: usize,
        rounds: usize,
        threads: usize,
    ) -> Result<Overhead> {
        let job = JobConfig {
            preprocess: graph(),
            ..JobConfig::default()
        };
        let plan = Arc::new(Plan::compile(&job.preprocess)?);
        let batches = batches.min(input.len() / batch_size).max(1);
        let raws: Vec<RawColumns> = (0..batches)
            .map(|b| {
                slice(
                    input,
                    b * batch_size..((b + 1) * batch_size).min(input.len()),
                )
            })
            .collect();
        let ready: Vec<Batch> = raws
            .iter()
            .map(|r| {
                let mut b = Batch::default();
                plan.run(r, &mut b, &mut plan.scratch());
                b
            })
            .collect();
        let model = Dlrm::new(&job, elastrec_job::prepare::resolve_table_rows(&job))?;
        let mut step = TrainStep::new(model, &job.optimizer.dense, batch_size);
        for b in ready.iter().take(3) {
            step.train_batch(b)?; // warm up: touch the tables' pages
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()?;
        let (mut alone, mut reader, mut between) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            // The three placements alternate, so a drift of the machine hits them alike.
            let t = Instant::now();
            pool.install(|| {
                ready
                    .iter()
                    .try_for_each(|b| step.train_batch(b).map(|_| ()))
            })?;
            alone.push(t.elapsed().as_secs_f64() / batches as f64);

            let t = Instant::now();
            std::thread::scope(|scope| -> Result<()> {
                let (tx, rx) = sync_channel::<Batch>(2);
                let plan = plan.clone();
                let raws = &raws;
                scope.spawn(move || {
                    let mut scratch = plan.scratch();
                    for r in raws {
                        let mut b = Batch::default();
                        plan.run(r, &mut b, &mut scratch);
                        if tx.send(b).is_err() {
                            return;
                        }
                    }
                });
                let step = &mut step;
                pool.install(move || rx.iter().try_for_each(|b| step.train_batch(&b).map(|_| ())))?;
                Ok(())
            })?;
            reader.push(t.elapsed().as_secs_f64() / batches as f64);

            let t = Instant::now();
            let mut b = Batch::default();
            for r in &raws {
                plan.run_parallel(r, &mut b, threads);
                pool.install(|| step.train_batch(&b))?;
            }
            between.push(t.elapsed().as_secs_f64() / batches as f64);
        }
        let t = Instant::now();
        let mut b = Batch::default();
        let mut scratch = plan.scratch();
        for r in &raws {
            plan.run(r, &mut b, &mut scratch);
        }
        let plan_s = t.elapsed().as_secs_f64() / batches as f64;
        let whole = slice(input, 0..batches * batch_size.min(input.len()));
        let costs = plan
            .profile(&whole)
            .into_iter()
            .map(|(k, s)| (k, s / batches as f64))
            .collect();
        let (step_s, reader_thread_s, between_steps_s) = (
            median(&mut alone),
            median(&mut reader),
            median(&mut between),
        );
        Ok(Overhead {
            batch_size,
            batches,
            threads,
            step_s,
            reader_thread_s,
            between_steps_s,
            plan_s,
            reader_thread_overhead: reader_thread_s / step_s - 1.0,
            between_steps_overhead: between_steps_s / step_s - 1.0,
            costs,
        })
    }
}
