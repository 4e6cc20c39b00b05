//! Primus scaling rules (§3.2): the horizontal data-executor rule (Eq. 1) and the vertical
//! CPU/memory adjustment (Eq. 2-3).

use serde::{Deserialize, Serialize};

use crate::alloc::Range;
use crate::error::{check_non_negative, BrainError, Result};

/// Horizontal rule: `L_u = w . u` over data executors' (buffer pool, CPU, memory)
/// utilization, compared with the threshold `L_theta`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HorizontalRule {
    /// Weights of (buffer pool, CPU, memory) utilization (Primus recommends user weights).
    pub weights: [f64; 3],
    /// Load threshold `L_theta`.
    pub threshold: f64,
    /// Executors added or removed per decision.
    pub step: u32,
}

impl Default for HorizontalRule {
    fn default() -> Self {
        Self {
            weights: [0.5, 0.3, 0.2],
            threshold: 0.5,
            step: 1,
        }
    }
}

/// A horizontal decision.
#[derive(Debug, Clone, PartialEq)]
pub struct HorizontalDecision {
    /// The load `L_u`.
    pub load: f64,
    /// New number of data executors.
    pub data_executors: u32,
    /// Why.
    pub reason: String,
}

impl HorizontalRule {
    /// Eq. 1. As the paper states it: `L_u < L_theta` means the training executors have more
    /// capacity than the data executors feed, so data executors are added; `L_u >
    /// L_theta` removes some; equality holds. The count stays inside `bounds`.
    pub fn decide(
        &self,
        utilization: [f64; 3],
        current: u32,
        bounds: Range<u32>,
    ) -> Result<HorizontalDecision> {
        for (i, (u, w)) in utilization.iter().zip(&self.weights).enumerate() {
            check_non_negative(&format!("utilization[{i}]"), *u)?;
            check_non_negative(&format!("weights[{i}]"), *w)?;
        }
        let load: f64 = utilization
            .iter()
            .zip(&self.weights)
            .map(|(u, w)| u * w)
            .sum();
        let (target, why) = if load < self.threshold {
            (current.saturating_add(self.step), "below")
        } else if load > self.threshold {
            (current.saturating_sub(self.step), "above")
        } else {
            (current, "at")
        };
        let data_executors = bounds.clamp(target);
        Ok(HorizontalDecision {
            load,
            data_executors,
            reason: format!(
                "Primus Eq. 1: L_u = {load:.3} {why} L_theta = {:.3}: data executors {current} -> {data_executors}",
                self.threshold
            ),
        })
    }
}

/// Vertical rule parameters (Eq. 2-3).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct VerticalRule {
    /// Safety margin `R_s` added on top of the forecast usage (same unit as the resource).
    pub safety_margin: f64,
    /// Changes with `|R' - R_alloc| <= R_theta` are not made.
    pub min_change: f64,
}

/// Eq. 2: `D(N_R) = sum_{i=1..N_R} w(i) (R_i - R_{i-1}) / N_R` with `w(i) = 1/(N_R - i + 1)`,
/// over the metrics `R_0..R_{N_R}` (oldest first): recent changes weigh most.
pub fn weighted_change(metrics: &[f64]) -> Result<f64> {
    for (i, v) in metrics.iter().enumerate() {
        check_non_negative(&format!("metrics[{i}]"), *v)?;
    }
    if metrics.len() < 2 {
        return Err(BrainError::Profile(format!(
            "Primus Eq. 2 needs at least 2 metrics, got {}",
            metrics.len()
        )));
    }
    let n = metrics.len() - 1;
    let nf = n as f64;
    Ok((1..=n)
        .map(|i| (metrics[i] - metrics[i - 1]) / (nf - i as f64 + 1.0))
        .sum::<f64>()
        / nf)
}

/// A vertical decision.
#[derive(Debug, Clone, PartialEq)]
pub struct VerticalDecision {
    /// New allocation (equal to the current one when the change is too small).
    pub alloc: f64,
    /// Whether a change is made.
    pub changed: bool,
    /// Why.
    pub reason: String,
}

impl VerticalRule {
    /// Eq. 3: `R' = R_used + R_x + R_s` with `R_used` the maximum of the window and `R_x`
    /// from Eq. 2; kept inside `bounds`; skipped when within `R_theta` of `current`.
    pub fn decide(
        &self,
        metrics: &[f64],
        current: f64,
        bounds: Range<f64>,
    ) -> Result<VerticalDecision> {
        check_non_negative("safety_margin", self.safety_margin)?;
        check_non_negative("min_change", self.min_change)?;
        check_non_negative("current", current)?;
        let r_x = weighted_change(metrics)?;
        let used = metrics.iter().copied().fold(0.0, f64::max);
        let raw = used + r_x + self.safety_margin;
        let target = bounds.clamp(raw);
        if (target - current).abs() <= self.min_change {
            return Ok(VerticalDecision {
                alloc: current,
                changed: false,
                reason: format!(
                    "Primus Eq. 3: R' = {raw:.3} within R_theta = {:.3} of {current:.3}: no change",
                    self.min_change
                ),
            });
        }
        Ok(VerticalDecision {
            alloc: target,
            changed: true,
            reason: format!(
                "Primus Eq. 3: R_used {used:.3} + R_x {r_x:.3} + R_s {:.3} = {raw:.3} -> {target:.3}",
                self.safety_margin
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn horizontal_follows_eq1() {
        let r = HorizontalRule {
            weights: [0.5, 0.3, 0.2],
            threshold: 0.5,
            step: 2,
        };
        let b = Range::new(1, 10);
        // L_u = 0.5*0.2 + 0.3*0.4 + 0.2*0.5 = 0.32 < 0.5: add executors.
        let d = r.decide([0.2, 0.4, 0.5], 4, b).unwrap();
        assert!((d.load - 0.32).abs() < 1e-12);
        assert_eq!(d.data_executors, 6);
        let d = r.decide([0.9, 0.9, 0.9], 4, b).unwrap();
        assert_eq!(d.data_executors, 2);
        let d = r.decide([0.9, 0.9, 0.9], 1, b).unwrap();
        assert_eq!(d.data_executors, 1, "stays inside bounds");
        assert!(r.decide([f64::NAN, 0.0, 0.0], 1, b).is_err());
    }

    #[test]
    fn weighted_change_matches_eq2_by_hand() {
        // R = [10, 12, 11, 15]: diffs 2, -1, 4 with weights 1/3, 1/2, 1, divided by 3.
        let d = weighted_change(&[10.0, 12.0, 11.0, 15.0]).unwrap();
        let by_hand = (2.0 / 3.0 - 1.0 / 2.0 + 4.0) / 3.0;
        assert!((d - by_hand).abs() < 1e-12);
        assert!(weighted_change(&[1.0]).is_err());
    }

    #[test]
    fn vertical_applies_margin_and_minimum_change() {
        let rule = VerticalRule {
            safety_margin: 2.0,
            min_change: 1.0,
        };
        let b = Range::new(1.0, 64.0);
        let d = rule.decide(&[10.0, 12.0, 11.0, 15.0], 8.0, b).unwrap();
        let expect = 15.0 + (2.0 / 3.0 - 0.5 + 4.0) / 3.0 + 2.0;
        assert!(d.changed && (d.alloc - expect).abs() < 1e-12, "{d:?}");
        // Within R_theta: unchanged.
        let d = rule.decide(&[10.0, 10.0, 10.0], 12.5, b).unwrap();
        assert!(!d.changed && d.alloc == 12.5);
        // Shrinks when usage falls: R_used 3 + R_x (-1/2 - 1)/2 + R_s 2 = 4.25 ...
        let d = rule.decide(&[3.0, 2.0, 1.0], 30.0, b).unwrap();
        assert!(d.changed && (d.alloc - 4.25).abs() < 1e-12, "{d:?}");
        // ... but never below the bound.
        let d = rule
            .decide(&[3.0, 2.0, 1.0], 30.0, Range::new(5.0, 64.0))
            .unwrap();
        assert!(d.changed && d.alloc == 5.0, "{d:?}");
    }
}
