//! Brain benchmarks: one NSGA-II plan for one job, the weighted greedy over 1,000 jobs,
//! and the forecasters on a 7-day diurnal trace (MAPE printed before the timings).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use elastrec_brain::forecast::{diurnal_trace, mape, Forecaster, HoltWinters, SeasonalNaive};
use elastrec_brain::greedy::{weighted_greedy, GreedyParams, JobOptions};
use elastrec_brain::nsga2::{nsga2, JobProblem, Nsga2Params, OverheadModel, Prices};
use elastrec_brain::throughput::dlrover::{DlroverCoefficients, DlroverConstants, DlroverModel};
use elastrec_brain::{Allocation, Bounds, Resources};
use rand::{Rng, SeedableRng};

fn model() -> DlroverModel {
    DlroverModel::new(
        DlroverConstants {
            batch_size: 512,
            model_size_mb: 40.0,
            bandwidth_mb_s: 1250.0,
            emb_dim: 416.0,
        },
        DlroverCoefficients {
            alpha_grad: 2e-3,
            alpha_upd: 0.02,
            alpha_sync: 0.6,
            alpha_emb: 4e-6,
            beta: 0.05,
        },
    )
}

fn current() -> Allocation {
    Allocation {
        workers: 4,
        ps: 2,
        worker_cpu: 4.0,
        ps_cpu: 4.0,
        worker_mem_gb: 8.0,
        ps_mem_gb: 16.0,
    }
}

fn bench_nsga2(c: &mut Criterion) {
    let m = model();
    let problem = JobProblem {
        model: &m,
        bounds: Bounds::default(),
        current: Some(current()),
        prices: Prices::default(),
        overhead: OverheadModel::default(),
        ps_mem_needed_gb: 24.0,
    };
    let front = nsga2(&problem, Nsga2Params::default()).unwrap();
    println!(
        "nsga2: default params (population 48, 60 generations): front of {} allocations",
        front.len()
    );
    let mut g = c.benchmark_group("nsga2");
    g.throughput(Throughput::Elements(1));
    g.bench_function("plan_one_job", |b| {
        b.iter(|| nsga2(black_box(&problem), Nsga2Params::default()).unwrap())
    });
    g.finish();
}

fn bench_greedy(c: &mut Criterion) {
    let m = model();
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let bounds = Bounds::default();
    let jobs: Vec<JobOptions> = (0..1000)
        .map(|j| {
            let cur = current();
            let cur_tp = elastrec_brain::throughput::ThroughputModel::predict(&m, &cur);
            let candidates = (0..20)
                .map(|_| {
                    let a = bounds.clamp(&Allocation {
                        workers: rng.random_range(1..=64),
                        ps: rng.random_range(1..=16),
                        worker_cpu: f64::from(rng.random_range(2..=32u32)) / 2.0,
                        ps_cpu: f64::from(rng.random_range(2..=32u32)) / 2.0,
                        worker_mem_gb: 8.0,
                        ps_mem_gb: 16.0,
                    });
                    let tp = elastrec_brain::throughput::ThroughputModel::predict(&m, &a);
                    elastrec_brain::nsga2::Candidate {
                        alloc: a,
                        throughput: tp,
                        cost: Prices::default().cost(&a),
                        gain: tp - cur_tp,
                        violation: 0.0,
                    }
                })
                .collect();
            JobOptions {
                job_id: format!("job-{j}"),
                remaining_samples: rng.random_range(1e6..1e10),
                current: Some(cur),
                candidates,
            }
        })
        .collect();
    let used: f64 = jobs.iter().map(|j| j.current.unwrap().total_cpu()).sum();
    let used_mem: f64 = jobs.iter().map(|j| j.current.unwrap().total_mem_gb()).sum();
    let cap = Resources {
        cpu: used + 20_000.0,
        mem_gb: used_mem + 80_000.0,
    };
    let mut g = c.benchmark_group("greedy");
    g.throughput(Throughput::Elements(1000));
    g.bench_function("1000_jobs_x_20_candidates", |b| {
        b.iter(|| weighted_greedy(black_box(&jobs), cap, GreedyParams::default()).unwrap())
    });
    g.finish();
}

fn bench_forecast(c: &mut Criterion) {
    let per_day = 288;
    for (noise, seed) in [(0.05, 1u64), (0.08, 2), (0.15, 3)] {
        let y = diurnal_trace(7, per_day, 30_000.0, noise, seed);
        let (train, test) = y.split_at(6 * per_day);
        let hw = HoltWinters::new(per_day).forecast(train, per_day).unwrap();
        let sn = SeasonalNaive { period: per_day }
            .forecast(train, per_day)
            .unwrap();
        println!(
            "forecast day 7 of a 7-day diurnal trace (5-min samples, noise {:.0}%): MAPE holt-winters {:.2}%, seasonal-naive {:.2}%",
            noise * 100.0,
            mape(&hw, test),
            mape(&sn, test)
        );
    }
    let y = diurnal_trace(7, per_day, 30_000.0, 0.08, 2);
    let train = &y[..6 * per_day];
    let mut g = c.benchmark_group("forecast");
    g.bench_function("holt_winters_fit_6_days_forecast_1_day", |b| {
        b.iter(|| {
            HoltWinters::new(per_day)
                .forecast(black_box(train), per_day)
                .unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, bench_nsga2, bench_greedy, bench_forecast);
criterion_main!(benches);
