//! The real gRPC server on loopback with a real client.

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
    }
}

/// Iteration times from a known DLRover-RM model with 2% noise.
fn profile() -> Vec<pb::ProfileSample> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
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
                iter_time_s: t * (1.0 + 0.02 * rng.random_range(-1.0..1.0)),
            }
        })
        .collect()
}

async fn start() -> (
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
    let opts = BrainServeOptions::new(url, TOKEN);
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
    let p = c
        .warm_start(req(
            pb::WarmStartRequest {
                job: Some(job("j1")),
            },
            TOKEN,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(p.kind, "warm-start");
    assert!(!p.reasons.is_empty());
    let a = p.allocation.unwrap();
    assert!((1..=32).contains(&a.workers) && (1..=8).contains(&a.ps));

    // A second, similar job warm-starts from the first one's configuration.
    let p2 = c
        .warm_start(req(
            pb::WarmStartRequest {
                job: Some(job("j2")),
            },
            TOKEN,
        ))
        .await
        .unwrap()
        .into_inner();
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
