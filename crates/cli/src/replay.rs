//! `elastrec replay`: the traffic generator for online jobs.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use elastrec_data::Schema;
use elastrec_job::config::JobConfig;
use elastrec_stream::{replay, Connection, MessageFormat, Partitioner, ReplaySpec, Trace};
use std::sync::Arc;

/// Replays a log into a Kafka topic at the rates of a trace: Criteo-layout rows, or a
/// named log (Parquet, CSV) as JSON objects of its features (`--format json --job`).
#[derive(clap::Args)]
pub struct ReplayArgs {
    /// Destination: `kafka://HOST:PORT[,HOST:PORT...]/TOPIC` (the topic must exist).
    #[arg(long, value_name = "URL")]
    to: String,
    /// Criteo TSV files (plain or gzip), or with `--format json` a named log's Parquet or
    /// CSV files; directories: their `day_*` files, all read in name order.
    #[arg(long, value_name = "PATH", required = true, num_args = 1..)]
    data: Vec<PathBuf>,
    /// Rates over time: a CSV of `t_s,qps` points, linear in between (a header line and
    /// `#` comments are allowed). Without it: `--qps` for `--seconds`.
    #[arg(long, value_name = "CSV", conflicts_with = "qps")]
    qps_trace: Option<PathBuf>,
    /// A constant rate, samples per second.
    #[arg(long)]
    qps: Option<f64>,
    /// How long a constant rate lasts, seconds.
    #[arg(long, default_value_t = 60.0)]
    seconds: f64,
    /// Play the trace this many times faster (rates up, times down).
    #[arg(long, default_value_t = 1.0)]
    speedup: f64,
    /// Message encoding: `tsv` (one sample per message), `batch` (the binary format) or
    /// `json` (a named log's rows as JSON objects of the features `--job` names).
    #[arg(long, default_value = "tsv", value_parser = ["tsv", "batch", "json"])]
    format: String,
    /// The job file whose `[data]` names the label and features (`[[data.feature]]`, or
    /// the label alone: the features are then inferred from the first `--data` file) that
    /// `--format json` messages carry: the online job's own file.
    #[arg(long, value_name = "JOB.toml")]
    job: Option<PathBuf>,
    /// Samples per message with `--format batch` (default 256) and `--format json`
    /// (default 1: one object per message; more: an array of objects).
    #[arg(long)]
    samples_per_message: Option<u32>,
    /// Start over from the first file when the data runs out before the trace.
    #[arg(long)]
    repeat: bool,
    /// Send this share of the positive samples to `--skew-partition` (its click rate then
    /// differs from the other partitions').
    #[arg(long, default_value_t = 0.0)]
    skew_share: f64,
    /// Send this share of all samples to `--skew-partition` (a hot partition, with more
    /// traffic than the others).
    #[arg(long, default_value_t = 0.0)]
    hot_share: f64,
    /// The partition that gets the extra positives and the extra traffic.
    #[arg(long, default_value_t = 0)]
    skew_partition: i32,
    /// Seed of the skew's coin.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Kafka client property, `KEY=VALUE` (repeatable), the names `[stream] properties`
    /// takes, e.g. `--property security.protocol=ssl --property compression.type=zstd`.
    #[arg(long = "property", value_name = "KEY=VALUE")]
    properties: Vec<String>,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// Splits `kafka://brokers/topic`.
fn parse_target(url: &str) -> Result<(String, String)> {
    let rest = url
        .strip_prefix("kafka://")
        .with_context(|| format!("--to {url:?}: expected kafka://HOST:PORT/TOPIC"))?;
    let (brokers, topic) = rest
        .split_once('/')
        .with_context(|| format!("--to {url:?}: no topic after the brokers"))?;
    if brokers.is_empty() || topic.is_empty() || topic.contains('/') {
        bail!("--to {url:?}: expected kafka://HOST:PORT/TOPIC");
    }
    Ok((brokers.to_string(), topic.to_string()))
}

/// The named features `--format json` sends: the job file's `[[data.feature]]`, or with
/// only a label, those inferred from the first replayed file (as `train` infers them from
/// its first training file).
fn named_schema(job: &std::path::Path, files: &[PathBuf]) -> Result<Schema> {
    let mut config = JobConfig::load(job)?;
    if config.data.schema().is_none() {
        if config.data.label.is_none() {
            bail!(
                "{}: names no data.label: --format json sends named features, which the job \
                 file's [data] names (label, and [[data.feature]] or nothing to infer them)",
                job.display()
            );
        }
        let first = files.first().context("no files to replay")?;
        elastrec_job::prepare::infer_schema_from(&mut config, first)?;
    }
    config
        .data
        .schema()
        .context("the job file's features could not be read")
}

/// Runs `elastrec replay`.
pub fn run(a: ReplayArgs) -> Result<()> {
    let (brokers, topic) = parse_target(&a.to)?;
    if !(a.speedup.is_finite() && a.speedup > 0.0) {
        bail!("--speedup must be a positive number, got {}", a.speedup);
    }
    let trace = match (&a.qps_trace, a.qps) {
        (Some(p), _) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("reading the trace {}", p.display()))?;
            Trace::parse_csv(&text, p)?
        }
        (None, Some(q)) if q.is_finite() && q >= 0.0 && a.seconds > 0.0 => {
            Trace::constant(q, a.seconds)
        }
        (None, Some(_)) => bail!("--qps must be ≥ 0 and --seconds positive"),
        (None, None) => bail!("give the rates: --qps-trace CSV, or --qps N [--seconds S]"),
    }
    .faster(a.speedup);
    let mut conn = Connection::new(brokers);
    for p in &a.properties {
        let (k, v) = p
            .split_once('=')
            .with_context(|| format!("--property {p:?}: expected KEY=VALUE"))?;
        conn.properties
            .insert(k.trim().to_string(), v.trim().to_string());
    }
    let files = crate::commands::data_files(&a.data)?;
    let format = match a.format.as_str() {
        "batch" => MessageFormat::Batch,
        "json" => MessageFormat::Json,
        _ => MessageFormat::Tsv,
    };
    let schema = match (format, &a.job) {
        (MessageFormat::Json, Some(job)) => Some(Arc::new(named_schema(job, &files)?)),
        (MessageFormat::Json, None) => bail!(
            "--format json sends a named log's features: give the job file that names them \
             (--job JOB.toml, the online job's own)"
        ),
        (_, Some(_)) => bail!("--job goes with --format json"),
        (_, None) => None,
    };
    let spec = ReplaySpec {
        conn,
        topic,
        files,
        schema,
        repeat: a.repeat,
        format,
        samples_per_message: a.samples_per_message.unwrap_or(match format {
            MessageFormat::Batch => 256,
            _ => 1,
        }),
        trace,
        partitioner: Partitioner::skewed(a.skew_partition, a.hot_share, a.skew_share)?,
        seed: a.seed,
    };
    let total = spec.trace.duration_s();
    let report = replay(&spec, |r| {
        eprintln!(
            "[{:>6.1}s/{total:.0}s] {} samples sent ({:.0}/s)",
            r.seconds,
            r.samples,
            r.samples as f64 / r.seconds.max(1e-9)
        );
    })?;
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!("samples   {}", report.samples);
        println!("messages  {}", report.messages);
        println!("seconds   {:.1}", report.seconds);
        println!("partition  samples  click rate");
        for (p, (&n, &pos)) in report
            .per_partition
            .iter()
            .zip(&report.positives_per_partition)
            .enumerate()
        {
            println!("{p:>9}  {n:>7}  {:.3}", pos as f64 / n.max(1) as f64);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_url_names_brokers_and_topic() {
        assert_eq!(
            parse_target("kafka://127.0.0.1:9092,h:1/clicks").unwrap(),
            ("127.0.0.1:9092,h:1".into(), "clicks".into())
        );
        for bad in [
            "127.0.0.1:9092/t",
            "kafka://h:1",
            "kafka:///t",
            "kafka://h:1/a/b",
        ] {
            assert!(parse_target(bad).is_err(), "{bad}");
        }
    }
}
