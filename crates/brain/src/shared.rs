//! Jobs that share one brain, planned together (DLRover-RM Eq. 11-14 across jobs).
//!
//! The service answers one job's `Plan` at a time, but the capacity it is configured with
//! is the whole cluster's. [`ActiveJobs`] remembers, for every job that re-planned
//! recently, its latest NSGA-II front, the allocation it reported, its remaining samples,
//! the plan it was last granted and when it was last heard from. A re-plan of job `J`
//! refreshes `J`'s entry, then [`ActiveJobs::plan`] runs the weighted greedy over every
//! active job with `S` = the cluster capacity (Eq. 13: the free capacity plus the jobs'
//! current allocations) and hands `J` its own assignment. The other jobs get theirs when
//! they next re-plan.
//!
//! - **What a job holds.** `J` holds what it reports. Another job holds the larger, per
//!   resource, of what it reported and what it was last granted: it may already run with
//!   either. The greedy never takes held resources away (a job it skips keeps them), and
//!   `J`'s pick must fit beside what the others hold now; when the joint plan gives `J`
//!   room another job has not released yet, `J` gets the best candidate that fits now and
//!   the rest at a later re-plan. So the granted plans never add up to more than `S` as
//!   long as every job runs what the brain planned (OOM prevention may still raise PS
//!   memory past a pick).
//! - **Stability.** The NSGA-II is seeded and the greedy breaks ties by job id, so the same
//!   fronts, allocations and remaining samples give every job the same assignment whoever
//!   asks: a job that re-plans gets what the last run of any other job computed for it,
//!   unless its own profile or another job's entry changed since.
//! - **Pure.** Time comes in as an argument, so the expiry is tested without a clock.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::alloc::{Allocation, Resources};
use crate::error::{BrainError, Result};
use crate::greedy::{weighted_greedy, weighted_greedy_holding, GreedyParams, JobOptions};
use crate::nsga2::Candidate;
use crate::planner::Pick;

/// Where the service's time comes from (tests drive their own): milliseconds on a
/// monotonic clock, as every policy reads time (`elastrec_common::clock`).
pub trait Clock: Send + Sync {
    /// The current reading, ms.
    fn now_ms(&self) -> u64;
}

/// The system's monotonic clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        elastrec_common::clock::monotonic_ms()
    }
}

/// What the brain remembers of one active job.
#[derive(Debug, Clone, PartialEq)]
pub struct ActiveJob {
    /// The NSGA-II front of its last re-plan (gains relative to `current`).
    pub front: Vec<Candidate>,
    /// The allocation it reported at its last re-plan.
    pub current: Option<Allocation>,
    /// Samples it still had to train then (`Phi_sp` of Eq. 14).
    pub remaining_samples: f64,
    /// The allocation of the plan the brain last returned to it.
    pub granted: Option<Allocation>,
    /// When it last called `Plan` or `ReportProfile` (ms, monotonic).
    pub last_seen_ms: u64,
}

impl ActiveJob {
    /// The resources of its reported allocation.
    pub fn reported(&self) -> Resources {
        self.current.as_ref().map(Resources::of).unwrap_or_default()
    }

    /// What it may be running with: the larger, per resource, of its reported allocation
    /// and the plan it was last granted.
    pub fn holding(&self) -> Resources {
        let r = self.reported();
        match &self.granted {
            Some(g) => {
                let g = Resources::of(g);
                Resources {
                    cpu: r.cpu.max(g.cpu),
                    mem_gb: r.mem_gb.max(g.mem_gb),
                }
            }
            None => r,
        }
    }
}

/// One job's share in a shared plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Share {
    /// Job id.
    pub job_id: String,
    /// The candidate the greedy chose for it (`None`: it keeps what it holds).
    pub chosen: Option<Candidate>,
    /// What it runs with after the decision: the chosen allocation or its reported one.
    pub allocation: Option<Allocation>,
    /// The candidate the greedy would choose for it alone in the cluster.
    pub alone: Option<Candidate>,
}

/// Result of [`ActiveJobs::plan`].
#[derive(Debug, Clone, PartialEq)]
pub struct SharedPlan {
    /// The decision for the job being planned.
    pub pick: Pick,
    /// Every active job's share in this run, by job id.
    pub shares: Vec<Share>,
}

/// The jobs that share the brain's cluster, by id.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ActiveJobs {
    jobs: BTreeMap<String, ActiveJob>,
}

/// Most jobs a reason names one by one.
const NAMED: usize = 10;

fn sum(rs: impl IntoIterator<Item = Resources>) -> Resources {
    rs.into_iter().fold(Resources::default(), |a, r| Resources {
        cpu: a.cpu + r.cpu,
        mem_gb: a.mem_gb + r.mem_gb,
    })
}

fn max(a: Resources, b: Resources) -> Resources {
    Resources {
        cpu: a.cpu.max(b.cpu),
        mem_gb: a.mem_gb.max(b.mem_gb),
    }
}

fn minus(a: Resources, b: Resources) -> Resources {
    Resources {
        cpu: (a.cpu - b.cpu).max(0.0),
        mem_gb: (a.mem_gb - b.mem_gb).max(0.0),
    }
}

/// `8 workers x 4.0 CPU + 2 PS x 4.0 CPU (40.0 CPU, 96.0 GiB)`.
pub fn describe(a: &Allocation) -> String {
    format!(
        "{} workers x {:.1} CPU + {} PS x {:.1} CPU ({:.1} CPU, {:.1} GiB)",
        a.workers,
        a.worker_cpu,
        a.ps,
        a.ps_cpu,
        a.total_cpu(),
        a.total_mem_gb()
    )
}

fn named<T>(items: &[T], show: impl Fn(&T) -> String) -> String {
    let mut out: Vec<String> = items.iter().take(NAMED).map(show).collect();
    if items.len() > NAMED {
        out.push(format!("and {} more", items.len() - NAMED));
    }
    out.join("; ")
}

impl ActiveJobs {
    /// No active job.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of active jobs.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    /// Whether no job is active.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// The entry of `job_id`.
    pub fn get(&self, job_id: &str) -> Option<&ActiveJob> {
        self.jobs.get(job_id)
    }

    /// Active job ids, sorted.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.jobs.keys().map(String::as_str)
    }

    /// Drops the jobs last heard from more than `timeout` before `now_ms`; returns their
    /// ids.
    pub fn expire(&mut self, now_ms: u64, timeout: Duration) -> Vec<String> {
        let gone: Vec<String> = self
            .jobs
            .iter()
            .filter(|(_, j)| {
                u128::from(now_ms.saturating_sub(j.last_seen_ms)) > timeout.as_millis()
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in &gone {
            self.jobs.remove(id);
        }
        gone
    }

    /// Records that `job_id` was heard from at `now_ms` (a profile report); `false` when it is
    /// not active (it has not re-planned yet, or it expired).
    pub fn touch(&mut self, job_id: &str, now_ms: u64) -> bool {
        match self.jobs.get_mut(job_id) {
            Some(j) => {
                j.last_seen_ms = j.last_seen_ms.max(now_ms);
                true
            }
            None => false,
        }
    }

    /// Records `job_id`'s latest re-plan at `now_ms`: its front, the allocation it reports and
    /// its remaining samples. Its previous grant is superseded: it re-plans from what it
    /// reports it runs with.
    pub fn update(
        &mut self,
        job_id: &str,
        front: Vec<Candidate>,
        current: Option<Allocation>,
        remaining_samples: f64,
        now_ms: u64,
    ) {
        self.jobs.insert(
            job_id.to_string(),
            ActiveJob {
                front,
                current,
                remaining_samples,
                granted: None,
                last_seen_ms: now_ms,
            },
        );
    }

    /// Records the allocation of the plan the brain returned to `job_id`.
    pub fn grant(&mut self, job_id: &str, alloc: Allocation) {
        if let Some(j) = self.jobs.get_mut(job_id) {
            j.granted = Some(alloc);
        }
    }

    /// Forgets `job_id` (it now plans on its own machine); whether it was active.
    pub fn remove(&mut self, job_id: &str) -> bool {
        self.jobs.remove(job_id).is_some()
    }

    /// The weighted greedy over every active job's front under the cluster capacity
    /// `capacity` (= S), and `job_id`'s pick (see the module docs).
    pub fn plan(
        &self,
        job_id: &str,
        capacity: Resources,
        params: GreedyParams,
    ) -> Result<SharedPlan> {
        let me = self
            .jobs
            .keys()
            .position(|k| k == job_id)
            .ok_or_else(|| BrainError::Internal(format!("job `{job_id}` is not active")))?;
        let entries: Vec<(&String, &ActiveJob)> = self.jobs.iter().collect();
        let options: Vec<JobOptions> = entries
            .iter()
            .map(|(id, j)| JobOptions {
                job_id: (*id).clone(),
                remaining_samples: j.remaining_samples,
                current: j.current,
                candidates: j.front.clone(),
            })
            .collect();
        let holding: Vec<Resources> = entries
            .iter()
            .enumerate()
            .map(
                |(k, (_, j))| {
                    if k == me {
                        j.reported()
                    } else {
                        j.holding()
                    }
                },
            )
            .collect();
        let total = sum(holding.iter().copied());
        let others = minus(total, holding[me]);
        // Jobs holding more than the cluster (it shrank, or they grew outside the brain)
        // keep what they hold; no job grows in a resource that is overcommitted.
        let s = max(capacity, total);
        let g = weighted_greedy_holding(&options, &holding, s, params)?;
        let alone: Vec<Option<Candidate>> = options
            .iter()
            .zip(&entries)
            .map(|(o, (_, j))| {
                weighted_greedy(std::slice::from_ref(o), max(capacity, j.reported()), params)
                    .map(|r| r.assignments[0].chosen)
            })
            .collect::<Result<_>>()?;
        let shares: Vec<Share> = g
            .assignments
            .iter()
            .zip(&entries)
            .zip(&alone)
            .map(|((a, (_, j)), alone)| Share {
                job_id: a.job_id.clone(),
                chosen: a.chosen,
                allocation: a.chosen.map(|c| c.alloc).or(j.current),
                alone: *alone,
            })
            .collect();

        let mut reasons = Vec::new();
        let free = minus(s, total);
        if entries.len() == 1 {
            reasons.push(format!(
                "planned as the only active job on the brain's cluster of {:.0} CPU / {:.0} GiB ({:.1} CPU / {:.1} GiB free besides its current allocation)",
                capacity.cpu, capacity.mem_gb, free.cpu, free.mem_gb
            ));
        } else {
            let ids: Vec<&String> = entries
                .iter()
                .enumerate()
                .filter(|(k, _)| *k != me)
                .map(|(_, (id, _))| *id)
                .collect();
            reasons.push(format!(
                "planned together with {} other active job(s) ({}) on the brain's cluster of {:.0} CPU / {:.0} GiB: they hold {:.1} CPU / {:.1} GiB, {:.1} CPU / {:.1} GiB are free besides every job's current allocation",
                ids.len(),
                named(&ids, |id| id.to_string()),
                capacity.cpu,
                capacity.mem_gb,
                others.cpu,
                others.mem_gb,
                free.cpu,
                free.mem_gb
            ));
        }
        if !total.fits_in(&capacity) {
            reasons.push(format!(
                "the active jobs hold {:.1} CPU / {:.1} GiB, more than the cluster's {:.0} CPU / {:.0} GiB: no job grows in an overcommitted resource",
                total.cpu, total.mem_gb, capacity.cpu, capacity.mem_gb
            ));
        }
        let mut chosen = g.assignments[me].chosen;
        if let Some(c) = chosen {
            reasons.push(format!(
                "weighted greedy over the {} active jobs' fronts gave this job the candidate with RE x WG = {:.3e} (gain {:.1} samples/s for cost {:.2}/h)",
                entries.len(),
                g.assignments[me].score,
                c.gain,
                c.cost
            ));
        }
        if shares
            .iter()
            .any(|s| s.chosen.map(|c| c.alloc) != s.alone.map(|c| c.alloc))
        {
            reasons.push(format!(
                "capacity is short, the greedy shares it as: {}; other jobs get theirs at their next plan",
                named(&shares, |s| {
                    let got = match (&s.chosen, &s.allocation) {
                        (Some(c), _) => describe(&c.alloc),
                        (None, Some(a)) => format!("keeps {}", describe(a)),
                        (None, None) => "nothing".into(),
                    };
                    let alone = s
                        .alone
                        .map_or("nothing".into(), |c| describe(&c.alloc));
                    format!("{} {got} (alone: {alone})", s.job_id)
                })
            ));
        }
        // The room the joint plan gives this job may still be held by a job that was
        // granted a larger plan and has not re-planned since.
        let room = max(minus(s, others), holding[me]);
        if let Some(c) = chosen.filter(|c| !Resources::of(&c.alloc).fits_in(&room)) {
            let now = weighted_greedy(std::slice::from_ref(&options[me]), room, params)?;
            chosen = now.assignments[0].chosen;
            reasons.push(format!(
                "the shared plan gives this job {}, but other jobs still hold part of it until they re-plan: {} for now",
                describe(&c.alloc),
                chosen.map_or("keep the current allocation".into(), |c| format!(
                    "{} (RE x WG = {:.3e})",
                    describe(&c.alloc),
                    now.assignments[0].score
                ))
            ));
        }
        Ok(SharedPlan {
            pick: Pick {
                chosen,
                free: minus(room, holding[me]),
                reasons,
            },
            shares,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: Resources = Resources {
        cpu: 100.0,
        mem_gb: 1000.0,
    };
    const P: GreedyParams = GreedyParams {
        rho: 2.5,
        epsilon: 1e-6,
    };

    /// `workers` x 4 CPU / 8 GiB and one PS alike: `4 w + 4` CPU.
    fn alloc(workers: u32) -> Allocation {
        Allocation {
            workers,
            ps: 1,
            worker_cpu: 4.0,
            ps_cpu: 4.0,
            worker_mem_gb: 8.0,
            ps_mem_gb: 8.0,
        }
    }

    /// A front of 3..=`max_workers` workers where each worker adds `per_worker`
    /// samples/s to a job running 2.
    fn front(per_worker: f64, max_workers: u32) -> Vec<Candidate> {
        (3..=max_workers)
            .map(|w| {
                let a = alloc(w);
                Candidate {
                    alloc: a,
                    throughput: per_worker * f64::from(w),
                    cost: crate::nsga2::Prices::default().cost(&a),
                    gain: per_worker * f64::from(w - 2),
                    violation: 0.0,
                }
            })
            .collect()
    }

    fn workers(p: &SharedPlan, job: &str) -> u32 {
        let s = p.shares.iter().find(|s| s.job_id == job).unwrap();
        s.allocation.map_or(0, |a| a.workers)
    }

    fn held_cpu(jobs: &ActiveJobs) -> f64 {
        jobs.ids()
            .map(|id| jobs.get(id).unwrap().holding().cpu)
            .sum()
    }

    /// Two jobs want most of the cluster each; the one with the better RE x WG gets more,
    /// both get the same shares whoever asks, and the shares fit the cluster.
    #[test]
    fn shared_plan_favours_the_better_job_and_fits_the_cluster() {
        let t0: u64 = 1_000;
        let mut jobs = ActiveJobs::new();
        jobs.update("a", front(1000.0, 15), Some(alloc(2)), 1e8, t0);
        jobs.update("b", front(400.0, 40), Some(alloc(2)), 1e8, t0);
        let pa = jobs.plan("a", CAP, P).unwrap();
        let pb = jobs.plan("b", CAP, P).unwrap();
        assert_eq!(pa.shares, pb.shares, "the same run whoever asks");
        assert_eq!(pa.pick.chosen, pa.shares[0].chosen);
        assert_eq!(pb.pick.chosen, pb.shares[1].chosen);
        let (wa, wb) = (workers(&pa, "a"), workers(&pa, "b"));
        assert!(wa > wb && wb > 2, "a {wa}, b {wb}");
        let alone = pa.shares[1].alone.unwrap().alloc.workers;
        assert!(alone > wb, "b alone {alone} > shared {wb}");
        let used: f64 = pa
            .shares
            .iter()
            .map(|s| s.allocation.unwrap().total_cpu())
            .sum();
        assert!(used <= CAP.cpu, "{used}");
        let r = pb.pick.reasons.join("\n");
        assert!(
            r.contains("planned together with 1 other active job(s) (a)"),
            "{r}"
        );
        assert!(
            r.contains("capacity is short") && r.contains("(alone: "),
            "{r}"
        );
    }

    /// A job granted a big plan while it was alone holds it: a job that arrives later gets
    /// what is left. Had the first job not applied its grant, its next re-plan gives the
    /// room back to the joint plan.
    #[test]
    fn grants_count_until_the_job_re_plans() {
        let t0: u64 = 1_000;
        let mut jobs = ActiveJobs::new();
        jobs.update("b", front(400.0, 15), Some(alloc(2)), 1e8, t0);
        let first = jobs.plan("b", CAP, P).unwrap().pick.chosen.unwrap().alloc;
        jobs.grant("b", first);
        assert_eq!(first.workers, 15);
        jobs.update("a", front(1000.0, 40), Some(alloc(2)), 1e8, t0);
        let pa = jobs.plan("a", CAP, P).unwrap();
        let a1 = pa.pick.chosen.unwrap().alloc;
        jobs.grant("a", a1);
        assert_eq!(a1.workers, 8, "what b's grant leaves");
        assert!(held_cpu(&jobs) <= CAP.cpu, "{}", held_cpu(&jobs));
        // b re-plans from the 2 workers it still runs: a, the better job, takes the room.
        jobs.update("b", front(400.0, 15), Some(alloc(2)), 1e8, t0);
        let pb = jobs.plan("b", CAP, P).unwrap();
        assert_eq!(pb.pick.chosen, None, "{:?}", pb.pick.reasons);
        jobs.grant("b", alloc(2));
        jobs.update("a", front(1000.0, 40), Some(a1), 1e8, t0);
        let a2 = jobs.plan("a", CAP, P).unwrap().pick.chosen.unwrap().alloc;
        jobs.grant("a", a2);
        assert_eq!(a2.workers, 21);
        assert!(held_cpu(&jobs) <= CAP.cpu, "{}", held_cpu(&jobs));
    }

    /// A job that holds more than its front offers (a plan raised by OOM prevention) keeps
    /// it until it re-plans, even where the joint plan shrinks it: another job's pick must
    /// fit beside it now.
    #[test]
    fn a_pick_fits_beside_what_other_jobs_still_hold() {
        let t0: u64 = 1_000;
        let mut jobs = ActiveJobs::new();
        jobs.update("a", front(1000.0, 10), Some(alloc(2)), 1e8, t0);
        jobs.grant("a", alloc(15));
        jobs.update("b", front(400.0, 40), Some(alloc(2)), 1e8, t0);
        let pb = jobs.plan("b", CAP, P).unwrap();
        assert_eq!(workers(&pb, "a"), 10);
        assert_eq!(
            pb.shares[1].chosen.unwrap().alloc.workers,
            13,
            "joint share"
        );
        let now = pb.pick.chosen.unwrap().alloc;
        assert_eq!(now.workers, 8, "beside a's 64 CPU");
        let r = pb.pick.reasons.join("\n");
        assert!(r.contains("until they re-plan"), "{r}");
    }

    /// A job that stops calling is dropped after the timeout and its resources go to the
    /// jobs still calling; a profile report keeps a job active.
    #[test]
    fn a_job_that_stops_calling_is_dropped_after_the_timeout() {
        let t0: u64 = 1_000;
        let timeout = Duration::from_secs(600);
        let mut jobs = ActiveJobs::new();
        jobs.update("big", vec![], Some(alloc(20)), 1e8, t0);
        jobs.update("a", front(1000.0, 40), Some(alloc(2)), 1e8, t0);
        let before = workers(&jobs.plan("a", CAP, P).unwrap(), "a");
        assert_eq!(before, 3, "beside big's 84 CPU");
        // Five minutes on, a reports a profile; big says nothing.
        assert!(jobs.touch("a", t0 + 300_000));
        assert!(!jobs.touch("never-planned", t0));
        assert!(
            jobs.expire(t0 + timeout.as_millis() as u64, timeout)
                .is_empty(),
            "at the limit"
        );
        let gone = jobs.expire(t0 + timeout.as_millis() as u64 + 1_000, timeout);
        assert_eq!(gone, vec!["big".to_string()]);
        assert_eq!(jobs.ids().collect::<Vec<_>>(), vec!["a"]);
        let pa = jobs.plan("a", CAP, P).unwrap();
        assert_eq!(workers(&pa, "a"), 24, "the whole cluster");
        assert!(
            pa.pick.reasons[0].contains("only active job"),
            "{:?}",
            pa.pick.reasons
        );
        // a expires ten minutes after its report.
        let gone = jobs.expire(t0 + 901_000, timeout);
        assert_eq!(gone, vec!["a".to_string()]);
        assert!(jobs.is_empty());
        assert!(jobs.plan("a", CAP, P).is_err());
    }

    /// Jobs that hold more than the cluster keep it, and nobody grows.
    #[test]
    fn an_overcommitted_cluster_grows_nobody() {
        let t0: u64 = 1_000;
        let mut jobs = ActiveJobs::new();
        jobs.update("a", front(1000.0, 40), Some(alloc(2)), 1e8, t0);
        jobs.update("b", vec![], Some(alloc(30)), 1e8, t0);
        let pa = jobs.plan("a", CAP, P).unwrap();
        assert_eq!(pa.pick.chosen, None);
        assert!(pa.pick.reasons.iter().any(|r| r.contains("overcommitted")));
        assert_eq!(pa.pick.free.cpu, 0.0);
    }
}
