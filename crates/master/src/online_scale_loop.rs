//! The loop that scales an online job's workers with its traffic: every `interval_s` it
//! measures (arrival rate and lag from the stream watcher, the workers' busy time from
//! their heartbeats), asks [`OnlineScaler`] and applies the count.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use elastrec_control::online_scale::{Decision, Observation, OnlineScaler, OnlineSettings, Rule};
use elastrec_job::stream::{StreamConfig, StreamScaling};
use serde::Serialize;

use crate::core::MasterCore;
use crate::events::event;
use crate::job::Phase;
use elastrec_brain::traffic::TrafficHistory;

/// One decision, with when it was taken.
#[derive(Debug, Clone, Serialize)]
pub struct ScalingEvent {
    /// Seconds since the loop started.
    pub at_s: f64,
    /// The decision.
    #[serde(flatten)]
    pub decision: Decision,
}

/// The master database's `meta` key of the traffic history.
pub const TRAFFIC_KEY: &str = "traffic_history";
/// The traffic history is persisted about this often (s): a resumed job loses at most
/// this much of it.
const PERSIST_EVERY_S: f64 = 60.0;

/// The scaler's settings from the job's `[stream]` section (`sync` picks KALE's
/// synchronous model).
pub fn settings_of(cfg: &StreamConfig, sync: bool) -> OnlineSettings {
    OnlineSettings {
        rule: match cfg.autoscale {
            StreamScaling::Off => Rule::Off,
            StreamScaling::Kale => Rule::Kale,
            StreamScaling::Hpa => Rule::Hpa,
        },
        workers: cfg.workers,
        interval_s: cfg.interval_s,
        slo_lag_s: cfg.slo_lag_s,
        horizon_s: cfg.horizon_s,
        season_s: cfg.season_s,
        rho: cfg.rho,
        tau_s: cfg.tau_s,
        rescale_s: cfg.rescale_s,
        sync,
        // Asynchronous workers join and leave while the others train; a synchronous step
        // waits for every worker it counts, a joining one included.
        change_stops_all: sync,
    }
}

/// Runs until the job leaves training. `sync` picks KALE's synchronous model.
pub async fn run(core: Arc<MasterCore>, cfg: StreamConfig, sync: bool) {
    let mut scaler = OnlineScaler::new(&settings_of(&cfg, sync));
    if let Some(text) = core.resumed_traffic.get() {
        match serde_json::from_str::<TrafficHistory>(text) {
            Ok(h) => {
                let intervals = h.len();
                if scaler.resume_history(h) {
                    event!("traffic_resumed", intervals,
                        "master: online autoscale goes on with {intervals} intervals of traffic history");
                } else {
                    event!(warn, "traffic_dropped",
                        "master: the stored traffic history was recorded for another season; starting a new one");
                }
            }
            Err(e) => event!(
                warn,
                "traffic_dropped",
                "master: the stored traffic history is unreadable ({e}); starting a new one"
            ),
        }
    }
    let persist_every = (PERSIST_EVERY_S / cfg.interval_s).ceil().max(1.0) as u64;
    let mut decisions = 0u64;
    let every = Duration::from_secs_f64(cfg.interval_s);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let started = Instant::now();
    // Per worker: (samples trained, busy seconds) at the previous tick.
    let mut before: BTreeMap<u32, (u64, f64)> = BTreeMap::new();
    let mut last_change: Option<Instant> = None;
    loop {
        tick.tick().await;
        let (target, running) = {
            let job = core.job.lock();
            if !matches!(job.phase(), Phase::Training) {
                break;
            }
            let running: Vec<u32> = job.running_worker_nodes().map(|n| n.id).collect();
            (job.target_workers(), running)
        };
        let Some(stats) = core.stream_stats.lock().clone() else {
            continue;
        };
        let profiles = core.profiles.lock().clone();
        let interval = every.as_secs_f64();
        let (mut util, mut measured_util, mut capacity, mut measured) = (0.0, 0, 0.0, 0);
        let mut now_seen = BTreeMap::new();
        for id in &running {
            let Some(p) = profiles.get(id) else { continue };
            // Reading counts: a task holds only messages the brokers already have, so a
            // worker waiting on its reader is busy fetching them, not idle.
            let busy = p.read_s + p.compute_s + p.pull_s + p.push_s;
            now_seen.insert(*id, (p.samples, busy));
            let Some(&(b0, s0)) = before.get(id) else {
                continue;
            };
            let (dn, ds) = (p.samples.saturating_sub(b0), (busy - s0).max(0.0));
            util += (ds / interval).min(1.0);
            measured_util += 1;
            if ds > 0.05 * interval && dn > 0 {
                capacity += dn as f64 / ds;
                measured += 1;
            }
        }
        before = now_seen;
        // A throughput sample only from a settled job: every worker measured, none
        // starting or leaving since the last change.
        let settled = last_change.is_none_or(|t| t.elapsed() >= 2 * every);
        let obs = Observation {
            workers: target,
            arrival_rate: stats.arrival_rate,
            backlog: stats.partitions.iter().map(|p| p.backlog as f64).sum(),
            lag_s: stats.lag_s,
            utilization: if measured_util > 0 {
                util / measured_util as f64
            } else {
                0.0
            },
            capacity: (settled
                && measured > 0
                && measured == running.len()
                && measured as u32 == target)
                .then_some((target, capacity)),
        };
        let d = scaler.decide(&obs);
        decisions += 1;
        if decisions.is_multiple_of(persist_every) {
            let text = serde_json::to_string(scaler.history()).expect("serializes");
            // A failed write leaves the previous history: the job goes on either way.
            let _ = core
                .persist(vec![crate::job::Change::Meta(TRAFFIC_KEY, text)])
                .await;
        }
        if d.target != target {
            let to = d.target;
            if core.run(|job, cx| job.scale(to, cx)).await.is_err() {
                break;
            }
            last_change = Some(Instant::now());
            event!("online_scaling", from = target, to, reason = %d.reason,
                "master: online autoscale: {target} -> {to} workers ({})",
                d.reason
            );
        }
        core.online_scaling.lock().push(ScalingEvent {
            at_s: started.elapsed().as_secs_f64(),
            decision: d,
        });
    }
}
