//! Subcommand bodies: build a configuration, call one library function, print the result.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use elastrec_common::machine;
use elastrec_common::quiet::{Load, LoadProbe};
use elastrec_data::{GenSpec, OutputFormat};
use elastrec_job::config::JobConfig;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Sizes the global rayon pool (0: all cores).
fn init_threads(threads: usize) -> Result<()> {
    if threads > 0 {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build_global()
            .context("could not size the thread pool")?;
    }
    Ok(())
}

pub fn train(config: &Path, print_config: bool) -> Result<()> {
    let mut job = JobConfig::load(config)?;
    if print_config {
        // A job naming only its label shows the features it would train with.
        if let Some(inferred) = elastrec_job::prepare::resolve_schema(&mut job)
            .with_context(|| format!("inferring the features of {}", config.display()))?
        {
            println!(
                "# data.feature and data.table inferred from {} rows of the first training \
                 file; edit and keep them in the job file to fix them",
                inferred.sampled_rows
            );
            for (column, why) in &inferred.skipped {
                println!("# column {column:?} left out: {why}");
            }
        }
        // The batch size a small training set gets is printed, so the printed job trains
        // as this one would (the dense statistics are computed again from the data).
        match elastrec_job::prepare::fill_batch_size(&mut job) {
            Ok(Some(batch)) => {
                println!("# train.batch_size {batch}: chosen for this small training set")
            }
            Ok(None) => {}
            // The configuration is printed without the data: the batch size stays.
            Err(e) => println!("# train.batch_size not chosen from the data: {e}"),
        }
        print!("{}", toml::to_string_pretty(&job)?);
        return Ok(());
    }
    // Following needs a master that outlives one pass over what is ready.
    anyhow::ensure!(
        !job.data.follow,
        "{}: data.follow: a following job runs under a master; start it with `elastrec run {}`, \
         or set data.follow = false to train once on what is ready",
        config.display(),
        config.display()
    );
    init_threads(job.train.threads)?;
    let s =
        elastrec_worker::train(&job).with_context(|| format!("training {}", config.display()))?;
    println!("training finished");
    println!("  samples           {:>12}", s.samples);
    println!(
        "  epochs / steps    {:>12}",
        format!("{} / {}", s.epochs, s.steps)
    );
    println!("  samples/s         {:>12.0}", s.samples_per_s);
    println!("  train loss        {:>12.4}", s.train_loss);
    if let Some(e) = s.eval {
        println!("  eval AUC          {:>12.4}", e.auc);
        if let Some(g) = e.gauc {
            println!("  eval GAUC         {g:>12.4}  (AUC within each user's rows, averaged)");
        }
        println!("  eval logloss      {:>12.4}", e.logloss);
        if let Some(ne) = e.ne {
            println!("  eval NE           {ne:>12.4}  (log loss over the click rate's entropy)");
        }
        if let Some(c) = e.calibration {
            println!("  eval calibration  {c:>12.3}  (predicted over actual clicks)");
        }
        println!("  eval samples      {:>12}", e.samples);
    }
    if let Some(t) = s.teacher_auc {
        println!("  teacher AUC       {:>12.4}  (the data's ceiling)", t);
        if let Some(e) = s.eval {
            let lift = (e.auc - 0.5) / (t - 0.5);
            println!("  share of lift     {:>11.1}%", 100.0 * lift);
        }
    }
    println!(
        "  embedding memory  {:>8.1} MiB",
        s.embedding_bytes as f64 / (1 << 20) as f64
    );
    if let Some(d) = s.dynamic_embeddings {
        println!(
            "  dynamic rows      {:>12}  of {} slots; {} admitted, {} evicted, {} expired, {} updates filtered",
            d.stored_rows, d.slots, d.stats.admitted, d.stats.evicted, d.stats.expired, d.stats.filtered
        );
    }
    println!("  wall time         {:>11.1}s", s.wall_s);
    println!("  threads           {:>12}", s.threads);
    if s.rows_skipped > 0 {
        println!("  bad rows skipped  {:>12}", s.rows_skipped);
        for e in &s.skipped_examples {
            println!("    {e}");
        }
    }
    println!(
        "  results           {}",
        job.output.dir.join("summary.json").display()
    );
    if let Some(p) = &s.model_path {
        println!("  model             {}", p.display());
    }
    Ok(())
}

pub struct GenData {
    pub out: PathBuf,
    pub rows: u64,
    /// `tsv`, `parquet` or (named only) `csv`.
    pub format: &'static str,
    pub seed: u64,
    pub days: u32,
    pub drift: f64,
    /// A second label per row (a conversion after the click).
    pub conversions: bool,
    pub scale: f64,
    pub hourly_from: Option<String>,
    /// A click log with named columns and lists instead of Criteo's layout.
    pub named: bool,
}

pub fn gen_data(a: GenData) -> Result<()> {
    if a.rows == 0 {
        bail!("--rows must be at least 1");
    }
    if a.named {
        return gen_named(&a);
    }
    let first_day = a
        .hourly_from
        .as_deref()
        .map(|d| {
            elastrec_orchestrate::parse_time(d).map_err(|e| anyhow::anyhow!("--hourly-from: {e}"))
        })
        .transpose()?;
    let spec = GenSpec {
        out: a.out.clone(),
        rows: a.rows,
        format: if a.format == "parquet" {
            OutputFormat::Parquet
        } else {
            OutputFormat::Tsv
        },
        seed: a.seed,
        days: a.days,
        scale: a.scale,
        drift: a.drift,
        conversions: a.conversions,
    };
    let pb = ProgressBar::with_draw_target(Some(a.rows), ProgressDrawTarget::stderr());
    pb.set_style(ProgressStyle::with_template(
        "generating [{elapsed_precise}] {wide_bar} {pos}/{len} ({per_sec}, eta {eta})",
    )?);
    let r = elastrec_data::generate_with_progress(&spec, &|done| pb.set_position(done))?;
    pb.finish_and_clear();
    println!(
        "wrote {} rows to {} in {:.1}s ({:.0} rows/s)",
        r.rows,
        a.out.display(),
        r.generation_secs,
        r.rows_per_sec
    );
    for f in &r.files {
        println!("  {:<20} {:>10} rows {:>12} bytes", f.name, f.rows, f.bytes);
    }
    println!(
        "click rate {:.4}, teacher AUC {:.4} (the ceiling a model can approach)",
        r.click_rate, r.teacher_auc
    );
    if r.drift > 0.0 {
        println!(
            "click behaviour drifts {} of a quarter turn per day: day {}'s click model has nothing of day 0's",
            r.drift,
            (1.0 / r.drift).ceil()
        );
    }
    if let Some(first) = first_day {
        let days: Vec<_> = r
            .files
            .iter()
            .enumerate()
            .map(|(d, f)| elastrec_data::gen::partition::DaySplit {
                file: a.out.join(&f.name),
                rows: f.rows,
                date: (first + chrono::Duration::days(d as i64))
                    .format("%Y%m%d")
                    .to_string(),
            })
            .collect();
        let dirs = elastrec_data::gen::partition::split_hourly(&a.out, &days)?;
        println!(
            "split into {} hourly partitions {} ... {} (each with a _SUCCESS marker)",
            dirs.len(),
            dirs.first()
                .map(|d| d.display().to_string())
                .unwrap_or_default(),
            dirs.last()
                .map(|d| d.display().to_string())
                .unwrap_or_default()
        );
    }
    println!("report: {}", a.out.join("report.json").display());
    Ok(())
}

/// `gen-data --named`: the click log of `elastrec_data::gen::named`.
fn gen_named(a: &GenData) -> Result<()> {
    let r = elastrec_data::gen::named::generate_named(&elastrec_data::gen::named::NamedSpec {
        out: a.out.clone(),
        rows: a.rows,
        days: a.days,
        seed: a.seed,
        csv: a.format == "csv",
    })?;
    println!(
        "wrote {} rows with named columns to {} ({} files)",
        r.rows,
        a.out.display(),
        r.files.len()
    );
    for f in &r.files {
        println!("  {}", f.display());
    }
    println!(
        "click rate {:.4}, teacher AUC {:.4} (the ceiling a model can approach)",
        r.click_rate, r.teacher_auc
    );
    let text = serde_json::to_string_pretty(&r)?;
    let report = a.out.join("named-report.json");
    std::fs::write(&report, text).with_context(|| format!("writing {}", report.display()))?;
    println!("report: {}", report.display());
    Ok(())
}

/// Expands directories into their `day_*` data files, in name order.
pub(crate) fn data_files(inputs: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for p in inputs {
        if p.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("reading directory {}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| {
                    f.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("day_") && !n.ends_with(".idx"))
                })
                .collect();
            found.sort();
            if found.is_empty() {
                bail!("{}: no day_* data files in this directory", p.display());
            }
            files.extend(found);
        } else if p.exists() {
            files.push(p.clone());
        } else {
            bail!("{}: no such file or directory", p.display());
        }
    }
    Ok(files)
}

/// `--on-bad-row`'s value.
pub fn bad_row_policy(value: &str) -> Result<elastrec_data::BadRowPolicy> {
    value
        .parse()
        .map_err(|e| anyhow::anyhow!("--on-bad-row {e}"))
}

pub fn eval(
    model: &Path,
    data: &[PathBuf],
    on_bad_row: &str,
    json: bool,
    predictions: Option<&Path>,
    onnx_inputs: Option<&Path>,
) -> Result<()> {
    let policy = bad_row_policy(on_bad_row)?;
    let (dlrm, mut job) = elastrec_worker::model_file::load(model)?;
    job.data.on_bad_row = policy;
    let files = data_files(data)?;
    let mut stats = elastrec_data::ReadStats::default();
    let batches = elastrec_worker::trainer::load_eval_set(&files, &job, &mut stats)?;
    let mut predictor = elastrec_worker::Predictor::new(&dlrm, job.train.batch_size);
    let mut out = predictions
        .map(|p| PredictionsFile::create(p, dlrm.dense.tasks(), job.data.user_slot()))
        .transpose()?;
    let tasks = elastrec_worker::trainer::evaluate_tasks_each(
        &dlrm,
        &batches,
        &mut predictor,
        job.data.user_slot(),
        |b, probs| out.as_mut().map_or(Ok(()), |o| o.write(b, probs)),
    )?;
    if let Some(o) = out {
        o.finish()?;
    }
    if let Some(path) = onnx_inputs {
        let sig = elastrec_export::Signature::of_job(&dlrm, &job)?;
        let mut inputs = elastrec_export::Inputs::new(sig);
        for b in &batches {
            inputs.push(b)?;
        }
        inputs.write(path)?;
        eprintln!(
            "the ONNX inputs of {} rows in {}",
            inputs.rows(),
            path.display()
        );
    }
    let r = tasks[0];
    if json {
        let mut v = serde_json::to_value(r)?;
        v["rows_skipped"] = stats.rows_skipped.into();
        v["files"] = serde_json::to_value(&files)?;
        if tasks.len() > 1 {
            v["tasks"] = serde_json::to_value(&tasks)?;
        }
        println!("{v}");
    } else {
        println!("model        {}", model.display());
        println!("files        {}", files.len());
        println!("samples      {}", r.samples);
        println!("AUC          {:.4}", r.auc);
        if let Some(g) = r.gauc {
            println!("GAUC         {g:.4}  (AUC within each user's rows, averaged)");
        }
        println!("logloss      {:.4}", r.logloss);
        if let Some(ne) = r.ne {
            println!("NE           {ne:.4}  (log loss over the click rate's entropy)");
        }
        if let Some(c) = r.calibration {
            println!("calibration  {c:.3}  (predicted over actual clicks)");
        }
        for (t, e) in tasks.iter().enumerate().skip(1) {
            println!("task {t}       {e}");
        }
        if stats.rows_skipped > 0 {
            println!("{stats}");
        }
    }
    if let Some(p) = predictions {
        eprintln!("predictions of {} rows in {}", r.samples, p.display());
    }
    Ok(())
}

/// `elastrec eval --predictions`: a CSV of `label,weight,prediction` (then
/// `label_1,prediction_1`, ... for a multi-task model's other tasks, and `user`, the
/// user column's id, when the job names one), one line per row.
struct PredictionsFile {
    path: PathBuf,
    out: std::io::BufWriter<std::fs::File>,
    tasks: usize,
    user: Option<usize>,
}

impl PredictionsFile {
    fn create(path: &Path, tasks: usize, user: Option<usize>) -> Result<Self> {
        let file = std::fs::File::create(path)
            .with_context(|| format!("creating {} (--predictions)", path.display()))?;
        let mut out = std::io::BufWriter::new(file);
        let mut header = "label,weight,prediction".to_string();
        for t in 1..tasks {
            header += &format!(",label_{t},prediction_{t}");
        }
        if user.is_some() {
            header += ",user";
        }
        writeln!(out, "{header}").with_context(|| format!("writing {}", path.display()))?;
        Ok(Self {
            path: path.to_path_buf(),
            out,
            tasks,
            user,
        })
    }

    fn write(
        &mut self,
        b: &elastrec_data::Batch,
        probs: &[f32],
    ) -> elastrec_worker::error::Result<()> {
        let t = self.tasks;
        let lines = (0..b.len()).try_for_each(|i| {
            let w = b.weights.get(i).copied().unwrap_or(1.0);
            write!(self.out, "{},{w},{}", b.labels[i], probs[i * t])?;
            for k in 1..t {
                let y = b.task_labels[i * (t - 1) + k - 1];
                write!(self.out, ",{y},{}", probs[i * t + k])?;
            }
            if let Some(u) = self.user {
                write!(self.out, ",{}", b.sparse[i * b.sparse_width + u])?;
            }
            writeln!(self.out)
        });
        lines.map_err(|e| elastrec_worker::error::WorkerError::io(&self.path, e))
    }

    fn finish(mut self) -> Result<()> {
        self.out
            .flush()
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

pub struct Bench {
    pub steps: usize,
    pub batch_size: usize,
    pub threads: usize,
    pub cpus: Option<String>,
    pub max_table_rows: u64,
    pub data_dir: PathBuf,
    pub pytorch: Option<PathBuf>,
    pub rounds: usize,
    pub max_foreign_load: f64,
    pub max_repeats: usize,
    pub json: bool,
}

/// A round's load as the bench reports it: the foreign share, and whether it was quiet
/// (`None`: not measurable here, e.g. without `/proc`).
fn judge(load: Option<Load>, max_share: f64) -> (serde_json::Value, Option<bool>) {
    match load {
        Some(l) => (
            serde_json::json!(l.foreign_share()),
            Some(l.is_quiet(max_share)),
        ),
        None => (serde_json::Value::Null, None),
    }
}

/// Runs `bench/pytorch_dlrm.py` on the same file, model, batch size and thread count.
fn pytorch_reference(
    python: &Path,
    mode: &str,
    opts: &elastrec_worker::bench::BenchOptions,
    threads: usize,
) -> Result<serde_json::Value> {
    let data = elastrec_worker::bench::first_file(opts);
    let args = [
        ("--mode", mode.to_string()),
        ("--threads", threads.to_string()),
        ("--batch", opts.batch_size.to_string()),
        ("--max-rows", opts.max_table_rows.to_string()),
        ("--steps", opts.steps.to_string()),
        ("--warmup", opts.warmup.to_string()),
    ];
    let mut args = crate::bench_rounds::flags(args);
    args.extend(["--data".into(), data.into_os_string()]);
    crate::bench_rounds::python_reference(python, "pytorch_dlrm.py", &args)
}

/// The CPUs `elastrec bench` confines itself (and so the PyTorch reference) to:
/// `--cpus`, else the first `threads` CPUs it may use; `None`: every allowed CPU.
fn bench_cpus(cpus: Option<&str>, threads: usize) -> Result<Option<Vec<usize>>> {
    let allowed = machine::allowed_cpus();
    match cpus.map(str::trim) {
        Some("all") => Ok(None),
        Some(list) => {
            let cpus = machine::parse_cpu_list(list).map_err(|e| anyhow::anyhow!("--cpus: {e}"))?;
            if let Some(c) = cpus.iter().find(|c| !allowed.contains(c)) {
                bail!(
                    "--cpus: CPU {c} is not one this process may run on ({}); pick from those",
                    machine::format_cpu_list(&allowed)
                );
            }
            Ok(Some(cpus))
        }
        None if threads > 0 && threads <= allowed.len() => Ok(Some(allowed[..threads].to_vec())),
        None => Ok(None),
    }
}

pub fn bench(a: Bench) -> Result<()> {
    // Pinned before any thread pool starts: threads and child processes inherit it.
    let pinned = bench_cpus(a.cpus.as_deref(), a.threads)?;
    if let Some(cpus) = &pinned {
        machine::pin_to(cpus).with_context(|| {
            format!(
                "confining the bench to CPUs {}",
                machine::format_cpu_list(cpus)
            )
        })?;
    }
    let threads = match (&pinned, a.threads) {
        (Some(cpus), 0) => cpus.len(),
        (_, t) => t,
    };
    init_threads(threads)?;
    let cpu = machine::CpuInfo::of_this_machine();
    let cpus = machine::format_cpu_list(&machine::allowed_cpus());
    if let Some(c) = &cpu {
        eprintln!(
            "CPU: {} ({} logical CPUs; {}; GEMM kernels: {}); running on CPUs {cpus}",
            c.model,
            c.logical_cpus,
            c.simd.join(" "),
            c.gemm_kernels
        );
    }
    let opts = elastrec_worker::bench::BenchOptions {
        steps: a.steps,
        batch_size: a.batch_size,
        max_table_rows: a.max_table_rows,
        data_dir: a.data_dir,
        ..Default::default()
    };
    eprintln!(
        "benchmarking the Criteo-Kaggle DLRM: batch {}, {} timed steps, {} threads",
        opts.batch_size,
        opts.steps,
        rayon::current_num_threads()
    );
    let data = elastrec_worker::bench::prepare(&opts)?;
    let probe = LoadProbe::start();
    let r = elastrec_worker::bench::run(&opts, &data)?;
    let first_load = probe.and_then(|p| p.stop());
    let mut out = serde_json::to_value(&r)?;
    out["machine"] = serde_json::json!({ "cpu": cpu, "cpus": cpus });
    let mut disturbed = None;
    if let Some(py) = &a.pytorch {
        let sps = |v: &serde_json::Value| v["samples_per_s"].as_f64().unwrap_or(f64::NAN);
        // The machine's speed drifts (other tenants, clocks): each round times elastrec
        // and PyTorch back to back and the ratio is taken within the round. A round that
        // other processes disturbed is repeated, and its ratio is not used.
        let rounds = a.rounds.max(1);
        let mut per_round = Vec::with_capacity(rounds);
        let mut full = serde_json::Value::Null;
        let (mut quiet, mut repeats) = (0, 0);
        while quiet < rounds {
            let round = per_round.len();
            eprintln!(
                "round {}: elastrec, then the PyTorch reference ({})",
                round + 1,
                py.display()
            );
            let probe = LoadProbe::start();
            let ours = elastrec_worker::bench::in_memory_samples_per_s(&opts, &data)?;
            full = pytorch_reference(py, "full", &opts, r.threads)?;
            let (foreign, ok) = judge(probe.and_then(|p| p.stop()), a.max_foreign_load);
            per_round.push(serde_json::json!({
                "elastrec": ours, "pytorch": sps(&full), "ratio": ours / sps(&full),
                "foreign_load": foreign, "quiet": ok,
            }));
            if ok == Some(false) {
                eprintln!(
                    "round {}: other processes used {:.1}% of the CPU (limit {:.1}%): disturbed",
                    round + 1,
                    100.0 * foreign.as_f64().unwrap_or(0.0),
                    100.0 * a.max_foreign_load
                );
                repeats += 1;
                if repeats > a.max_repeats {
                    break;
                }
                continue;
            }
            quiet += 1;
        }
        let mut ratios: Vec<f64> = per_round
            .iter()
            .filter(|v| v["quiet"] != false)
            .filter_map(|v| v["ratio"].as_f64())
            .collect();
        ratios.sort_by(f64::total_cmp);
        let probe = LoadProbe::start();
        let dense = pytorch_reference(py, "dense", &opts, r.threads)?;
        let (dense_foreign, dense_ok) = judge(probe.and_then(|p| p.stop()), a.max_foreign_load);
        let (first_foreign, first_ok) = judge(first_load, a.max_foreign_load);
        let dense_quiet = dense_ok != Some(false) && first_ok != Some(false);
        // The reference says what it ran with; it inherited this process's CPUs.
        if let Some(theirs) = full["cpus"].as_str().filter(|c| *c != cpus) {
            eprintln!(
                "warning: the PyTorch reference ran on CPUs {theirs}, elastrec on {cpus}: the \
                 ratio compares different cores"
            );
        }
        out["pytorch_full"] = full;
        out["pytorch_dense"] = dense.clone();
        out["full_step_rounds"] = per_round.into();
        out["max_foreign_load"] = a.max_foreign_load.into();
        out["ratio_full_vs_pytorch"] = ratios.get(ratios.len() / 2).copied().into();
        out["dense_foreign_load"] = serde_json::json!([first_foreign, dense_foreign]);
        out["ratio_dense_vs_pytorch"] = dense_quiet
            .then(|| r.dense_samples_per_s / sps(&dense))
            .into();
        if ratios.is_empty() || !dense_quiet {
            disturbed = Some(format!(
                "other processes used more than {:.1}% of the CPU during {}; \
                 that ratio is not reported (null). Stop other work and run the bench again",
                100.0 * a.max_foreign_load,
                if ratios.is_empty() {
                    format!("every full-step round ({} tried)", repeats)
                } else {
                    "the dense-part measurement".to_string()
                }
            ));
        }
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_bench_table(&r, &out, a.pytorch.is_some());
    }
    match disturbed {
        Some(why) => bail!("{why}"),
        None => Ok(()),
    }
}

/// `elastrec bench`'s report as a Markdown table (`out`: the JSON report, for the PyTorch
/// rounds and ratios).
fn print_bench_table(
    r: &elastrec_worker::bench::BenchReport,
    out: &serde_json::Value,
    pytorch: bool,
) {
    println!("| measurement | value |");
    println!("|---|---|");
    let m = &out["machine"];
    if let Some(cpu) = m["cpu"].as_object() {
        let s = |k: &str| {
            cpu.get(k)
                .and_then(|v| v.as_str())
                .unwrap_or("-")
                .to_string()
        };
        let simd: Vec<&str> = cpu
            .get("simd")
            .and_then(|v| v.as_array())
            .map(|a| a.iter().filter_map(|f| f.as_str()).collect())
            .unwrap_or_default();
        println!("| CPU | {} |", s("model"));
        println!("| vector extensions | {} |", simd.join(" "));
        println!("| elastrec GEMM kernels | {} |", s("gemm_kernels"));
    }
    println!(
        "| CPUs (affinity of both sides) | {} |",
        m["cpus"].as_str().unwrap_or("-")
    );
    println!("| threads | {} |", r.threads);
    println!(
        "| training samples/s, in memory | {:.0} |",
        r.in_memory_samples_per_s
    );
    println!(
        "| training samples/s, from TSV files | {:.0} |",
        r.from_files_samples_per_s
    );
    println!("| dense part samples/s | {:.0} |", r.dense_samples_per_s);
    println!(
        "| dense part GFLOP/s (of measured SGEMM peak {:.1}) | {:.1} ({:.0}%) |",
        r.gemm_peak_gflops,
        r.dense_gflops,
        100.0 * r.dense_fraction_of_peak
    );
    println!(
        "| embedding store bytes / raw row+state bytes | {} / {} (+{:.2}%) |",
        r.embedding_bytes,
        r.embedding_raw_bytes,
        100.0 * r.embedding_overhead
    );
    if let Some(rss) = r.peak_rss_bytes {
        println!(
            "| peak resident memory | {:.0} MiB |",
            rss as f64 / (1 << 20) as f64
        );
    }
    if pytorch {
        let f = |k: &str| out[k]["samples_per_s"].as_f64().unwrap_or(f64::NAN);
        let rounds = out["full_step_rounds"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for (i, rd) in rounds.iter().enumerate() {
            let g = |k: &str| rd[k].as_f64().unwrap_or(f64::NAN);
            let load = match rd["quiet"].as_bool() {
                Some(true) => format!("quiet, {:.1}% foreign CPU", 100.0 * g("foreign_load")),
                Some(false) => format!(
                    "**disturbed**, {:.1}% foreign CPU, not used",
                    100.0 * g("foreign_load")
                ),
                None => "load not measurable".to_string(),
            };
            println!(
                "| round {}: full step samples/s, elastrec / PyTorch | {:.0} / {:.0} = {:.2}x ({load}) |",
                i + 1,
                g("elastrec"),
                g("pytorch"),
                g("ratio")
            );
        }
        let t = &out["pytorch_full"];
        let field = |k: &str| match &t[k] {
            serde_json::Value::Null => "-".to_string(),
            serde_json::Value::String(v) => v.clone(),
            v => v.to_string(),
        };
        println!(
            "| PyTorch | {} (CPU capability {}, BLAS {}, oneDNN {}), {} threads on CPUs {} |",
            field("torch"),
            field("cpu_capability"),
            field("blas"),
            field("onednn"),
            field("threads_used"),
            field("cpus")
        );
        let quiet_rounds = rounds.iter().filter(|r| r["quiet"] != false).count();
        println!(
            "| PyTorch dense part samples/s | {:.0} |",
            f("pytorch_dense")
        );
        let ratio = |k: &str| match out[k].as_f64() {
            Some(v) => format!("{v:.2}x"),
            None => "not reported (disturbed)".to_string(),
        };
        println!(
            "| **elastrec / PyTorch, full step (median of {quiet_rounds} quiet rounds)** | **{}** |",
            ratio("ratio_full_vs_pytorch")
        );
        println!(
            "| elastrec / PyTorch, dense part | {} |",
            ratio("ratio_dense_vs_pytorch")
        );
    }
}

pub fn brain_plan(job: &Path, json: bool) -> Result<()> {
    let plan = plan_of(job).with_context(|| format!("planning {}", job.display()))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&plan)?);
    } else {
        print!("{}", plan.render_table());
    }
    Ok(())
}

/// The brain's plan for `path`: a brain job description (a file with a `[job]` table,
/// `docs/brain.md`), or a job file `elastrec run` runs, planned as its master plans it at
/// start when the brain knows no similar job. Such a job's data is generated or listed
/// and its features inferred first, as `run` does: its tables and samples come from them.
fn plan_of(path: &Path) -> Result<elastrec_brain::Plan> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let table: toml::Table = toml::from_str(&text).context("not a TOML file")?;
    if table.contains_key("job") {
        return Ok(elastrec_brain::plan_for_job_file(path)?);
    }
    let mut cfg = elastrec_master::run::validate_job(path)?;
    anyhow::ensure!(
        cfg.stream.is_none(),
        "an online job reads an unbounded stream, and its worker count follows the traffic \
         (docs/online.md): `brain plan` plans jobs over files"
    );
    elastrec_job::prepare::ensure_data(&cfg, true)?;
    elastrec_job::datasets::resolve_datasets(&mut cfg)?;
    elastrec_job::prepare::resolve_schema(&mut cfg)?;
    elastrec_job::prepare::fill_batch_size(&mut cfg)?;
    // The samples the job trains: its training rows but the validation slice, per epoch.
    let counts = elastrec_job::prepare::count_train_rows(&cfg)?;
    let (kept, _) = elastrec_job::selection::split_validation(&counts, cfg.train.validation);
    let samples = kept.iter().map(|(_, rows)| rows).sum::<u64>() * u64::from(cfg.train.epochs);
    let id = path
        .file_stem()
        .map_or("job".into(), |s| s.to_string_lossy().into_owned());
    let file = elastrec_master::autoscale_loop::brain_job_file(&cfg, &id, samples)?;
    Ok(elastrec_brain::plan_for_job(&file)?)
}

/// `elastrec brain history`: the jobs of a config database as a table (or JSON).
/// How long ago, as a person reads it: `42 s ago`, `17 min ago`, `5 h ago`, `3 d ago`.
fn age(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..=119 => format!("{s} s ago"),
        120..=7_199 => format!("{} min ago", s / 60),
        7_200..=172_799 => format!("{} h ago", s / 3_600),
        _ => format!("{} d ago", s / 86_400),
    }
}

pub fn brain_history(db: Option<&str>, limit: usize, json: bool) -> Result<()> {
    let url = match db {
        Some(u) => u.to_string(),
        None => {
            let path = elastrec_master::brain_link::default_brain_db(Path::new("."))?;
            anyhow::ensure!(
                path.exists(),
                "{} does not exist yet: no job has run with autoscale.enabled on this account \
                 (or pass --db URL)",
                path.display()
            );
            format!("sqlite://{}", path.display())
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let jobs = rt
        .block_on(async {
            elastrec_brain::db::ConfigDb::connect(&url)
                .await?
                .jobs(limit)
                .await
        })
        .with_context(|| format!("reading {}", elastrec_brain::db::redact_url(&url)))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&jobs)?);
        return Ok(());
    }
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|j| {
            let f = &j.features;
            let (nodes, cores) = j.config.map_or(("-".into(), "-".into()), |a| {
                (
                    format!(
                        "{} x {:.1} GiB / {} x {:.1} GiB",
                        a.workers, a.worker_mem_gb, a.ps, a.ps_mem_gb
                    ),
                    format!("{:.1} / {:.1}", a.worker_cpu, a.ps_cpu),
                )
            });
            let (status, rate) = j
                .outcome
                .as_ref()
                .map_or(("no outcome".into(), "-".into()), |o| {
                    (o.status.clone(), format!("{:.0}", o.throughput))
                });
            vec![
                j.job_id.clone(),
                f.model_type.clone(),
                f.scenario.clone(),
                f.user.clone(),
                format!("{} / {}", f.table_count, f.total_rows),
                f.dataset_samples.to_string(),
                status,
                age(now_ms.saturating_sub(j.last_report_ms)),
                nodes,
                cores,
                rate,
            ]
        })
        .collect();
    let mut out = String::new();
    elastrec_brain::plan::table(
        &mut out,
        &[
            "job",
            "model",
            "scenario",
            "user",
            "tables / rows",
            "samples",
            "status",
            "last report",
            "workers / PS (memory each)",
            "cores worker / PS",
            "samples/s",
        ],
        &rows,
    );
    print!("{out}");
    println!(
        "{} jobs; warm start leaves out the failed and oom ones (docs/autoscale.md)",
        jobs.len()
    );
    Ok(())
}

/// The cluster a brain service plans for.
pub struct BrainCluster {
    /// Cores.
    pub cpu: f64,
    /// Memory, GiB.
    pub mem_gb: f64,
    /// Seconds of silence after which a job no longer holds a share.
    pub inactive_after_s: f64,
}

pub fn brain_serve(
    db: &str,
    listen: std::net::SocketAddr,
    metrics: std::net::SocketAddr,
    token_file: Option<&Path>,
    cluster: BrainCluster,
) -> Result<()> {
    use elastrec_brain::service::{resolve_token, TOKEN_ENV};
    for (flag, v) in [
        ("--cluster-cpu", cluster.cpu),
        ("--cluster-mem-gb", cluster.mem_gb),
        ("--inactive-after-s", cluster.inactive_after_s),
    ] {
        if !(v.is_finite() && v > 0.0) {
            bail!("{flag} must be a positive number, got {v}");
        }
    }
    let token = resolve_token(token_file, std::env::var_os(TOKEN_ENV))?;
    let mut opts = elastrec_brain::BrainServeOptions::new(db, token);
    opts.listen = listen;
    opts.metrics = metrics;
    opts.config.capacity.cpu = cluster.cpu;
    opts.config.capacity.mem_gb = cluster.mem_gb;
    opts.config.sharing.inactive_after_s = cluster.inactive_after_s;
    eprintln!(
        "brain listening on {listen}, config database {}",
        elastrec_brain::db::redact_url(db)
    );
    tokio::runtime::Runtime::new()?
        .block_on(elastrec_brain::serve(opts))
        .context("brain service stopped")
}

/// Runs a role process (`ps`, `worker`, started by the master) on a multi-threaded
/// runtime: they serve gRPC and train at once.
pub fn on_runtime<T>(role: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(role)
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_age_reads_in_the_unit_a_person_would_use() {
        use super::age;
        assert_eq!(age(-5), "0 s ago");
        assert_eq!(age(42_000), "42 s ago");
        assert_eq!(age(119_999), "119 s ago");
        assert_eq!(age(120_000), "2 min ago");
        assert_eq!(age(3 * 3_600_000), "3 h ago");
        assert_eq!(age(49 * 3_600_000), "2 d ago");
    }
}
