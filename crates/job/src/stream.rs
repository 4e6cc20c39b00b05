//! `[stream]`: online training from Kafka. A job with this section trains from the topics'
//! partitions until it is stopped, instead of from `[data] train` files.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use elastrec_stream::{Connection, MessageFormat, StartAt};
use serde::{Deserialize, Serialize};

/// The `[stream]` section.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StreamConfig {
    /// Bootstrap brokers, `host:port[,host:port...]`.
    pub brokers: String,
    /// Topics to train from; every partition of each is read.
    pub topics: Vec<String>,
    /// The name the job's Kafka clients give the brokers (`client.id` in broker logs and
    /// quotas). Progress is not committed to a consumer group: the checkpoint decides where
    /// a resumed job reads, and each partition's lag is on the master's `/metrics`. Empty:
    /// `elastrec-` and the job's name.
    pub group: String,
    /// Where a new job starts reading: `"earliest"` (the oldest message kept),
    /// `"latest"` (only what arrives after the start), or an RFC 3339 time
    /// (`"2026-11-23T08:00:00Z"`: the first message at or after it). A resumed job or one
    /// started from a checkpoint reads from the checkpointed offsets instead.
    pub start: String,
    /// How messages are encoded: `"tsv"` (one Criteo line per message), `"batch"`
    /// (elastrec's binary batch format, `docs/online.md`), or `"json"` (objects of the
    /// job's named features, `[[data.feature]]`, one or an array of them per message).
    pub format: MessageFormat,
    /// How often the master reads the partitions' watermarks, ms.
    pub poll_ms: u64,
    /// New messages that do not fill a whole shard are dealt once the oldest of them has
    /// waited this long, ms (freshness against task overhead).
    pub linger_ms: u64,
    /// Kafka client properties under their usual names: `security.protocol`, `ssl.*`
    /// (CA, client certificate and key files), `sasl.*` (mechanism, user, password or the
    /// environment variable holding it), `compression.type`, `fetch.wait.max.ms`,
    /// `request.timeout.ms`, `client.id` (`docs/online.md`). Any other is refused.
    pub properties: BTreeMap<String, String>,
    /// The lag (age of the oldest untrained message) above which the service-level
    /// objective is violated, seconds.
    pub slo_lag_s: f64,
    /// Who sets the worker count from the traffic: `"off"` (`elastrec scale` only),
    /// `"kale"` (forecast, fewest workers that keep up, stabilized; `docs/online.md`) or
    /// `"hpa"` (a reactive utilization/lag rule, the baseline KALE is compared with).
    pub autoscale: StreamScaling,
    /// Smallest and largest worker count the autoscaler may choose.
    pub workers: [u32; 2],
    /// Seconds between scaling decisions.
    pub interval_s: f64,
    /// How far ahead the traffic is forecast, seconds.
    pub horizon_s: f64,
    /// Length of the traffic's season (a day: 86400) for Holt-Winters; 0: no season,
    /// a damped trend only.
    pub season_s: f64,
    /// Algorithm 1's `rho`: smallest change of the plan examined.
    pub rho: u32,
    /// Algorithm 1's `tau`: a planned level lasting less than this is calibrated away, s.
    pub tau_s: f64,
    /// Training time one change of the worker count costs, seconds: a new worker's start
    /// and the first shards it pulls (elastrec adds and removes workers without stopping
    /// the others), or a whole restart where scaling stops the world. KALE weighs it
    /// against the lag a change removes: a change that would add SLO violation is not
    /// made, and a job behind its SLO jumps to the count that catches up soonest instead
    /// of one worker at a time.
    pub rescale_s: f64,
    /// Progressive validation: AUC and logloss of the predictions made just before
    /// training, over this many most recent samples; 0 turns it off.
    pub eval_window: u64,
    /// How often the progressive-validation figures are recorded, seconds.
    pub eval_every_s: f64,
    /// How partitions' data is dealt to workers: `"shared"` (one queue, oldest data first
    /// whatever its partition; every worker trains every partition, the effect of KALE's
    /// global shuffling) or `"pinned"` (partition `p` only to the worker ranked
    /// `p mod w` among the `w` running ones, as a Kafka consumer group would; the
    /// baseline that shuffling is measured against, `docs/online.md`).
    pub assignment: PartitionAssignment,
}

/// Largest progressive-validation window: 5 bytes per sample kept by the master, and an
/// exact AUC sorts the window every `eval_every_s`.
pub const MAX_EVAL_WINDOW: u64 = 10_000_000;

/// How stream partitions are dealt to workers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PartitionAssignment {
    /// One queue for all partitions.
    #[default]
    Shared,
    /// Each partition to one worker.
    Pinned,
}

/// The online autoscaling policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamScaling {
    /// Workers change only on request.
    #[default]
    Off,
    /// KALE: forecast, throughput model, Algorithm 1, threshold fallback.
    Kale,
    /// A reactive rule on utilization and lag (Kubernetes HPA-like).
    Hpa,
}

impl Default for StreamConfig {
    fn default() -> Self {
        Self {
            brokers: "127.0.0.1:9092".into(),
            topics: Vec::new(),
            group: String::new(),
            start: "earliest".into(),
            format: MessageFormat::Tsv,
            poll_ms: 200,
            linger_ms: 500,
            properties: BTreeMap::new(),
            slo_lag_s: 10.0,
            autoscale: StreamScaling::Off,
            workers: [1, 8],
            interval_s: 5.0,
            horizon_s: 30.0,
            season_s: 0.0,
            rho: 1,
            tau_s: 30.0,
            rescale_s: 5.0,
            eval_window: 100_000,
            eval_every_s: 10.0,
            assignment: PartitionAssignment::Shared,
        }
    }
}

impl StreamConfig {
    /// How to reach the brokers.
    pub fn connection(&self) -> Connection {
        Connection {
            brokers: self.brokers.clone(),
            properties: self.properties.clone(),
        }
    }

    /// The consumer group for a job named `job`.
    pub fn group_for(&self, job: &str) -> String {
        if self.group.is_empty() {
            format!("elastrec-{job}")
        } else {
            self.group.clone()
        }
    }

    /// `start`, parsed.
    pub fn start_at(&self) -> Result<StartAt, String> {
        match self.start.as_str() {
            "earliest" => Ok(StartAt::Earliest),
            "latest" => Ok(StartAt::Latest),
            t => {
                let at = humantime::parse_rfc3339_weak(t).map_err(|e| {
                    format!("{t:?} is not \"earliest\", \"latest\" or an RFC 3339 time ({e})")
                })?;
                let ms = at
                    .duration_since(UNIX_EPOCH)
                    .map_err(|_| format!("{t:?} is before 1970"))?
                    .as_millis();
                if at > SystemTime::now() {
                    return Err(format!("{t:?} is in the future"));
                }
                Ok(StartAt::Timestamp(ms as i64))
            }
        }
    }

    /// Checks the section; `Err((field, reason))`.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.brokers.trim().is_empty() {
            return Err(("stream.brokers", "must name at least one broker".into()));
        }
        if self.topics.is_empty() || self.topics.iter().any(|t| t.is_empty() || t.contains('/')) {
            return Err((
                "stream.topics",
                "needs at least one topic name, none empty or containing '/'".into(),
            ));
        }
        self.start_at().map_err(|e| ("stream.start", e))?;
        self.connection()
            .check()
            .map_err(|e| ("stream.properties", e.to_string()))?;
        if self.poll_ms == 0 || self.poll_ms > 60_000 {
            return Err(("stream.poll_ms", "must be in 1..=60000".into()));
        }
        if self.linger_ms > 600_000 {
            return Err(("stream.linger_ms", "must be at most 600000".into()));
        }
        let positive = |v: f64| v.is_finite() && v > 0.0;
        if !positive(self.slo_lag_s) {
            return Err(("stream.slo_lag_s", "must be a positive number".into()));
        }
        let [lo, hi] = self.workers;
        if lo == 0 || lo > hi {
            return Err((
                "stream.workers",
                format!("[{lo}, {hi}]: needs 1 <= smallest <= largest"),
            ));
        }
        if !positive(self.interval_s) || !positive(self.horizon_s) || !positive(self.tau_s) {
            return Err((
                "stream.interval_s",
                "interval_s, horizon_s and tau_s must be positive numbers".into(),
            ));
        }
        if !(self.rescale_s.is_finite() && self.rescale_s >= 0.0) {
            return Err(("stream.rescale_s", "must be 0 or a positive number".into()));
        }
        if !(self.season_s.is_finite() && self.season_s >= 0.0) {
            return Err(("stream.season_s", "must be 0 or a positive number".into()));
        }
        if self.eval_window > MAX_EVAL_WINDOW {
            return Err((
                "stream.eval_window",
                format!(
                    "must be at most {MAX_EVAL_WINDOW} samples (the master keeps them in memory)"
                ),
            ));
        }
        if !positive(self.eval_every_s) {
            return Err(("stream.eval_every_s", "must be a positive number".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_accepts_the_two_words_and_a_time() {
        let mut s = StreamConfig {
            topics: vec!["clicks".into()],
            ..StreamConfig::default()
        };
        assert_eq!(s.start_at(), Ok(StartAt::Earliest));
        s.start = "2024-01-02T03:04:05Z".into();
        assert_eq!(s.start_at(), Ok(StartAt::Timestamp(1_704_164_645_000)));
        s.start = "yesterday".into();
        assert_eq!(s.validate().unwrap_err().0, "stream.start");
        s.start = "latest".into();
        s.topics = vec!["a/b".into()];
        assert_eq!(s.validate().unwrap_err().0, "stream.topics");
    }
}
