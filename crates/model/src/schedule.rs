//! Learning-rate schedules: a linear warm-up, then a decay, as a multiplier of every
//! optimizer's configured rate (dense and sparse alike). The schedule counts training
//! samples, not steps, so it means the same whatever the batch size.

use serde::{Deserialize, Serialize};

/// How the rate falls after the warm-up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decay {
    /// Constant.
    #[default]
    None,
    /// Linearly to `final_scale` at `decay_samples`.
    Linear,
    /// Half a cosine down to `final_scale` at `decay_samples`.
    Cosine,
}

/// `[optimizer.schedule]`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LrSchedule {
    /// Samples over which the rate rises linearly from near 0 to the configured rate
    /// (0: no warm-up).
    pub warmup_samples: u64,
    /// The decay after the warm-up.
    pub decay: Decay,
    /// Samples at which the decay reaches `final_scale` (counted from the start of
    /// training, warm-up included); 0: the run's training samples.
    pub decay_samples: u64,
    /// The multiplier the decay ends at (0 ..= 1).
    pub final_scale: f32,
}

impl Default for LrSchedule {
    fn default() -> Self {
        Self {
            warmup_samples: 0,
            decay: Decay::None,
            decay_samples: 0,
            final_scale: 0.1,
        }
    }
}

impl LrSchedule {
    /// True when the rate never changes.
    pub fn is_constant(&self) -> bool {
        self.warmup_samples == 0 && self.decay == Decay::None
    }

    /// The multiplier for a step that starts after `samples` training samples, in a run of
    /// `total` samples (used when `decay_samples` is 0).
    pub fn scale(&self, samples: u64, total: u64) -> f32 {
        let warm = if self.warmup_samples > 0 {
            ((samples + 1) as f64 / self.warmup_samples as f64).min(1.0)
        } else {
            1.0
        };
        let end = if self.decay_samples > 0 {
            self.decay_samples
        } else {
            total
        };
        let start = self.warmup_samples.min(end);
        let progress = if end > start {
            (samples.saturating_sub(start) as f64 / (end - start) as f64).min(1.0)
        } else {
            0.0
        };
        let f = f64::from(self.final_scale);
        let decay = match self.decay {
            Decay::None => 1.0,
            Decay::Linear => 1.0 - (1.0 - f) * progress,
            Decay::Cosine => f + (1.0 - f) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()),
        };
        (warm * decay) as f32
    }

    /// Checks the ranges; `Err((field, reason))`.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if !(0.0..=1.0).contains(&self.final_scale) {
            return Err((
                "optimizer.schedule.final_scale",
                format!("must be between 0 and 1, got {}", self.final_scale),
            ));
        }
        if self.decay_samples > 0 && self.decay_samples < self.warmup_samples {
            return Err((
                "optimizer.schedule.decay_samples",
                format!(
                    "{} ends the decay before the warm-up ends ({}); set it larger, or 0 for the whole run",
                    self.decay_samples, self.warmup_samples
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Warm-up 100 samples, cosine to 0.1 at 1,100: ramps linearly, peaks at 1 when the
    /// warm-up ends, is halfway down (0.55) at 600 and ends at 0.1, and stays there.
    #[test]
    fn warm_up_then_cosine_by_hand() {
        let s = LrSchedule {
            warmup_samples: 100,
            decay: Decay::Cosine,
            decay_samples: 0,
            final_scale: 0.1,
        };
        let at = |n| s.scale(n, 1100);
        assert!((at(0) - 0.01).abs() < 1e-6);
        assert!((at(49) - 0.5).abs() < 1e-6);
        assert!((at(100) - 1.0).abs() < 1e-6);
        assert!((at(600) - 0.55).abs() < 1e-6);
        assert!((at(1100) - 0.1).abs() < 1e-6);
        assert!((at(5000) - 0.1).abs() < 1e-6);
        let linear = LrSchedule {
            decay: Decay::Linear,
            warmup_samples: 0,
            ..s
        };
        assert!((linear.scale(550, 1100) - 0.55).abs() < 1e-6);
        assert_eq!(LrSchedule::default().scale(123, 1000), 1.0);
        assert!(LrSchedule::default().is_constant());
    }

    #[test]
    fn bad_settings_name_their_field() {
        let s = LrSchedule {
            final_scale: 2.0,
            ..LrSchedule::default()
        };
        assert_eq!(
            s.validate().unwrap_err().0,
            "optimizer.schedule.final_scale"
        );
        let s = LrSchedule {
            warmup_samples: 10,
            decay_samples: 5,
            ..LrSchedule::default()
        };
        assert_eq!(
            s.validate().unwrap_err().0,
            "optimizer.schedule.decay_samples"
        );
    }
}
