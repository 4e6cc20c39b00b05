//! What an online job's users watch (KALE Table 3): arrival rate, lag per partition in
//! seconds, SLO violations, accumulated lag, downtime. Pure: the watcher feeds it
//! watermarks and trained offsets with the time they were read.

use std::collections::VecDeque;

use serde::Serialize;

/// How long the arrival history is kept for finding when an offset arrived, ms.
const HISTORY_MS: u64 = 30 * 60 * 1000;
/// Window of the arrival rate, ms.
const RATE_WINDOW_MS: u64 = 5_000;

/// Per partition: when its watermarks were read, and what they were.
#[derive(Debug, Clone, Default)]
struct Arrivals {
    /// `(time_ms, high)`, oldest first, `high` non-decreasing.
    seen: VecDeque<(u64, u64)>,
}

impl Arrivals {
    fn push(&mut self, now_ms: u64, high: u64) {
        if self.seen.back().is_none_or(|&(_, h)| high > h) || self.seen.len() < 2 {
            self.seen.push_back((now_ms, high));
        }
        while self
            .seen
            .front()
            .is_some_and(|&(t, _)| now_ms.saturating_sub(t) > HISTORY_MS)
            && self.seen.len() > 2
        {
            self.seen.pop_front();
        }
    }

    /// When offset `o` was first seen to exist: the first read whose high watermark
    /// exceeded it (messages older than the history count from its start).
    fn arrived_ms(&self, o: u64) -> Option<u64> {
        let i = self.seen.partition_point(|&(_, h)| h <= o);
        self.seen.get(i).map(|&(t, _)| t)
    }

    /// Messages per second over the last [`RATE_WINDOW_MS`].
    fn rate(&self, now_ms: u64) -> f64 {
        let Some(&(t1, h1)) = self.seen.back() else {
            return 0.0;
        };
        let from = now_ms.saturating_sub(RATE_WINDOW_MS);
        let i = self
            .seen
            .partition_point(|&(t, _)| t < from)
            .saturating_sub(1);
        let (t0, h0) = self.seen[i];
        let dt = now_ms.max(t1).saturating_sub(t0);
        if dt == 0 {
            return 0.0;
        }
        (h1 - h0) as f64 * 1000.0 / dt as f64
    }
}

/// One partition's state as shown to users.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PartitionLag {
    /// `kafka:topic/partition`.
    pub partition: String,
    /// Next offset the broker will assign.
    pub high: u64,
    /// First offset not yet trained.
    pub trained: u64,
    /// Messages waiting.
    pub backlog: u64,
    /// Seconds the oldest waiting message has waited (0: none waits).
    pub lag_s: f64,
    /// Messages per second arriving.
    pub rate: f64,
    /// The largest `lag_s` seen.
    pub peak_lag_s: f64,
    /// `lag_s` integrated over time, seconds (KALE Fig. 8 per partition).
    pub accumulated_lag_s: f64,
}

/// The job's stream statistics.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StreamStats {
    /// The lag above which the SLO is violated, seconds.
    pub slo_lag_s: f64,
    /// Per partition.
    pub partitions: Vec<PartitionLag>,
    /// Messages per second arriving, all partitions.
    pub arrival_rate: f64,
    /// The job's lag: the largest partition lag, seconds.
    pub lag_s: f64,
    /// Seconds observed.
    pub observed_s: f64,
    /// Seconds the lag was above `slo_lag_s`.
    pub violation_s: f64,
    /// `violation_s / observed_s`.
    pub slo_violation_rate: f64,
    /// The job's lag integrated over time (the sum of the lag sampled every second), s.
    pub accumulated_lag_s: f64,
    /// Seconds messages were waiting while no worker trained (scaling, failures), in
    /// stretches of at least [`STALL_MIN_S`].
    pub downtime_s: f64,
    /// Worker-seconds spent (the master adds them).
    pub worker_s: f64,
    /// Seconds the brokers did not answer the watch (unreachable, or a query that took a
    /// second or more): the source's outages. The lag, the violations and the downtime
    /// include them; a job cannot train what its brokers do not serve.
    pub source_stall_s: f64,
    #[serde(skip)]
    arrivals: Vec<Arrivals>,
    #[serde(skip)]
    last_ms: Option<u64>,
    /// Length of the current stretch with waiting messages and no progress, seconds.
    #[serde(skip)]
    stall_s: f64,
}

/// A stretch without progress shorter than this is the normal gap between a message's
/// arrival and its task's first report (lingering, dealing, a batch), not downtime.
pub const STALL_MIN_S: f64 = 1.0;

impl StreamStats {
    /// Statistics for `partitions` with SLO `slo_lag_s`.
    pub fn new(partitions: Vec<String>, slo_lag_s: f64) -> Self {
        Self {
            slo_lag_s,
            arrivals: vec![Arrivals::default(); partitions.len()],
            partitions: partitions
                .into_iter()
                .map(|partition| PartitionLag {
                    partition,
                    ..PartitionLag::default()
                })
                .collect(),
            ..Self::default()
        }
    }

    /// The brokers did not answer for `seconds`.
    pub fn source_stalled(&mut self, seconds: f64) {
        if seconds.is_finite() && seconds > 0.0 {
            self.source_stall_s += seconds;
        }
    }

    /// One reading at `now_ms`: every partition's high watermark and first untrained
    /// offset, whether any worker trained since the last reading, and live workers.
    pub fn observe(&mut self, now_ms: u64, highs: &[u64], trained: &[u64], progressed: bool) {
        let mut lag: f64 = 0.0;
        let mut rate = 0.0;
        let dt = self
            .last_ms
            .map_or(0.0, |last| now_ms.saturating_sub(last) as f64 / 1000.0);
        for (i, p) in self.partitions.iter_mut().enumerate() {
            let (Some(&high), Some(&done)) = (highs.get(i), trained.get(i)) else {
                continue;
            };
            let a = &mut self.arrivals[i];
            a.push(now_ms, high);
            p.high = high;
            p.trained = done;
            p.backlog = high.saturating_sub(done);
            p.rate = a.rate(now_ms);
            p.lag_s = if p.backlog == 0 {
                0.0
            } else {
                a.arrived_ms(done)
                    .map_or(0.0, |t| now_ms.saturating_sub(t) as f64 / 1000.0)
            };
            p.peak_lag_s = p.peak_lag_s.max(p.lag_s);
            p.accumulated_lag_s += p.lag_s * dt;
            lag = lag.max(p.lag_s);
            rate += p.rate;
        }
        self.lag_s = lag;
        self.arrival_rate = rate;
        if self.last_ms.is_some() {
            self.observed_s += dt;
            if lag > self.slo_lag_s {
                self.violation_s += dt;
            }
            self.accumulated_lag_s += lag * dt;
            if lag > 0.0 && !progressed {
                self.stall_s += dt;
                if self.stall_s >= STALL_MIN_S {
                    // The whole stretch counts once it is long enough to be a stall.
                    self.downtime_s += if self.stall_s - dt < STALL_MIN_S {
                        self.stall_s
                    } else {
                        dt
                    };
                }
            } else {
                self.stall_s = 0.0;
            }
            self.slo_violation_rate = if self.observed_s > 0.0 {
                self.violation_s / self.observed_s
            } else {
                0.0
            };
        }
        self.last_ms = Some(now_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_is_the_age_of_the_oldest_untrained_message() {
        let mut s = StreamStats::new(vec!["kafka:t/0".into(), "kafka:t/1".into()], 2.0);
        // 100 messages/s arrive on partition 0; nothing on partition 1.
        s.observe(0, &[0, 5], &[0, 5], true);
        s.observe(1000, &[100, 5], &[0, 5], true);
        s.observe(2000, &[200, 5], &[50, 5], true);
        // Offset 50 arrived between 0 and 1 s (first seen at 1 s): 1 s old at 2 s.
        assert_eq!(s.partitions[0].lag_s, 1.0);
        assert_eq!(s.partitions[0].backlog, 150);
        assert_eq!(s.partitions[1].lag_s, 0.0);
        assert_eq!(s.arrival_rate, 100.0);
        // Training stops; the lag grows past the SLO and the stall counts as downtime.
        s.observe(3000, &[300, 5], &[50, 5], false);
        s.observe(4000, &[400, 5], &[50, 5], false);
        assert_eq!(s.lag_s, 3.0);
        assert_eq!(s.observed_s, 4.0);
        assert_eq!(s.violation_s, 1.0, "only the last second was above 2 s");
        assert_eq!(s.slo_violation_rate, 0.25);
        assert_eq!(s.downtime_s, 2.0);
        assert_eq!(s.accumulated_lag_s, 0.0 + 1.0 + 2.0 + 3.0);
        assert_eq!(
            s.partitions[0].accumulated_lag_s, 6.0,
            "partition 0 is the job's lag"
        );
        assert_eq!(s.partitions[1].accumulated_lag_s, 0.0);
        // Caught up: no lag, and the peak stays.
        s.observe(5000, &[500, 5], &[500, 5], true);
        assert_eq!(s.lag_s, 0.0);
        assert_eq!(s.partitions[0].peak_lag_s, 3.0);
    }

    #[test]
    fn only_stretches_without_progress_of_a_second_or_more_are_downtime() {
        let mut s = StreamStats::new(vec!["kafka:t/0".into()], 10.0);
        s.observe(0, &[0], &[0], true);
        // Short gaps between reports (messages waiting 0.5 s): normal, not downtime.
        for k in 1..=8u64 {
            let high = 10 * k;
            s.observe(k * 500, &[high], &[high - 5], k % 2 == 0);
        }
        assert_eq!(s.downtime_s, 0.0);
        // 1.5 s without progress: all of it counts.
        for k in 9..=11u64 {
            s.observe(k * 500, &[10 * k], &[35], false);
        }
        assert_eq!(s.downtime_s, 1.5);
        s.observe(6000, &[120], &[120], true);
        s.observe(6500, &[125], &[120], false);
        assert_eq!(s.downtime_s, 1.5, "a new stretch starts from zero");
    }
}
