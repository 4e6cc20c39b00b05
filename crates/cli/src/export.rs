//! `elastrec export`: one servable `model.bin` from a checkpoint of a `run` job.
//!
//! A distributed job's model lives in pieces: every parameter server's part of a
//! checkpoint holds its rows of every table and its slice of the dense parameters, and a
//! delta checkpoint holds only some rows on top of its base. Export applies the whole
//! chain (full checkpoint first, then its deltas) onto one unsharded model, exactly as a
//! single parameter server would restore it, and writes the file `elastrec eval` reads.
//! The checkpoint describes itself (its manifest carries the model and optimizer
//! settings), so no job file is needed.
//!
//! The master runs this as a child process (periodic export of online jobs, the final
//! model of a batch job): a large model's conversion then never competes for the master's
//! memory, and a crash in it never takes the job down.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context as _};
use elastrec_checkpoint::format::Manifest;
use elastrec_checkpoint::store::{redact_location, CheckpointStore};
use elastrec_common::EvalResult;
use elastrec_job::config::{JobConfig, ModelConfig, OptimizerConfig};
use elastrec_master::export::{DeltaRecord, ExportRecord, Judge};
use elastrec_ps::image::{apply_parts, decode, part_name, DecodedPart};
use elastrec_worker::model_file::ModelDelta;
use elastrec_worker::step::Dlrm;
use serde::Deserialize;

/// `elastrec export` flags.
#[derive(clap::Args)]
#[command(group = clap::ArgGroup::new("source").required(true).args(["checkpoint", "model"]))]
pub struct ExportArgs {
    /// Checkpoint storage of the job: a directory (`<output.dir>/checkpoints` by default)
    /// or `s3://bucket/prefix` (credentials from the environment).
    #[arg(long)]
    pub checkpoint: Option<String>,
    /// A model file (`model.bin` of `train`, or an earlier export) to convert, instead of
    /// a checkpoint; with `--format onnx` or `safetensors`.
    #[arg(long, value_name = "FILE")]
    pub model: Option<PathBuf>,
    /// What to write: `bin` (elastrec's model file, which `eval` and `serve` read),
    /// `onnx` (a graph ONNX Runtime runs, with `<out>.json` describing its inputs) or
    /// `safetensors` (tables and dense weights by name, for PyTorch and numpy).
    #[arg(long, value_enum, default_value_t = Format::Bin)]
    pub format: Format,
    /// `--format onnx`: keep the embedding tables in `<out>.data` beside the graph (ONNX
    /// external data) instead of inside it; forced past 1 GiB of tables.
    #[arg(long)]
    pub external_data: bool,
    /// `--format onnx`: the graph's `dense` input takes the raw dense columns (NaN for a
    /// null) and applies their transforms (`log1p`, a feature's numeric `ops`) itself,
    /// so a service feeds it the numbers it logs.
    #[arg(long)]
    pub raw_dense: bool,
    /// Checkpoint id to export (default: the newest intact one).
    #[arg(long)]
    pub id: Option<u64>,
    /// Model file to write (replaced atomically).
    #[arg(long)]
    pub out: PathBuf,
    /// Also write a model delta to `--delta-out`: every dense parameter and the embedding
    /// rows that differ from this earlier export of the same job, which a running
    /// `elastrec serve` serving that export applies without restarting.
    #[arg(long, value_name = "MODEL", requires = "delta_out")]
    pub delta_from: Option<PathBuf>,
    /// Where the delta of `--delta-from` goes (replaced atomically).
    #[arg(long, requires = "delta_from")]
    pub delta_out: Option<PathBuf>,
    /// Also evaluate the model on rows `START` to `END` (exclusive) of `FILE`, given as
    /// `START:END:FILE`; repeatable. The record's `validation` holds the figures (the
    /// master of `elastrec run` judges its checkpoints on the job's validation slice so).
    #[arg(long, value_name = "START:END:FILE", value_parser = parse_row_range)]
    pub validate: Vec<(PathBuf, u64, u64)>,
    /// Also evaluate the model on this whole file (the record's `eval`); repeatable.
    #[arg(long, value_name = "FILE")]
    pub eval_data: Vec<PathBuf>,
    /// Malformed rows in `--validate` and `--eval-data`: fail (default) or skip.
    #[arg(long, default_value = "fail")]
    pub on_bad_row: String,
    /// Print what was exported as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Formats `elastrec export` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// elastrec's model file.
    Bin,
    /// An ONNX graph (opset 17).
    Onnx,
    /// A safetensors file of tables and dense weights.
    Safetensors,
}

/// `START:END:FILE` of `--validate` (the file last: a path may hold colons).
fn parse_row_range(s: &str) -> Result<(PathBuf, u64, u64), String> {
    let mut it = s.splitn(3, ':');
    let (Some(a), Some(b), Some(file)) = (it.next(), it.next(), it.next()) else {
        return Err(format!("`{s}` is not START:END:FILE"));
    };
    let start: u64 = a
        .parse()
        .map_err(|_| format!("`{a}` in `{s}` is not a row number"))?;
    let end: u64 = b
        .parse()
        .map_err(|_| format!("`{b}` in `{s}` is not a row number"))?;
    if end < start || file.is_empty() {
        return Err(format!(
            "`{s}`: END must not be below START, and FILE must be named"
        ));
    }
    Ok((PathBuf::from(file), start, end))
}

/// The model and optimizer settings a checkpoint's manifest records.
#[derive(Deserialize)]
struct Described {
    model: ModelConfig,
    optimizer: OptimizerConfig,
    /// Absent for the default graph.
    #[serde(default)]
    preprocess: Vec<elastrec_preprocess::FeatureSpec>,
    /// Absent for the Criteo layout.
    #[serde(default)]
    schema: Option<elastrec_data::Schema>,
}

/// Runs `elastrec export`.
pub fn run(args: ExportArgs) -> anyhow::Result<()> {
    if args.format != Format::Bin {
        return convert(&args);
    }
    let Some(checkpoint) = args.checkpoint.as_deref() else {
        bail!(
            "--model is converted with --format onnx or safetensors; a model file is already `bin`"
        );
    };
    let judge = Judge {
        validation: args.validate,
        eval: args.eval_data,
        on_bad_row: crate::commands::bad_row_policy(&args.on_bad_row)?,
    };
    let e = crate::commands::on_runtime(export(
        checkpoint,
        args.id,
        args.delta_from.as_deref().zip(args.delta_out.as_deref()),
        &args.out,
        &judge,
    ))?;
    if args.json {
        println!("{}", serde_json::to_string(&e)?);
    } else {
        let delta = match &e.delta {
            Some(d) => format!(
                "; the delta from checkpoint {} to {}: {} rows, {:.1} MB",
                d.from,
                d.path.display(),
                d.rows,
                d.bytes as f64 / 1e6
            ),
            None => String::new(),
        };
        println!(
            "exported checkpoint {} (chain {:?}, {} samples) to {}: {} embedding rows, {} dense parameters, {:.1} MB in {:.2} s{delta}",
            e.checkpoint,
            e.chain,
            e.samples,
            e.path.display(),
            e.rows,
            e.dense_params,
            e.bytes as f64 / 1e6,
            e.seconds
        );
        for (what, figures) in [("validation rows", &e.validation), ("eval files", &e.eval)] {
            if let Some(r) = figures.first() {
                println!("{what}: {r} over {} samples", r.samples);
            }
        }
    }
    Ok(())
}

/// `elastrec export --format onnx|safetensors`: the model file or checkpoint in a format
/// other tools read.
fn convert(args: &ExportArgs) -> anyhow::Result<()> {
    if args.delta_from.is_some() || !args.validate.is_empty() || !args.eval_data.is_empty() {
        bail!("--delta-from, --validate and --eval-data go with --format bin");
    }
    let started = Instant::now();
    let (model, job) = match (&args.model, &args.checkpoint) {
        (Some(path), _) => elastrec_worker::model_file::load(path)?,
        (None, Some(location)) => {
            let r = crate::commands::on_runtime(restore(location, args.id))?;
            (r.model, r.job)
        }
        (None, None) => bail!("name the model: --model FILE or --checkpoint DIR"),
    };
    let schema = job.data.schema();
    let source = elastrec_data::FeatureSource::new(schema.as_ref(), !job.preprocess.is_empty());
    let record = match args.format {
        Format::Onnx => {
            let opts = elastrec_export::OnnxOptions {
                external_data: args.external_data,
                raw_dense: args.raw_dense,
            };
            let sig = elastrec_export::Signature::of_job(&model, &job)?;
            let e = elastrec_export::onnx::write_signed(&model, sig, &args.out, opts)?;
            serde_json::json!({
                "format": "onnx",
                "path": e.path,
                "data": e.data,
                "signature": e.signature_file,
                "bytes": e.bytes,
                "nodes": e.nodes,
            })
        }
        Format::Safetensors => {
            let e = elastrec_export::tensors::write(&model, source, &args.out)?;
            serde_json::json!({
                "format": "safetensors",
                "path": e.path,
                "bytes": e.bytes,
                "tensors": e.tensors,
            })
        }
        Format::Bin => unreachable!("handled by run"),
    };
    if args.json {
        println!("{record}");
    } else {
        println!(
            "wrote {} ({:.1} MB) in {:.2} s",
            args.out.display(),
            record["bytes"].as_u64().unwrap_or(0) as f64 / 1e6,
            started.elapsed().as_secs_f64()
        );
        if args.format == Format::Onnx {
            println!(
                "its inputs are described in {}",
                elastrec_export::onnx::side_file(&args.out).display()
            );
        }
    }
    Ok(())
}

/// Writes checkpoint `id` (default: the newest intact one) of the storage at `location`
/// to the model file `out`, and with `delta` = `(earlier, path)` the delta from the
/// earlier export `earlier` to `path`; evaluates the model on `judge`'s data.
pub async fn export(
    location: &str,
    id: Option<u64>,
    delta: Option<(&Path, &Path)>,
    out: &Path,
    judge: &Judge,
) -> anyhow::Result<ExportRecord> {
    let started = Instant::now();
    let Restored {
        model,
        job,
        manifest: m,
        chain,
    } = restore(location, id).await?;
    elastrec_worker::model_file::save_exported(&model, &job, Some(m.id), out)?;
    let delta = match delta {
        None => None,
        Some((earlier, path)) => {
            let prev = elastrec_worker::model_file::load_model(earlier)
                .with_context(|| format!("reading the earlier export {}", earlier.display()))?;
            let delta = ModelDelta::between(&prev, &model, m.id, m.samples).map_err(|e| {
                anyhow::anyhow!("{} cannot be the base of a delta: {e}", earlier.display())
            })?;
            elastrec_worker::model_file::save_delta(&delta, path)?;
            Some(DeltaRecord {
                path: path.to_path_buf(),
                from: delta.header.from,
                rows: delta.rows(),
                bytes: std::fs::metadata(path)
                    .with_context(|| format!("{}", path.display()))?
                    .len(),
            })
        }
    };
    let bytes = std::fs::metadata(out)
        .with_context(|| format!("{}", out.display()))?
        .len();
    let (validation, eval) = evaluate(&model, &job, judge)?;
    Ok(ExportRecord {
        path: out.to_path_buf(),
        checkpoint: m.id,
        chain: chain.iter().map(|c| c.id).collect(),
        samples: m.samples,
        checkpoint_ms: m.created_ms,
        rows: model.embeddings.config().rows.iter().sum(),
        delta,
        dense_params: model.dense.num_params(),
        bytes,
        seconds: started.elapsed().as_secs_f64(),
        validation,
        eval,
    })
}

/// A checkpoint's model, rebuilt whole from its chain.
struct Restored {
    model: Dlrm,
    job: JobConfig,
    manifest: Manifest,
    chain: Vec<Manifest>,
}

/// Applies the chain of checkpoint `id` (default: the newest intact one) of the storage
/// at `location` onto one unsharded model.
async fn restore(location: &str, id: Option<u64>) -> anyhow::Result<Restored> {
    let store = elastrec_master::checkpoint::open_store(location)?;
    let m = match id {
        // Every part read below is checked against the manifest's checksum, so a named
        // checkpoint needs no separate verification pass.
        Some(id) => store.manifest(id).await?,
        None => elastrec_master::checkpoint::pick(&store, location, None).await?,
    };
    let where_ = || format!("checkpoint {} in {}", m.id, redact_location(location));
    let described: Described = match m.info.get("fingerprint_parts") {
        Some(v) => serde_json::from_value(v.clone())
            .with_context(|| format!("{}: its model description", where_()))?,
        None => bail!(
            "{} does not describe its model (written by an older elastrec); export a newer checkpoint",
            where_()
        ),
    };
    let mut job = JobConfig {
        model: described.model,
        optimizer: described.optimizer,
        preprocess: described.preprocess,
        ..JobConfig::default()
    };
    if let Some(schema) = described.schema {
        job.data.set_schema(schema);
    }
    let chain = store.chain(&m).await.with_context(where_)?;
    let mut model: Option<Dlrm> = None;
    for link in &chain {
        let parts = read_parts(&store, link)
            .await
            .with_context(|| format!("{}: checkpoint {} of its chain", where_(), link.id))?;
        let dlrm = match &mut model {
            Some(d) => d,
            None => model.insert(model_for(&job, &parts).with_context(where_)?),
        };
        let total = dlrm.dense.num_params();
        if let Some(p) = parts.iter().find(|p| p.header.dense_total != total) {
            bail!(
                "{}: checkpoint {} holds {} dense parameters, its model has {total}",
                where_(),
                link.id,
                p.header.dense_total
            );
        }
        let mut opt = job.optimizer.dense.build(total);
        apply_parts(
            &parts,
            &mut dlrm.embeddings,
            dlrm.dense.params_mut(),
            opt.as_mut(),
            &(0..total),
        )
        .with_context(|| format!("{}: applying checkpoint {}", where_(), link.id))?;
    }
    let model = model.context("a checkpoint chain is never empty")?;
    Ok(Restored {
        model,
        job,
        manifest: m,
        chain,
    })
}

/// The model's figures (task 0 first) on `judge`'s validation rows and eval files, each
/// empty when not asked for. Rows are read as `elastrec eval` reads them: through the
/// graph the checkpoint describes.
fn evaluate(
    model: &Dlrm,
    job: &JobConfig,
    judge: &Judge,
) -> anyhow::Result<(Vec<EvalResult>, Vec<EvalResult>)> {
    use elastrec_worker::trainer::{evaluate_tasks, load_eval_set, load_slice};
    if judge.validation.is_empty() && judge.eval.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let mut job = job.clone();
    job.data.on_bad_row = judge.on_bad_row;
    let mut predictor = elastrec_worker::Predictor::new(model, job.train.batch_size);
    let mut stats = elastrec_data::ReadStats::default();
    let mut figures = |batches: anyhow::Result<Vec<elastrec_data::Batch>>| match batches? {
        b if b.is_empty() => Ok(Vec::new()),
        b => anyhow::Ok(evaluate_tasks(
            model,
            &b,
            &mut predictor,
            job.data.user_slot(),
        )?),
    };
    let validation = figures(
        load_slice(&judge.validation, &job, &mut stats).context("reading the validation rows"),
    )?;
    let eval =
        figures(load_eval_set(&judge.eval, &job, &mut stats).context("reading the eval files"))?;
    Ok((validation, eval))
}

/// Every parameter server's part of checkpoint `m`, decoded.
async fn read_parts(store: &CheckpointStore, m: &Manifest) -> anyhow::Result<Vec<DecodedPart>> {
    let servers = m.num_ps.max(1);
    let mut parts = Vec::with_capacity(servers as usize);
    for j in 0..servers {
        let name = part_name(j, servers);
        if m.part(&name).is_none() {
            bail!("no part {name} (the manifest lists {} servers)", servers);
        }
        let bytes = store.read_part(m, &name).await?;
        let part = tokio::task::spawn_blocking(move || decode(&bytes))
            .await
            .context("decoding task")?
            .with_context(|| format!("part {name}"))?;
        parts.push(part);
    }
    Ok(parts)
}

/// A fresh unsharded model shaped like the tables of a full checkpoint's parts.
fn model_for(job: &JobConfig, parts: &[DecodedPart]) -> anyhow::Result<Dlrm> {
    let first = parts.first().context("the checkpoint has no parts")?;
    if first.header.delta {
        bail!("its chain does not start with a full checkpoint");
    }
    let tables = first.tables.len();
    let mut rows = vec![0; tables];
    for t in &first.tables {
        *rows
            .get_mut(t.table)
            .with_context(|| format!("table index {} of {tables} tables", t.table))? = t.table_rows;
    }
    Ok(Dlrm::new(job, rows)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_ranges_name_their_file_last_and_bad_ones_say_why() {
        assert_eq!(
            parse_row_range("20:30:/data/a:b.tsv").unwrap(),
            (PathBuf::from("/data/a:b.tsv"), 20, 30)
        );
        assert!(parse_row_range("30:20:a.tsv").unwrap_err().contains("END"));
        assert!(parse_row_range("x:20:a.tsv").unwrap_err().contains("`x`"));
        assert!(parse_row_range("1:2")
            .unwrap_err()
            .contains("START:END:FILE"));
        assert!(parse_row_range("1:2:").unwrap_err().contains("FILE"));
    }
}
