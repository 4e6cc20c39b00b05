//! `elastrec preprocess`: a job's `[[preprocess]]` graph, explained, and its features
//! materialized as Parquet for users who want them offline.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use elastrec_job::config::JobConfig;
use elastrec_preprocess::{default_graph, FeatureKind, Plan, PreprocessedReader};

/// Arguments of `elastrec preprocess`.
#[derive(clap::Args)]
pub struct PreprocessArgs {
    /// The job file whose `[[preprocess]]` graph (or the default graph) is applied to its
    /// `data.train` and `data.eval` files.
    #[arg(long)]
    job: PathBuf,
    /// Directory for the Parquet files (one per input file, `<name>.parquet`) and
    /// `features.json`.
    #[arg(long, required_unless_present = "explain")]
    out: Option<PathBuf>,
    /// Only print the compiled graph: features, widths, table rows and fused steps.
    #[arg(long)]
    explain: bool,
}

/// Runs the command.
pub fn run(a: PreprocessArgs) -> Result<()> {
    let mut job = JobConfig::load(&a.job)?;
    let specs = if job.preprocess.is_empty() {
        default_graph()
    } else {
        job.preprocess.clone()
    };
    let plan = Arc::new(Plan::compile(&specs)?);
    explain(&plan);
    let Some(out) = a.out.filter(|_| !a.explain) else {
        return Ok(());
    };
    elastrec_job::prepare::ensure_data(&job, job.train.progress)?;
    elastrec_job::datasets::resolve_datasets(&mut job)?;
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let files: Vec<PathBuf> = job
        .train_files()
        .into_iter()
        .chain(job.eval_files())
        .collect();
    anyhow::ensure!(
        !files.is_empty(),
        "{}: the job names no data.train or data.eval files to preprocess",
        a.job.display()
    );
    println!("{:<40} {:>12} {:>10}  output", "input", "rows", "skipped");
    for f in &files {
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "data".into());
        let stem = name.split('.').next().unwrap_or(&name).to_string();
        let target = out.join(format!("{stem}.parquet"));
        let total = elastrec_data::count_rows(f)?;
        let pb = elastrec_job::prepare::progress_bar(job.train.progress, total, &stem);
        let reader = elastrec_data::open_reader(f, job.data.on_bad_row)?;
        let mut reader = PreprocessedReader::new(reader, plan.clone());
        let rows =
            elastrec_preprocess::materialize::write_parquet(&mut reader, &plan, &target, |r| {
                pb.set_position(r)
            })
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("preprocessing {}", f.display()))?;
        pb.finish_and_clear();
        let skipped = elastrec_data::BatchReader::stats(&reader).rows_skipped;
        println!(
            "{:<40} {rows:>12} {skipped:>10}  {}",
            name,
            target.display()
        );
    }
    let features = serde_json::json!({
        "features": plan.features(),
        "dense_width": plan.dense_width(),
        "sparse_width": plan.sparse_width(),
        "graph": specs,
    });
    let path = out.join("features.json");
    std::fs::write(&path, serde_json::to_string_pretty(&features)?)
        .with_context(|| format!("writing {}", path.display()))?;
    println!("features described in {}", path.display());
    Ok(())
}

fn explain(plan: &Plan) {
    println!(
        "{} features: {} dense columns, {} sparse columns (embedding tables)",
        plan.features().len(),
        plan.dense_width(),
        plan.sparse_width()
    );
    println!(
        "{:<24} {:<7} {:>6} {:<10} {:>12}",
        "feature", "kind", "width", "type", "ids"
    );
    for f in plan.features() {
        let ids = match (f.kind, f.rows, f.cardinality) {
            (FeatureKind::Dense, ..) => "-".to_string(),
            (_, Some(r), _) => format!("{r} rows"),
            (_, None, Some(c)) => c.to_string(),
            (_, None, None) if f.raw_column.is_some() => "as the data".to_string(),
            (_, None, None) => "unbounded".to_string(),
        };
        let kind = match f.kind {
            FeatureKind::Dense => "dense",
            FeatureKind::Sparse => "sparse",
        };
        println!(
            "{:<24} {:<7} {:>6} {:<10} {:>12}",
            f.name, kind, f.width, f.output, ids
        );
    }
    let steps: Vec<String> = plan
        .steps()
        .iter()
        .map(|(k, n)| format!("{k}×{n}"))
        .collect();
    println!("fused steps ({}): {}", steps.len(), steps.join(", "));
}
