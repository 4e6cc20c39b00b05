//! The checkpoint store against a real S3-compatible server (moto_server). Fails, rather
//! than skips, when moto is not installed.

use elastrec_checkpoint::format::CheckpointKind;
use elastrec_checkpoint::store::CheckpointStore;
use elastrec_checkpoint::CheckpointError;
use object_store::ObjectStoreExt;

use crate::moto::{self, Moto};
use crate::scenarios;
use crate::util::{part_bytes, save};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_store_against_moto() {
    // Credentials from the environment only, as in production: the location has none.
    moto::set_credentials_env();
    let moto = Moto::start();
    moto.create_bucket("ckpt");
    let url = moto.url("ckpt", "round-trip");
    assert!(!url.contains("testing"), "no credentials in {url}");
    let open = |prefix: &str| CheckpointStore::open(&moto.url("ckpt", prefix)).unwrap();

    scenarios::round_trip(&open("round-trip")).await;
    scenarios::corruption_falls_back(&open("corrupt")).await;
    scenarios::crash_mid_save_is_ignored(&open("crash")).await;
    scenarios::retention_keeps_delta_bases(&open("retain")).await;

    // Large parts go up as concurrent multipart uploads and read back intact.
    let store = open("multipart").with_multipart(8 << 20, 5 << 20);
    let saved = save(
        &store,
        1,
        CheckpointKind::Full,
        &[("ps-0", 12 << 20), ("dense", 100)],
    )
    .await;
    let bytes = store.read_part(&saved, "ps-0").await.unwrap();
    assert_eq!(bytes, part_bytes(1, "ps-0", 12 << 20));
    store.verify(&saved).await.unwrap();
    let head = store
        .object_store()
        .head(&store.part_path(1, "ps-0"))
        .await
        .unwrap();
    let etag = head.e_tag.unwrap_or_default();
    assert!(
        etag.contains("-3"),
        "12 MiB in 5 MiB chunks is a 3-part upload: {etag}"
    );

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

    // The old form, keys in the query, is refused before any request, naming the parameter.
    let with_keys = format!("{url}&access_key_id=testing&secret_access_key=testing");
    let err = CheckpointStore::open(&with_keys).unwrap_err();
    assert!(matches!(err, CheckpointError::Config { .. }), "{err}");
    assert!(err.to_string().contains("`access_key_id`"), "{err}");
    assert!(err.to_string().contains("AWS_ACCESS_KEY_ID"), "{err}");
}
