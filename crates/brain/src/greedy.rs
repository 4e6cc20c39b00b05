//! Cluster-level weighted greedy selection (DLRover-RM Eq. 11-14).
//!
//! Each job offers plan candidates (its NSGA-II front). A candidate's score is its
//! Resource Efficiency `RE = TG / RC` (Eq. 11) times the priority weight
//! `WG = 1 / (Phi / Psi + epsilon)^rho` (Eq. 14), with `Phi` the job's remaining samples and
//! `Psi` the candidate's throughput. The greedy takes candidates in descending score, at
//! most one per job, while the cluster total stays within `S` (Eq. 13). A job that gets no
//! candidate keeps its current allocation, which the budget accounts for from the start.

use serde::{Deserialize, Serialize};

use crate::alloc::{Allocation, Resources};
use crate::error::{check_non_negative, check_non_negative_at, check_positive, BrainError, Result};
use crate::nsga2::Candidate;

/// Greedy settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GreedyParams {
    /// Priority exponent `rho` of Eq. 14 (AntGroup uses 2.5: shorter jobs first).
    pub rho: f64,
    /// `epsilon` of Eq. 14 (seconds), keeps the weight finite.
    pub epsilon: f64,
}

impl Default for GreedyParams {
    fn default() -> Self {
        Self {
            rho: 2.5,
            epsilon: 1e-6,
        }
    }
}

/// One job's options.
#[derive(Debug, Clone, PartialEq)]
pub struct JobOptions {
    /// Job id.
    pub job_id: String,
    /// Remaining samples to train, `Phi_sp`.
    pub remaining_samples: f64,
    /// What the job holds now (`None`: a new job holding nothing).
    pub current: Option<Allocation>,
    /// Plan candidates (e.g. an NSGA-II front).
    pub candidates: Vec<Candidate>,
}

/// The greedy's decision for one job.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    /// Job id.
    pub job_id: String,
    /// The chosen candidate, or `None` to keep the current allocation.
    pub chosen: Option<Candidate>,
    /// `RE * WG` of the chosen candidate (0 if none).
    pub score: f64,
    /// `WG` of the chosen candidate (0 if none).
    pub weight: f64,
}

/// Result of [`weighted_greedy`].
#[derive(Debug, Clone, PartialEq)]
pub struct GreedyResult {
    /// One entry per job, in input order.
    pub assignments: Vec<Assignment>,
    /// Total resources after the decision.
    pub used: Resources,
}

/// Eq. 14.
pub fn priority_weight(remaining_samples: f64, throughput: f64, p: GreedyParams) -> f64 {
    1.0 / (remaining_samples / throughput + p.epsilon).powf(p.rho)
}

/// Eq. 11.
pub fn resource_efficiency(c: &Candidate) -> f64 {
    c.gain / c.cost
}

/// Eq. 12-14 under the cluster capacity `capacity` (= S).
pub fn weighted_greedy(
    jobs: &[JobOptions],
    capacity: Resources,
    params: GreedyParams,
) -> Result<GreedyResult> {
    let holding: Vec<Resources> = jobs
        .iter()
        .map(|j| j.current.as_ref().map(Resources::of).unwrap_or_default())
        .collect();
    weighted_greedy_holding(jobs, &holding, capacity, params)
}

/// [`weighted_greedy`] where `holding[j]` is what job `j` holds now (what it keeps when
/// the greedy skips it and gives back when one of its candidates is chosen) instead of the
/// resources of its `current` allocation. A brain shared by jobs that re-plan at different
/// times counts a job that was granted a plan but has not re-planned since at the larger
/// of its reported and granted resources: it may already run with either.
pub fn weighted_greedy_holding(
    jobs: &[JobOptions],
    holding: &[Resources],
    capacity: Resources,
    params: GreedyParams,
) -> Result<GreedyResult> {
    check_non_negative("capacity.cpu", capacity.cpu)?;
    check_non_negative("capacity.mem_gb", capacity.mem_gb)?;
    check_positive("epsilon", params.epsilon)?;
    if !params.rho.is_finite() {
        return Err(BrainError::invalid("rho", "must be finite"));
    }
    if holding.len() != jobs.len() {
        return Err(BrainError::invalid(
            "holding",
            format!("{} entries for {} jobs", holding.len(), jobs.len()),
        ));
    }
    let mut used = Resources::default();
    for (j, (job, held)) in jobs.iter().zip(holding).enumerate() {
        check_non_negative_at(
            || format!("jobs[{j}].remaining_samples"),
            job.remaining_samples,
        )?;
        check_non_negative_at(|| format!("holding[{j}].cpu"), held.cpu)?;
        check_non_negative_at(|| format!("holding[{j}].mem_gb"), held.mem_gb)?;
        used.cpu += held.cpu;
        used.mem_gb += held.mem_gb;
    }
    if !used.fits_in(&capacity) {
        return Err(BrainError::invalid(
            "capacity",
            format!(
                "current allocations ({:.1} CPU, {:.1} GiB) already exceed the cluster ({:.1} CPU, {:.1} GiB)",
                used.cpu, used.mem_gb, capacity.cpu, capacity.mem_gb
            ),
        ));
    }
    // (score, weight, job, candidate)
    let mut pairs: Vec<(f64, f64, usize, usize)> = Vec::new();
    for (j, job) in jobs.iter().enumerate() {
        for (k, c) in job.candidates.iter().enumerate() {
            if !(c.gain > 0.0 && c.cost > 0.0 && c.throughput > 0.0 && c.violation == 0.0) {
                continue;
            }
            let wg = priority_weight(job.remaining_samples, c.throughput, params);
            let score = resource_efficiency(c) * wg;
            if score.is_finite() {
                pairs.push((score, wg, j, k));
            }
        }
    }
    pairs.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.2.cmp(&b.2)).then(a.3.cmp(&b.3)));
    let mut out: Vec<Assignment> = jobs
        .iter()
        .map(|j| Assignment {
            job_id: j.job_id.clone(),
            chosen: None,
            score: 0.0,
            weight: 0.0,
        })
        .collect();
    for (score, wg, j, k) in pairs {
        if out[j].chosen.is_some() {
            continue;
        }
        let cand = jobs[j].candidates[k];
        let cur = holding[j];
        let new = Resources::of(&cand.alloc);
        let after = Resources {
            cpu: used.cpu - cur.cpu + new.cpu,
            mem_gb: used.mem_gb - cur.mem_gb + new.mem_gb,
        };
        if after.fits_in(&capacity) {
            used = after;
            out[j] = Assignment {
                job_id: jobs[j].job_id.clone(),
                chosen: Some(cand),
                score,
                weight: wg,
            };
        }
    }
    Ok(GreedyResult {
        assignments: out,
        used,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn cand(workers: u32, tp: f64, gain: f64) -> Candidate {
        let alloc = Allocation {
            workers,
            ps: 1,
            worker_cpu: 4.0,
            ps_cpu: 4.0,
            worker_mem_gb: 8.0,
            ps_mem_gb: 8.0,
        };
        Candidate {
            alloc,
            throughput: tp,
            cost: crate::nsga2::Prices::default().cost(&alloc),
            gain,
            violation: 0.0,
        }
    }

    #[test]
    fn weight_follows_eq14() {
        let p = GreedyParams {
            rho: 2.0,
            epsilon: 1e-6,
        };
        let w = priority_weight(1e6, 1e4, p);
        assert!((w - 1.0 / (100.0f64 + 1e-6).powi(2)).abs() < 1e-15);
        // rho -> 0: every weight tends to 1.
        let p0 = GreedyParams {
            rho: 1e-9,
            epsilon: 1e-6,
        };
        assert!((priority_weight(1e9, 1.0, p0) - 1.0).abs() < 1e-6);
    }

    #[test]
    fn rho_decides_between_short_and_long_jobs() {
        let jobs = |_: ()| {
            vec![
                JobOptions {
                    job_id: "long".into(),
                    remaining_samples: 1e9,
                    current: None,
                    candidates: vec![cand(4, 1e4, 1e4)],
                },
                JobOptions {
                    job_id: "short".into(),
                    remaining_samples: 1e6,
                    current: None,
                    candidates: vec![cand(4, 1e4, 1e4)],
                },
            ]
        };
        // Room for exactly one of the two identical allocations.
        let one = Resources::of(&cand(4, 1.0, 1.0).alloc);
        let pick = |rho: f64| {
            let r = weighted_greedy(&jobs(()), one, GreedyParams { rho, epsilon: 1e-6 }).unwrap();
            r.assignments
                .iter()
                .filter(|a| a.chosen.is_some())
                .map(|a| a.job_id.clone())
                .collect::<Vec<String>>()
        };
        assert_eq!(pick(2.5), vec!["short"], "rho > 0 favours the shorter job");
        assert_eq!(pick(-2.5), vec!["long"], "rho < 0 favours the longer job");
    }

    #[test]
    fn never_exceeds_the_cluster_and_counts_current_allocations() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        for trial in 0..50 {
            let jobs: Vec<JobOptions> = (0..200)
                .map(|j| {
                    let current = rng
                        .random_bool(0.5)
                        .then(|| cand(rng.random_range(1..4), 1.0, 1.0).alloc);
                    JobOptions {
                        job_id: format!("j{j}"),
                        remaining_samples: rng.random_range(1e5..1e9),
                        current,
                        candidates: (0..10)
                            .map(|_| {
                                let w = rng.random_range(1..32);
                                cand(
                                    w,
                                    1e3 * f64::from(w),
                                    rng.random_range(-10.0..1e3 * f64::from(w)),
                                )
                            })
                            .collect(),
                    }
                })
                .collect();
            let base: Resources = jobs.iter().filter_map(|j| j.current.as_ref()).fold(
                Resources::default(),
                |acc, a| {
                    let r = Resources::of(a);
                    Resources {
                        cpu: acc.cpu + r.cpu,
                        mem_gb: acc.mem_gb + r.mem_gb,
                    }
                },
            );
            let cap = Resources {
                cpu: base.cpu + rng.random_range(0.0..5000.0),
                mem_gb: base.mem_gb + rng.random_range(0.0..8000.0),
            };
            let r = weighted_greedy(&jobs, cap, GreedyParams::default()).unwrap();
            let mut total = Resources::default();
            for (a, j) in r.assignments.iter().zip(&jobs) {
                let alloc = a.chosen.map(|c| c.alloc).or(j.current);
                if let Some(al) = alloc {
                    let x = Resources::of(&al);
                    total.cpu += x.cpu;
                    total.mem_gb += x.mem_gb;
                }
                if let Some(c) = a.chosen {
                    assert!(c.gain > 0.0, "never picks a candidate without gain");
                }
            }
            assert!(total.fits_in(&cap), "trial {trial}: {total:?} > {cap:?}");
            assert!((total.cpu - r.used.cpu).abs() < 1e-6);
            assert!(r.assignments.iter().any(|a| a.chosen.is_some()));
        }
    }

    /// A holding replaces the current allocation in the budget: what the job keeps when
    /// skipped and gives back when one of its candidates is chosen.
    #[test]
    fn holdings_replace_current_allocations_in_the_budget() {
        let jobs = vec![
            JobOptions {
                job_id: "held".into(),
                remaining_samples: 1e6,
                current: Some(cand(1, 1.0, 1.0).alloc),
                candidates: vec![],
            },
            JobOptions {
                job_id: "grows".into(),
                remaining_samples: 1e6,
                current: None,
                candidates: vec![cand(4, 1e4, 1e4)],
            },
        ];
        let big = Resources::of(&cand(8, 1.0, 1.0).alloc);
        let four = Resources::of(&cand(4, 1.0, 1.0).alloc);
        let cap = Resources {
            cpu: big.cpu + four.cpu - 1.0,
            mem_gb: big.mem_gb + four.mem_gb,
        };
        let p = GreedyParams::default();
        // Counted at its current allocation, "held" leaves room for "grows" ...
        let r = weighted_greedy(&jobs, cap, p).unwrap();
        assert!(r.assignments[1].chosen.is_some());
        // ... counted at what it holds, it does not.
        let holding = [big, Resources::default()];
        let r = weighted_greedy_holding(&jobs, &holding, cap, p).unwrap();
        assert!(r.assignments[1].chosen.is_none());
        assert_eq!(r.used, big);
        assert!(weighted_greedy_holding(&jobs, &[big], cap, p).is_err());
    }

    #[test]
    fn rejects_overcommitted_cluster() {
        let jobs = vec![JobOptions {
            job_id: "a".into(),
            remaining_samples: 1.0,
            current: Some(cand(8, 1.0, 1.0).alloc),
            candidates: vec![],
        }];
        assert!(weighted_greedy(
            &jobs,
            Resources {
                cpu: 1.0,
                mem_gb: 1.0
            },
            GreedyParams::default()
        )
        .is_err());
    }
}
