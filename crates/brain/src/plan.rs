//! Plans: what the brain proposes, why, and the figures it expects; rendered as tables.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::alloc::Allocation;
use crate::nsga2::Candidate;
use crate::oom::MemoryAction;
use crate::throughput::FitReport;

/// Which decision produced a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlanKind {
    /// At submission (Algorithm 1 or the default).
    WarmStart,
    /// A periodic re-plan that changes the allocation.
    Replan,
    /// A re-plan that keeps the current allocation.
    Keep,
}

impl PlanKind {
    /// Name on the wire and in tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::WarmStart => "warm-start",
            Self::Replan => "re-plan",
            Self::Keep => "keep",
        }
    }

    /// The kind named `name` on the wire ([`PlanKind::as_str`]'s inverse).
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::WarmStart, Self::Replan, Self::Keep]
            .into_iter()
            .find(|k| k.as_str() == name)
    }
}

/// A resource plan for one job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Job id.
    pub job_id: String,
    /// What produced it.
    pub kind: PlanKind,
    /// The allocation to run with (always inside the job's bounds).
    pub allocation: Allocation,
    /// Predicted samples/s (absent without a fitted model).
    pub predicted_throughput: Option<f64>,
    /// Resource Cost of the allocation (Eq. 7), per hour.
    pub predicted_cost: f64,
    /// Throughput Gain net of scaling overhead (Eq. 8), samples/s.
    pub predicted_gain: Option<f64>,
    /// Why, in order.
    pub reasons: Vec<String>,
    /// Fit quality of the model behind the plan.
    pub fit: Option<FitReport>,
    /// OOM-prevention actions folded into the plan.
    pub memory: Vec<MemoryAction>,
    /// The NSGA-II front the plan was chosen from (cheapest first).
    pub front: Vec<Candidate>,
}

/// Writes `rows` under `header` as a boxed text table.
pub fn table(out: &mut String, header: &[&str], rows: &[Vec<String>]) {
    let mut width: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let sep: String = width
        .iter()
        .map(|w| format!("+{}", "-".repeat(w + 2)))
        .collect::<String>()
        + "+\n";
    let line = |cells: &[String]| -> String {
        cells
            .iter()
            .zip(&width)
            .map(|(c, w)| format!("| {c:>w$} "))
            .collect::<String>()
            + "|\n"
    };
    out.push_str(&sep);
    out.push_str(&line(
        &header.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
    ));
    out.push_str(&sep);
    for r in rows {
        out.push_str(&line(r));
    }
    out.push_str(&sep);
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |x| format!("{x:.1}"))
}

impl Plan {
    /// The plan as a text table (allocation, predictions, fit, reasons, front).
    pub fn render_table(&self) -> String {
        let a = &self.allocation;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "plan for job `{}` ({})",
            self.job_id,
            self.kind.as_str()
        );
        table(
            &mut out,
            &[
                "workers",
                "ps",
                "cpu/worker",
                "cpu/ps",
                "GiB/worker",
                "GiB/ps",
                "samples/s",
                "cost/h",
                "gain",
            ],
            &[vec![
                a.workers.to_string(),
                a.ps.to_string(),
                format!("{:.1}", a.worker_cpu),
                format!("{:.1}", a.ps_cpu),
                format!("{:.1}", a.worker_mem_gb),
                format!("{:.1}", a.ps_mem_gb),
                opt(self.predicted_throughput),
                format!("{:.2}", self.predicted_cost),
                opt(self.predicted_gain),
            ]],
        );
        if let Some(f) = &self.fit {
            let _ = writeln!(
                out,
                "model {}: held-out MAE {:.1} samples/s, MAPE {:.2}% ({} train / {} held out), RMSLE {:.4}",
                f.model, f.mae, f.mape, f.train_samples, f.holdout_samples, f.rmsle
            );
        }
        for m in &self.memory {
            let _ = writeln!(
                out,
                "PS {} (current layout): predicted peak {:.1} GiB vs limit {:.1} GiB{} -> needs {:.1} GiB{}",
                m.ps_index,
                m.predicted_peak_gb,
                m.limit_gb,
                m.step_at_limit
                    .map_or(String::new(), |s| format!(" (reached at step {s})")),
                m.new_mem_gb,
                if m.capped { " (capped by bounds)" } else { "" }
            );
        }
        out.push_str("reasons:\n");
        for r in &self.reasons {
            let _ = writeln!(out, "  - {r}");
        }
        if !self.front.is_empty() {
            let _ = writeln!(out, "pareto front ({} candidates):", self.front.len());
            let rows: Vec<Vec<String>> = self
                .front
                .iter()
                .map(|c| {
                    vec![
                        c.alloc.workers.to_string(),
                        c.alloc.ps.to_string(),
                        format!("{:.1}", c.alloc.worker_cpu),
                        format!("{:.1}", c.alloc.ps_cpu),
                        format!("{:.1}", c.alloc.worker_mem_gb),
                        format!("{:.1}", c.alloc.ps_mem_gb),
                        format!("{:.1}", c.throughput),
                        format!("{:.2}", c.cost),
                        format!("{:.1}", c.gain),
                    ]
                })
                .collect();
            table(
                &mut out,
                &[
                    "workers",
                    "ps",
                    "cpu/worker",
                    "cpu/ps",
                    "GiB/worker",
                    "GiB/ps",
                    "samples/s",
                    "cost/h",
                    "gain",
                ],
                &rows,
            );
        }
        out
    }
}

/// A KALE streaming plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamPlan {
    /// Job id.
    pub job_id: String,
    /// Forecast traffic per interval, samples/s.
    pub forecast: Vec<f64>,
    /// Fewest workers per interval (Eq. 10).
    pub raw_workers: Vec<u32>,
    /// After stabilization (Algorithm 1).
    pub stabilized_workers: Vec<u32>,
    /// Workers to run with now (after the fallback rule).
    pub workers_now: u32,
    /// Predicted throughput with `workers_now`.
    pub predicted_throughput_now: f64,
    /// Why.
    pub reasons: Vec<String>,
    /// Fit quality.
    pub fit: Option<FitReport>,
}

impl StreamPlan {
    /// The plan as a text table.
    pub fn render_table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "streaming plan for job `{}`: {} workers now ({:.1} samples/s)",
            self.job_id, self.workers_now, self.predicted_throughput_now
        );
        let rows: Vec<Vec<String>> = self
            .forecast
            .iter()
            .zip(&self.raw_workers)
            .zip(&self.stabilized_workers)
            .enumerate()
            .map(|(i, ((f, r), s))| {
                vec![
                    i.to_string(),
                    format!("{f:.1}"),
                    r.to_string(),
                    s.to_string(),
                ]
            })
            .collect();
        table(
            &mut out,
            &["interval", "forecast", "fewest", "stabilized"],
            &rows,
        );
        out.push_str("reasons:\n");
        for r in &self.reasons {
            let _ = writeln!(out, "  - {r}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_every_figure_and_reason() {
        let p = Plan {
            job_id: "j".into(),
            kind: PlanKind::Replan,
            allocation: Allocation {
                workers: 7,
                ps: 3,
                worker_cpu: 4.5,
                ps_cpu: 2.0,
                worker_mem_gb: 8.0,
                ps_mem_gb: 16.0,
            },
            predicted_throughput: Some(12345.6),
            predicted_cost: 50.0,
            predicted_gain: Some(100.0),
            reasons: vec!["because".into()],
            fit: None,
            memory: vec![],
            front: vec![],
        };
        let t = p.render_table();
        for needle in ["re-plan", " 7 |", "4.5", "12345.6", "because"] {
            assert!(t.contains(needle), "missing {needle} in\n{t}");
        }
    }
}
