//! Online (streaming) training jobs on the cluster, under one scaling policy.
//!
//! Each stream's traffic follows a diurnal trace (the brain's `diurnal_trace`: a daily
//! cycle, a weekend dip, noise) peaking near the job's `peak_rate`. Its workers train
//! `F(w)` samples/s, KALE's asynchronous form `w / (θ0 + θ1/w + θ2·w)` with coefficients
//! drawn per job. Every `control_s` the master measures arrivals, backlog, lag and
//! utilization, and the live [`OnlineScaler`] (KALE or the HPA-like rule) picks the
//! worker count. A change stops the job for `rescale_s` (save, restart, reload, rebuild
//! the consumer group: KALE §2), which is the downtime.

use elastrec_brain::forecast::diurnal_trace;
use elastrec_control::online_scale::{Observation, OnlineScaler, OnlineSettings, Rule};
use rand::Rng;

use super::nodes::{Nodes, Pod};
use super::trace::JobRecord;
use super::{job_rng, OnlinePolicy, SimSettings};

/// Cores and GiB of one online worker.
const WORKER_CPU: f64 = 8.0;
const WORKER_MEM_GB: f64 = 32.0;

/// KALE's metrics (Table 3) for one stream, or summed over streams.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct StreamOutcome {
    /// Job id (empty for a sum).
    pub job_id: String,
    /// Seconds simulated.
    pub seconds: f64,
    /// Seconds with the lag above the SLO.
    pub violation_s: f64,
    /// Lag summed per minute, minutes (KALE Eq. 11).
    pub accumulated_lag_min: f64,
    /// Minutes stopped by scaling.
    pub downtime_min: f64,
    /// Worker-hours held.
    pub worker_hours: f64,
    /// Worker count changes.
    pub changes: u32,
    /// Scale-ups the cluster had no room for.
    pub unplaced: u32,
}

/// The hidden throughput of a stream's workers.
#[derive(Debug, Clone, Copy)]
struct Capacity {
    theta: [f64; 3],
}

impl Capacity {
    fn of(rec: &JobRecord, rng: &mut impl Rng) -> Self {
        // One worker trains about a twelfth of the peak.
        let per = rec.peak_rate / 12.0 * rng.random_range(0.8..1.25);
        let t0 = 1.0 / per;
        Self {
            theta: [
                t0 * 0.9,
                t0 * 0.1 * rng.random_range(0.5..1.5),
                t0 * 0.01 * rng.random_range(0.5..1.5),
            ],
        }
    }

    fn throughput(&self, w: u32) -> f64 {
        let w = f64::from(w.max(1));
        w / (self.theta[0] + self.theta[1] / w + self.theta[2] * w)
    }

    /// Fewest workers whose throughput reaches `load` (at most 64).
    fn workers_for(&self, load: f64) -> u32 {
        (1..=64).find(|&w| self.throughput(w) >= load).unwrap_or(64)
    }
}

struct Stream<'a> {
    rec: &'a JobRecord,
    traffic: Vec<f64>,
    cap: Capacity,
    scaler: Option<OnlineScaler>,
    workers: u32,
    pods: Vec<Pod>,
    backlog: f64,
    down_until: f64,
    out: StreamOutcome,
    rng: rand::rngs::StdRng,
}

/// The live scaler's settings for a simulated stream.
pub fn scaler_settings(rule: Rule, s: &SimSettings) -> OnlineSettings {
    OnlineSettings {
        rule,
        workers: [1, 64],
        interval_s: s.control_s,
        slo_lag_s: s.slo_lag_s,
        // Plan over the time a change takes to come into effect and then some.
        horizon_s: (3.0 * s.rescale_s).max(2.0 * s.control_s),
        season_s: 86_400.0,
        rho: 2,
        tau_s: 1800.0,
        rescale_s: s.rescale_s,
        sync: false,
        // The simulated jobs pause and restart on every change (KALE §3.3).
        change_stops_all: true,
    }
}

/// Runs `trace`'s online jobs under `policy` for their duration; one outcome per stream.
pub fn run(
    trace: &[JobRecord],
    policy: OnlinePolicy,
    s: &SimSettings,
    progress: &dyn Fn(f64),
) -> Vec<StreamOutcome> {
    let mut nodes = Nodes::new(s.nodes, s.node_cpu, s.node_mem_gb);
    let per_day = (86_400.0 / s.control_s).round() as usize;
    let mut streams: Vec<Stream<'_>> = trace
        .iter()
        .map(|rec| {
            let mut rng = job_rng(s.seed, &rec.job_id);
            let cap = Capacity::of(rec, &mut rng);
            let days = (rec.duration_s / 86_400.0).ceil().max(1.0) as usize;
            let traffic = diurnal_trace(days, per_day, rec.peak_rate / 1.75, 0.05, rng.random());
            let scaler = match policy {
                OnlinePolicy::Kale => Some(OnlineScaler::new(&scaler_settings(Rule::Kale, s))),
                OnlinePolicy::Hpa => Some(OnlineScaler::new(&scaler_settings(Rule::Hpa, s))),
                OnlinePolicy::Adequate | OnlinePolicy::StaticUser => None,
            };
            let workers = match policy {
                OnlinePolicy::Adequate => cap.workers_for(rec.peak_rate * 1.1),
                _ => rec.requested.workers,
            };
            Stream {
                rec,
                traffic,
                cap,
                scaler,
                workers,
                pods: Vec::new(),
                backlog: 0.0,
                down_until: 0.0,
                out: StreamOutcome {
                    job_id: rec.job_id.clone(),
                    ..StreamOutcome::default()
                },
                rng,
            }
        })
        .collect();
    for st in &mut streams {
        st.pods = nodes
            .place_all(&[(WORKER_CPU, WORKER_MEM_GB, st.workers)])
            .unwrap_or_default();
        if st.pods.is_empty() {
            st.workers = 0;
        }
    }
    let dt = s.control_s;
    let longest = trace.iter().map(|r| r.duration_s).fold(0.0, f64::max);
    let steps = (longest / dt).ceil() as usize;
    for k in 0..steps {
        let t = k as f64 * dt;
        for st in &mut streams {
            if t >= st.rec.duration_s {
                continue;
            }
            step(st, k, t, dt, s, &mut nodes);
        }
        if k % 60 == 0 {
            progress(k as f64 / steps.max(1) as f64);
        }
    }
    streams.into_iter().map(|s| s.out).collect()
}

fn step(st: &mut Stream<'_>, k: usize, t: f64, dt: f64, s: &SimSettings, nodes: &mut Nodes) {
    let rate = st.traffic.get(k).copied().unwrap_or(0.0);
    let up = (t + dt - st.down_until.max(t)).clamp(0.0, dt);
    let cap = if st.workers > 0 {
        st.cap.throughput(st.workers)
    } else {
        0.0
    };
    let arrived = rate * dt;
    let trained = (st.backlog + arrived).min(cap * up);
    st.backlog += arrived - trained;
    // FIFO: the oldest waiting sample arrived about backlog / rate ago.
    let lag_s = if st.backlog > 0.5 {
        st.backlog / rate.max(1.0)
    } else {
        0.0
    };
    let o = &mut st.out;
    o.seconds += dt;
    if lag_s > s.slo_lag_s {
        o.violation_s += dt;
    }
    o.accumulated_lag_min += lag_s / 60.0 * (dt / 60.0);
    o.downtime_min += (dt - up) / 60.0;
    o.worker_hours += f64::from(st.workers) * dt / 3600.0;
    let Some(scaler) = st.scaler.as_mut() else {
        return;
    };
    // A job restarting for a change is not training: its master does not re-plan it.
    if up < dt {
        return;
    }
    let utilization = if cap * up > 0.0 {
        trained / (cap * up)
    } else {
        0.0
    };
    let noise = 1.0 + 0.03 * (st.rng.random::<f64>() * 2.0 - 1.0);
    let obs = Observation {
        workers: st.workers.max(1),
        arrival_rate: rate,
        backlog: st.backlog,
        lag_s,
        utilization,
        // Workers measured over a whole interval up: their speed while busy.
        capacity: (up >= dt && st.workers > 0).then_some((st.workers, cap * noise)),
    };
    let d = scaler.decide(&obs);
    if d.target == st.workers || d.target == 0 {
        return;
    }
    // Every change restarts the job's workers (downtime), on the cluster's nodes.
    nodes.release(&st.pods);
    match nodes.place_all(&[(WORKER_CPU, WORKER_MEM_GB, d.target)]) {
        Some(p) => {
            st.pods = p;
            st.workers = d.target;
        }
        None => {
            st.out.unplaced += 1;
            nodes.restore(&st.pods);
            return;
        }
    }
    st.out.changes += 1;
    st.down_until = t + dt + s.rescale_s;
}
