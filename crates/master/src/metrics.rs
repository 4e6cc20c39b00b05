//! Prometheus metrics of the master, served on `/metrics`.

use std::sync::atomic::AtomicU64;

use elastrec_proto::master::StatusResponse;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

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
    /// Unreported remainders returned to the queue.
    pub requeues: Counter,
    /// The per-method request counters, resolved once (no allocation per request).
    by_method: Vec<(&'static str, Counter)>,
    /// Online jobs: per partition, the age of the oldest untrained message and backlog.
    partition_lag: Family<Labels, Gauge<f64, AtomicU64>>,
    partition_backlog: Family<Labels, Gauge>,
    /// Online jobs: job-wide stream figures (KALE Table 3), by name.
    stream: Family<Labels, Gauge<f64, AtomicU64>>,
}

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
        let requeues = Counter::default();
        registry.register(
            "requeues",
            "Unreported remainders requeued",
            requeues.clone(),
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
        let stream = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "stream",
            "Online jobs: lag_seconds, arrival_rate, slo_violation_rate, accumulated_lag_seconds, downtime_seconds",
            stream.clone(),
        );
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
            requeues,
            partition_lag,
            partition_backlog,
            stream,
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
        for (name, v) in [
            ("lag_seconds", st.lag_s),
            ("arrival_rate", st.arrival_rate),
            ("slo_violation_rate", st.slo_violation_rate),
            ("accumulated_lag_seconds", st.accumulated_lag_s),
            ("downtime_seconds", st.downtime_s),
        ] {
            self.stream
                .get_or_create(&vec![("figure".to_string(), name.to_string())])
                .set(v);
        }
    }

    /// Sets the progressive-validation gauges (`elastrec_master_stream{figure=window_*}`).
    /// A multi-task job's tasks after the first have `task{t}_window_auc` and
    /// `task{t}_window_logloss`.
    pub fn observe_progressive(&self, f: &crate::progressive::WindowFigures) {
        let mut figures = vec![
            ("window_auc".to_string(), f.auc.unwrap_or(f64::NAN)),
            ("window_logloss".to_string(), f.logloss),
            ("window_samples".to_string(), f.samples as f64),
        ];
        for (t, w) in f.tasks.iter().enumerate().skip(1) {
            figures.push((format!("task{t}_window_auc"), w.auc.unwrap_or(f64::NAN)));
            figures.push((format!("task{t}_window_logloss"), w.logloss));
        }
        for (name, v) in figures {
            self.stream
                .get_or_create(&vec![("figure".to_string(), name)])
                .set(v);
        }
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
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        elastrec_metrics::encode(&self.registry)
    }
}
