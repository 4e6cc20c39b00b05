//! The checkpoint store against a real S3-compatible server (moto_server). Fails, rather
//! than skips, when moto is not installed.

use elastrec_checkpoint::store::CheckpointStore;

use crate::moto::Moto;
use crate::scenarios;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_store_against_moto() {
    let moto = Moto::start();
    moto.create_bucket("ckpt");
    let open = |prefix: &str| CheckpointStore::open(&moto.url("ckpt", prefix)).unwrap();

    scenarios::round_trip(&open("round-trip")).await;
    scenarios::corruption_falls_back(&open("corrupt")).await;
    scenarios::crash_mid_save_is_ignored(&open("crash")).await;
    scenarios::retention_keeps_delta_bases(&open("retain")).await;

    // Prefixes are separate stores in one bucket.
    assert_eq!(open("round-trip").next_id().await.unwrap(), 2);
    assert_eq!(open("never-used").next_id().await.unwrap(), 1);

    // A missing bucket is a storage error naming the location.
    let err = CheckpointStore::open(&moto.url("no-such-bucket", "p"))
        .unwrap()
        .list()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("s3://no-such-bucket/p"), "{err}");
}
