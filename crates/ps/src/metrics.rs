//! Prometheus metrics of one parameter server (prefix `elastrec_ps`, label `ps`: its
//! index), served on `/metrics` by [`elastrec_metrics`].

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use elastrec_metrics::prometheus_client::metrics::counter::Counter;
use elastrec_metrics::prometheus_client::metrics::gauge::Gauge;
use elastrec_metrics::prometheus_client::metrics::histogram::Histogram;
use elastrec_metrics::prometheus_client::registry::Registry;

/// What a PS counts. Updated without the state lock, so that a scrape never waits for a
/// checkpoint copy.
pub struct PsMetrics {
    registry: Registry,
    pub(crate) pulls: Counter,
    pub(crate) pushes: Counter,
    pub(crate) rows_pulled: Counter,
    pub(crate) rows_pushed: Counter,
    pub(crate) pull_latency: Histogram,
    pub(crate) push_latency: Histogram,
    pub(crate) repeated_pushes: Counter,
    pub(crate) checkpoints: Counter,
    pub(crate) replica_failures: Counter,
    last_stall_seconds: Gauge<f64, AtomicU64>,
    version: Gauge,
    rows_held: Gauge,
    layout_version: Gauge,
    process: elastrec_metrics::process::ProcessMetrics,
}

impl PsMetrics {
    /// The metrics of PS `index`, holding `rows_held` embedding rows.
    pub fn new(index: u32, rows_held: u64) -> Self {
        let mut r = Registry::with_prefix_and_labels(
            "elastrec_ps",
            [("ps".into(), index.to_string().into())].into_iter(),
        );
        let process = elastrec_metrics::process::ProcessMetrics::register(&mut r);
        let m = Self {
            process,
            pulls: Counter::default(),
            pushes: Counter::default(),
            rows_pulled: Counter::default(),
            rows_pushed: Counter::default(),
            pull_latency: elastrec_metrics::latency_histogram(),
            push_latency: elastrec_metrics::latency_histogram(),
            repeated_pushes: Counter::default(),
            checkpoints: Counter::default(),
            replica_failures: Counter::default(),
            last_stall_seconds: Gauge::default(),
            version: Gauge::default(),
            rows_held: Gauge::default(),
            layout_version: Gauge::default(),
            registry: Registry::default(),
        };
        r.register("pulls", "Pull requests served", m.pulls.clone());
        r.register("pushes", "Push requests served", m.pushes.clone());
        r.register(
            "rows_pulled",
            "Embedding rows pulled",
            m.rows_pulled.clone(),
        );
        r.register(
            "rows_pushed",
            "Embedding rows pushed",
            m.rows_pushed.clone(),
        );
        r.register(
            "pull_latency_seconds",
            "Time to handle a pull request",
            m.pull_latency.clone(),
        );
        r.register(
            "push_latency_seconds",
            "Time to handle a push request (synchronous mode: the step barrier included)",
            m.push_latency.clone(),
        );
        r.register(
            "repeated_pushes_skipped",
            "Pushes skipped because their batch was already applied",
            m.repeated_pushes.clone(),
        );
        r.register(
            "dense_replica_failures",
            "Times the replica of this server's dense slice on its successor was lost or \
             could not be seeded (pushes are answered without it until it is seeded again)",
            m.replica_failures.clone(),
        );
        r.register(
            "checkpoints",
            "Checkpoint parts written",
            m.checkpoints.clone(),
        );
        r.register(
            "checkpoint_last_stall_seconds",
            "Training stall of the last checkpoint (state copied under the lock), seconds",
            m.last_stall_seconds.clone(),
        );
        r.register(
            "version",
            "Dense updates applied (the step)",
            m.version.clone(),
        );
        r.register(
            "rows_held",
            "Embedding rows this shard holds",
            m.rows_held.clone(),
        );
        r.register(
            "layout_version",
            "Version of the PS layout this server serves (or joins), see docs/resharding.md",
            m.layout_version.clone(),
        );
        m.rows_held.set(rows_held as i64);
        Self { registry: r, ..m }
    }

    /// Sets the layout served and the rows held (they change when the servers are
    /// re-sharded).
    pub(crate) fn set_layout(&self, layout_version: u64, rows_held: u64) {
        self.layout_version.set(layout_version as i64);
        self.rows_held.set(rows_held as i64);
    }

    /// Records a checkpoint whose copy stalled training for `stall`.
    pub(crate) fn checkpoint(&self, stall: Duration) {
        self.checkpoints.inc();
        self.last_stall_seconds.set(stall.as_secs_f64());
    }

    /// The exposition, with the step as of `version`.
    pub fn render(&self, version: u64) -> String {
        self.version.set(version as i64);
        self.process.refresh();
        elastrec_metrics::encode(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_metric_with_the_ps_label() {
        let m = PsMetrics::new(1, 500);
        m.pulls.inc();
        m.pull_latency.observe(0.001);
        m.checkpoint(Duration::from_micros(2500));
        let body = m.render(42);
        let names = elastrec_metrics::parse_exposition(&body).unwrap();
        for name in [
            "pulls_total",
            "pushes_total",
            "rows_pulled_total",
            "rows_pushed_total",
            "pull_latency_seconds_count",
            "push_latency_seconds_count",
            "repeated_pushes_skipped_total",
            "checkpoints_total",
            "checkpoint_last_stall_seconds",
            "version",
            "rows_held",
            "layout_version",
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
        ] {
            assert!(
                names.contains(&format!("elastrec_ps_{name}")),
                "{name}: {body}"
            );
        }
        for line in [
            "elastrec_ps_pulls_total{ps=\"1\"} 1\n",
            "elastrec_ps_version{ps=\"1\"} 42\n",
            "elastrec_ps_rows_held{ps=\"1\"} 500\n",
            "elastrec_ps_checkpoints_total{ps=\"1\"} 1\n",
            "elastrec_ps_checkpoint_last_stall_seconds{ps=\"1\"} 0.0025\n",
        ] {
            assert!(body.contains(line), "{line}: {body}");
        }
    }
}
