//! The same database suite against SQLite and PostgreSQL.

use elastrec_brain::db::{ConfigDb, Outcome};
use elastrec_brain::planner::{warm_plan, BrainConfig};
use elastrec_brain::throughput::ProfileSample;
use elastrec_brain::{oom::MemorySample, Allocation, Bounds, JobSpec, TableSpec};

pub fn spec(id: &str, rows: u64, scenario: &str) -> JobSpec {
    JobSpec {
        job_id: id.into(),
        model_type: "dlrm".into(),
        tables: vec![
            TableSpec { rows, dim: 16 },
            TableSpec { rows: 1000, dim: 8 },
        ],
        dense_params: 200_000,
        dataset_samples: 50_000_000,
        batch_size: 256,
        scenario: scenario.into(),
        user: "u".into(),
        bounds: Bounds::default(),
        requested: None,
    }
}

pub fn alloc(workers: u32) -> Allocation {
    Allocation {
        workers,
        ps: 2,
        worker_cpu: 4.0,
        ps_cpu: 4.0,
        worker_mem_gb: 8.0,
        ps_mem_gb: 16.0,
    }
}

fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

async fn suite(store: &ConfigDb) {
    let start_ms = wall_ms();
    // Empty database: warm start falls back to the documented default.
    let cfg = BrainConfig::default();
    let history = store.history(wall_ms(), i64::MAX).await.unwrap();
    assert!(history.is_empty());
    let p = warm_plan(&cfg, &spec("new", 1_000_000, "ads"), &history).unwrap();
    assert!(p.reasons[0].contains("default"), "{:?}", p.reasons);

    // Seed: three jobs with configurations over time; one failed with OOM.
    for (id, rows, scen, ws) in [
        ("a", 1_000_000, "ads", [4, 10]),
        ("b", 2_000_000, "ads", [6, 20]),
        ("c", 900_000, "feed", [8, 30]),
        ("d", 1_000_000, "ads", [3, 99]),
    ] {
        store.upsert_job(&spec(id, rows, scen)).await.unwrap();
        for w in ws {
            store
                .record_config(id, &alloc(w), "reported")
                .await
                .unwrap();
        }
    }
    store
        .record_outcome(
            "d",
            &Outcome {
                status: "oom".into(),
                throughput: 1.0,
                duration_s: 5.0,
            },
        )
        .await
        .unwrap();
    store
        .record_outcome(
            "a",
            &Outcome {
                status: "succeeded".into(),
                throughput: 9e3,
                duration_s: 3600.0,
            },
        )
        .await
        .unwrap();
    let configs = store.configs("a").await.unwrap();
    assert_eq!(
        configs.iter().map(|c| c.0.workers).collect::<Vec<_>>(),
        vec![4, 10]
    );
    let history = store.history(wall_ms(), i64::MAX).await.unwrap();
    let ids: Vec<&str> = history.iter().map(|h| h.job_id.as_str()).collect();
    assert_eq!(ids, vec!["a", "b", "c"], "the OOM job is not learned from");
    // Two hours on, with nothing heard of b and c (no outcome): their masters died without
    // saying how the jobs ended, and only a, which finished, is learned from.
    let later = wall_ms() + 2 * 3_600_000;
    let ids: Vec<String> = store
        .history(later, 3_600_000)
        .await
        .unwrap()
        .into_iter()
        .map(|h| h.job_id)
        .collect();
    assert_eq!(
        ids,
        vec!["a"],
        "silent jobs without an outcome are left out"
    );
    assert_eq!(history[0].config.workers, 10, "latest configuration");
    assert_eq!(
        store.job("b").await.unwrap().unwrap(),
        spec("b", 2_000_000, "ads")
    );
    assert!(store.job("zz").await.unwrap().is_none());

    // Warm start over the seeded database (Algorithm 1 with mu = 0.5, k = 3):
    // least similar first c(30), b(20), a(10): 0.5*10 + 0.5*(0.5*20 + 0.5*30) = 17.5 -> 18.
    let mut cfg = BrainConfig::default();
    cfg.warm.k = 3;
    cfg.warm.mu = 0.5;
    let p = warm_plan(&cfg, &spec("new", 1_000_000, "ads"), &history).unwrap();
    assert_eq!(p.allocation.workers, 18, "{:?}", p.reasons);
    assert!(p.reasons.iter().any(|r| r.contains("similar job a")));

    // Profiles and memory readings round-trip in order.
    let samples: Vec<ProfileSample> = (1..=5)
        .map(|w| ProfileSample {
            alloc: alloc(w),
            batch_size: 256,
            iter_time_s: 0.1 * f64::from(w),
        })
        .collect();
    assert_eq!(store.add_samples("a", &samples).await.unwrap(), 5);
    assert_eq!(store.add_samples("a", &samples[..2]).await.unwrap(), 2);
    let back = store.samples("a", 100).await.unwrap();
    assert_eq!(back.len(), 7);
    assert_eq!(&back[..5], &samples[..]);
    let last3 = store.samples("a", 3).await.unwrap();
    assert_eq!(last3, vec![samples[4], samples[0], samples[1]]);
    let mut bad = samples[0];
    bad.iter_time_s = f64::NAN;
    assert!(store.add_samples("a", &[bad]).await.is_err());
    let mem = vec![
        MemorySample {
            ps_index: 1,
            step: 10,
            mem_gb: 2.0,
        },
        MemorySample {
            ps_index: 0,
            step: 20,
            mem_gb: 3.0,
        },
        MemorySample {
            ps_index: 0,
            step: 10,
            mem_gb: 2.5,
        },
    ];
    store.add_memory("a", &mem).await.unwrap();
    let back = store.memory("a").await.unwrap();
    assert_eq!(back, vec![mem[2], mem[1], mem[0]]);

    // The history says when each job was last heard of: "b" has no outcome (as when its
    // master dies) and fell silent at its last configuration; "a" reported since.
    let end_ms = wall_ms();
    let jobs = store.jobs(10).await.unwrap();
    let job = |id: &str| jobs.iter().find(|j| j.job_id == id).unwrap();
    assert!(job("b").outcome.is_none());
    for j in &jobs {
        assert!(
            (start_ms..=end_ms).contains(&j.last_report_ms),
            "{}: {} outside {start_ms}..={end_ms}",
            j.job_id,
            j.last_report_ms
        );
    }
    assert!(job("a").last_report_ms >= job("b").last_report_ms);
}

#[tokio::test]
async fn sqlite_suite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("brain.db").display()
    );
    let store = ConfigDb::connect(&url).await.unwrap();
    suite(&store).await;
    // Reopening applies no migration twice and keeps the data.
    drop(store);
    let store = ConfigDb::connect(&url).await.unwrap();
    assert_eq!(store.history(wall_ms(), i64::MAX).await.unwrap().len(), 3);
}

#[tokio::test]
async fn postgres_suite() {
    let pg = super::pg::Postgres::start();
    let store = ConfigDb::connect(&pg.url).await.unwrap();
    assert_eq!(store.backend(), elastrec_brain::db::Backend::Postgres);
    suite(&store).await;
    drop(store);
    let store = ConfigDb::connect(&pg.url).await.unwrap();
    assert_eq!(store.history(wall_ms(), i64::MAX).await.unwrap().len(), 3);
    // A server-side failure (no such database) does not echo the password either.
    let server = &pg.url[..pg.url.rfind('/').unwrap()];
    let with_password = format!(
        "{}/no_such_db",
        server.replace("postgres@", "postgres:s3cret@")
    );
    let e = ConfigDb::connect(&with_password)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("no_such_db") && !e.contains("s3cret"), "{e}");
}

#[tokio::test]
async fn sqlite_url_without_mode_creates_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fresh.db");
    let store = ConfigDb::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    assert!(store.history(wall_ms(), i64::MAX).await.unwrap().is_empty());
    assert!(path.exists());
}

#[tokio::test]
async fn bad_url_is_a_configuration_error() {
    let e = ConfigDb::connect("mysql://x").await.unwrap_err();
    assert!(matches!(e, elastrec_brain::BrainError::Config(_)), "{e}");
}

/// Connection errors never carry the database password, whether the brain or sqlx
/// words them.
#[tokio::test]
async fn connection_errors_hide_the_password() {
    for url in [
        "mysql://u:s3cret@h/db",
        "postgres://u:s3cret@h:99999/db",
        "postgres://u@h:99999/db?password=s3cret",
    ] {
        let e = ConfigDb::connect(url).await.unwrap_err().to_string();
        assert!(!e.contains("s3cret"), "{url}: {e}");
    }
    let e = ConfigDb::connect("mysql://u:s3cret@h/db")
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "configuration: database URL must start with sqlite: or postgres://, got `mysql://u:***@h/db`"
    );
}
