//! `elastrec plot`: charts of a simulation's results (`elastrec simulate cluster --out`)
//! or of a finished job (its `result.json`): what `docs/` shows as images.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::chart::{save, BarChart, Chart, Format, LineChart, Series};

/// Flags of `elastrec plot`.
#[derive(Debug, Args)]
pub struct PlotArgs {
    /// A simulation's output directory (`jobs.csv`, `streams.csv`) or a job directory with
    /// its `result.json`.
    pub source: PathBuf,
    /// Where the charts go (created if absent).
    #[arg(long)]
    pub out: PathBuf,
    /// Formats to write, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "png,svg")]
    pub format: Vec<Format>,
}

/// Writes the charts of `args.source`; prints and returns their paths.
pub fn run(args: &PlotArgs) -> Result<Vec<PathBuf>> {
    let charts = charts_of(&args.source)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating the output directory {}", args.out.display()))?;
    let mut written = Vec::new();
    for (name, chart) in &charts {
        written.extend(save(chart, &args.out, name, &args.format)?);
    }
    for p in &written {
        println!("{}", p.display());
    }
    Ok(written)
}

/// The charts a directory's results make, by file name.
pub fn charts_of(dir: &Path) -> Result<Vec<(String, Chart)>> {
    if !dir.is_dir() {
        bail!(
            "{} is not a directory: give a simulation's --out directory or a job directory",
            dir.display()
        );
    }
    let mut charts = Vec::new();
    let jobs = dir.join("jobs.csv");
    if jobs.exists() {
        charts.extend(simulation_batch(&Table::read(&jobs)?)?);
    }
    let streams = dir.join("streams.csv");
    if streams.exists() {
        charts.extend(simulation_streams(&Table::read(&streams)?)?);
    }
    let metrics = dir.join("metrics.jsonl");
    if metrics.exists() {
        charts.extend(train_charts(&read_jsonl(&metrics)?));
    }
    let result = dir.join("result.json");
    if result.exists() {
        let text = std::fs::read_to_string(&result)
            .with_context(|| format!("reading {}", result.display()))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not JSON", result.display()))?;
        charts.extend(job_charts(&v));
    }
    if charts.is_empty() {
        bail!(
            "{} has nothing to plot: expected jobs.csv / streams.csv (elastrec simulate cluster --out), metrics.jsonl (a `train` run's directory) or result.json (a finished `run` job's directory)",
            dir.display()
        );
    }
    Ok(charts)
}

/// The records of a JSON-lines file; a line that is not JSON is an error naming it.
fn read_jsonl(file: &Path) -> Result<Vec<serde_json::Value>> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .with_context(|| format!("{}:{}: not a JSON object", file.display(), i + 1))
        })
        .collect()
}

/// A `train` run's loss and AUC over the samples trained (its `metrics.jsonl`). A
/// directory trained into twice holds both runs one after the other: the last is drawn.
fn train_charts(records: &[serde_json::Value]) -> Vec<(String, Chart)> {
    let samples = |r: &serde_json::Value| r["samples"].as_f64();
    // The last run starts where the samples go back.
    let start = (1..records.len())
        .rev()
        .find(|&i| samples(&records[i]) < samples(&records[i - 1]))
        .unwrap_or(0);
    let run = &records[start..];
    let line = |name: &str, events: &[&str], key: &str| Series {
        name: name.into(),
        points: run
            .iter()
            .filter(|r| events.contains(&r["event"].as_str().unwrap_or_default()))
            .filter_map(|r| Some((samples(r)?, r[key].as_f64()?)))
            .collect(),
    };
    let evals = ["eval", "epoch"];
    let keep = |series: Vec<Series>| -> Vec<Series> {
        series
            .into_iter()
            .filter(|s| !s.points.is_empty())
            .collect()
    };
    let mut charts = Vec::new();
    let loss = keep(vec![
        line(
            "training loss (mean over the epoch so far)",
            &evals,
            "train_loss",
        ),
        line("held-out log loss", &evals, "logloss"),
        line("validation log loss", &["validation"], "logloss"),
    ]);
    if !loss.is_empty() {
        charts.push((
            "train-loss".into(),
            Chart::Line(LineChart {
                title: "Loss over training".into(),
                x_label: "samples trained".into(),
                y_label: "log loss (nats per sample)".into(),
                series: loss,
                steps: false,
            }),
        ));
    }
    let auc = keep(vec![
        line("held-out AUC", &evals, "auc"),
        line("validation AUC", &["validation"], "auc"),
    ]);
    if !auc.is_empty() {
        charts.push((
            "train-auc".into(),
            Chart::Line(LineChart {
                title: "AUC over training".into(),
                x_label: "samples trained".into(),
                y_label: "AUC".into(),
                series: auc,
                steps: false,
            }),
        ));
    }
    charts
}

/// A CSV file read by header, with its name for errors.
pub struct Table {
    file: PathBuf,
    header: Vec<String>,
    rows: Vec<(usize, Vec<String>)>,
}

impl Table {
    /// Reads `file` (our own CSV: a header, no quoted commas).
    pub fn read(file: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        Self::parse(file, &text)
    }

    fn parse(file: &Path, text: &str) -> Result<Self> {
        let mut lines = text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty());
        let Some((_, head)) = lines.next() else {
            bail!("{}: empty file, expected a header line", file.display());
        };
        let header: Vec<String> = head.split(',').map(|s| s.trim().to_string()).collect();
        let rows = lines
            .map(|(i, l)| (i + 1, l.split(',').map(|s| s.trim().to_string()).collect()))
            .collect();
        Ok(Self {
            file: file.to_path_buf(),
            header,
            rows,
        })
    }

    fn column(&self, name: &str) -> Result<usize> {
        self.header.iter().position(|h| h == name).with_context(|| {
            format!(
                "{}:1: no column `{name}` (the header has {})",
                self.file.display(),
                self.header.join(", ")
            )
        })
    }

    /// Every row's `name` column.
    fn text(&self, name: &str) -> Result<Vec<String>> {
        let c = self.column(name)?;
        self.rows
            .iter()
            .map(|(line, r)| {
                r.get(c).cloned().with_context(|| {
                    format!(
                        "{}:{line}: no value in column `{name}`",
                        self.file.display()
                    )
                })
            })
            .collect()
    }

    /// Every row's `name` column as a number (`None` where empty: a job that did not end).
    fn numbers(&self, name: &str) -> Result<Vec<Option<f64>>> {
        let c = self.column(name)?;
        self.rows
            .iter()
            .map(|(line, r)| match r.get(c).map(String::as_str) {
                None | Some("") => Ok(None),
                Some(v) => v.parse::<f64>().map(Some).map_err(|_| {
                    anyhow::anyhow!(
                        "{}:{line}: column `{name}` holds `{v}`, not a number",
                        self.file.display()
                    )
                }),
            })
            .collect()
    }
}

/// Values grouped by policy, in first-seen order.
fn by_policy(policies: &[String], values: &[Option<f64>]) -> Vec<(String, Vec<f64>)> {
    let mut groups: Vec<(String, Vec<f64>)> = Vec::new();
    for (p, v) in policies.iter().zip(values) {
        let i = match groups.iter().position(|(q, _)| q == p) {
            Some(i) => i,
            None => {
                groups.push((p.clone(), Vec::new()));
                groups.len() - 1
            }
        };
        groups[i].1.extend(v);
    }
    groups
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// JCT per policy: its distribution and its mean.
fn simulation_batch(t: &Table) -> Result<Vec<(String, Chart)>> {
    let groups = by_policy(&t.text("policy")?, &t.numbers("jct_min")?);
    let cdf = groups
        .iter()
        .map(|(p, v)| {
            let mut v = v.clone();
            v.sort_by(f64::total_cmp);
            let n = v.len().max(1) as f64;
            Series {
                name: p.clone(),
                points: v
                    .iter()
                    .enumerate()
                    .map(|(i, &x)| (x, (i + 1) as f64 / n))
                    .collect(),
            }
        })
        .collect();
    Ok(vec![
        (
            "jct-cdf".into(),
            Chart::Line(LineChart {
                title: "Job completion time, cumulative".into(),
                x_label: "JCT (minutes from submission)".into(),
                y_label: "fraction of jobs finished".into(),
                series: cdf,
                steps: false,
            }),
        ),
        (
            "jct-mean".into(),
            Chart::Bar(BarChart {
                title: "Mean job completion time by policy".into(),
                y_label: "mean JCT (minutes)".into(),
                bars: groups.iter().map(|(p, v)| (p.clone(), mean(v))).collect(),
            }),
        ),
    ])
}

/// KALE Table 3's figures per stream policy.
fn simulation_streams(t: &Table) -> Result<Vec<(String, Chart)>> {
    let policies = t.text("policy")?;
    let hours = by_policy(&policies, &t.numbers("hours")?);
    let violation = by_policy(&policies, &t.numbers("violation_s")?);
    let lag = by_policy(&policies, &t.numbers("accumulated_lag_min")?);
    let worker_hours = by_policy(&policies, &t.numbers("worker_hours")?);
    let sum = |v: &[f64]| v.iter().sum::<f64>();
    let bars = |g: &[(String, Vec<f64>)], f: &dyn Fn(usize, &[f64]) -> f64| {
        g.iter()
            .enumerate()
            .map(|(i, (p, v))| (p.clone(), f(i, v)))
            .collect::<Vec<_>>()
    };
    Ok(vec![
        (
            "stream-violation".into(),
            Chart::Bar(BarChart {
                title: "Time above the lag SLO (KALE Table 3)".into(),
                y_label: "SLO violation (% of time)".into(),
                bars: bars(&violation, &|i, v| {
                    100.0 * sum(v) / (3600.0 * sum(&hours[i].1)).max(1e-9)
                }),
            }),
        ),
        (
            "stream-lag".into(),
            Chart::Bar(BarChart {
                title: "Accumulated lag (KALE Eq. 11)".into(),
                y_label: "lag-minutes summed per minute".into(),
                bars: bars(&lag, &|_, v| sum(v)),
            }),
        ),
        (
            "stream-worker-hours".into(),
            Chart::Bar(BarChart {
                title: "Worker-hours held by the streams".into(),
                y_label: "worker-hours".into(),
                bars: bars(&worker_hours, &|_, v| sum(v)),
            }),
        ),
    ])
}

/// A finished job's scaling decisions: the throughput measured before and after each
/// against the plan's prediction, and the workers over time; for an online job, its
/// worker count and the load planned for.
fn job_charts(v: &serde_json::Value) -> Vec<(String, Chart)> {
    let mut charts = Vec::new();
    let f = |x: &serde_json::Value| x.as_f64();
    let scaling = v["autoscale"]["scaling"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !scaling.is_empty() {
        let at = |r: &serde_json::Value| f(&r["at_s"]).unwrap_or(0.0);
        let series = |name: &str, key: &str| Series {
            name: name.into(),
            points: scaling
                .iter()
                .filter_map(|r| f(&r[key]).map(|y| (at(r), y)))
                .collect(),
        };
        charts.push((
            "scaling-throughput".into(),
            Chart::Line(LineChart {
                title: "Throughput at each scaling decision".into(),
                x_label: "seconds since the job started".into(),
                y_label: "samples/s".into(),
                series: vec![
                    series("measured before", "measured_before"),
                    series("predicted", "predicted"),
                    series("measured after", "measured_after"),
                ],
                steps: false,
            }),
        ));
        let mut workers = Vec::new();
        if let Some(first) = scaling.first() {
            workers.push((0.0, f(&first["before"][0]).unwrap_or(0.0)));
        }
        workers.extend(
            scaling
                .iter()
                .filter_map(|r| f(&r["after"][0]).map(|w| (at(r), w))),
        );
        charts.push((
            "scaling-workers".into(),
            Chart::Line(LineChart {
                title: "Workers over the run".into(),
                x_label: "seconds since the job started".into(),
                y_label: "workers".into(),
                series: vec![Series {
                    name: "workers".into(),
                    points: workers,
                }],
                steps: true,
            }),
        ));
    }
    let decisions = v["online"]["decisions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !decisions.is_empty() {
        let at = |d: &serde_json::Value| f(&d["at_s"]).unwrap_or(0.0);
        charts.push((
            "online-workers".into(),
            Chart::Line(LineChart {
                title: "Online job: workers chosen each interval".into(),
                x_label: "seconds since the job started".into(),
                y_label: "workers".into(),
                series: vec![Series {
                    name: "target".into(),
                    points: decisions
                        .iter()
                        .filter_map(|d| f(&d["target"]).map(|w| (at(d), w)))
                        .collect(),
                }],
                steps: true,
            }),
        ));
        charts.push((
            "online-load".into(),
            Chart::Line(LineChart {
                title: "Online job: load planned for".into(),
                x_label: "seconds since the job started".into(),
                y_label: "messages/s".into(),
                series: vec![Series {
                    name: "load".into(),
                    points: decisions
                        .iter()
                        .filter_map(|d| f(&d["load"]).map(|l| (at(d), l)))
                        .collect(),
                }],
                steps: false,
            }),
        ));
    }
    charts.extend(progressive_chart(v));
    charts
}

/// The progressive AUC over the job (a batch job's `progressive`, an online job's
/// `online.progressive`), a line per task of a multi-task model.
fn progressive_chart(v: &serde_json::Value) -> Option<(String, Chart)> {
    let history = v["progressive"]["history"]
        .as_array()
        .or_else(|| v["online"]["progressive"]["history"].as_array())
        .filter(|h| !h.is_empty())?;
    // The AUC `auc_of` finds in each window, against the window's time.
    let line = |name: String, auc_of: &dyn Fn(&serde_json::Value) -> &serde_json::Value| Series {
        name,
        points: history
            .iter()
            .filter_map(|w| {
                auc_of(w)
                    .as_f64()
                    .map(|a| (w["at_s"].as_f64().unwrap_or(0.0), a))
            })
            .collect(),
    };
    let tasks = history
        .iter()
        .map(|w| w["tasks"].as_array().map_or(0, Vec::len))
        .max()
        .unwrap_or(0);
    let series = if tasks > 1 {
        (0..tasks)
            .map(|t| line(format!("task {t}"), &|w| &w["tasks"][t]["auc"]))
            .collect()
    } else {
        vec![line("AUC".into(), &|w| &w["auc"])]
    };
    series.iter().any(|s| !s.points.is_empty()).then(|| {
        (
            "progressive-auc".into(),
            Chart::Line(LineChart {
                title: "Progressive validation AUC (each window before it is trained)".into(),
                x_label: "seconds since the job started".into(),
                y_label: "AUC".into(),
                series,
                steps: false,
            }),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `train` run's records become its loss and AUC charts over the samples trained;
    /// of a directory trained into twice, the second run.
    #[test]
    fn a_train_runs_metrics_become_loss_and_auc_over_samples() {
        let rec = |event: &str, samples: u64, loss: f64, auc: f64| {
            serde_json::json!({"event": event, "samples": samples, "train_loss": loss,
                "logloss": loss + 0.01, "auc": auc})
        };
        let records = vec![
            rec("epoch", 1000, 0.9, 0.5),
            rec("eval", 500, 0.6, 0.7),
            rec("eval", 1000, 0.5, 0.75),
            rec("validation", 1000, 0.52, 0.74),
            rec("epoch", 2000, 0.45, 0.78),
        ];
        let charts = train_charts(&records);
        let names: Vec<&str> = charts.iter().map(|c| c.0.as_str()).collect();
        assert_eq!(names, ["train-loss", "train-auc"]);
        let Chart::Line(auc) = &charts[1].1 else {
            panic!("a line chart")
        };
        assert_eq!(auc.x_label, "samples trained");
        assert_eq!(
            auc.series[0].points,
            vec![(500.0, 0.7), (1000.0, 0.75), (2000.0, 0.78)],
            "the second run's evaluations"
        );
        assert_eq!(auc.series[1].points, vec![(1000.0, 0.74)]);
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("metrics.jsonl");
        std::fs::write(&f, "{\"samples\": 1}\nnot json\n").unwrap();
        let err = read_jsonl(&f).unwrap_err().to_string();
        assert!(err.contains("metrics.jsonl:2"), "{err}");
    }

    #[test]
    fn a_missing_column_or_a_bad_number_names_the_file_and_line() {
        let f = Path::new("jobs.csv");
        let t = Table::parse(f, "policy,jct\nes,3\n").unwrap();
        let e = simulation_batch(&t).err().unwrap().to_string();
        assert!(e.contains("jobs.csv:1: no column `jct_min`"), "{e}");
        let t = Table::parse(f, "policy,jct_min\nes,3\nes,x\n").unwrap();
        let e = simulation_batch(&t).err().unwrap().to_string();
        assert!(e.contains("jobs.csv:3: column `jct_min` holds `x`"), "{e}");
    }

    #[test]
    fn a_multi_task_jobs_progressive_auc_is_a_line_per_task() {
        let window = |at: f64, a0: f64, a1: Option<f64>| {
            serde_json::json!({"at_s": at, "auc": a0, "logloss": 0.4, "tasks": [
                {"auc": a0, "logloss": 0.4, "positive_rate": 0.2},
                {"auc": a1, "logloss": 0.1, "positive_rate": 0.05}]})
        };
        let online = serde_json::json!({"online": {"progressive": {"history": [
            window(1.0, 0.6, None),
            window(2.0, 0.7, Some(0.65)),
        ]}}});
        let charts = job_charts(&online);
        let (name, Chart::Line(c)) = &charts[0] else {
            panic!("a line chart: {charts:?}")
        };
        assert_eq!(name, "progressive-auc");
        let lines: Vec<_> = c
            .series
            .iter()
            .map(|s| (s.name.as_str(), s.points.clone()))
            .collect();
        assert_eq!(
            lines,
            vec![
                ("task 0", vec![(1.0, 0.6), (2.0, 0.7)]),
                ("task 1", vec![(2.0, 0.65)])
            ]
        );
        // One task: one line; no history, no chart.
        let batch = serde_json::json!({"progressive": {"history": [
            {"at_s": 3.0, "auc": 0.8, "logloss": 0.4}]}});
        let Chart::Line(c) = &job_charts(&batch)[0].1 else {
            panic!("a line chart")
        };
        assert_eq!(c.series[0].name, "AUC");
        assert_eq!(c.series[0].points, vec![(3.0, 0.8)]);
        assert!(job_charts(&serde_json::json!({"progressive": {"history": []}})).is_empty());
    }

    #[test]
    fn the_jct_cdf_ends_at_one_per_policy_and_skips_jobs_that_did_not_end() {
        let t = Table::parse(
            Path::new("jobs.csv"),
            "policy,jct_min\nes,30\nes,10\nes,\nkale,5\n",
        )
        .unwrap();
        let charts = simulation_batch(&t).unwrap();
        let Chart::Line(cdf) = &charts[0].1 else {
            panic!("a line chart")
        };
        assert_eq!(cdf.series[0].name, "es");
        assert_eq!(cdf.series[0].points, vec![(10.0, 0.5), (30.0, 1.0)]);
        let Chart::Bar(m) = &charts[1].1 else {
            panic!("a bar chart")
        };
        assert_eq!(m.bars, vec![("es".into(), 20.0), ("kale".into(), 5.0)]);
    }
}
