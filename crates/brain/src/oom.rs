//! OOM prediction (DLRover-RM §5.3): fit each PS's memory growth over training steps,
//! predict its usage at job end, and emit a memory plan before the limit is reached.
//!
//! The growth model is `mem(s) = a + b s + c sqrt(s)` with `a, b, c >= 0` (NNLS): embedding
//! tables grow as new ids arrive, linearly or with a decaying rate.

use serde::{Deserialize, Serialize};

use crate::alloc::Range;
use crate::error::{check_non_negative, check_non_negative_at, BrainError, Result};
use crate::nnls::{nnls, Matrix};

/// One memory reading of one PS.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MemorySample {
    /// Which PS.
    pub ps_index: u32,
    /// Training step of the reading.
    pub step: u64,
    /// Resident memory, GiB.
    pub mem_gb: f64,
}

/// Fitted growth of one PS.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MemoryGrowth {
    /// Constant term, GiB.
    pub base: f64,
    /// GiB per step.
    pub linear: f64,
    /// GiB per sqrt(step).
    pub sqrt: f64,
}

impl MemoryGrowth {
    /// Predicted memory at `step`.
    pub fn at(&self, step: u64) -> f64 {
        let s = step as f64;
        self.base + self.linear * s + self.sqrt * s.sqrt()
    }

    /// First step at which memory reaches `limit` (bisection; the model is non-decreasing),
    /// or `None` if not before `max_step`.
    pub fn step_reaching(&self, limit: f64, max_step: u64) -> Option<u64> {
        if self.at(max_step) < limit {
            return None;
        }
        let (mut lo, mut hi) = (0u64, max_step);
        if self.at(0) >= limit {
            return Some(0);
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.at(mid) >= limit {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        Some(hi)
    }
}

/// Fewest readings per PS for a fit.
pub const OOM_MIN_SAMPLES: usize = 4;

/// Fits the growth of one PS from its readings.
pub fn fit_growth(samples: &[MemorySample]) -> Result<MemoryGrowth> {
    for (i, s) in samples.iter().enumerate() {
        check_non_negative_at(|| format!("memory[{i}].mem_gb"), s.mem_gb)?;
    }
    if samples.len() < OOM_MIN_SAMPLES {
        return Err(BrainError::Profile(format!(
            "too few memory samples: {} given, at least {OOM_MIN_SAMPLES} needed",
            samples.len()
        )));
    }
    let mut a = Matrix::zeros(samples.len(), 3);
    for (i, s) in samples.iter().enumerate() {
        a.set_row(i, &[1.0, s.step as f64, (s.step as f64).sqrt()]);
    }
    let b: Vec<f64> = samples.iter().map(|s| s.mem_gb).collect();
    let x = nnls(&a, &b)?.x;
    Ok(MemoryGrowth {
        base: x[0],
        linear: x[1],
        sqrt: x[2],
    })
}

/// The growth of each PS's memory ([`fit_growth`] of its readings), by PS index.
pub fn fit_each(samples: &[MemorySample]) -> Result<Vec<(u32, MemoryGrowth)>> {
    let mut by_ps: std::collections::BTreeMap<u32, Vec<MemorySample>> = Default::default();
    for s in samples {
        by_ps.entry(s.ps_index).or_default().push(*s);
    }
    by_ps
        .into_iter()
        .map(|(ps, s)| Ok((ps, fit_growth(&s)?)))
        .collect()
}

/// OOM policy parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OomPolicy {
    /// Headroom over the predicted peak in the new memory size (0.2 = 20%).
    pub headroom: f64,
    /// Act when the predicted peak exceeds this fraction of the limit.
    pub trigger_fraction: f64,
}

impl Default for OomPolicy {
    fn default() -> Self {
        Self {
            headroom: 0.2,
            trigger_fraction: 0.9,
        }
    }
}

/// A memory plan for one PS.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MemoryAction {
    /// Which PS.
    pub ps_index: u32,
    /// Predicted memory at the last step, GiB.
    pub predicted_peak_gb: f64,
    /// Current limit, GiB.
    pub limit_gb: f64,
    /// Step at which the limit would be reached (`None`: only the trigger fraction is).
    pub step_at_limit: Option<u64>,
    /// Proposed memory per PS, GiB (inside bounds).
    pub new_mem_gb: f64,
    /// Whether the bound caps the proposal below the predicted need (more PS needed).
    pub capped: bool,
}

/// Predicts each PS's memory at `total_steps` and returns a plan for every PS whose
/// predicted peak crosses `trigger_fraction * limit` before the job ends. `current_step`
/// must be before the predicted limit step: plans come before the OOM, not after.
pub fn predict(
    samples: &[MemorySample],
    limit_gb: f64,
    current_step: u64,
    total_steps: u64,
    policy: OomPolicy,
    bounds: Range<f64>,
) -> Result<Vec<MemoryAction>> {
    let fits = fit_each(samples)?;
    predict_from(&fits, limit_gb, current_step, total_steps, policy, bounds)
}

fn check_steps(current_step: u64, total_steps: u64) -> Result<()> {
    if total_steps < current_step {
        return Err(BrainError::invalid(
            "total_steps",
            format!("{total_steps} is before current_step {current_step}"),
        ));
    }
    Ok(())
}

/// [`predict`] from growths already fitted ([`fit_each`]): a plan fits once for this
/// and for the peak its layout must hold.
pub fn predict_from(
    fits: &[(u32, MemoryGrowth)],
    limit_gb: f64,
    current_step: u64,
    total_steps: u64,
    policy: OomPolicy,
    bounds: Range<f64>,
) -> Result<Vec<MemoryAction>> {
    check_non_negative("limit_gb", limit_gb)?;
    check_steps(current_step, total_steps)?;
    let mut out = Vec::new();
    for &(ps, g) in fits {
        let peak = g.at(total_steps);
        if peak < policy.trigger_fraction * limit_gb {
            continue;
        }
        let need = peak * (1.0 + policy.headroom);
        let new_mem_gb = bounds.clamp(need.max(limit_gb));
        out.push(MemoryAction {
            ps_index: ps,
            predicted_peak_gb: peak,
            limit_gb,
            step_at_limit: g
                .step_reaching(limit_gb, total_steps)
                .map(|s| s.max(current_step)),
            new_mem_gb,
            capped: new_mem_gb < need,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn readings(
        ps: u32,
        growth: MemoryGrowth,
        until: u64,
        noise: f64,
        seed: u64,
    ) -> Vec<MemorySample> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..=20)
            .map(|i| {
                let step = until * i / 20;
                MemorySample {
                    ps_index: ps,
                    step,
                    mem_gb: growth.at(step) * (1.0 + noise * rng.random_range(-1.0..1.0)),
                }
            })
            .collect()
    }

    #[test]
    fn predicts_growth_and_plans_before_the_limit() {
        let g = MemoryGrowth {
            base: 4.0,
            linear: 0.001,
            sqrt: 0.0,
        };
        // Observed up to step 2,000 (6 GiB); job ends at 10,000 (14 GiB); limit 10 GiB.
        let mut s = readings(0, g, 2_000, 0.01, 1);
        s.extend(readings(
            1,
            MemoryGrowth {
                base: 2.0,
                linear: 0.0,
                sqrt: 0.0,
            },
            2_000,
            0.01,
            2,
        ));
        let plan = predict(
            &s,
            10.0,
            2_000,
            10_000,
            OomPolicy::default(),
            Range::new(2.0, 64.0),
        )
        .unwrap();
        assert_eq!(plan.len(), 1, "only PS 0 grows: {plan:?}");
        let a = plan[0];
        assert_eq!(a.ps_index, 0);
        assert!((a.predicted_peak_gb - 14.0).abs() / 14.0 < 0.1, "{a:?}");
        let hit = a.step_at_limit.unwrap();
        assert!(
            hit > 2_000 && (hit as f64 - 6_000.0).abs() < 1_000.0,
            "{a:?}"
        );
        assert!(a.new_mem_gb >= a.predicted_peak_gb && !a.capped);
    }

    #[test]
    fn capped_when_bound_too_small_and_quiet_when_ample() {
        let g = MemoryGrowth {
            base: 4.0,
            linear: 0.01,
            sqrt: 0.0,
        };
        let s = readings(0, g, 1_000, 0.0, 3);
        let plan = predict(
            &s,
            10.0,
            1_000,
            10_000,
            OomPolicy::default(),
            Range::new(2.0, 32.0),
        )
        .unwrap();
        assert!(plan[0].capped && plan[0].new_mem_gb == 32.0);
        let plan = predict(
            &s,
            1_000.0,
            1_000,
            10_000,
            OomPolicy::default(),
            Range::new(2.0, 2048.0),
        )
        .unwrap();
        assert!(plan.is_empty());
    }

    #[test]
    fn rejects_too_few_and_negative_samples() {
        let s = vec![
            MemorySample {
                ps_index: 0,
                step: 1,
                mem_gb: 1.0
            };
            2
        ];
        assert!(matches!(
            predict(&s, 8.0, 0, 10, OomPolicy::default(), Range::new(1.0, 8.0)),
            Err(BrainError::Profile(_))
        ));
        let s = vec![
            MemorySample {
                ps_index: 0,
                step: 1,
                mem_gb: -1.0
            };
            5
        ];
        assert!(fit_growth(&s).is_err());
    }
}
