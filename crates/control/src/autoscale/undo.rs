//! Undoing a plan whose growth did not pay: halfway first, then back to the best
//! allocation measured to pay.

use super::*;

/// Halfway from one allocation to another: the geometric mean of their workers, with
/// `to`'s PS count and cores per worker, and the fewer cores per PS of the two. Only
/// the workers are halved: the brain's model lacks the terms that grow with them
/// (contention, stragglers). Halving the cores too was measured on the cluster
/// simulator's default trace: 1.5% less mean JCT for 8% more core-hours, more cores than
/// the well-tuned configurations held. A raise of the PS's cores is not kept into the
/// halfway step: judged with the workers, it could not be told apart from them, and
/// without it the trace's mean JCT fell 0.5% for 1.3% fewer core-hours
/// (`docs/simulator.md`).
pub(super) fn halfway(from: &Allocation, to: &Allocation) -> Allocation {
    Allocation {
        workers: (f64::from(from.workers) * f64::from(to.workers))
            .sqrt()
            .round() as u32,
        ps_cpu: from.ps_cpu.min(to.ps_cpu),
        ..*to
    }
}

impl Autoscaler {
    /// The decision that undoes the last plan, when its first window says it did not pay:
    /// a growth that raised throughput by less than [`Settings::growth_efficiency`] of the
    /// cores it added, or any other change that lost more throughput than the cores it gave
    /// back (and `min_gain` of noise).
    ///
    /// A growth that added workers is first halved: the job goes to the geometric mean of
    /// the workers before and after it, with the plan's cores and PS ([`halfway`]), judged
    /// at its first window against the same allocation before the growth. The brain's model lacks the
    /// terms that make the last workers and cores idle (contention, stragglers), so a plan
    /// too big to pay may still hold a smaller growth that does; undoing it whole left
    /// jobs at half the speed their cluster had room for. When the halfway step pays, the
    /// plans stay below the workers and cores of the growth that did not; when it does
    /// not either, the job goes back and its plans stay within the workers (or, without a
    /// change of workers, the cores) it had.
    pub(super) fn undo_unpaid_plan(&mut self, v: &View) -> Option<Decision> {
        self.halfway = None;
        let g = self.growth.take()?;
        let (now, w, p) = self.measured?;
        let after = self.settings.allocation(v.workers, v.ps);
        // Judged only at the allocation the plan made (a failure or a refused change in
        // between leaves nothing to judge).
        if (w, p) != (v.workers, v.ps) || self.settings.growth_efficiency <= 0.0 {
            return None;
        }
        let b = g.before;
        let (cores_before, cores_after) = (b.total_cpu(), after.total_cpu());
        if g.give_back {
            self.judge_give_back(&g, &after, now);
            return None;
        }
        let cores = cores_after / cores_before;
        let speed = now / g.measured_before;
        let grew = cores > 1.0 + 1e-9;
        let paid = if grew {
            speed - 1.0 >= self.settings.growth_efficiency * (cores - 1.0)
        } else {
            // The brain plans a change that keeps or saves cores only for a gain.
            speed >= 1.0 - self.settings.min_gain
        };
        if paid {
            if let Some(planned) = g.halfway_of {
                self.cap_below_growth(&planned, &g, &after, now);
            }
            return None;
        }
        let mut reasons = vec![format!(
            "measured: the plan's {} workers x {} cores and {} PS x {} cores ({cores_before} -> {cores_after} cores, {:+.0}%) changed throughput {:.0} -> {now:.0} samples/s ({:+.1}%)",
            after.workers,
            after.worker_cpu,
            after.ps,
            after.ps_cpu,
            (cores - 1.0) * 100.0,
            g.measured_before,
            (speed - 1.0) * 100.0,
        )];
        if grew {
            reasons.push(format!(
                "{:.0}% of proportional, below autoscale.growth_efficiency ({:.0}%)",
                (speed - 1.0) / (cores - 1.0) * 100.0,
                self.settings.growth_efficiency * 100.0
            ));
            let mid = halfway(&b, &after);
            let mid_cpu = mid.total_cpu();
            if g.halfway_of.is_none()
                && !g.ps_probe
                && mid_cpu > cores_before + 0.5
                && mid_cpu < cores_after - 0.5
            {
                reasons.push(format!(
                    "halfway: {} workers x {} cores and {} PS x {} cores ({mid_cpu} cores), judged against the {:.0} samples/s before the plan",
                    mid.workers, mid.worker_cpu, mid.ps, mid.ps_cpu, g.measured_before
                ));
                let step = Growth {
                    halfway_of: Some(after),
                    ..g
                };
                self.halfway = Some((mid.workers, step));
                return Some(Decision::Apply {
                    workers: mid.workers,
                    worker_cpu: mid.worker_cpu,
                    ps: mid.ps,
                    ps_cpu: mid.ps_cpu,
                    predicted: None,
                    reasons,
                });
            }
        } else {
            reasons.push(format!(
                "slower by more than autoscale.min_gain ({:.0}%) for no more cores",
                self.settings.min_gain * 100.0
            ));
        }
        // Back to the allocation before the plan, or to a larger one this job measured
        // to pay against it: on a shared brain the plan may have left a probe that gave a
        // quarter of the job's warm start back, and capping the job there would keep it
        // below an allocation it already ran well.
        let (b, back_to) = match self.best_paid_below(&b, g.measured_before, &after, g.for_memory) {
            Some((a, tp)) => {
                reasons.push(format!(
                    "{} workers x {} cores and {} PS x {} cores ({} cores) were measured at {tp:.0} samples/s, {:+.1}% for {:+.0}% cores: paid",
                    a.workers,
                    a.worker_cpu,
                    a.ps,
                    a.ps_cpu,
                    a.total_cpu(),
                    (tp / g.measured_before - 1.0) * 100.0,
                    (a.total_cpu() / cores_before - 1.0) * 100.0,
                ));
                (a, tp)
            }
            None => (b, g.measured_before),
        };
        Some(self.go_back(v, &g, &b, &after, back_to, reasons))
    }

    /// A give-back probe is judged, never undone: workers given back that were worth less
    /// than [`Settings::growth_efficiency`] of proportional cap later plans at the fewer.
    fn judge_give_back(&mut self, g: &Growth, after: &Allocation, now: f64) {
        let b = g.before;
        let (cores_before, cores_after) = (b.total_cpu(), after.total_cpu());
        // What the cores given back were worth: the growth from here back to them.
        let added = cores_before / cores_after - 1.0;
        let gained = g.measured_before / now - 1.0;
        if b.workers > after.workers && gained < self.settings.growth_efficiency * added {
            self.max_workers = Some(
                self.max_workers
                    .map_or(after.workers, |m| m.min(after.workers)),
            );
            self.cap_reason = Some(format!(
                "probe: {} -> {} workers ({cores_after} -> {cores_before} cores, {:+.0}%) is worth {:+.1}% throughput ({:.0} -> {:.0} samples/s), {:.0}% of proportional, below autoscale.growth_efficiency ({:.0}%): plans stay within {} workers",
                after.workers,
                b.workers,
                added * 100.0,
                gained * 100.0,
                now,
                g.measured_before,
                gained / added * 100.0,
                self.settings.growth_efficiency * 100.0,
                after.workers
            ));
        }
    }

    /// The halfway step of a growth that did not pay paid: later plans stay below the
    /// workers and cores of that growth (`planned`), and may search between.
    fn cap_below_growth(&mut self, planned: &Allocation, g: &Growth, after: &Allocation, now: f64) {
        let (cores_before, cores_after) = (g.before.total_cpu(), after.total_cpu());
        let speed = now / g.measured_before;
        // Below the growth that did not pay: a later plan may search between.
        let mut limits = Vec::new();
        if planned.workers > after.workers {
            let below = planned.workers - 1;
            self.max_workers = Some(self.max_workers.map_or(below, |m| m.min(below)));
            limits.push(format!("{below} workers"));
        }
        let below = planned.total_cpu() - 1.0;
        self.max_cpu = Some(self.max_cpu.map_or(below, |m| m.min(below)));
        limits.push(format!("{below} cores"));
        self.cap_reason = Some(format!(
            "the halfway step to {} workers x {} cores and {} PS x {} cores ({cores_before} -> {cores_after} cores) raised throughput {:.0} -> {now:.0} samples/s ({:+.1}%), at least autoscale.growth_efficiency ({:.0}%) of proportional, where {} workers and {} cores did not: plans stay within {}",
            after.workers,
            after.worker_cpu,
            after.ps,
            after.ps_cpu,
            g.measured_before,
            (speed - 1.0) * 100.0,
            self.settings.growth_efficiency * 100.0,
            planned.workers,
            planned.total_cpu(),
            limits.join(" and ")
        ));
    }

    /// Undoes the growth `g` to `b` (measured at `back_to` samples/s), capping later plans
    /// at what it measured to pay; a PS count changed for memory, or one the servers'
    /// memory will need by the job's end, stays.
    fn go_back(
        &mut self,
        v: &View,
        g: &Growth,
        b: &Allocation,
        after: &Allocation,
        back_to: f64,
        mut reasons: Vec<String>,
    ) -> Decision {
        let cores_before = g.before.total_cpu();
        let grew = after.total_cpu() > cores_before * (1.0 + 1e-9);
        let capped = if g.ps_probe {
            None
        } else if after.workers > b.workers {
            self.max_workers = Some(self.max_workers.map_or(b.workers, |m| m.min(b.workers)));
            Some(format!("plans stay within {} workers", b.workers))
        } else if grew && after.ps_cpu > b.ps_cpu + 1e-9 {
            // A plan that moved cores onto the PS says what the PS's cores are worth,
            // not what more cores of the job's shape would be: a cap on the job's cores
            // kept such jobs below the cores their warm start ran well.
            self.max_ps_cpu = Some(self.max_ps_cpu.map_or(b.ps_cpu, |m| m.min(b.ps_cpu)));
            Some(format!("plans stay within {} cores per PS", b.ps_cpu))
        } else if grew {
            self.max_cpu = Some(self.max_cpu.map_or(cores_before, |m| m.min(cores_before)));
            Some(format!("plans stay within {cores_before} cores"))
        } else {
            None
        };
        if let Some(c) = capped {
            reasons.push(c);
            self.cap_reason = Some(reasons.join("; "));
        }
        // A PS count changed for memory stays, and so does one that grew for speed where
        // the servers' memory will need it by the job's end: only the rest is undone.
        let memory_need = (b.ps < after.ps && !g.for_memory)
            .then(|| self.ps_needed_for_memory(v))
            .flatten()
            .filter(|(need, _)| *need > b.ps);
        let ps = if g.for_memory {
            after.ps
        } else if let Some((need, _)) = &memory_need {
            after.ps.min(*need)
        } else {
            b.ps
        };
        let stays = if g.for_memory {
            " (the PS count, changed for memory, stays)".to_string()
        } else if let Some((_, why)) = &memory_need {
            format!(" (the PS count stays: {why})")
        } else {
            String::new()
        };
        if (b.workers, b.worker_cpu, ps, b.ps_cpu)
            == (after.workers, after.worker_cpu, after.ps, after.ps_cpu)
        {
            reasons.push(format!("kept{stays}"));
            return Decision::Keep(reasons.join("; "));
        }
        reasons.push(format!(
            "back to {} workers x {} cores and {ps} PS x {} cores{stays}",
            b.workers, b.worker_cpu, b.ps_cpu,
        ));
        Decision::Apply {
            workers: b.workers,
            worker_cpu: b.worker_cpu,
            ps,
            ps_cpu: b.ps_cpu,
            predicted: Some(back_to),
            reasons,
        }
    }

    /// The allocation between `before` and the unpaid `after` (more cores than `before`,
    /// fewer workers and cores than `after`) that this job measured fastest among those
    /// that paid against `before`'s `measured_before` (at least
    /// [`Settings::growth_efficiency`] of proportional), within the bounds and limits;
    /// with its measured throughput. Only for a growth of workers that did not change
    /// the PS for memory.
    pub(super) fn best_paid_below(
        &self,
        before: &Allocation,
        measured_before: f64,
        after: &Allocation,
        for_memory: bool,
    ) -> Option<(Allocation, f64)> {
        if for_memory || after.workers <= before.workers {
            return None;
        }
        let s = &self.settings;
        let (lo, hi) = (before.total_cpu(), after.total_cpu());
        self.throughput_at
            .iter()
            .map(|(&(ps, cpu, ps_cpu, workers), &tp)| {
                let a = Allocation {
                    workers,
                    ps,
                    worker_cpu: cpu as f64,
                    ps_cpu: ps_cpu as f64 / 1000.0,
                    ..*before
                };
                (a, tp)
            })
            .filter(|(a, tp)| {
                let cores = a.total_cpu();
                a.workers > before.workers
                    && a.workers < after.workers
                    && (s.workers[0]..=s.workers[1]).contains(&a.workers)
                    && (s.ps[0]..=s.ps[1]).contains(&a.ps)
                    && a.worker_cpu <= s.worker_cpu_max + 1e-9
                    && a.ps_cpu <= s.ps_cpu_max + 1e-9
                    && cores > lo + 1e-9
                    && cores < hi - 1e-9
                    && self.max_workers.is_none_or(|m| a.workers <= m)
                    && self.max_cpu.is_none_or(|m| cores <= m + 1e-9)
                    && self.max_ps_cpu.is_none_or(|m| a.ps_cpu <= m + 1e-9)
                    && tp / measured_before - 1.0 >= s.growth_efficiency * (cores / lo - 1.0)
            })
            .max_by(|x, y| x.1.total_cmp(&y.1))
    }
}
