//! elastrec's own control of a batch job in the simulation: the live autoscaler and
//! memory limits, each job's master observing and deciding, the brain planning them
//! together.

use super::*;

fn absorb(ctl: &mut ElastrecCtl, r: &ProfileReport) {
    // What the service's ReportProfile stores: a report with an invalid sample is refused
    // whole.
    if r.samples
        .iter()
        .enumerate()
        .all(|(i, p)| p.validate(i).is_ok())
    {
        ctl.samples.extend_from_slice(&r.samples);
        ctl.memory.extend_from_slice(&r.memory);
        if ctl.samples.len() > FIT_WINDOW {
            ctl.samples.drain(..ctl.samples.len() - FIT_WINDOW);
        }
    }
}

impl Sim<'_> {
    /// Limits between half a GiB and a node's memory, changed in place.
    pub(super) fn memory_limits(&self) -> MemoryLimits {
        let range = Range::new(0.5, self.s.node_mem_gb);
        MemoryLimits::new(range, range)
    }

    /// The master's vertical scaling of memory (Primus Eq. 2-3): each role's limit
    /// follows its use, changed in place where the nodes have room (else it stays).
    pub(super) fn follow_memory_use(&mut self, i: usize, t: f64) {
        let j = self.jobs[i].as_mut().expect("running");
        let Ctl::Elastrec(ctl) = &mut j.ctl else {
            return;
        };
        let a = j.alloc;
        let per_ps = j.truth.ps_mem_gb(j.done / j.rec.samples as f64) / f64::from(a.ps);
        let (workers, ps) = j.pods.split_at_mut(a.workers as usize);
        let worker_use = WORKER_MEM_GB * WORKER_MEM_USE;
        if let Some(c) = ctl
            .limits
            .observe(t, WORKERS_NODE, worker_use, a.worker_mem_gb)
        {
            if self.nodes.resize_mem(workers, c.to_gb) {
                j.alloc.worker_mem_gb = c.to_gb;
            } else {
                ctl.limits.undo(&c);
            }
        }
        if let Some(c) = ctl.limits.observe(t, PS_NODE, per_ps, j.ps_mem_limit) {
            if self.nodes.resize_mem(ps, c.to_gb) {
                j.ps_mem_limit = c.to_gb;
            } else {
                ctl.limits.undo(&c);
            }
        }
    }

    pub(super) fn autoscale_settings(&self, spec: &JobSpec, a: &Allocation) -> Settings {
        // The live master's defaults (`[autoscale]`).
        let live = elastrec_job::autoscale::AutoscaleConfig::default();
        Settings {
            workers: [spec.bounds.workers.min, spec.bounds.workers.max],
            ps: [spec.bounds.ps.min, spec.bounds.ps.max],
            interval_ms: ms(self.s.plan_interval_s),
            sample_ms: ms(self.s.control_s),
            min_gain: live.min_gain,
            batch_size: spec.batch_size,
            worker_cpu: a.worker_cpu,
            worker_cpu_max: spec.bounds.worker_cpu.max,
            ps_cpu: a.ps_cpu,
            ps_cpu_max: spec.bounds.ps_cpu.max,
            worker_mem_gb: a.worker_mem_gb,
            ps_mem_gb: a.ps_mem_gb,
            cluster_cpu: self.brain.capacity.cpu,
            cluster_mem_gb: self.brain.capacity.mem_gb,
            worker_start_s: self.s.worker_start_s,
            ps_migration_s: self.s.ps_migration_s,
            ps_scaling: true,
            hot_ratio: 3.0,
            // A shared brain service: the cluster's plan decides every worker.
            send_capacity: false,
            explore: false,
            explore_efficiency: live.explore_efficiency,
            explore_linear: live.explore_linear,
            growth_efficiency: self.s.growth_efficiency,
        }
    }

    pub(super) fn view(&self, i: usize, t: f64) -> View {
        let j = self.jobs[i].as_ref().expect("running");
        let steady = j.paused_until <= t && j.switch.is_none();
        View {
            now_ms: ms(t),
            workers: j.alloc.workers,
            target_workers: j.alloc.workers,
            ps: j.alloc.ps,
            steady,
            recovering: false,
            samples_done: j.done as u64,
            samples_total: j.rec.samples,
        }
    }

    pub(super) fn elastrec_round(&mut self, t: f64) {
        // The masters observe and decide, one job at a time (each has its own master).
        let mut plans: Vec<(usize, View, PlanAsk)> = Vec::new();
        for i in self.running.clone() {
            self.follow_memory_use(i, t);
            let mut v = self.view(i, t);
            // A measured window carries the job's noise.
            let noise = {
                let j = self.jobs[i].as_mut().expect("running");
                1.0 + j.truth.noise * (j.rng.random::<f64>() * 2.0 - 1.0)
            };
            let (rec_samples, per_ps) = {
                let j = self.jobs[i].as_ref().expect("running");
                (
                    j.rec.samples,
                    j.truth.ps_mem_gb(j.done / j.rec.samples as f64) / f64::from(j.alloc.ps),
                )
            };
            let j = self.jobs[i].as_mut().expect("running");
            let Ctl::Elastrec(ctl) = &mut j.ctl else {
                continue;
            };
            v.samples_done =
                ((j.done - j.mark.0) * noise + j.mark.0).clamp(0.0, rec_samples as f64) as u64;
            j.mark = (j.done, t);
            ctl.scaler.observe(&v);
            let step = v.samples_done / u64::from(j.rec.batch_size.max(1));
            for p in 0..j.alloc.ps {
                ctl.scaler.observe_memory(p, step, per_ps);
            }
            match ctl.scaler.next_round(&v) {
                Round::Idle => {}
                Round::Report(r) => absorb(ctl, &r),
                Round::Probe(r, d) => {
                    absorb(ctl, &r);
                    self.apply_elastrec(i, &d, &v, t, "probe");
                }
                Round::Revert(r, d) => {
                    absorb(ctl, &r);
                    self.apply_elastrec(i, &d, &v, t, "revert");
                }
                Round::Plan(r, p) => {
                    absorb(ctl, &r);
                    plans.push((i, v, p));
                }
            }
        }
        if plans.is_empty() {
            return;
        }
        // The brain: each job's fit and front on its own (in parallel, as they are
        // independent), then the shared greedy one job at a time, in job order.
        let brain = self.brain;
        let inputs: Vec<_> = plans
            .iter()
            .map(|(i, _, req)| {
                let j = self.jobs[*i].as_ref().expect("running");
                let Ctl::Elastrec(ctl) = &j.ctl else {
                    unreachable!()
                };
                let cfg = req.settings(&brain).expect("the master's request is valid");
                (cfg, &ctl.spec, &ctl.samples, &ctl.memory, req)
            })
            .collect();
        let fits: Vec<_> = inputs
            .par_iter()
            .map(|(cfg, spec, samples, memory, req)| {
                planner::fit_front(cfg, &req.input(spec, samples, memory))
            })
            .collect();
        let cfgs: Vec<BrainConfig> = inputs.iter().map(|x| x.0).collect();
        drop(inputs);
        for (((i, v, req), fit), cfg) in plans.into_iter().zip(fits).zip(cfgs) {
            self.totals.plans += 1;
            let now = ms(t);
            let plan = {
                let j = self.jobs[i].as_ref().expect("running");
                let Ctl::Elastrec(ctl) = &j.ctl else {
                    unreachable!()
                };
                let input = req.input(&ctl.spec, &ctl.samples, &ctl.memory);
                fit.and_then(|fit| planner::replan_shared(&cfg, &mut self.active, &input, fit, now))
            };
            let j = self.jobs[i].as_mut().expect("running");
            let Ctl::Elastrec(ctl) = &mut j.ctl else {
                unreachable!()
            };
            match plan {
                Ok(plan) => {
                    let d = ctl.scaler.review(&Proposal::from(&plan), &v);
                    self.apply_elastrec(i, &d, &v, t, "plan");
                }
                Err(e) => ctl.scaler.brain_failed(e.to_string()),
            }
        }
    }

    pub(super) fn apply_elastrec(
        &mut self,
        i: usize,
        d: &Decision,
        v: &View,
        t: f64,
        source: &str,
    ) {
        let Decision::Apply {
            workers,
            worker_cpu,
            ps,
            ps_cpu,
            ..
        } = *d
        else {
            return;
        };
        let old = self.jobs[i].as_ref().expect("running").alloc;
        let new = Allocation {
            workers,
            worker_cpu,
            ps,
            ps_cpu,
            ..old
        };
        if self.resize(i, new, t) {
            let j = self.jobs[i].as_mut().expect("running");
            if let Ctl::Elastrec(ctl) = &mut j.ctl {
                ctl.scaler.applied(d, v, source);
            }
        }
    }
}
