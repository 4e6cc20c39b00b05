//! Horizontal scaling of the data executors by Primus Eq. 1: `L_u = w · u`, where `u` is
//! the executors' utilization `[u_b, u_c, u_m]` (serving buffer, CPU, memory) over the last
//! interval, against a threshold `L_θ`.
//!
//! `u_b` is the share of reads the executors answered from their serving buffer (a chunk
//! parsed ahead while the worker trained the previous one). Low, the workers ask before
//! the next chunk is ready: parsing is the bottleneck and an executor is added. High, data
//! waits for the workers: one can go. A band around `L_θ` keeps the count from flapping.
//! Pure: the loop that feeds it lives in the master (`run/serve.rs`).

use std::collections::HashMap;

use serde::Serialize;

/// What one executor reported, cumulative since it started (its heartbeat profile).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ExecutorSample {
    /// Reads answered.
    pub reads: u64,
    /// Reads answered from the serving buffer.
    pub hits: u64,
    /// Process CPU seconds.
    pub cpu_s: f64,
    /// Resident memory, bytes.
    pub rss_bytes: u64,
}

/// The policy's settings (`cluster.executor_*`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExecutorPolicy {
    /// Eq. 1's `w` for `[u_b, u_c, u_m]`.
    pub weights: [f64; 3],
    /// Eq. 1's `L_θ`.
    pub threshold: f64,
    /// Half-width of the band around `L_θ` where the count stays.
    pub band: f64,
    /// Fewest and most executors.
    pub min: u32,
    pub max: u32,
    /// CPU cores one executor is allotted (for `u_c`).
    pub cores: f64,
    /// Memory one executor is allotted, bytes (for `u_m`).
    pub memory_bytes: f64,
}

/// One decision, with its reasons.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExecutorDecision {
    /// Executors before and after.
    pub from: u32,
    pub to: u32,
    /// `L_u` and its parts `[u_b, u_c, u_m]`.
    pub load: f64,
    pub utilization: [f64; 3],
    /// Why, in words.
    pub reason: String,
}

/// The scaler's memory: each executor's previous sample.
#[derive(Debug, Default)]
pub struct ExecutorScaler {
    last: HashMap<u32, ExecutorSample>,
}

impl ExecutorScaler {
    /// Decides from the executors' samples (by node id) `dt_s` seconds after the previous
    /// call, with `current` executors running. `None` when nothing was read in between
    /// (no evidence either way), else the decision (`to == from`: keep).
    pub fn decide(
        &mut self,
        policy: &ExecutorPolicy,
        current: u32,
        samples: &[(u32, ExecutorSample)],
        dt_s: f64,
    ) -> Option<ExecutorDecision> {
        let (mut reads, mut hits, mut cpu, mut rss) = (0u64, 0u64, 0.0f64, 0.0f64);
        for &(id, s) in samples {
            let prev = self.last.insert(id, s).unwrap_or_default();
            reads += s.reads.saturating_sub(prev.reads);
            hits += s.hits.saturating_sub(prev.hits);
            cpu += (s.cpu_s - prev.cpu_s).max(0.0);
            rss += s.rss_bytes as f64;
        }
        let live: std::collections::HashSet<u32> = samples.iter().map(|s| s.0).collect();
        self.last.retain(|id, _| live.contains(id));
        if reads == 0 || samples.is_empty() || dt_s <= 0.0 {
            return None;
        }
        let n = samples.len() as f64;
        let u = [
            hits as f64 / reads as f64,
            (cpu / (dt_s * policy.cores.max(1e-9) * n)).min(1.0),
            (rss / n / policy.memory_bytes.max(1.0)).min(1.0),
        ];
        let load: f64 = policy
            .weights
            .iter()
            .zip(&u)
            .map(|(w, x)| w * x)
            .sum::<f64>()
            / policy.weights.iter().sum::<f64>();
        let (low, high) = (
            policy.threshold - policy.band,
            policy.threshold + policy.band,
        );
        let (to, reason) = if load < low && current < policy.max {
            (
                current + 1,
                format!("L_u {load:.2} < {low:.2}: the workers wait for parsed data"),
            )
        } else if load > high && current > policy.min {
            (
                current - 1,
                format!("L_u {load:.2} > {high:.2}: parsed data waits for the workers"),
            )
        } else {
            (
                current,
                format!("L_u {load:.2} within [{low:.2}, {high:.2}] or at a bound"),
            )
        };
        Some(ExecutorDecision {
            from: current,
            to,
            load,
            utilization: u,
            reason,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> ExecutorPolicy {
        ExecutorPolicy {
            weights: [1.0, 0.0, 0.0],
            threshold: 0.5,
            band: 0.25,
            min: 1,
            max: 3,
            cores: 1.0,
            memory_bytes: 1e9,
        }
    }

    fn sample(reads: u64, hits: u64) -> ExecutorSample {
        ExecutorSample {
            reads,
            hits,
            cpu_s: reads as f64 * 0.01,
            rss_bytes: 100 << 20,
        }
    }

    /// Eq. 1 over intervals: a low hit rate adds executors up to the maximum, a high one
    /// removes them down to the minimum, the band keeps the count; no reads, no decision.
    #[test]
    fn executors_follow_the_serving_buffer_within_their_bounds() {
        let p = policy();
        let mut s = ExecutorScaler::default();
        // First interval: 100 reads, 10 from the buffer (u_b = 0.1 < 0.25).
        let d = s.decide(&p, 1, &[(7, sample(100, 10))], 5.0).unwrap();
        assert_eq!((d.from, d.to), (1, 2));
        assert!((d.load - 0.1).abs() < 1e-9 && (d.utilization[0] - 0.1).abs() < 1e-9);
        // Differences, not totals: 100 more reads, all 100 hits → 1.0 > 0.75: one less.
        let d = s
            .decide(&p, 2, &[(7, sample(200, 110)), (8, sample(0, 0))], 5.0)
            .unwrap();
        assert_eq!((d.to, d.load), (1, 1.0));
        // In the band: keep.
        let d = s
            .decide(&p, 2, &[(7, sample(300, 160)), (8, sample(0, 0))], 5.0)
            .unwrap();
        assert_eq!(d.to, 2, "{}", d.reason);
        // Bounds: never above max or below min.
        let d = s.decide(&p, 3, &[(7, sample(400, 160))], 5.0).unwrap();
        assert_eq!(d.to, 3);
        let d = s.decide(&p, 1, &[(7, sample(500, 260))], 5.0).unwrap();
        assert_eq!(d.to, 1);
        // Nothing read since: no evidence, no decision.
        assert_eq!(s.decide(&p, 1, &[(7, sample(500, 260))], 5.0), None);
    }

    /// The CPU and memory terms are the interval's CPU share per allotted core and the
    /// resident share of the allotted memory, weighted as configured.
    #[test]
    fn cpu_and_memory_terms_are_shares_of_the_allotment() {
        let p = ExecutorPolicy {
            weights: [0.0, 1.0, 1.0],
            ..policy()
        };
        let mut s = ExecutorScaler::default();
        let a = ExecutorSample {
            reads: 10,
            hits: 0,
            cpu_s: 2.5,
            rss_bytes: 500_000_000,
        };
        let d = s.decide(&p, 1, &[(1, a)], 5.0).unwrap();
        assert!((d.utilization[1] - 0.5).abs() < 1e-9, "{:?}", d.utilization);
        assert!((d.utilization[2] - 0.5).abs() < 1e-9, "{:?}", d.utilization);
        assert!((d.load - 0.5).abs() < 1e-9);
    }
}
