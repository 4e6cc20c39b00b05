//! Datasets on an S3-compatible server (moto on loopback): partitions listed through the
//! object-store API, markers and file patterns applied, no credentials in the location.

#[path = "../../checkpoint/tests/integration/moto.rs"]
#[allow(dead_code)] // the helper serves several test files
mod moto;

use std::sync::Arc;
use std::time::Duration;

use elastrec_orchestrate::{parse_time, Dataset, DatasetConfig, TaskGraph, TaskLimits};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

#[test]
fn partitions_on_s3_are_listed_in_time_order_with_their_markers() {
    let s3 = moto::Moto::start();
    moto::set_credentials_env();
    s3.create_bucket("logs");
    let store: Arc<dyn ObjectStore> = Arc::new(
        AmazonS3Builder::from_env()
            .with_bucket_name("logs")
            .with_endpoint(s3.endpoint())
            .with_allow_http(true)
            .with_region("us-east-1")
            .build()
            .unwrap(),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        for day in ["20261101", "20261102", "20261103"] {
            for f in ["part-0.tsv", "part-1.tsv", "notes.txt"] {
                let key = Path::from(format!("clicks/dt={day}/{f}"));
                store
                    .put(&key, PutPayload::from_static(b"0\t1\n"))
                    .await
                    .unwrap();
            }
            // The third day has not landed completely: no marker.
            if day != "20261103" {
                let key = Path::from(format!("clicks/dt={day}/_SUCCESS"));
                store.put(&key, PutPayload::from_static(b"")).await.unwrap();
            }
        }
    });
    let cfg = DatasetConfig {
        name: "clicks".into(),
        path: format!(
            "s3://logs/clicks/dt={{date}}?endpoint={}&region=us-east-1",
            s3.endpoint()
        ),
        files: "*.tsv".into(),
        from: Some("2026-11-01".into()),
        ..Default::default()
    };
    let ds = Dataset::compile(&cfg, 0, std::path::Path::new(".")).unwrap();
    let mut graph = TaskGraph::new(vec![ds], TaskLimits::default());
    let (tasks, pending) = graph
        .plan_for_start(
            parse_time("2026-11-04").unwrap(),
            Duration::from_millis(1),
            false,
        )
        .unwrap();
    let paths: Vec<String> = tasks.iter().flat_map(|t| graph.task_paths(t)).collect();
    assert_eq!(paths.len(), 4, "{paths:?}");
    assert!(paths[0].ends_with("/dt=20261101/part-0.tsv"), "{paths:?}");
    assert!(paths[3].ends_with("/dt=20261102/part-1.tsv"), "{paths:?}");
    assert!(
        paths.iter().all(|p| p.starts_with("s3://logs/clicks")),
        "{paths:?}"
    );
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].dir, "dt=20261103");
    assert!(pending[0].exists, "listed, only missing its marker");
}
