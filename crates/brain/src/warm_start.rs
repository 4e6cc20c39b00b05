//! Warm start (DLRover-RM Algorithm 1): the start-up allocation of a new job from the
//! configurations of the most similar past jobs, exponentially smoothed.

use serde::{Deserialize, Serialize};

use crate::alloc::{Allocation, Bounds};
use crate::error::{check_non_negative, BrainError, Result};
use crate::job::JobSpec;

/// Features of a job used for similarity (model metadata, data size, tags).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobFeatures {
    /// Model family, e.g. "dlrm", "dcn".
    pub model_type: String,
    /// Number of embedding tables.
    pub table_count: u64,
    /// Rows over all tables.
    pub total_rows: u64,
    /// Embedding dimensions looked up per sample (sum over tables).
    pub emb_dim_total: u64,
    /// Dense parameters.
    pub dense_params: u64,
    /// Samples in the dataset.
    pub dataset_samples: u64,
    /// Business scenario tag.
    pub scenario: String,
    /// Submitting user.
    pub user: String,
}

impl JobFeatures {
    /// Features of a job description.
    pub fn of(spec: &JobSpec) -> Self {
        Self {
            model_type: spec.model_type.clone(),
            table_count: spec.tables.len() as u64,
            total_rows: spec.tables.iter().map(|t| t.rows).sum(),
            emb_dim_total: spec.tables.iter().map(|t| u64::from(t.dim)).sum(),
            dense_params: spec.dense_params,
            dataset_samples: spec.dataset_samples,
            scenario: spec.scenario.clone(),
            user: spec.user.clone(),
        }
    }
}

/// A past job with the configuration it ran well with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoricalJob {
    /// Job id.
    pub job_id: String,
    /// Its features.
    pub features: JobFeatures,
    /// Its (last successful) configuration.
    pub config: Allocation,
}

/// Weights of each feature's similarity (normalized by their sum).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FeatureWeights {
    /// Same model family.
    pub model_type: f64,
    /// Table count ratio.
    pub table_count: f64,
    /// Total rows ratio.
    pub total_rows: f64,
    /// Embedding dimension ratio.
    pub emb_dim: f64,
    /// Dense size ratio.
    pub dense_params: f64,
    /// Dataset size ratio.
    pub dataset_samples: f64,
    /// Same scenario.
    pub scenario: f64,
    /// Same user.
    pub user: f64,
}

impl Default for FeatureWeights {
    fn default() -> Self {
        Self {
            model_type: 2.0,
            table_count: 1.0,
            total_rows: 2.0,
            emb_dim: 1.0,
            dense_params: 1.0,
            dataset_samples: 1.0,
            scenario: 1.0,
            user: 0.5,
        }
    }
}

/// Warm-start settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WarmStartParams {
    /// How many similar jobs to smooth over (top-k).
    pub k: usize,
    /// Smoothing factor `mu` in (0, 1): weight of each more similar job over the running
    /// smoothed value.
    pub mu: f64,
    /// Jobs less similar than this are ignored.
    pub min_similarity: f64,
    /// A past job with no outcome that has not reported for this long lost its master
    /// (perhaps to the configuration that is its last): it is not learned from. Seconds.
    #[serde(default = "default_silent_after_s")]
    pub silent_after_s: f64,
    /// Feature weights.
    pub weights: FeatureWeights,
}

fn default_silent_after_s() -> f64 {
    3600.0
}

impl Default for WarmStartParams {
    fn default() -> Self {
        Self {
            k: 5,
            mu: 0.6,
            min_similarity: 0.3,
            silent_after_s: default_silent_after_s(),
            weights: FeatureWeights::default(),
        }
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    let (a, b) = ((a as f64) + 1.0, (b as f64) + 1.0);
    a.min(b) / a.max(b)
}

/// Similarity in [0, 1]: a weighted mean of per-feature similarities (equality for tags,
/// `min/max` ratio for sizes).
pub fn similarity(a: &JobFeatures, b: &JobFeatures, w: &FeatureWeights) -> f64 {
    let eq = |x: &str, y: &str| if x == y { 1.0 } else { 0.0 };
    let parts = [
        (w.model_type, eq(&a.model_type, &b.model_type)),
        (w.table_count, ratio(a.table_count, b.table_count)),
        (w.total_rows, ratio(a.total_rows, b.total_rows)),
        (w.emb_dim, ratio(a.emb_dim_total, b.emb_dim_total)),
        (w.dense_params, ratio(a.dense_params, b.dense_params)),
        (
            w.dataset_samples,
            ratio(a.dataset_samples, b.dataset_samples),
        ),
        (w.scenario, eq(&a.scenario, &b.scenario)),
        (w.user, eq(&a.user, &b.user)),
    ];
    let total: f64 = parts.iter().map(|p| p.0).sum();
    if total <= 0.0 {
        return 0.0;
    }
    parts.iter().map(|(wt, s)| wt * s).sum::<f64>() / total
}

/// Outcome of [`warm_start`].
#[derive(Debug, Clone, PartialEq)]
pub struct WarmStart {
    /// Start-up allocation (inside bounds).
    pub alloc: Allocation,
    /// Similar jobs used, least similar first, with their similarity.
    pub neighbours: Vec<(String, f64)>,
    /// Why.
    pub reasons: Vec<String>,
}

/// Memory the PS must hold together for a job, GiB: fp32 embeddings and dense weights with
/// two optimizer slots each (Adam-like; conservative for Adagrad), plus 25% headroom.
pub fn ps_mem_needed_gb(f: &JobFeatures, spec: &JobSpec) -> f64 {
    let emb: f64 = spec
        .tables
        .iter()
        .map(|t| t.rows as f64 * f64::from(t.dim))
        .sum();
    let params = emb + f.dense_params as f64;
    params * 4.0 * 3.0 * 1.25 / (1u64 << 30) as f64
}

/// The documented default when the database has no similar job: 4 workers with 4 cores and
/// 8 GiB, PS with 4 cores, as many PS (at most 32 GiB each) as the model memory needs;
/// everything clamped into `bounds`.
pub fn default_allocation(mem_needed_gb: f64, bounds: &Bounds) -> Allocation {
    let per_ps = bounds.ps_mem_gb.max.min(32.0);
    let ps = (mem_needed_gb / per_ps).ceil().max(1.0) as u32;
    let ps = bounds.ps.clamp(ps);
    let a = Allocation {
        workers: 4,
        ps,
        worker_cpu: 4.0,
        ps_cpu: 4.0,
        worker_mem_gb: 8.0,
        ps_mem_gb: (mem_needed_gb / f64::from(ps)).ceil().max(4.0),
    };
    bounds.clamp(&a)
}

/// Raises PS memory, then PS count, until the PS hold `need` GiB (within bounds).
pub(crate) fn fit_memory(
    mut a: Allocation,
    need: f64,
    bounds: &Bounds,
) -> (Allocation, Option<String>) {
    if f64::from(a.ps) * a.ps_mem_gb >= need {
        return (a, None);
    }
    let before = a;
    a.ps_mem_gb = bounds.ps_mem_gb.clamp((need / f64::from(a.ps)).ceil());
    if f64::from(a.ps) * a.ps_mem_gb < need {
        a.ps = bounds.ps.clamp((need / a.ps_mem_gb).ceil() as u32);
    }
    let note = if f64::from(a.ps) * a.ps_mem_gb < need {
        format!(
            "PS memory capped by bounds: {:.1} GiB of {need:.1} GiB needed",
            f64::from(a.ps) * a.ps_mem_gb
        )
    } else {
        format!(
            "PS memory raised from {} x {:.1} GiB to {} x {:.1} GiB to hold {need:.1} GiB of model state",
            before.ps, before.ps_mem_gb, a.ps, a.ps_mem_gb
        )
    };
    (a, Some(note))
}

/// Algorithm 1. Picks the top-k most similar past jobs (above `min_similarity`), ranks them
/// least similar first (`A^0`) to most similar (`A^{k-1}`), smooths
/// `Ā^i = mu A^i + (1 - mu) Ā^{i-1}` from `Ā^0 = A^0`, and returns `Ā^{k-1}` rounded and
/// clamped into the bounds, with PS memory raised to hold the model. Falls back to the
/// job's requested configuration, or without one to [`default_allocation`], when no
/// similar job exists.
pub fn warm_start(
    spec: &JobSpec,
    history: &[HistoricalJob],
    params: &WarmStartParams,
    bounds: &Bounds,
) -> Result<WarmStart> {
    if !(params.mu > 0.0 && params.mu < 1.0) {
        return Err(BrainError::Config(format!(
            "warm-start mu must lie in (0, 1), got {}",
            params.mu
        )));
    }
    if params.k == 0 {
        return Err(BrainError::Config("warm-start k must be >= 1".into()));
    }
    check_non_negative("min_similarity", params.min_similarity)?;
    bounds.validate()?;
    let f = JobFeatures::of(spec);
    let need = ps_mem_needed_gb(&f, spec);
    let mut scored: Vec<(f64, &HistoricalJob)> = history
        .iter()
        .filter(|h| h.job_id != spec.job_id)
        .map(|h| (similarity(&f, &h.features, &params.weights), h))
        .filter(|(s, _)| *s >= params.min_similarity)
        .collect();
    scored.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then_with(|| a.1.job_id.cmp(&b.1.job_id))
    });
    scored.truncate(params.k);
    scored.reverse(); // least similar first: A^{k-1} is the most similar.
    let mut reasons = Vec::new();
    let alloc = if scored.is_empty() {
        match spec.requested {
            // The user's guess beats a default that knows nothing of the job.
            Some(r) => {
                reasons.push(format!(
                    "no similar job in the config database (of {}): the configuration the job asked for",
                    history.len()
                ));
                bounds.clamp(&r)
            }
            None => {
                reasons.push(format!(
                    "no similar job in the config database (of {}): documented default start-up plan",
                    history.len()
                ));
                default_allocation(need, bounds)
            }
        }
    } else {
        let v = |a: &Allocation| {
            [
                f64::from(a.workers),
                f64::from(a.ps),
                a.worker_cpu,
                a.ps_cpu,
                a.worker_mem_gb,
                a.ps_mem_gb,
            ]
        };
        let mut s = v(&scored[0].1.config);
        for (_, h) in &scored[1..] {
            let a = v(&h.config);
            for (si, ai) in s.iter_mut().zip(a) {
                *si = params.mu * ai + (1.0 - params.mu) * *si;
            }
        }
        reasons.push(format!(
            "warm start from {} similar jobs (most similar: {} at {:.2}), smoothed with mu = {}",
            scored.len(),
            scored.last().map_or("", |x| x.1.job_id.as_str()),
            scored.last().map_or(0.0, |x| x.0),
            params.mu
        ));
        let half = |x: f64| (x * 2.0).round() / 2.0;
        bounds.clamp(&Allocation {
            workers: s[0].round() as u32,
            ps: s[1].round() as u32,
            worker_cpu: half(s[2]),
            ps_cpu: half(s[3]),
            worker_mem_gb: half(s[4]),
            ps_mem_gb: half(s[5]),
        })
    };
    let (alloc, note) = fit_memory(alloc, need, bounds);
    reasons.extend(note);
    bounds.ensure_contains(&alloc)?;
    Ok(WarmStart {
        alloc,
        neighbours: scored.iter().map(|(s, h)| (h.job_id.clone(), *s)).collect(),
        reasons,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::tests::spec;

    fn hist(id: &str, rows: u64, workers: u32, scenario: &str) -> HistoricalJob {
        let mut s = spec(id);
        s.tables[0].rows = rows;
        s.scenario = scenario.into();
        HistoricalJob {
            job_id: id.into(),
            features: JobFeatures::of(&s),
            config: Allocation {
                workers,
                ps: 2,
                worker_cpu: 4.0,
                ps_cpu: 4.0,
                worker_mem_gb: 8.0,
                ps_mem_gb: 16.0,
            },
        }
    }

    #[test]
    fn smoothing_follows_algorithm_1() {
        let job = spec("new");
        let h = vec![
            hist("a", 1_000_000, 10, "ads"),
            hist("b", 2_000_000, 20, "ads"),
            hist("c", 900_000, 30, "feed"),
        ];
        let p = WarmStartParams {
            k: 3,
            mu: 0.5,
            ..Default::default()
        };
        let ws = warm_start(&job, &h, &p, &Bounds::default()).unwrap();
        // Similarity: a (same rows, same scenario) > b (2x rows) > c (other scenario).
        let order: Vec<&str> = ws.neighbours.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(order, vec!["c", "b", "a"]);
        // Ā = 0.5*10 + 0.5*(0.5*20 + 0.5*30) = 17.5 -> 18 (rounded).
        assert_eq!(ws.alloc.workers, 18);
        let p1 = WarmStartParams { k: 1, ..p };
        assert_eq!(
            warm_start(&job, &h, &p1, &Bounds::default())
                .unwrap()
                .alloc
                .workers,
            10
        );
    }

    #[test]
    fn empty_history_gives_documented_default_inside_bounds() {
        let job = spec("new");
        let ws = warm_start(&job, &[], &WarmStartParams::default(), &Bounds::default()).unwrap();
        assert_eq!((ws.alloc.workers, ws.alloc.worker_cpu), (4, 4.0));
        assert!(ws.reasons[0].contains("default"));
        let tight = Bounds {
            workers: crate::alloc::Range::new(1, 2),
            ..Default::default()
        };
        let ws = warm_start(&job, &[], &WarmStartParams::default(), &tight).unwrap();
        assert!(tight.contains(&ws.alloc));
    }

    /// Without a similar job, a job that says what it asked for starts with that (within
    /// the bounds, with PS memory for its model); with one, the history decides.
    #[test]
    fn empty_history_starts_from_the_requested_configuration() {
        let mut job = spec("new");
        let asked = Allocation {
            workers: 12,
            ps: 3,
            worker_cpu: 6.0,
            ps_cpu: 2.0,
            worker_mem_gb: 8.0,
            ps_mem_gb: 64.0,
        };
        job.requested = Some(asked);
        let p = WarmStartParams::default();
        let ws = warm_start(&job, &[], &p, &Bounds::default()).unwrap();
        assert_eq!(ws.alloc, asked);
        assert!(ws.reasons[0].contains("asked for"), "{:?}", ws.reasons);
        let tight = Bounds {
            workers: crate::alloc::Range::new(1, 8),
            ..Default::default()
        };
        assert_eq!(warm_start(&job, &[], &p, &tight).unwrap().alloc.workers, 8);
        let past = HistoricalJob {
            job_id: "old".into(),
            features: JobFeatures::of(&job),
            config: Allocation {
                workers: 5,
                ..asked
            },
        };
        assert_eq!(
            warm_start(&job, &[past], &p, &Bounds::default())
                .unwrap()
                .alloc
                .workers,
            5
        );
        job.requested = Some(Allocation { ps: 0, ..asked });
        let e = job.validate().unwrap_err().to_string();
        assert!(e.contains("requested.ps"), "{e}");
    }

    #[test]
    fn big_model_gets_enough_ps_memory() {
        let mut job = spec("big");
        job.tables[0].rows = 500_000_000; // 500M x 16 x 12 B x 1.25 = ~112 GiB
        let ws = warm_start(&job, &[], &WarmStartParams::default(), &Bounds::default()).unwrap();
        let need = ps_mem_needed_gb(&JobFeatures::of(&job), &job);
        assert!(
            f64::from(ws.alloc.ps) * ws.alloc.ps_mem_gb >= need,
            "{ws:?}"
        );
    }

    #[test]
    fn bad_params_are_configuration_errors() {
        let p = WarmStartParams {
            mu: 1.5,
            ..Default::default()
        };
        assert!(matches!(
            warm_start(&spec("x"), &[], &p, &Bounds::default()),
            Err(BrainError::Config(_))
        ));
    }
}
