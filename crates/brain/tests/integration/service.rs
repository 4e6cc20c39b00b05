//! The real gRPC server on loopback with a real client.

use elastrec_brain::planner::BrainConfig;
use elastrec_brain::service::serve_with_listeners;
use elastrec_brain::BrainServeOptions;
use elastrec_proto::brain as pb;
use pb::brain_client::BrainClient;
use tonic::transport::Channel;
use tonic::{Code, Request};

const TOKEN: &str = "s3cret";

fn req<T>(msg: T, token: &str) -> Request<T> {
    let mut r = Request::new(msg);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}

fn job(id: &str) -> pb::JobSpec {
    pb::JobSpec {
        job_id: id.into(),
        model_type: "dlrm".into(),
        tables: vec![
            pb::Table {
                rows: 1_000_000,
                dim: 16,
            },
            pb::Table {
                rows: 5_000,
                dim: 16,
            },
        ],
        dense_params: 500_000,
        dataset_samples: 100_000_000,
        batch_size: 512,
        scenario: "ads".into(),
        user: "u".into(),
        bounds: Some(pb::Bounds {
            workers: Some(pb::Range {
                min: 1.0,
                max: 32.0,
            }),
            ps: Some(pb::Range { min: 1.0, max: 8.0 }),
            ..Default::default()
        }),
        requested: None,
    }
}

/// Iteration times from a known DLRover-RM model with 2% noise.
fn profile() -> Vec<pb::ProfileSample> {
    profile_of(3, 1.0)
}

/// [`profile`] drawn with `seed`, every iteration `slowdown` times longer.
fn profile_of(seed: u64, slowdown: f64) -> Vec<pb::ProfileSample> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..30)
        .map(|_| {
            let (w, p) = (rng.random_range(1..=16u32), rng.random_range(1..=6u32));
            let (cw, cp) = (
                f64::from(rng.random_range(1..=8u32)),
                f64::from(rng.random_range(1..=8u32)),
            );
            let (wf, pf) = (f64::from(w), f64::from(p));
            let t = 2e-3 * 512.0 / cw
                + 0.02 * wf / (pf * cp)
                + 0.6 * (2.0 / pf) / (1250.0 / wf)
                + 4e-6 * 512.0 * 32.0 / pf
                + 0.05;
            pb::ProfileSample {
                allocation: Some(pb::Allocation {
                    workers: w,
                    ps: p,
                    worker_cpu: cw,
                    ps_cpu: cp,
                    worker_mem_gb: 8.0,
                    ps_mem_gb: 16.0,
                }),
                batch_size: 512,
                iter_time_s: slowdown * t * (1.0 + 0.02 * rng.random_range(-1.0..1.0)),
            }
        })
        .collect()
}

/// The brain's warm-start plan for `spec`, asked with the right token.
async fn warm_start(c: &mut BrainClient<Channel>, spec: pb::JobSpec) -> pb::PlanResponse {
    c.warm_start(req(pb::WarmStartRequest { job: Some(spec) }, TOKEN))
        .await
        .unwrap()
        .into_inner()
}

async fn start() -> (
    BrainClient<Channel>,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
    tempfile::TempDir,
    std::net::SocketAddr,
) {
    start_with(BrainConfig::default()).await
}

async fn start_with(
    config: BrainConfig,
) -> (
    BrainClient<Channel>,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
    tempfile::TempDir,
    std::net::SocketAddr,
) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("brain.db").display()
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let metrics = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics_addr = metrics.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let mut opts = BrainServeOptions::new(url, TOKEN);
    opts.config = config;
    let h = tokio::spawn(async move {
        serve_with_listeners(opts, listener, metrics, async {
            let _ = rx.await;
        })
        .await
        .unwrap();
    });
    let mut client = None;
    for _ in 0..100 {
        if let Ok(c) = BrainClient::connect(format!("http://{addr}")).await {
            client = Some(c);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    (
        client.expect("brain server did not come up"),
        tx,
        h,
        dir,
        metrics_addr,
    )
}

/// A job that ran at an allocation no plan gave it (its probes, a scale by hand) leaves
/// that allocation as its configuration: the next similar job warm-starts from where the
/// first one actually ran, not from the start-up plan it registered with.
#[tokio::test]
async fn a_later_job_warm_starts_from_where_the_first_one_ran() {
    let (mut c, stop, handle, _dir, _metrics) = start().await;
    let first = warm_start(&mut c, job("j1")).await.allocation.unwrap();
    let ran = pb::Allocation {
        workers: first.workers + 5,
        ..first
    };
    c.report_profile(req(
        pb::ReportProfileRequest {
            job_id: "j1".into(),
            samples: vec![pb::ProfileSample {
                allocation: Some(ran),
                batch_size: 256,
                iter_time_s: 0.05,
            }],
            memory: vec![],
        },
        TOKEN,
    ))
    .await
    .unwrap();
    let second = warm_start(&mut c, job("j2")).await.allocation.unwrap();
    assert_eq!(second.workers, ran.workers, "{second:?}");
    let _ = stop.send(());
    handle.await.unwrap();
}

/// Records how job `id` ended, ending on `a`.
async fn finish(c: &mut BrainClient<Channel>, id: &str, status: &str, a: pb::Allocation) {
    c.record_outcome(req(
        pb::RecordOutcomeRequest {
            job_id: id.into(),
            status: status.into(),
            final_allocation: Some(a),
            throughput: 1000.0,
            duration_s: 60.0,
        },
        TOKEN,
    ))
    .await
    .unwrap();
}

fn alloc(workers: u32, ps: u32, cores: f64) -> pb::Allocation {
    pb::Allocation {
        workers,
        ps,
        worker_cpu: cores,
        ps_cpu: cores,
        worker_mem_gb: 8.0,
        ps_mem_gb: 16.0,
    }
}

/// DLRover-RM Algorithm 1 over recorded outcomes. Of three past jobs, one similar that
/// finished, one identical to the new job that failed, and one of another kind (another
/// model, scenario and user, sizes a thousand times off), the new job starts from the
/// whole final allocation of the first: workers, PS and cores. Without the outcomes, the
/// failed twin would have pulled the plan towards its own allocation.
#[tokio::test]
async fn a_new_job_starts_from_the_similar_job_that_finished_not_the_failed_or_the_dissimilar() {
    let (mut c, stop, handle, _dir, _metrics) = start().await;
    let mut similar = job("similar");
    similar.dataset_samples /= 2;
    warm_start(&mut c, similar).await;
    let ran = alloc(12, 3, 6.0);
    finish(&mut c, "similar", "succeeded", ran).await;
    warm_start(&mut c, job("failed")).await;
    finish(&mut c, "failed", "oom", alloc(2, 1, 1.0)).await;
    let other = pb::JobSpec {
        job_id: "other".into(),
        model_type: "deepfm".into(),
        tables: vec![pb::Table {
            rows: 1_000_000_000,
            dim: 128,
        }],
        dense_params: 500_000_000,
        dataset_samples: 100_000_000_000,
        scenario: "search".into(),
        user: "v".into(),
        ..job("other")
    };
    warm_start(&mut c, other).await;
    finish(&mut c, "other", "succeeded", alloc(30, 8, 8.0)).await;

    let plan = warm_start(&mut c, job("new")).await;
    let a = plan.allocation.unwrap();
    assert_eq!((a.workers, a.ps), (ran.workers, ran.ps), "{plan:?}");
    assert_eq!(
        (a.worker_cpu, a.ps_cpu),
        (ran.worker_cpu, ran.ps_cpu),
        "{plan:?}"
    );
    let reasons = plan.reasons.join("; ");
    assert!(
        reasons.contains("warm start from 1 similar jobs (most similar: similar at"),
        "{reasons}"
    );

    // An outcome names a known job and one of the statuses the brain knows.
    let bad = |id: &str, status: &str| pb::RecordOutcomeRequest {
        job_id: id.into(),
        status: status.into(),
        final_allocation: None,
        throughput: 0.0,
        duration_s: 0.0,
    };
    let e = c
        .record_outcome(req(bad("new", "exploded"), TOKEN))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("exploded"), "{}", e.message());
    let e = c
        .record_outcome(req(bad("nobody", "succeeded"), TOKEN))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let e = c
        .record_outcome(req(bad("new", "succeeded"), "wrong"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    let _ = stop.send(());
    handle.await.unwrap();
}

#[tokio::test]
async fn report_warm_start_plan_and_stream_over_grpc() {
    let (mut c, stop, handle, _dir, metrics) = start().await;

    // Wrong or missing token: Unauthenticated.
    let e = c
        .warm_start(req(
            pb::WarmStartRequest {
                job: Some(job("j1")),
            },
            "nope",
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    let e = c
        .warm_start(Request::new(pb::WarmStartRequest {
            job: Some(job("j1")),
        }))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);

    // Warm start at submission (empty database: the default).
    let p = warm_start(&mut c, job("j1")).await;
    assert_eq!(p.kind, "warm-start");
    assert!(!p.reasons.is_empty());
    let a = p.allocation.unwrap();
    assert!((1..=32).contains(&a.workers) && (1..=8).contains(&a.ps));

    // A second, similar job warm-starts from the first one's configuration.
    let p2 = warm_start(&mut c, job("j2")).await;
    assert!(
        p2.reasons.iter().any(|r| r.contains("similar job j1")),
        "{:?}",
        p2.reasons
    );

    // Too few samples: the plan is refused with a clear reason.
    let e = c
        .plan(req(
            pb::PlanRequest {
                job_id: "j1".into(),
                ..Default::default()
            },
            TOKEN,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("too few samples"), "{}", e.message());

    // Report a profile, then re-plan.
    let r = c
        .report_profile(req(
            pb::ReportProfileRequest {
                job_id: "j1".into(),
                samples: profile(),
                memory: vec![],
            },
            TOKEN,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.samples_stored, 30);
    let cur = pb::Allocation {
        workers: 2,
        ps: 1,
        worker_cpu: 2.0,
        ps_cpu: 2.0,
        worker_mem_gb: 8.0,
        ps_mem_gb: 16.0,
    };
    let p = c
        .plan(req(
            pb::PlanRequest {
                job_id: "j1".into(),
                current: Some(cur),
                remaining_samples: 1_000_000_000,
                current_step: 0,
                total_steps: 0,
                ..Default::default()
            },
            TOKEN,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(p.kind, "re-plan", "{:?}", p.reasons);
    let a = p.allocation.unwrap();
    assert!((1..=32).contains(&a.workers) && (1..=8).contains(&a.ps));
    assert!(p.predicted_throughput > 0.0 && p.pareto_size > 0);
    let fit = p.fit.unwrap();
    assert!(fit.mape < 5.0 && fit.holdout_samples == 6, "{fit:?}");

    // Malformed wire values are InvalidArgument naming the field.
    let mut bad = profile();
    bad[2].iter_time_s = f64::NAN;
    let e = c
        .report_profile(req(
            pb::ReportProfileRequest {
                job_id: "j1".into(),
                samples: bad,
                memory: vec![],
            },
            TOKEN,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("samples[2].iter_time_s"),
        "{}",
        e.message()
    );
    let mut absurd = job("j3");
    absurd.tables[0].dim = 1 << 30;
    let e = c
        .warm_start(req(pb::WarmStartRequest { job: Some(absurd) }, TOKEN))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("tables[0].dim"), "{}", e.message());
    let e = c
        .plan(req(
            pb::PlanRequest {
                job_id: "unknown".into(),
                ..Default::default()
            },
            TOKEN,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);

    // KALE streaming plan over a diurnal history.
    let traffic: Vec<f64> = (0..96)
        .map(|i| 3_000.0 + 1_500.0 * (f64::from(i) / 48.0 * std::f64::consts::TAU).sin())
        .collect();
    let s = c
        .plan_stream(req(
            pb::PlanStreamRequest {
                job_id: "j1".into(),
                traffic_history: traffic,
                interval_s: 1800.0,
                period: 48,
                horizon: 12,
                mode: pb::TrainingMode::Async as i32,
                global_batch: 0,
                current_workers: 2,
                lag_samples: 0.0,
                utilization: 0.5,
            },
            TOKEN,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(s.stabilized_workers.len(), 12);
    assert!((1..=32).contains(&s.workers_now));
    assert!(!s.reasons.is_empty());

    // Every call above is counted by method, refused ones (wrong token) excepted: the
    // loopback endpoint needs no token.
    let (code, body) = tokio::task::spawn_blocking(move || {
        elastrec_metrics::http_get(&metrics.to_string(), "/metrics", None)
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(code, 200, "{body}");
    elastrec_metrics::parse_exposition(&body).unwrap();
    for (method, requests, errors) in [
        ("warm_start", 3, 1),
        ("plan", 3, 2),
        ("report_profile", 2, 1),
        ("plan_stream", 1, 0),
    ] {
        let line = |name: &str, n: u32| {
            format!("elastrec_brain_{name}_total{{method=\"{method}\"}} {n}\n")
        };
        assert!(
            body.contains(&line("requests", requests)),
            "{method}: {body}"
        );
        if errors > 0 {
            assert!(body.contains(&line("errors", errors)), "{method}: {body}");
        }
    }

    let _ = stop.send(());
    handle.await.unwrap();
}

/// Cluster of the sharing tests: less than two jobs want alone (each would take up to
/// 8 workers x 4 CPU + 4 PS x 4 CPU = 48 CPU).
const SHARED_CPU: f64 = 64.0;
const SHARED_MEM_GB: f64 = 1024.0;

/// What the masters of the sharing tests run with: 6 CPU, 32 GiB.
const CUR: pb::Allocation = pb::Allocation {
    workers: 2,
    ps: 1,
    worker_cpu: 2.0,
    ps_cpu: 2.0,
    worker_mem_gb: 8.0,
    ps_mem_gb: 16.0,
};

fn shared_config() -> BrainConfig {
    let mut c = BrainConfig::default();
    c.capacity.cpu = SHARED_CPU;
    c.capacity.mem_gb = SHARED_MEM_GB;
    c
}

/// [`job`] bounded to 8 workers and 4 PS of at most 4 CPU each.
fn small_job(id: &str) -> pb::JobSpec {
    let four = Some(pb::Range { min: 1.0, max: 4.0 });
    pb::JobSpec {
        bounds: Some(pb::Bounds {
            workers: Some(pb::Range { min: 1.0, max: 8.0 }),
            ps: four,
            worker_cpu: four,
            ps_cpu: four,
            ..Default::default()
        }),
        ..job(id)
    }
}

fn cpu(a: &pb::Allocation) -> f64 {
    f64::from(a.workers) * a.worker_cpu + f64::from(a.ps) * a.ps_cpu
}

fn mem(a: &pb::Allocation) -> f64 {
    f64::from(a.workers) * a.worker_mem_gb + f64::from(a.ps) * a.ps_mem_gb
}

/// A re-plan of `id` running [`CUR`]; `free` is the (CPU, GiB) override of a job on its
/// own machine.
fn plan_req(id: &str, free: Option<(f64, f64)>) -> pb::PlanRequest {
    pb::PlanRequest {
        job_id: id.into(),
        current: Some(CUR),
        remaining_samples: 1_000_000_000,
        free_cpu: free.map(|f| f.0),
        free_mem_gb: free.map(|f| f.1),
        ..Default::default()
    }
}

/// Two jobs share a brain whose cluster cannot give both what each wants alone. The job
/// whose workers gain three times as much (better RE x WG) asks second yet ends with more,
/// the planned allocations never add up to more than the cluster, and the other job,
/// planned alone with the same free room, gets more than its share.
#[tokio::test]
async fn jobs_sharing_the_brain_are_planned_together() {
    let (mut c, stop, handle, _dir, _) = start_with(shared_config()).await;
    // Each job's latest plan, from its start-up plan on.
    let mut latest = std::collections::BTreeMap::new();
    let fits = |latest: &std::collections::BTreeMap<String, pb::Allocation>| {
        let used: f64 = latest.values().map(cpu).sum();
        let used_mem: f64 = latest.values().map(mem).sum();
        assert!(
            used <= SHARED_CPU + 1e-9 && used_mem <= SHARED_MEM_GB + 1e-9,
            "{used} CPU, {used_mem} GiB: {latest:?}"
        );
    };
    for (id, seed, slowdown) in [("fast", 3, 1.0), ("slow", 4, 3.0)] {
        let p = warm_start(&mut c, small_job(id)).await;
        latest.insert(id.to_string(), p.allocation.unwrap());
        c.report_profile(req(
            pb::ReportProfileRequest {
                job_id: id.into(),
                samples: profile_of(seed, slowdown),
                memory: vec![],
            },
            TOKEN,
        ))
        .await
        .unwrap();
    }
    fits(&latest);
    // The slow job asks first and takes what the fast one's start-up plan leaves. Then both
    // re-plan from the allocation they still run (masters that have not scaled yet): the
    // greedy, not the order of the calls, decides.
    let mut last = std::collections::BTreeMap::new();
    for id in ["slow", "fast", "slow", "fast"] {
        let p = c
            .plan(req(plan_req(id, None), TOKEN))
            .await
            .unwrap()
            .into_inner();
        latest.insert(id.to_string(), p.allocation.unwrap());
        fits(&latest);
        last.insert(id, p);
    }
    let (fast, slow) = (&last["fast"], &last["slow"]);
    let (fa, sa) = (fast.allocation.unwrap(), slow.allocation.unwrap());
    assert!(cpu(&fa) > cpu(&sa), "fast {fa:?}, slow {sa:?}");
    assert_eq!(fast.kind, "re-plan", "{:?}", fast.reasons);
    for (p, other) in [(fast, "slow"), (slow, "fast")] {
        let together = format!("planned together with 1 other active job(s) ({other})");
        assert!(
            p.reasons.iter().any(|r| r.contains(&together)),
            "{:?}",
            p.reasons
        );
    }
    // On its own machine with the same free room, the slow job gets more.
    let free = (SHARED_CPU - cpu(&CUR), SHARED_MEM_GB - mem(&CUR));
    let alone = c
        .plan(req(plan_req("slow", Some(free)), TOKEN))
        .await
        .unwrap()
        .into_inner();
    let aa = alone.allocation.unwrap();
    assert!(cpu(&aa) > cpu(&sa), "alone {aa:?}, shared {sa:?}");
    assert!(
        !alone.reasons.iter().any(|r| r.contains("planned")),
        "{:?}",
        alone.reasons
    );

    let _ = stop.send(());
    handle.await.unwrap();
}

/// A clock the test moves by hand (ms).
struct TestClock(std::sync::Mutex<u64>);

impl elastrec_brain::shared::Clock for TestClock {
    fn now_ms(&self) -> u64 {
        *self.0.lock().unwrap()
    }
}

impl TestClock {
    fn advance(&self, secs: u64) {
        *self.0.lock().unwrap() += secs * 1000;
    }
}

/// A job that stops calling leaves the shared plan once `sharing.inactive_after_s` has
/// passed; a profile report keeps a job in it. (The service's handlers in process, with a
/// clock the test moves.)
#[tokio::test]
async fn a_job_that_stops_calling_leaves_the_shared_plan() {
    use elastrec_brain::service::BrainService;
    use pb::brain_server::Brain as _;
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("brain.db").display()
    );
    let clock = std::sync::Arc::new(TestClock(std::sync::Mutex::new(1_000)));
    // Room for one job's 40 CPU, but not beside the other's 20 CPU start-up plan.
    let mut cfg = shared_config();
    cfg.capacity.cpu = 48.0;
    assert_eq!(cfg.sharing.inactive_after_s, 600.0, "documented default");
    let svc = BrainService::open_with_clock(&url, cfg, clock.clone())
        .await
        .unwrap();
    for id in ["idle", "busy"] {
        svc.warm_start(Request::new(pb::WarmStartRequest {
            job: Some(small_job(id)),
        }))
        .await
        .unwrap();
    }
    let report = |samples| pb::ReportProfileRequest {
        job_id: "busy".into(),
        samples,
        memory: vec![],
    };
    svc.report_profile(Request::new(report(profile())))
        .await
        .unwrap();
    let first = svc
        .plan(Request::new(plan_req("busy", None)))
        .await
        .unwrap()
        .into_inner();
    assert!(
        first
            .reasons
            .iter()
            .any(|r| r.contains("planned together with 1 other active job(s) (idle)")),
        "{:?}",
        first.reasons
    );
    // Nine minutes on, busy reports (nothing new); idle has not called since it started.
    clock.advance(540);
    svc.report_profile(Request::new(report(vec![])))
        .await
        .unwrap();
    clock.advance(61);
    let second = svc
        .plan(Request::new(plan_req("busy", None)))
        .await
        .unwrap()
        .into_inner();
    assert!(
        second.reasons.iter().any(|r| r.contains("only active job")),
        "{:?}",
        second.reasons
    );
    let (a1, a2) = (first.allocation.unwrap(), second.allocation.unwrap());
    assert!(cpu(&a1) <= 28.0, "beside idle's start-up plan: {a1:?}");
    assert!(cpu(&a2) > cpu(&a1), "{a1:?} then {a2:?}");
}
