//! Runs every policy on one trace and reports in the papers' layout: DLRover-RM's JCT and
//! utilization, KALE's Table 3 (SLO violation, accumulated lag, downtime, worker-hours).

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use super::batch::{self, BatchTotals, JobOutcome};
use super::online::{self, StreamOutcome};
use super::trace::{JobKind, JobRecord};
use super::{BatchPolicy, OnlinePolicy, SimSettings};

/// One batch policy's row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BatchRow {
    /// Policy.
    pub policy: BatchPolicy,
    /// Jobs finished and submitted.
    pub finished: usize,
    /// See `finished`.
    pub submitted: usize,
    /// Job completion time (submission to end), minutes: mean, median, 95th percentile.
    pub jct_mean_min: f64,
    /// See `jct_mean_min`.
    pub jct_median_min: f64,
    /// See `jct_mean_min`.
    pub jct_p95_min: f64,
    /// Mean wait in the queue, minutes.
    pub wait_mean_min: f64,
    /// Cores allocated to jobs over the cluster's cores (time average).
    pub cpu_allocated: f64,
    /// Cores computing over cores allocated (DLRover-RM's CPU utilization).
    pub cpu_utilization: f64,
    /// Memory used over memory allocated (DLRover-RM's memory utilization).
    pub mem_utilization: f64,
    /// Core-hours held by jobs.
    pub core_hours: f64,
    /// Node failures, OOMs and scaling actions, summed over jobs.
    pub failures: u32,
    /// See `failures`.
    pub ooms: u32,
    /// See `failures`.
    pub scalings: u32,
    /// Samples trained twice after rewinds, as a share of all samples.
    pub retrained: f64,
    /// Brain plans (elastrec) and simulated events.
    pub plans: u64,
    /// See `plans`.
    pub events: u64,
    /// Wall time of this policy's simulation, seconds.
    pub wall_s: f64,
}

/// One online policy's row (KALE Table 3).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OnlineRow {
    /// Policy.
    pub policy: OnlinePolicy,
    /// Share of the time a stream's lag was above the SLO.
    pub violation: f64,
    /// Lag summed per minute over all streams, minutes.
    pub accumulated_lag_min: f64,
    /// Minutes stopped by scaling, all streams.
    pub downtime_min: f64,
    /// Worker-hours, all streams.
    pub worker_hours: f64,
    /// Worker count changes, all streams.
    pub changes: u32,
}

/// Jobs that run at least this long (minutes) under the well-tuned configuration are
/// "long": the regime of DLRover-RM's experiments, where a ramp-up is amortized.
pub const LONG_JOB_MIN: f64 = 100.0;

/// Everything one `simulate cluster` run produced.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterReport {
    /// The settings.
    pub settings: SimSettings,
    /// Batch and online jobs in the trace.
    pub batch_jobs: usize,
    /// See `batch_jobs`.
    pub online_jobs: usize,
    /// One row per batch policy, in the order asked.
    pub batch: Vec<BatchRow>,
    /// One row per online policy.
    pub online: Vec<OnlineRow>,
    /// Every batch job under every policy.
    #[serde(skip)]
    pub jobs: Vec<(BatchPolicy, JobOutcome)>,
    /// Every stream under every policy.
    #[serde(skip)]
    pub streams: Vec<(OnlinePolicy, StreamOutcome)>,
    /// Wall time of the whole run, seconds, and events per second.
    pub wall_s: f64,
    /// See `wall_s`.
    pub events_per_s: f64,
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let k = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[k]
}

fn batch_row(
    policy: BatchPolicy,
    jobs: &[JobOutcome],
    totals: &BatchTotals,
    samples: f64,
    wall_s: f64,
) -> BatchRow {
    let mut jct: Vec<f64> = jobs
        .iter()
        .filter_map(|j| j.end_s.map(|e| (e - j.submit_s) / 60.0))
        .collect();
    jct.sort_by(f64::total_cmp);
    let waits: Vec<f64> = jobs
        .iter()
        .filter_map(|j| j.start_s.map(|s| (s - j.submit_s) / 60.0))
        .collect();
    let mean = |v: &[f64]| {
        if v.is_empty() {
            f64::NAN
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    BatchRow {
        policy,
        finished: jct.len(),
        submitted: jobs.len(),
        jct_mean_min: mean(&jct),
        jct_median_min: percentile(&jct, 0.5),
        jct_p95_min: percentile(&jct, 0.95),
        wait_mean_min: mean(&waits),
        cpu_allocated: ratio(totals.cpu_alloc_s, totals.cpu_capacity_s),
        cpu_utilization: ratio(totals.cpu_used_s, totals.cpu_alloc_s),
        mem_utilization: ratio(totals.mem_used_s, totals.mem_alloc_s),
        core_hours: jobs.iter().map(|j| j.core_hours).sum(),
        failures: jobs.iter().map(|j| j.failures).sum(),
        ooms: jobs.iter().map(|j| j.ooms).sum(),
        scalings: jobs.iter().map(|j| j.scalings).sum(),
        retrained: ratio(jobs.iter().map(|j| j.retrained).sum(), samples),
        plans: totals.plans,
        events: totals.events,
        wall_s,
    }
}

fn online_row(policy: OnlinePolicy, streams: &[StreamOutcome]) -> OnlineRow {
    let seconds: f64 = streams.iter().map(|s| s.seconds).sum();
    OnlineRow {
        policy,
        violation: if seconds > 0.0 {
            streams.iter().map(|s| s.violation_s).sum::<f64>() / seconds
        } else {
            0.0
        },
        accumulated_lag_min: streams.iter().map(|s| s.accumulated_lag_min).sum(),
        downtime_min: streams.iter().map(|s| s.downtime_min).sum(),
        worker_hours: streams.iter().map(|s| s.worker_hours).sum(),
        changes: streams.iter().map(|s| s.changes).sum(),
    }
}

/// Runs the batch jobs of `trace` under each of `batch_policies` and its online jobs under
/// each of `online_policies`, every run on a fresh cluster of `s.nodes` nodes.
/// `progress(policy, fraction)` is called as runs go.
pub fn run_cluster(
    trace: &[JobRecord],
    batch_policies: &[BatchPolicy],
    online_policies: &[OnlinePolicy],
    s: &SimSettings,
    progress: &dyn Fn(&str, f64),
) -> ClusterReport {
    let started = std::time::Instant::now();
    let batch_jobs: Vec<JobRecord> = trace
        .iter()
        .filter(|j| j.kind == JobKind::Batch)
        .cloned()
        .collect();
    let streams: Vec<JobRecord> = trace
        .iter()
        .filter(|j| j.kind == JobKind::Online)
        .cloned()
        .collect();
    let samples: f64 = batch_jobs.iter().map(|j| j.samples as f64).sum();
    let mut report = ClusterReport {
        settings: s.clone(),
        batch_jobs: batch_jobs.len(),
        online_jobs: streams.len(),
        batch: Vec::new(),
        online: Vec::new(),
        jobs: Vec::new(),
        streams: Vec::new(),
        wall_s: 0.0,
        events_per_s: 0.0,
    };
    let mut events = 0u64;
    if !batch_jobs.is_empty() {
        for &p in batch_policies {
            let t0 = std::time::Instant::now();
            let (outcomes, totals) = batch::run(&batch_jobs, p, s, &|f| progress(p.name(), f));
            events += totals.events;
            report.batch.push(batch_row(
                p,
                &outcomes,
                &totals,
                samples,
                t0.elapsed().as_secs_f64(),
            ));
            report.jobs.extend(outcomes.into_iter().map(|o| (p, o)));
        }
    }
    if !streams.is_empty() {
        for &p in online_policies {
            let out = online::run(&streams, p, s, &|f| progress(p.name(), f));
            events +=
                out.len() as u64 * (out.first().map_or(0.0, |o| o.seconds) / s.control_s) as u64;
            report.online.push(online_row(p, &out));
            report.streams.extend(out.into_iter().map(|o| (p, o)));
        }
    }
    report.wall_s = started.elapsed().as_secs_f64();
    report.events_per_s = events as f64 / report.wall_s.max(1e-9);
    report
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

fn change(a: f64, b: f64) -> String {
    if b > 0.0 && a.is_finite() {
        format!("{:+.1}%", 100.0 * (a - b) / b)
    } else {
        "-".into()
    }
}

impl ClusterReport {
    /// The tables and the comparisons the papers make, as text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let s = &self.settings;
        let _ = writeln!(
            out,
            "cluster: {} nodes x {} cores / {} GiB; {} batch jobs, {} online jobs; seed {}",
            s.nodes, s.node_cpu, s.node_mem_gb, self.batch_jobs, self.online_jobs, s.seed
        );
        if !self.batch.is_empty() {
            let base = self
                .batch
                .iter()
                .find(|r| r.policy == BatchPolicy::Elastrec)
                .map(|r| r.jct_mean_min);
            let _ = writeln!(out, "\nBatch jobs (DLRover-RM §6: JCT and utilization)");
            let _ = writeln!(
                out,
                "{:<13} {:>9} {:>9} {:>9} {:>9} {:>12} {:>8} {:>8} {:>8} {:>8} {:>11} {:>6} {:>5} {:>7}",
                "policy", "finished", "JCT mean", "median", "p95", "elastrec vs", "wait", "CPU alloc", "CPU util", "mem util", "core-hours", "fails", "OOMs", "scales"
            );
            for r in &self.batch {
                let _ = writeln!(
                    out,
                    "{:<13} {:>9} {:>9.1} {:>9.1} {:>9.1} {:>12} {:>8.1} {:>8} {:>8} {:>8} {:>11.0} {:>6} {:>5} {:>7}",
                    r.policy.name(),
                    format!("{}/{}", r.finished, r.submitted),
                    r.jct_mean_min,
                    r.jct_median_min,
                    r.jct_p95_min,
                    base.map_or("-".into(), |b| change(b, r.jct_mean_min)),
                    r.wait_mean_min,
                    pct(r.cpu_allocated),
                    pct(r.cpu_utilization),
                    pct(r.mem_utilization),
                    r.core_hours,
                    r.failures,
                    r.ooms,
                    r.scalings
                );
            }
            let _ = writeln!(
                out,
                "(JCT in minutes from submission; `elastrec vs`: elastrec's mean JCT against the row's; CPU alloc: cores held / cluster; CPU util: cores computing / cores held)"
            );
        }
        if !self.online.is_empty() {
            let _ = writeln!(out, "\nOnline jobs (KALE Table 3)");
            let _ = writeln!(
                out,
                "{:<12} {:>15} {:>22} {:>15} {:>13} {:>8}",
                "policy",
                "violation rate",
                "accumulated lag (min)",
                "downtime (min)",
                "worker-hours",
                "changes"
            );
            for r in &self.online {
                let _ = writeln!(
                    out,
                    "{:<12} {:>15} {:>22.0} {:>15.0} {:>13.0} {:>8}",
                    r.policy.name(),
                    pct(r.violation),
                    r.accumulated_lag_min,
                    r.downtime_min,
                    r.worker_hours,
                    r.changes
                );
            }
        }
        let claims = self.claims();
        if !claims.is_empty() {
            let _ = writeln!(out, "\nAgainst the papers' headline results");
            for c in claims {
                let _ = writeln!(
                    out,
                    "- {}: paper {}, elastrec {} [{}]",
                    c.claim,
                    c.paper,
                    c.simulated,
                    if c.same_direction {
                        "same direction"
                    } else {
                        "NOT the paper's direction"
                    }
                );
            }
        }
        let _ = writeln!(
            out,
            "\nsimulated in {:.1} s ({:.0} events/s)",
            self.wall_s, self.events_per_s
        );
        out
    }

    /// elastrec's total JCT over the well-tuned configuration's, less one, over the jobs
    /// that run at least `min_minutes` under the latter and finish under both; with their
    /// count. `None` without such jobs.
    fn long_jobs_vs_tuned(&self, min_minutes: f64) -> Option<(f64, usize)> {
        let jct = |o: &JobOutcome| o.end_s.map(|e| (e - o.submit_s) / 60.0);
        let tuned: std::collections::HashMap<&str, f64> = self
            .jobs
            .iter()
            .filter(|(p, _)| *p == BatchPolicy::StaticTuned)
            .filter_map(|(_, o)| Some((o.job_id.as_str(), jct(o)?)))
            .filter(|(_, m)| *m >= min_minutes)
            .collect();
        let (mut e_sum, mut t_sum, mut n) = (0.0, 0.0, 0);
        for (_, o) in self
            .jobs
            .iter()
            .filter(|(p, _)| *p == BatchPolicy::Elastrec)
        {
            if let (Some(t), Some(e)) = (tuned.get(o.job_id.as_str()), jct(o)) {
                e_sum += e;
                t_sum += t;
                n += 1;
            }
        }
        (n > 0).then(|| (e_sum / t_sum - 1.0, n))
    }

    /// Each headline claim of the papers with the simulated figure.
    pub fn claims(&self) -> Vec<Claim> {
        let mut out = Vec::new();
        let b = |p: BatchPolicy| self.batch.iter().find(|r| r.policy == p);
        if let Some(e) = b(BatchPolicy::Elastrec) {
            for (p, paper, name) in [
                (BatchPolicy::Es, "-17.7%", "JCT vs ES"),
                (BatchPolicy::Optimus, "-28.5%", "JCT vs Optimus"),
                (
                    BatchPolicy::StaticTuned,
                    "+1.4%",
                    "JCT vs well-tuned static",
                ),
            ] {
                if let Some(o) = b(p) {
                    let d = (e.jct_mean_min - o.jct_mean_min) / o.jct_mean_min;
                    out.push(Claim {
                        claim: name.into(),
                        paper: paper.into(),
                        simulated: format!("{:+.1}%", 100.0 * d),
                        same_direction: if p == BatchPolicy::StaticTuned {
                            d < 0.05
                        } else {
                            d < 0.0
                        },
                    });
                }
            }
            if let Some((d, n)) = self.long_jobs_vs_tuned(LONG_JOB_MIN) {
                out.push(Claim {
                    claim: format!(
                        "JCT vs well-tuned static, the {n} jobs of {LONG_JOB_MIN:.0}+ min under it (the paper's jobs run for hours)"
                    ),
                    paper: "+1.4%".into(),
                    simulated: format!("{:+.1}%", 100.0 * d),
                    same_direction: d < 0.05,
                });
            }
            if let Some(u) = b(BatchPolicy::StaticUser) {
                out.push(Claim {
                    claim: "CPU utilization vs users' static configurations".into(),
                    paper: "+21.0..27.6 points".into(),
                    simulated: format!(
                        "{:+.1} points",
                        100.0 * (e.cpu_utilization - u.cpu_utilization)
                    ),
                    same_direction: e.cpu_utilization > u.cpu_utilization,
                });
                out.push(Claim {
                    claim: "memory utilization vs users' static configurations".into(),
                    paper: "+17.3..31.6 points".into(),
                    simulated: format!(
                        "{:+.1} points",
                        100.0 * (e.mem_utilization - u.mem_utilization)
                    ),
                    same_direction: e.mem_utilization > u.mem_utilization,
                });
            }
        }
        let o = |p: OnlinePolicy| self.online.iter().find(|r| r.policy == p);
        if let (Some(k), Some(h)) = (o(OnlinePolicy::Kale), o(OnlinePolicy::Hpa)) {
            out.push(Claim {
                claim: "SLO violation rate, KALE vs HPA".into(),
                paper: "2.6% vs 19.57%".into(),
                simulated: format!("{} vs {}", pct(k.violation), pct(h.violation)),
                same_direction: k.violation <= h.violation,
            });
            for (name, paper, a, bb) in [
                (
                    "accumulated lag, KALE vs HPA",
                    "-69.2%",
                    k.accumulated_lag_min,
                    h.accumulated_lag_min,
                ),
                (
                    "downtime, KALE vs HPA",
                    "-33.1%",
                    k.downtime_min,
                    h.downtime_min,
                ),
                (
                    "worker-hours, KALE vs HPA",
                    "-9.7% (242 vs 268 GPU-hours)",
                    k.worker_hours,
                    h.worker_hours,
                ),
            ] {
                out.push(Claim {
                    claim: name.into(),
                    paper: paper.into(),
                    simulated: change(a, bb),
                    same_direction: a <= bb,
                });
            }
        }
        out
    }

    /// Writes `summary.json`, `jobs.csv` and `streams.csv` into `dir`.
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let summary = serde_json::json!({
            "report": self,
            "claims": self.claims(),
        });
        std::fs::write(
            dir.join("summary.json"),
            serde_json::to_string_pretty(&summary).map_err(std::io::Error::other)?,
        )?;
        let mut jobs = String::from(
            "policy,job_id,submit_s,start_s,end_s,jct_min,failures,ooms,scalings,workers,ps,worker_cpu,ps_cpu,core_hours\n",
        );
        let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.1}"));
        for (p, j) in &self.jobs {
            let a = j.last;
            let _ = writeln!(
                jobs,
                "{},{},{:.1},{},{},{},{},{},{},{},{},{},{},{:.2}",
                p.name(),
                j.job_id,
                j.submit_s,
                opt(j.start_s),
                opt(j.end_s),
                opt(j.end_s.map(|e| (e - j.submit_s) / 60.0)),
                j.failures,
                j.ooms,
                j.scalings,
                a.map_or(String::new(), |a| a.workers.to_string()),
                a.map_or(String::new(), |a| a.ps.to_string()),
                a.map_or(String::new(), |a| a.worker_cpu.to_string()),
                a.map_or(String::new(), |a| a.ps_cpu.to_string()),
                j.core_hours
            );
        }
        std::fs::write(dir.join("jobs.csv"), jobs)?;
        let mut streams = String::from(
            "policy,job_id,hours,violation_s,accumulated_lag_min,downtime_min,worker_hours,changes\n",
        );
        for (p, s) in &self.streams {
            let _ = writeln!(
                streams,
                "{},{},{:.2},{:.0},{:.1},{:.1},{:.2},{}",
                p.name(),
                s.job_id,
                s.seconds / 3600.0,
                s.violation_s,
                s.accumulated_lag_min,
                s.downtime_min,
                s.worker_hours,
                s.changes
            );
        }
        std::fs::write(dir.join("streams.csv"), streams)
    }
}

/// One headline result of a paper against the simulation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Claim {
    /// What is compared.
    pub claim: String,
    /// The paper's figure.
    pub paper: String,
    /// elastrec's figure on this trace.
    pub simulated: String,
    /// Whether elastrec moved in the paper's direction.
    pub same_direction: bool,
}
