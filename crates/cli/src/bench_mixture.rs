//! `elastrec bench mixture`: batch + stream mixture training (Primus §5) on data whose
//! click behaviour drifts (`gen-data --drift`). The first days are the history (files),
//! the next-to-last day is the stream (replayed into Kafka at a fixed rate while the job
//! runs), the last day is held out. One job per arm, one after another on this machine:
//! history only, stream only, the mixture served sequentially, by weight and by Primus
//! Eq. 4 priority, and the MTRM model (priority serving). The table shows what each arm's
//! model scores on the held-out day and how long the stream's messages waited (lag)
//! behind the history.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use elastrec_stream::{MessageFormat, Partitioner, ReplaySpec, Trace};
use serde::Serialize;

use crate::bench_online::{run_job, BenchPlace, JobRun};

/// Arguments of `elastrec bench mixture`.
#[derive(clap::Args)]
pub struct BenchMixtureArgs {
    /// A `gen-data` directory with at least 3 `day_*` files, e.g. from
    /// `elastrec gen-data --out data/mix --rows 400000 --days 4 --drift 0.25`: all but the
    /// last two days are the history, the next-to-last the stream, the last is held out.
    #[arg(long, value_name = "DIR")]
    data: PathBuf,
    /// Arms to run, in order: `history` (the history's files only), `stream` (the stream
    /// only), `sequential`, `weighted`, `priority` (the mixture's serving modes), `mtrm`
    /// (priority serving, MTRM's memory and adapt towers).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "history,stream,sequential,weighted,priority,mtrm"
    )]
    arms: Vec<String>,
    /// The adapt tower of the `mtrm` arm (`model.adapt_mlp`).
    #[arg(long, value_delimiter = ',', default_value = "32,1")]
    adapt_mlp: Vec<usize>,
    /// Rate the stream day is replayed at, samples/s.
    #[arg(long, default_value_t = 4000.0)]
    qps: f64,
    /// Partitions of each arm's topic.
    #[arg(long, default_value_t = 3)]
    partitions: i32,
    /// Workers of every job.
    #[arg(long, default_value_t = 2)]
    workers: u32,
    /// Training batch size.
    #[arg(long, default_value_t = 256)]
    batch_size: u32,
    /// `data.mix.history_weight` of the weighted and priority arms.
    #[arg(long, default_value_t = 1.0)]
    history_weight: f64,
    /// `data.mix.stream_weight` of the weighted and priority arms.
    #[arg(long, default_value_t = 4.0)]
    stream_weight: f64,
    /// `data.mix.target_tasks` of the priority arm.
    #[arg(long, default_value_t = 2.0)]
    target_tasks: f64,
    /// The lag SLO, seconds.
    #[arg(long, default_value_t = 5.0)]
    slo_lag_s: f64,
    /// Where the arms' job directories go.
    #[arg(long, default_value = "bench-mixture")]
    out: PathBuf,
    /// Longest a job may take to train what it was sent after the replay ends, s.
    #[arg(long, default_value_t = 300)]
    drain_timeout_s: u64,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// What an arm trains on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arm {
    History,
    Stream,
    Mixture(&'static str),
    Mtrm,
}

impl Arm {
    fn parse(text: &str) -> Result<Self> {
        Ok(match text {
            "history" => Arm::History,
            "stream" => Arm::Stream,
            "sequential" => Arm::Mixture("sequential"),
            "weighted" => Arm::Mixture("weighted"),
            "priority" => Arm::Mixture("priority"),
            "mtrm" => Arm::Mtrm,
            other => bail!(
                "--arms: unknown arm {other:?} (history, stream, sequential, weighted, priority, mtrm)"
            ),
        })
    }

    fn name(self) -> &'static str {
        match self {
            Arm::History => "history",
            Arm::Stream => "stream",
            Arm::Mixture(mode) => mode,
            Arm::Mtrm => "mtrm",
        }
    }
}

/// One arm's figures.
#[derive(Debug, Serialize)]
struct ArmResult {
    arm: String,
    /// Samples trained (history rows and stream offsets).
    samples: u64,
    /// AUC and logloss of the final model on the held-out last day.
    eval_auc: Option<f64>,
    eval_logloss: Option<f64>,
    /// Progressive validation over the stream's most recent window (stream arms).
    window_auc: Option<f64>,
    /// The stream's lag integrated over the run, seconds (KALE's accumulated lag).
    accumulated_lag_s: Option<f64>,
    /// The largest lag any partition reached, seconds.
    peak_lag_s: Option<f64>,
    /// Share of the observed time the lag was above the SLO.
    slo_violation_rate: Option<f64>,
    wall_s: f64,
    /// Share of the machine other processes used during the arm.
    foreign_load: Option<f64>,
}

/// Runs `elastrec bench mixture`.
pub fn run(a: BenchMixtureArgs) -> Result<()> {
    let arms = a
        .arms
        .iter()
        .map(|s| Arm::parse(s))
        .collect::<Result<Vec<_>>>()?;
    let days = crate::commands::data_files(std::slice::from_ref(&a.data))?;
    if days.len() < 3 {
        bail!(
            "{}: {} day files; the benchmark needs at least 3 (history, stream, held-out)",
            a.data.display(),
            days.len()
        );
    }
    if !(a.qps.is_finite() && a.qps > 0.0) {
        bail!("--qps must be a positive rate, got {}", a.qps);
    }
    let (history, rest) = days.split_at(days.len() - 2);
    let (stream_day, eval_day) = (&rest[0], &rest[1]);
    let stream_rows = elastrec_data::count_rows(stream_day)?;
    let place = BenchPlace::new(&a.out)?;
    let (out, brokers, exe) = (&place.out, &place.brokers, &place.exe);
    let mut results = Vec::new();
    for (i, &arm) in arms.iter().enumerate() {
        let topic = place.topic(&format!("mix-{i}"), a.partitions)?;
        eprintln!(
            "bench mixture: {} ({}/{}): history {} file(s), stream {} rows at {:.0}/s",
            arm.name(),
            i + 1,
            arms.len(),
            history.len(),
            stream_rows,
            a.qps
        );
        let dir = out.join(arm.name());
        let job = out.join(format!("{}.toml", arm.name()));
        let files = Files {
            history,
            eval: eval_day,
        };
        std::fs::write(&job, job_toml(&a, arm, &dir, brokers, &topic, &files)?)?;
        let spec = ReplaySpec {
            conn: place.connection(),
            topic: topic.clone(),
            files: vec![stream_day.clone()],
            schema: None,
            repeat: false,
            format: MessageFormat::Tsv,
            samples_per_message: 1,
            // Long enough for the whole day; the replay ends with the data.
            trace: Trace::constant(a.qps, stream_rows as f64 / a.qps + 1.0),
            partitioner: Partitioner::skewed(0, 0.0, 0.0)?,
            seed: 1,
        };
        let run = run_job(&JobRun {
            exe,
            name: arm.name(),
            job: &job,
            dir: &dir,
            env: &[],
            replay: (arm != Arm::History).then_some(&spec),
            drain_timeout: Duration::from_secs(a.drain_timeout_s),
        })?;
        results.push(arm_result(arm, &run.result, run.wall_s, run.foreign_load));
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        print_table(&results);
    }
    Ok(())
}

/// The history's files and the held-out day.
struct Files<'a> {
    history: &'a [PathBuf],
    eval: &'a Path,
}

fn job_toml(
    a: &BenchMixtureArgs,
    arm: Arm,
    dir: &Path,
    brokers: &str,
    topic: &str,
    files: &Files,
) -> Result<String> {
    let quoted = |p: &Path| -> Result<String> {
        Ok(format!(
            "{:?}",
            p.to_str().context("data path is not UTF-8")?
        ))
    };
    let train = match arm {
        Arm::Stream => String::new(),
        _ => files
            .history
            .iter()
            .map(|p| quoted(p))
            .collect::<Result<Vec<_>>>()?
            .join(", "),
    };
    let mut text = format!(
        r#"# Written by `elastrec bench mixture`.
[data]
dir = "/"
train = [{train}]
eval = [{eval}]
[model]
bottom_mlp = [64, 16]
top_mlp = [64, 32, 1]
max_table_rows = 200000
[train]
batch_size = {batch}
progress = false
[output]
dir = {dir}
[cluster]
ps = 1
workers = {workers}
batches_per_shard = 4
"#,
        eval = quoted(files.eval)?,
        batch = a.batch_size,
        dir = quoted(dir)?,
        workers = a.workers,
    );
    let mode = match arm {
        Arm::Mixture(mode) => Some(mode),
        Arm::Mtrm => {
            let sizes: Vec<String> = a.adapt_mlp.iter().map(ToString::to_string).collect();
            text = text.replace(
                "[model]\n",
                &format!("[model]\nadapt_mlp = [{}]\n", sizes.join(", ")),
            );
            Some("priority")
        }
        _ => None,
    };
    if let Some(mode) = mode {
        text += &format!(
            "[data.mix]\nmode = \"{mode}\"\nhistory_weight = {}\nstream_weight = {}\ntarget_tasks = {}\n",
            a.history_weight, a.stream_weight, a.target_tasks
        );
    }
    if arm != Arm::History {
        text += &format!(
            "[stream]\nbrokers = \"{brokers}\"\ntopics = [\"{topic}\"]\nstart = \"earliest\"\npoll_ms = 50\nlinger_ms = 100\nslo_lag_s = {}\n",
            a.slo_lag_s
        );
    }
    Ok(text)
}

fn arm_result(arm: Arm, r: &serde_json::Value, wall_s: f64, load: Option<f64>) -> ArmResult {
    let st = &r["online"]["stream"];
    ArmResult {
        arm: arm.name().to_string(),
        samples: r["ledger"]["consumed"].as_u64().unwrap_or(0),
        eval_auc: r["eval"]["auc"].as_f64(),
        eval_logloss: r["eval"]["logloss"].as_f64(),
        window_auc: r["online"]["progressive"]["latest"]["auc"].as_f64(),
        accumulated_lag_s: st["accumulated_lag_s"].as_f64(),
        peak_lag_s: st["partitions"].as_array().map(|ps| {
            ps.iter()
                .filter_map(|p| p["peak_lag_s"].as_f64())
                .fold(0.0, f64::max)
        }),
        slo_violation_rate: st["slo_violation_rate"].as_f64(),
        wall_s,
        foreign_load: load,
    }
}

fn print_table(rows: &[ArmResult]) {
    let opt =
        |v: Option<f64>, digits: usize| v.map_or("-".to_string(), |x| format!("{x:.digits$}"));
    println!(
        "{:<11} {:>9} {:>9} {:>9} {:>10} {:>11} {:>9} {:>9} {:>7} {:>8}",
        "arm",
        "samples",
        "eval AUC",
        "logloss",
        "window AUC",
        "acc. lag s",
        "peak lag",
        "SLO viol",
        "wall s",
        "foreign"
    );
    for r in rows {
        println!(
            "{:<11} {:>9} {:>9} {:>9} {:>10} {:>11} {:>9} {:>9} {:>7.1} {:>8}",
            r.arm,
            r.samples,
            opt(r.eval_auc, 4),
            opt(r.eval_logloss, 4),
            opt(r.window_auc, 4),
            opt(r.accumulated_lag_s, 1),
            opt(r.peak_lag_s, 1),
            r.slo_violation_rate
                .map_or("-".into(), |v| format!("{:.1}%", 100.0 * v)),
            r.wall_s,
            r.foreign_load
                .map_or("-".into(), |v| format!("{:.1}%", 100.0 * v)),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arms_parse_and_unknown_ones_are_named() {
        assert_eq!(Arm::parse("priority").unwrap(), Arm::Mixture("priority"));
        assert_eq!(Arm::parse("history").unwrap().name(), "history");
        assert_eq!(Arm::parse("mtrm").unwrap().name(), "mtrm");
        let e = Arm::parse("mix").unwrap_err().to_string();
        assert!(e.contains("\"mix\""), "{e}");
    }
}
