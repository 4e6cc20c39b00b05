//! The verdict on a brain's plan: within the bounds, trusted by what the profile
//! measured, and for memory or for speed; and the record of each change applied.

use super::*;

/// `planned`, or the nearest count a fit over the `seen` ones can be trusted with: half
/// the fewest to twice the most (with a note why).
fn trusted(
    seen: &std::collections::BTreeSet<u32>,
    planned: u32,
    what: &str,
) -> (u32, Option<String>) {
    let (Some(&lo), Some(&hi)) = (seen.first(), seen.last()) else {
        return (planned, None);
    };
    let trusted = planned.clamp((lo / 2).max(1), hi.saturating_mul(2));
    if trusted == planned {
        return (planned, None);
    }
    (
        trusted,
        Some(format!(
            "{planned} {what} is outside what the fit can be trusted with (the profile measured {lo} to {hi}; half to twice that): {trusted} {what} first, measured before going further"
        )),
    )
}

impl Autoscaler {
    /// Judges a plan from the brain against the bounds and the state of the job.
    pub fn review(&mut self, plan: &Proposal, v: &View) -> Decision {
        self.brain_error = None;
        self.last_plan = Some(plan.clone());
        self.plan_for_memory = plan.for_memory;
        let d = self.judge(plan, v);
        // The brain sees a gain in more servers that the fit cannot predict yet (one PS
        // count, one value of a PS's cores): the next round measures one more.
        self.ps_probe_wanted = !self.plan_for_memory
            && self.seen_ps.len() < 2
            && self.seen_ps_cpu.len() < 2
            && plan.allocation.is_some_and(|a| a.ps > v.ps);
        self.last_verdict = Some(match &d {
            Decision::Apply {
                workers,
                ps,
                worker_cpu,
                ps_cpu,
                ..
            } => format!("apply: {workers} workers x {worker_cpu} cores, {ps} PS x {ps_cpu} cores"),
            Decision::Keep(why) => format!("keep: {why}"),
            Decision::Refuse(why) => format!("refused: {why}"),
        });
        d
    }

    pub(super) fn judge(&self, plan: &Proposal, v: &View) -> Decision {
        let Some(a) = plan.allocation else {
            return Decision::Refuse("the brain's plan has no allocation".into());
        };
        if let Some(refused) = self.out_of_bounds(&a, plan, v) {
            return refused;
        }
        let cpu = a.worker_cpu.round();
        let tp = plan.predicted_throughput;
        let (workers, guessed) = self.trusted_workers(a.workers);
        // A PS change for memory (a server would reach its limit before the job ends) is
        // always made. One for speed only once the profile spans two PS counts or two
        // values of a PS's cores (the PS term of Eq. 2 is `w / (p ps_cpu)`): from neither,
        // the fit cannot tell what a server is worth, and a re-sharding bought on a guess
        // costs a pause. At most twice (half) the counts measured, as for workers.
        let for_memory = plan.for_memory;
        let (planned_ps, ps_step) = if for_memory {
            (a.ps, None)
        } else {
            trusted(&self.seen_ps, a.ps, "PS")
        };
        let (ps, ps_note) = if planned_ps == v.ps {
            (a.ps, None)
        } else if !self.settings.ps_scaling {
            (
                v.ps,
                Some("needs online re-sharding, which this job cannot do (synchronous mode)"),
            )
        } else if !for_memory && self.seen_ps.len() < 2 && self.seen_ps_cpu.len() < 2 {
            (
                v.ps,
                Some("is for speed, and the profile holds one PS count and one value of a PS's cores: the fit cannot predict it"),
            )
        } else if planned_ps < v.ps && a.ps_mem_gb > self.settings.ps_mem_gb + 1e-9 {
            // Fewer PS hold more rows each: the plan sized them with more memory than
            // this job's PS have (memory is not changed in place), so they would run out.
            (
                v.ps,
                Some("needs more memory per PS than the job's PS have (the model state would not fit on fewer)"),
            )
        } else {
            (planned_ps, None)
        };
        // Cores per worker change only once the profile holds two values (as PS counts):
        // from one, the fit cannot tell what a core is worth, up or down (the cluster
        // simulator showed shared-brain plans cutting workers to one core on such a fit).
        let now_cpu = self.settings.worker_cpu;
        let cpu = if cpu != now_cpu && self.seen_cpu.len() < 2 {
            now_cpu
        } else {
            cpu
        };
        // Cores per PS once the fit can tell what they are worth: two values of them, or
        // two PS counts (the term is `w / (p * ps_cpu)`).
        let now_ps_cpu = self.settings.ps_cpu;
        let ps_cpu =
            if a.ps_cpu != now_ps_cpu && self.seen_ps_cpu.len() < 2 && self.seen_ps.len() < 2 {
                now_ps_cpu
            } else {
                a.ps_cpu
            };
        // Cores per PS above those of a plan that raised them and did not pay.
        let (ps_cpu, ps_cpu_capped) = match self.max_ps_cpu {
            Some(max) if ps_cpu > max + 1e-9 && !for_memory => (
                max,
                Some(format!(
                    "{ps_cpu} cores per PS are more than the {max} this job measured to pay (a plan that raised them did not): {max}"
                )),
            ),
            _ => (ps_cpu, None),
        };
        if (workers, ps) == (v.workers, v.ps) && cpu == now_cpu && ps_cpu == now_ps_cpu {
            return Decision::Keep(match ps_note {
                Some(why) => format!("the plan's PS change ({} -> {}) {why}", v.ps, a.ps),
                None => format!("the plan keeps {} workers and {} PS", v.workers, v.ps),
            });
        }
        let planned_cpu = f64::from(workers) * cpu + f64::from(ps) * ps_cpu;
        if let Some(max) = self
            .max_cpu
            .filter(|m| !for_memory && planned_cpu > m + 1e-9)
        {
            return Decision::Keep(format!(
                "the plan's {planned_cpu} cores are more than the {max} this job measured to pay (a growth beyond them raised throughput by less than autoscale.growth_efficiency of the cores it added)"
            ));
        }
        if let Some(max) = self.max_workers.filter(|m| !for_memory && workers > *m) {
            return Decision::Keep(format!(
                "the plan's {workers} workers are more than the {max} this job measured to pay (a growth beyond them raised throughput by less than autoscale.growth_efficiency of the cores it added)"
            ));
        }
        if let Some(now) = self.measured().filter(|t| *t > 0.0) {
            let change = (tp - now) / now;
            // Fewer nodes for the same speed is a saving; more nodes must be faster.
            let cheaper =
                workers <= v.workers && ps <= v.ps && cpu <= now_cpu && ps_cpu <= now_ps_cpu;
            if !cheaper && !for_memory && change < self.settings.min_gain {
                return Decision::Keep(format!(
                    "predicted {tp:.0} samples/s is {:+.1}% of the measured {now:.0}, below autoscale.min_gain ({:.0}%)",
                    change * 100.0,
                    self.settings.min_gain * 100.0
                ));
            }
            // A job that plans its own capacity saves nodes only at about the same speed:
            // a plan 10% slower for fewer workers made a warm job lose what it saved.
            // (A shared brain service shrinks a job for the others: its plan stands.)
            if cheaper && self.settings.send_capacity && change < -self.settings.min_gain {
                return Decision::Keep(format!(
                    "predicted {tp:.0} samples/s is {:+.1}% of the measured {now:.0}: fewer nodes only within autoscale.min_gain ({:.0}%) of the measured speed",
                    change * 100.0,
                    self.settings.min_gain * 100.0
                ));
            }
        }
        // The prediction was for the plan's count, not the trusted step towards it.
        let ps_step = ps_step.filter(|_| ps != v.ps);
        let steps = [guessed, ps_step, ps_cpu_capped];
        let predicted = steps.iter().all(Option::is_none).then_some(tp);
        let mut reasons = plan.reasons.clone();
        reasons.extend(steps.into_iter().flatten());
        Decision::Apply {
            workers,
            worker_cpu: cpu,
            ps,
            ps_cpu,
            predicted,
            reasons,
        }
    }

    /// The refusal of a plan outside the job's bounds, or one that comes while a PS is
    /// being recovered.
    fn out_of_bounds(&self, a: &Allocation, plan: &Proposal, v: &View) -> Option<Decision> {
        let [wmin, wmax] = self.settings.workers;
        let [pmin, pmax] = self.settings.ps;
        let cpu_max = self.settings.worker_cpu_max;
        let cpu = a.worker_cpu.round();
        if !(a.worker_cpu.is_finite() && (1.0..=cpu_max + 1e-9).contains(&cpu)) {
            return Some(Decision::Refuse(format!(
                "the plan's {} cores per worker are outside [1, {cpu_max}] (autoscale.worker_cpu_max)",
                a.worker_cpu
            )));
        }
        if !(wmin..=wmax).contains(&a.workers) {
            return Some(Decision::Refuse(format!(
                "the plan's {} workers are outside autoscale.workers [{wmin}, {wmax}]",
                a.workers
            )));
        }
        let ps_cpu_max = self.settings.ps_cpu_max.max(self.settings.ps_cpu);
        if !(a.ps_cpu.is_finite() && a.ps_cpu > 0.0 && a.ps_cpu <= ps_cpu_max + 1e-9) {
            return Some(Decision::Refuse(format!(
                "the plan's {} cores per PS are outside (0, {ps_cpu_max}] (autoscale.ps_cpu_max)",
                a.ps_cpu
            )));
        }
        if !(pmin..=pmax).contains(&a.ps) {
            return Some(Decision::Refuse(format!(
                "the plan's {} PS are outside autoscale.ps [{pmin}, {pmax}]",
                a.ps
            )));
        }
        let tp = plan.predicted_throughput;
        if !(tp.is_finite() && tp >= 0.0) {
            return Some(Decision::Refuse(format!(
                "the plan's predicted throughput {tp} is not a number of samples/s"
            )));
        }
        if v.recovering {
            return Some(Decision::Refuse(
                "a parameter server is being recovered; scaling waits until it runs".into(),
            ));
        }
        None
    }

    /// The plan's worker count, or the nearest one the fit can be trusted with: within
    /// half the fewest and twice the most workers the profile measured (with a note why).
    /// A fit of throughput against workers extrapolates badly: one over 11 and 15 workers,
    /// where the job was bound by its PS, predicted 1 worker as fast, and a warm job went
    /// from 11 workers to 1 and back. Clamped, such a plan becomes a step that measures.
    pub(super) fn trusted_workers(&self, planned: u32) -> (u32, Option<String>) {
        trusted(&self.seen_workers, planned, "workers")
    }

    /// Records an executed decision.
    pub fn applied(&mut self, d: &Decision, v: &View, source: &str) {
        if let Decision::Apply {
            workers,
            worker_cpu,
            ps,
            ps_cpu,
            predicted,
            reasons,
        } = d
        {
            let before = self.settings.allocation(v.workers, v.ps);
            let after = Allocation {
                workers: *workers,
                ps: *ps,
                worker_cpu: *worker_cpu,
                ps_cpu: *ps_cpu,
                ..before
            };
            // A plan's growth is judged at its first window, against the window before
            // it (measured at the allocation it leaves).
            let measured_here = self
                .measured
                .filter(|(_, w, p)| (*w, *p) == (v.workers, v.ps));
            let give_back = source == "probe" && after.total_cpu() < before.total_cpu() - 1e-9;
            let ps_probe = source == "probe" && after.ps > before.ps;
            let halfway = self
                .halfway
                .take()
                .filter(|(w, _)| source == "revert" && w == workers);
            self.growth = match halfway {
                // Judged against the allocation before the growth it halves.
                Some((_, step)) => Some(step),
                None => (source == "plan" || give_back || ps_probe)
                    .then_some(measured_here)
                    .flatten()
                    .map(|(tp, ..)| Growth {
                        before,
                        measured_before: tp,
                        give_back,
                        ps_probe,
                        for_memory: source == "plan" && self.plan_for_memory,
                        halfway_of: None,
                    }),
            };
            self.measure_next = source != "plan";
            self.history.push(ScalingRecord {
                at_s: v.now_ms.saturating_sub(self.started_ms) as f64 / 1000.0,
                before: (v.workers, v.ps),
                after: (*workers, *ps),
                worker_cpu: (self.settings.worker_cpu, *worker_cpu),
                ps_cpu: (self.settings.ps_cpu, *ps_cpu),
                source: source.to_string(),
                measured_before: self.measured(),
                predicted: *predicted,
                measured_after: None,
                reasons: reasons.clone(),
            });
            self.settings.worker_cpu = *worker_cpu;
            self.settings.ps_cpu = *ps_cpu;
            // The next window starts at the new allocation.
            self.window = None;
        }
    }
}
