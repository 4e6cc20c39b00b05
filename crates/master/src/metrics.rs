//! Prometheus metrics of the master, served on `/metrics`.

use std::sync::atomic::AtomicU64;

use elastrec_proto::master::StatusResponse;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;

fn method_label(method: &str) -> Labels {
    vec![("method".to_string(), method.to_string())]
}

/// The master's metrics.
pub struct Metrics {
    registry: Registry,
    requests: Family<Labels, Counter>,
    shards: Family<Labels, Gauge>,
    samples_done: Gauge,
    samples_per_sec: Gauge<f64, AtomicU64>,
    workers: Gauge,
    /// Nodes declared dead.
    pub node_deaths: Counter,
    /// Silent nodes that answered a direct probe and were kept.
    pub probe_saves: Counter,
    /// Unreported remainders returned to the queue.
    pub requeues: Counter,
    /// Scrapes that found the job's state locked and served the previous refresh.
    pub stale_scrapes: Counter,
    /// The per-method request counters, resolved once (no allocation per request).
    by_method: Vec<(&'static str, Counter)>,
    /// Online jobs: per partition, the age of the oldest untrained message and backlog.
    partition_lag: Family<Labels, Gauge<f64, AtomicU64>>,
    partition_backlog: Family<Labels, Gauge>,
    /// Online jobs: job-wide stream figures (KALE Table 3), one gauge each.
    stream: Vec<FloatGauge>,
    /// Progressive validation over the window, by task (`task="0"` first).
    progressive: Vec<Family<Labels, FloatGauge>>,
    progressive_samples: Gauge,
    /// Parameter servers running.
    ps: Gauge,
    /// The newest checkpoint's age, the interval in force, and CPR's portion of lost
    /// samples (absent metrics while checkpoints are off).
    checkpoint_age: FloatGauge,
    checkpoint_interval: FloatGauge,
    checkpoint_pls: FloatGauge,
    process: elastrec_metrics::process::ProcessMetrics,
}

/// The stream gauges: name under `elastrec_master_`, help.
const STREAM_GAUGES: [(&str, &str); 5] = [
    (
        "stream_lag_seconds",
        "Online jobs: the job's lag, the largest partition lag",
    ),
    (
        "stream_arrival_messages_per_second",
        "Online jobs: messages arriving, all partitions",
    ),
    (
        "stream_slo_violation_ratio",
        "Online jobs: share of the observed time with the lag above the SLO",
    ),
    (
        "stream_accumulated_lag_seconds",
        "Online jobs: the lag integrated over time (seconds of lag per second, summed)",
    ),
    (
        "stream_downtime_seconds",
        "Online jobs: time messages waited while no worker trained",
    ),
];

/// The progressive-validation gauges (by task): name under `elastrec_master_`, help.
const PROGRESSIVE_GAUGES: [(&str, &str); 4] = [
    (
        "progressive_auc",
        "Progressive validation: AUC over the window, by task (NaN: one class)",
    ),
    (
        "progressive_logloss",
        "Progressive validation: mean log loss over the window, by task",
    ),
    (
        "progressive_normalized_entropy",
        "Progressive validation: log loss over the entropy of the window's click rate, by task",
    ),
    (
        "progressive_calibration_ratio",
        "Progressive validation: predicted over actual clicks in the window, by task",
    ),
];

/// The RPC methods counted by [`Metrics::request`].
pub const METHODS: [&str; 7] = [
    "register",
    "heartbeat",
    "get_task",
    "report_progress",
    "report_eval",
    "scale",
    "status",
];

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every metric registered.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("elastrec_master");
        let requests = Family::<Labels, Counter>::default();
        registry.register("requests", "RPCs served, by method", requests.clone());
        let shards = Family::<Labels, Gauge>::default();
        registry.register("shards", "Data shards by state", shards.clone());
        let samples_done = Gauge::default();
        registry.register(
            "samples_done",
            "Samples reported trained",
            samples_done.clone(),
        );
        let samples_per_sec = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "samples_per_second",
            "Recent training rate",
            samples_per_sec.clone(),
        );
        let workers = Gauge::default();
        registry.register("workers_active", "Workers training", workers.clone());
        let node_deaths = Counter::default();
        registry.register("node_deaths", "Nodes declared dead", node_deaths.clone());
        let probe_saves = Counter::default();
        registry.register(
            "probe_saves",
            "Silent nodes that answered a direct probe and were kept",
            probe_saves.clone(),
        );
        let requeues = Counter::default();
        registry.register(
            "requeues",
            "Unreported remainders requeued",
            requeues.clone(),
        );
        let stale_scrapes = Counter::default();
        registry.register(
            "stale_scrapes",
            "Scrapes that found the job's state locked and served the gauges of the previous refresh",
            stale_scrapes.clone(),
        );
        let partition_lag = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "stream_partition_lag_seconds",
            "Online jobs: age of the oldest untrained message, by partition",
            partition_lag.clone(),
        );
        let partition_backlog = Family::<Labels, Gauge>::default();
        registry.register(
            "stream_partition_backlog",
            "Online jobs: messages waiting, by partition",
            partition_backlog.clone(),
        );
        let stream = STREAM_GAUGES
            .iter()
            .map(|&(name, help)| {
                let g = Gauge::<f64, AtomicU64>::default();
                registry.register(name, help, g.clone());
                g
            })
            .collect();
        let progressive: Vec<Family<Labels, FloatGauge>> = PROGRESSIVE_GAUGES
            .iter()
            .map(|&(name, help)| {
                let f = Family::<Labels, Gauge<f64, AtomicU64>>::default();
                registry.register(name, help, f.clone());
                f
            })
            .collect();
        // Task 0's series exist from the start (NaN until the first window), so a
        // dashboard shows a gap rather than no such metric.
        for family in &progressive {
            family
                .get_or_create(&vec![("task".to_string(), "0".to_string())])
                .set(f64::NAN);
        }
        let progressive_samples = Gauge::default();
        registry.register(
            "progressive_window_samples",
            "Progressive validation: samples in the window",
            progressive_samples.clone(),
        );
        let ps = Gauge::default();
        registry.register("ps_active", "Parameter servers running", ps.clone());
        let checkpoint_age = FloatGauge::default();
        registry.register(
            "checkpoint_age_seconds",
            "Age of the newest checkpoint (0: none yet)",
            checkpoint_age.clone(),
        );
        let checkpoint_interval = FloatGauge::default();
        registry.register(
            "checkpoint_interval_seconds",
            "Checkpoint interval in force (CPR: from the target portion of lost samples)",
            checkpoint_interval.clone(),
        );
        let checkpoint_pls = FloatGauge::default();
        registry.register(
            "checkpoint_lost_samples_ratio",
            "Portion of lost samples so far (CPR's PLS, Eq. 3)",
            checkpoint_pls.clone(),
        );
        let process = elastrec_metrics::process::ProcessMetrics::register(&mut registry);
        let by_method = METHODS
            .iter()
            .map(|&m| (m, requests.get_or_create(&method_label(m)).clone()))
            .collect();
        Self {
            by_method,
            registry,
            requests,
            shards,
            samples_done,
            samples_per_sec,
            workers,
            node_deaths,
            probe_saves,
            requeues,
            stale_scrapes,
            partition_lag,
            partition_backlog,
            stream,
            progressive,
            progressive_samples,
            ps,
            checkpoint_age,
            checkpoint_interval,
            checkpoint_pls,
            process,
        }
    }

    /// Updates the online job's gauges.
    pub fn observe_stream(&self, st: &crate::stream_stats::StreamStats) {
        for p in &st.partitions {
            let l = vec![("partition".to_string(), p.partition.clone())];
            self.partition_lag.get_or_create(&l).set(p.lag_s);
            self.partition_backlog
                .get_or_create(&l)
                .set(p.backlog as i64);
        }
        for (g, v) in self.stream.iter().zip([
            st.lag_s,
            st.arrival_rate,
            st.slo_violation_rate,
            st.accumulated_lag_s,
            st.downtime_s,
        ]) {
            g.set(v);
        }
    }

    /// Sets the progressive-validation gauges (`elastrec_master_progressive_*{task=...}`),
    /// task 0's and, for a multi-task job, every other task's.
    pub fn observe_progressive(&self, f: &crate::progressive::WindowFigures) {
        let first = crate::progressive::TaskWindow {
            auc: f.auc,
            logloss: f.logloss,
            positive_rate: f.positive_rate,
            ne: f.ne,
            calibration: f.calibration,
        };
        let tasks = std::iter::once(&first).chain(f.tasks.iter().skip(1));
        for (t, w) in tasks.enumerate() {
            let task = vec![("task".to_string(), t.to_string())];
            let nan = f64::NAN;
            for (family, v) in self.progressive.iter().zip([
                w.auc.unwrap_or(nan),
                w.logloss,
                w.ne.unwrap_or(nan),
                w.calibration.unwrap_or(nan),
            ]) {
                family.get_or_create(&task).set(v);
            }
        }
        self.progressive_samples.set(f.samples as i64);
    }

    /// Counts one request.
    pub fn request(&self, method: &str) {
        if let Some((_, c)) = self.by_method.iter().find(|(m, _)| *m == method) {
            c.inc();
        } else {
            self.requests.get_or_create(&method_label(method)).inc();
        }
    }

    /// Requests counted so far, all methods together.
    pub fn requests_total(&self) -> u64 {
        self.by_method.iter().map(|(_, c)| c.get()).sum()
    }

    /// Updates gauges from a status snapshot.
    pub fn observe(&self, s: &StatusResponse) {
        for (state, v) in [
            ("todo", s.shards_todo),
            ("doing", s.shards_doing),
            ("done", s.shards_done),
        ] {
            self.shards
                .get_or_create(&vec![("state".to_string(), state.to_string())])
                .set(v as i64);
        }
        self.samples_done.set(s.samples_done as i64);
        self.samples_per_sec.set(s.samples_per_sec);
        let active = s
            .nodes
            .iter()
            .filter(|n| {
                n.role == elastrec_proto::master::Role::Worker as i32 && n.state == "running"
            })
            .count();
        self.workers.set(active as i64);
        let ps = s
            .nodes
            .iter()
            .filter(|n| n.role == elastrec_proto::master::Role::Ps as i32 && n.state == "running")
            .count();
        self.ps.set(ps as i64);
        if let Some(c) = &s.checkpoint {
            self.checkpoint_age.set(c.last_age_s);
            self.checkpoint_interval.set(c.interval_s);
            self.checkpoint_pls.set(c.pls);
        }
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        self.process.refresh();
        elastrec_metrics::encode(&self.registry)
    }
}
