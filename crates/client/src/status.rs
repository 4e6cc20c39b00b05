//! A job's status as people and tools read it: the JSON `elastrec status --json` prints
//! and the dashboard serves, repeated reads of it, and the tables `elastrec status` prints.

use std::path::PathBuf;
use std::time::Duration;

use elastrec_proto::master::{
    AutoscaleStatus, DatasetsStatus, MixStatus, ProgressiveWindow, Role as PbRole, StatusRequest,
    StatusResponse, StreamStatus,
};
use elastrec_rpc::{self as rpc, Master};

use crate::connect::connect_with_timeout;

/// A job's live status as `elastrec status --json` prints it (and the dashboard serves).
pub fn status_value(s: &StatusResponse) -> serde_json::Value {
    let nodes: Vec<serde_json::Value> = s
        .nodes
        .iter()
        .map(|n| {
            serde_json::json!({
                "id": n.node_id, "role": role_name(n.role),
                "state": n.state, "pid": n.pid, "addr": n.addr,
                "metrics_addr": n.metrics_addr,
                "last_heartbeat_ms_ago": n.last_heartbeat_ms_ago, "samples": n.samples,
                "restarts": n.restarts, "task": n.task_id, "step": n.step,
                "profile": n.profile.map(|p| serde_json::json!({
                    "cpu_s": p.cpu_s, "rss_bytes": p.rss_bytes, "threads": p.threads,
                    "batches": p.batches, "samples": p.samples, "compute_s": p.compute_s, "pull_s": p.pull_s,
                    "push_s": p.push_s, "master_s": p.master_s, "read_s": p.read_s,
                    "requests": p.requests, "prefetch_hits": p.prefetch_hits,
                })),
            })
        })
        .collect();
    serde_json::json!({
            "job": s.job_id, "phase": s.phase, "epoch": s.epoch, "epochs": s.epochs,
            "shards": {"todo": s.shards_todo, "doing": s.shards_doing, "done": s.shards_done},
            "samples_done": s.samples_done, "samples_total": s.samples_total,
            "samples_per_sec": s.samples_per_sec, "target_workers": s.target_workers,
            "nodes": nodes,
            "pause": s.paused_at.map(|at| serde_json::json!({"at_samples": at, "held": s.held})),
            "checkpoint": s.checkpoint.as_ref().map(|c| serde_json::json!({
                "count": c.count, "last_id": c.last_id, "last_age_s": c.last_age_s,
                "interval_s": c.interval_s, "pls": c.pls, "recovery": c.recovery,
                "stall_ms": c.stall_ms, "memcpy_ms": c.memcpy_ms,
                "recoveries": c.recoveries, "taking": c.taking,
            })),
            "autoscale": s.autoscale,
            "layout": {"version": s.layout_version, "ps": s.num_ps},
            "reshards": s.reshards,
            "datasets": s.datasets,
            "stream": s.stream,
            "mix": s.mix,
            "progressive": s.progressive,
    })
}

/// Repeated status reads of one job (the dashboard's poller): the job directory's
/// address, token and TLS material are read and the channel opened once, not per read.
pub struct StatusReader {
    dir: PathBuf,
    wait: Duration,
    client: Option<Master>,
}

impl StatusReader {
    /// A reader of the job in `dir`; each call waits at most `wait`.
    pub fn new(dir: PathBuf, wait: Duration) -> Self {
        Self {
            dir,
            wait,
            client: None,
        }
    }

    /// The job's status as `status --json` prints it (`None`: no master answers within
    /// `wait`; its `result.json` or database then says how it ended).
    pub async fn read(&mut self) -> anyhow::Result<Option<serde_json::Value>> {
        let client = match &mut self.client {
            Some(c) => c,
            None => self
                .client
                .insert(connect_with_timeout(&self.dir, self.wait)?),
        };
        let call = client.status(StatusRequest {
            version: rpc::version(),
        });
        match tokio::time::timeout(self.wait, call).await {
            Ok(Ok(r)) => Ok(Some(status_value(&r.into_inner()))),
            _ => {
                // Connect afresh next time: a resumed master serves on a new address.
                self.client = None;
                Ok(None)
            }
        }
    }
}

/// Prints a live status as `elastrec status` shows it: the job's line, a row per node,
/// then what the job's sections report.
pub fn print_table(s: &StatusResponse) {
    println!("job {} ({})", s.job_id, s.phase);
    println!(
        "epoch {}/{}  samples {}/{}  {:.0} samples/s  shards todo {} doing {} done {}  target workers {}",
        s.epoch + 1,
        s.epochs,
        s.samples_done,
        s.samples_total,
        s.samples_per_sec,
        s.shards_todo,
        s.shards_doing,
        s.shards_done,
        s.target_workers
    );
    println!(
        "{:>5}  {:<6}  {:<8}  {:>7}  {:<21}  {:<21}  {:>12}  {:>9}  {:>8}  {:>6}  {:>8}  {:>7}  time split (read/compute/pull/push/master)",
        "node",
        "role",
        "state",
        "pid",
        "addr",
        "metrics",
        "heartbeat",
        "samples",
        "restarts",
        "task",
        "rss MB",
        "cpu s"
    );
    for n in &s.nodes {
        let p = n.profile.unwrap_or_default();
        let busy = p.read_s + p.compute_s + p.pull_s + p.push_s + p.master_s;
        let split = if busy > 0.0 {
            format!(
                "{:.0}/{:.0}/{:.0}/{:.0}/{:.0}%",
                100.0 * p.read_s / busy,
                100.0 * p.compute_s / busy,
                100.0 * p.pull_s / busy,
                100.0 * p.push_s / busy,
                100.0 * p.master_s / busy
            )
        } else {
            "-".into()
        };
        print!(
            "{:>5}  {:<6}  {:<8}  {:>7}  {:<21}  {:<21}  {:>9} ms  {:>9}  {:>8}  {:>6}",
            n.node_id,
            role_name(n.role),
            n.state,
            n.pid,
            n.addr,
            n.metrics_addr,
            n.last_heartbeat_ms_ago,
            n.samples,
            n.restarts,
            n.task_id
        );
        println!(
            "  {:>8.1}  {:>7.1}  {split}",
            p.rss_bytes as f64 / 1e6,
            p.cpu_s
        );
    }
    if let Some(at) = s.paused_at {
        println!(
            "paused at {at} samples: {}",
            if s.held {
                "held (no data handed out; `elastrec unpause` goes on)"
            } else {
                "not reached yet"
            }
        );
    }
    if let Some(c) = &s.checkpoint {
        println!(
            "checkpoints {} (last id {}, {:.1} s ago, every {:.1} s; stall {:.2} ms vs memory copy {:.2} ms)  PS recoveries {}  PLS {:.4}",
            c.count, c.last_id, c.last_age_s, c.interval_s, c.stall_ms, c.memcpy_ms, c.recoveries, c.pls
        );
        println!("recovery policy: {}", c.recovery);
    }
    if let Some(a) = &s.autoscale {
        print_autoscale(a);
    }
    if let Some(d) = &s.datasets {
        print_datasets(d);
    }
    if let Some(st) = &s.stream {
        print_stream(st);
    }
    if let Some(w) = &s.progressive {
        print_progressive(w);
    }
    if let Some(m) = &s.mix {
        print_mix(m);
    }
}

/// A node's role as `elastrec status` names it.
fn role_name(role: i32) -> &'static str {
    match PbRole::try_from(role) {
        Ok(PbRole::Ps) => "ps",
        Ok(PbRole::Executor) => "executor",
        _ => "worker",
    }
}

/// The serving buffers of a job with several sources: one line each.
fn print_mix(mix: &MixStatus) {
    println!("sources ({}):", mix.serving);
    for k in &mix.sources {
        println!(
            "  {k:<20}  {:>8} tasks queued  {:>12} rows served",
            mix.queued.get(k).copied().unwrap_or(0),
            mix.served.get(k).map_or(0, |s| s.rows)
        );
    }
}

/// An online job's part of `elastrec status`.
fn print_stream(st: &StreamStatus) {
    println!(
        "stream: {:.0} messages/s arriving, lag {:.1} s (SLO {:.1} s, violated {:.1}% of {:.0} s), accumulated lag {:.1} s, downtime {:.1} s",
        st.arrival_rate,
        st.lag_s,
        st.slo_lag_s,
        100.0 * st.slo_violation_rate,
        st.observed_s,
        st.accumulated_lag_s,
        st.downtime_s
    );
    println!(
        "  {:<28}  {:>12}  {:>12}  {:>9}  {:>7}  {:>9}  {:>9}",
        "partition", "high", "trained", "backlog", "lag s", "peak lag", "msg/s"
    );
    for p in &st.partitions {
        println!(
            "  {:<28}  {:>12}  {:>12}  {:>9}  {:>7.1}  {:>9.1}  {:>9.0}",
            p.partition, p.high, p.trained, p.backlog, p.lag_s, p.peak_lag_s, p.rate
        );
    }
    if let Some(w) = &st.progressive {
        print_progressive(w);
    }
    if let Some(d) = &st.last_decision {
        println!(
            "  scaling at {:.0} s: {} -> {} workers ({})",
            d.at_s, d.workers, d.target, d.reason
        );
    }
}

/// The progressive-validation lines of `status`.
fn print_progressive(w: &ProgressiveWindow) {
    let auc = |a: Option<f64>| a.map_or("-".to_string(), |x| format!("{x:.4}"));
    println!(
        "  progressive validation at {:.0} s: AUC {} logloss {:.4} over the last {} samples",
        w.at_s,
        auc(w.auc),
        w.logloss,
        w.samples
    );
    for (t, task) in w.tasks.iter().enumerate().skip(1) {
        println!(
            "    task {t}: AUC {} logloss {:.4}",
            auc(task.auc),
            task.logloss
        );
    }
}

/// A following job's part of `elastrec status`.
fn print_datasets(d: &DatasetsStatus) {
    println!(
        "following datasets: {} files, {} partitions landed since the master started; {}",
        d.files,
        d.landed,
        if d.growing {
            "more may land"
        } else {
            "every window is closed and read"
        }
    );
    for p in &d.pending {
        println!(
            "  waiting for {}/{} ({}, {:.0} s)",
            p.dataset,
            p.dir,
            if p.exists {
                "no marker yet"
            } else {
                "not there yet"
            },
            p.waiting_s
        );
    }
}

/// A JSON number with `digits` decimals, `-` where there is none.
fn fixed(v: &serde_json::Value, digits: usize) -> String {
    v.as_f64()
        .map_or("-".to_string(), |x| format!("{x:.digits$}"))
}

/// A finished job's `result.json` as `elastrec status` shows it: how it ended, its ledger
/// and model, and the autoscaler's plans and actions.
pub fn print_result(text: &str) {
    let Ok(r) = serde_json::from_str::<serde_json::Value>(text) else {
        println!("{text}");
        return;
    };
    let num = fixed;
    println!(
        "job {}: {}{} in {} s, {} samples/s; {} workers and {} PS launched",
        r["job_id"].as_str().unwrap_or("?"),
        r["status"].as_str().unwrap_or("?"),
        r["error"]
            .as_str()
            .map_or(String::new(), |e| format!(" ({e})")),
        num(&r["wall_s"], 1),
        num(&r["samples_per_s"], 0),
        r["workers_launched"],
        r["ps_launched"]
    );
    let l = &r["ledger"];
    if l.is_object() {
        println!(
            "ledger: consumed {}, duplicated {}, missing {}",
            l["consumed"], l["duplicated"], l["missing"]
        );
    }
    if r["eval"].is_object() {
        println!(
            "eval: AUC {} logloss {}",
            num(&r["eval"]["auc"], 4),
            num(&r["eval"]["logloss"], 4)
        );
    }
    for c in r["reshards"].as_array().into_iter().flatten() {
        println!(
            "PS {} -> {}: {}",
            c["from"],
            c["to"],
            c["reason"].as_str().unwrap_or_default()
        );
    }
    if let Ok(a) = serde_json::from_value::<AutoscaleStatus>(r["autoscale"].clone()) {
        print_autoscale(&a);
    }
}

/// The autoscaler's part of `elastrec status`.
fn print_autoscale(a: &AutoscaleStatus) {
    let num = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.0}"));
    let bounds = a.bounds.clone().unwrap_or_default();
    // As the JSON prints them: `[1,4]`.
    let range = |v: &[u32]| {
        let v: Vec<String> = v.iter().map(u32::to_string).collect();
        format!("[{}]", v.join(","))
    };
    println!(
        "autoscale: workers in {}, PS in {}; {} profile samples, measured {} samples/s",
        range(&bounds.workers),
        range(&bounds.ps),
        a.profile_samples,
        num(a.measured_samples_per_s)
    );
    if let Some(p) = &a.last_plan {
        let count = |c: Option<u32>| c.map_or("-".to_string(), |c| c.to_string());
        println!(
            "  last plan ({}): {} workers, {} PS, predicted {} samples/s, fit MAPE {}%",
            p.kind,
            count(p.workers),
            count(p.ps),
            num(Some(p.predicted_samples_per_s)),
            p.fit_mape_percent
                .map_or("-".to_string(), |m| format!("{m:.1}"))
        );
        for r in &p.reasons {
            println!("    - {r}");
        }
    }
    if let Some(v) = &a.last_verdict {
        println!("  verdict: {v}");
    }
    if let Some(e) = &a.brain_error {
        println!("  brain: {e} (training goes on with the last plan)");
    }
    if !a.scaling.is_empty() {
        println!(
            "  {:>8}  {:>9}  {:>9}  {:<6}  {:>10}  {:>10}  {:>10}",
            "at s", "workers", "PS", "source", "before/s", "predicted", "after/s"
        );
        for r in &a.scaling {
            let pair = |v: &[u32], i: usize| v.get(i).copied().unwrap_or(0);
            println!(
                "  {:>8.1}  {:>4} -> {:<2}  {:>4} -> {:<2}  {:<6}  {:>10}  {:>10}  {:>10}",
                r.at_s,
                pair(&r.before, 0),
                pair(&r.after, 0),
                pair(&r.before, 1),
                pair(&r.after, 1),
                r.source,
                num(r.measured_before),
                num(r.predicted),
                num(r.measured_after)
            );
        }
    }
}
