//! Allocations (what a job gets) and bounds (what it may get).

use serde::{Deserialize, Serialize};

use crate::error::{check_non_negative_at, BrainError, Result};

/// Resources of one job: worker and PS counts with CPU cores and memory (GiB) per role.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Allocation {
    /// Number of workers.
    pub workers: u32,
    /// Number of parameter servers.
    pub ps: u32,
    /// CPU cores per worker.
    pub worker_cpu: f64,
    /// CPU cores per PS.
    pub ps_cpu: f64,
    /// Memory per worker, GiB.
    pub worker_mem_gb: f64,
    /// Memory per PS, GiB.
    pub ps_mem_gb: f64,
}

impl Allocation {
    /// Total CPU cores.
    pub fn total_cpu(&self) -> f64 {
        f64::from(self.workers) * self.worker_cpu + f64::from(self.ps) * self.ps_cpu
    }

    /// Total memory, GiB.
    pub fn total_mem_gb(&self) -> f64 {
        f64::from(self.workers) * self.worker_mem_gb + f64::from(self.ps) * self.ps_mem_gb
    }

    /// Checks every field is finite and non-negative, with at least one worker and one PS.
    pub fn validate(&self, field: &str) -> Result<()> {
        if self.workers == 0 {
            return Err(BrainError::invalid(
                format!("{field}.workers"),
                "must be >= 1",
            ));
        }
        if self.ps == 0 {
            return Err(BrainError::invalid(format!("{field}.ps"), "must be >= 1"));
        }
        for (name, v) in [
            ("worker_cpu", self.worker_cpu),
            ("ps_cpu", self.ps_cpu),
            ("worker_mem_gb", self.worker_mem_gb),
            ("ps_mem_gb", self.ps_mem_gb),
        ] {
            check_non_negative_at(|| format!("{field}.{name}"), v)?;
            if v == 0.0 {
                return Err(BrainError::invalid(
                    format!("{field}.{name}"),
                    "must be > 0",
                ));
            }
        }
        Ok(())
    }
}

/// An inclusive range.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Range<T> {
    /// Smallest allowed value.
    pub min: T,
    /// Largest allowed value.
    pub max: T,
}

impl<T: PartialOrd + Copy> Range<T> {
    /// A range; callers validate with [`Bounds::validate`].
    pub fn new(min: T, max: T) -> Self {
        Self { min, max }
    }

    /// Whether `v` lies inside.
    pub fn contains(&self, v: T) -> bool {
        v >= self.min && v <= self.max
    }

    /// `v` moved inside the range.
    pub fn clamp(&self, v: T) -> T {
        if v < self.min {
            self.min
        } else if v > self.max {
            self.max
        } else {
            v
        }
    }
}

/// What the brain may propose for a job. Every plan lies inside these bounds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bounds {
    /// Worker count range (default 1..=64).
    #[serde(default = "Bounds::default_workers", with = "range_u32")]
    pub workers: Range<u32>,
    /// PS count range (default 1..=32).
    #[serde(default = "Bounds::default_ps", with = "range_u32")]
    pub ps: Range<u32>,
    /// CPU cores per worker (default 1..=32).
    #[serde(default = "Bounds::default_cpu", with = "range_f64")]
    pub worker_cpu: Range<f64>,
    /// CPU cores per PS (default 1..=32).
    #[serde(default = "Bounds::default_cpu", with = "range_f64")]
    pub ps_cpu: Range<f64>,
    /// Memory per worker, GiB (default 2..=128).
    #[serde(default = "Bounds::default_mem", with = "range_f64")]
    pub worker_mem_gb: Range<f64>,
    /// Memory per PS, GiB (default 2..=256).
    #[serde(default = "Bounds::default_ps_mem", with = "range_f64")]
    pub ps_mem_gb: Range<f64>,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            workers: Self::default_workers(),
            ps: Self::default_ps(),
            worker_cpu: Self::default_cpu(),
            ps_cpu: Self::default_cpu(),
            worker_mem_gb: Self::default_mem(),
            ps_mem_gb: Self::default_ps_mem(),
        }
    }
}

/// Largest count the brain accepts for workers or PS (absurd sizes are rejected).
pub const MAX_NODES: u32 = 100_000;
/// Largest per-node CPU count accepted.
pub const MAX_CPU: f64 = 1024.0;
/// Largest per-node memory accepted, GiB.
pub const MAX_MEM_GB: f64 = 65_536.0;

impl Bounds {
    fn default_workers() -> Range<u32> {
        Range::new(1, 64)
    }
    fn default_ps() -> Range<u32> {
        Range::new(1, 32)
    }
    fn default_cpu() -> Range<f64> {
        Range::new(1.0, 32.0)
    }
    fn default_mem() -> Range<f64> {
        Range::new(2.0, 128.0)
    }
    fn default_ps_mem() -> Range<f64> {
        Range::new(2.0, 256.0)
    }

    /// Checks that every range is non-empty, finite, positive and not absurd.
    pub fn validate(&self) -> Result<()> {
        for (name, r) in [("bounds.workers", self.workers), ("bounds.ps", self.ps)] {
            if r.min == 0 || r.min > r.max || r.max > MAX_NODES {
                return Err(BrainError::invalid(
                    name,
                    format!(
                        "need 1 <= min <= max <= {MAX_NODES}, got {}..{}",
                        r.min, r.max
                    ),
                ));
            }
        }
        for (name, r, cap) in [
            ("bounds.worker_cpu", self.worker_cpu, MAX_CPU),
            ("bounds.ps_cpu", self.ps_cpu, MAX_CPU),
            ("bounds.worker_mem_gb", self.worker_mem_gb, MAX_MEM_GB),
            ("bounds.ps_mem_gb", self.ps_mem_gb, MAX_MEM_GB),
        ] {
            if !(r.min.is_finite() && r.max.is_finite() && r.min > 0.0 && r.min <= r.max)
                || r.max > cap
            {
                return Err(BrainError::invalid(
                    name,
                    format!("need 0 < min <= max <= {cap}, got {}..{}", r.min, r.max),
                ));
            }
        }
        Ok(())
    }

    /// Whether `a` lies inside every range.
    pub fn contains(&self, a: &Allocation) -> bool {
        self.workers.contains(a.workers)
            && self.ps.contains(a.ps)
            && self.worker_cpu.contains(a.worker_cpu)
            && self.ps_cpu.contains(a.ps_cpu)
            && self.worker_mem_gb.contains(a.worker_mem_gb)
            && self.ps_mem_gb.contains(a.ps_mem_gb)
    }

    /// `a` moved inside every range.
    pub fn clamp(&self, a: &Allocation) -> Allocation {
        Allocation {
            workers: self.workers.clamp(a.workers),
            ps: self.ps.clamp(a.ps),
            worker_cpu: self.worker_cpu.clamp(a.worker_cpu),
            ps_cpu: self.ps_cpu.clamp(a.ps_cpu),
            worker_mem_gb: self.worker_mem_gb.clamp(a.worker_mem_gb),
            ps_mem_gb: self.ps_mem_gb.clamp(a.ps_mem_gb),
        }
    }

    /// Fails with [`BrainError::Internal`] when a proposed allocation leaves the bounds.
    pub fn ensure_contains(&self, a: &Allocation) -> Result<()> {
        if self.contains(a) {
            Ok(())
        } else {
            Err(BrainError::Internal(format!(
                "proposed allocation {a:?} lies outside bounds {self:?}"
            )))
        }
    }
}

/// Serde for `[min, max]` arrays of u32.
mod range_u32 {
    use super::Range;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    pub fn serialize<S: Serializer>(r: &Range<u32>, s: S) -> Result<S::Ok, S::Error> {
        [r.min, r.max].serialize(s)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Range<u32>, D::Error> {
        let [min, max] = <[u32; 2]>::deserialize(d)?;
        Ok(Range { min, max })
    }
}

/// Serde for `[min, max]` arrays of f64.
mod range_f64 {
    use super::Range;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    pub fn serialize<S: Serializer>(r: &Range<f64>, s: S) -> Result<S::Ok, S::Error> {
        [r.min, r.max].serialize(s)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Range<f64>, D::Error> {
        let [min, max] = <[f64; 2]>::deserialize(d)?;
        Ok(Range { min, max })
    }
}

/// Cluster-wide resources (CPU cores and memory GiB).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Resources {
    /// CPU cores.
    pub cpu: f64,
    /// Memory, GiB.
    pub mem_gb: f64,
}

impl Resources {
    /// The resources of an allocation.
    pub fn of(a: &Allocation) -> Self {
        Self {
            cpu: a.total_cpu(),
            mem_gb: a.total_mem_gb(),
        }
    }

    /// Whether `self` fits within `cap` (with a tiny tolerance for rounding).
    pub fn fits_in(&self, cap: &Resources) -> bool {
        self.cpu <= cap.cpu * (1.0 + 1e-12) + 1e-9
            && self.mem_gb <= cap.mem_gb * (1.0 + 1e-12) + 1e-9
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clamp_moves_inside_and_validate_rejects_bad_ranges() {
        let b = Bounds::default();
        let a = Allocation {
            workers: 1000,
            ps: 0,
            worker_cpu: 0.1,
            ps_cpu: 99.0,
            worker_mem_gb: 4.0,
            ps_mem_gb: 1e6,
        };
        assert!(!b.contains(&a));
        let c = b.clamp(&a);
        assert!(b.contains(&c));
        assert_eq!((c.workers, c.ps), (64, 1));
        let mut bad = b;
        bad.worker_cpu = Range::new(4.0, 2.0);
        assert!(
            matches!(bad.validate(), Err(BrainError::InvalidInput { field, .. }) if field == "bounds.worker_cpu")
        );
        bad = b;
        bad.ps_mem_gb = Range::new(f64::NAN, 2.0);
        assert!(bad.validate().is_err());
        bad = b;
        bad.workers = Range::new(0, 3);
        assert!(bad.validate().is_err());
    }
}
