//! The checkpoint store on a local directory.

use std::path::{Path, PathBuf};

use elastrec_checkpoint::error::Check;
use elastrec_checkpoint::format::{CheckpointKind, PartMeta};
use elastrec_checkpoint::store::CheckpointStore;
use elastrec_checkpoint::CheckpointError;

use crate::scenarios;
use crate::util::{ids, manifest, part_bytes, save, PARTS};

fn open(dir: &tempfile::TempDir) -> CheckpointStore {
    CheckpointStore::open(dir.path().to_str().unwrap()).unwrap()
}

fn file_of(dir: &Path, id: u64, name: &str) -> PathBuf {
    dir.join(format!("ckpt-{id:012}")).join(name)
}

fn flip_byte(path: &Path, at: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at] ^= 0x01;
    std::fs::write(path, bytes).unwrap();
}

#[tokio::test]
async fn local_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    scenarios::round_trip(&store).await;
    assert!(file_of(dir.path(), 1, "MANIFEST.json").is_file());
    assert!(file_of(dir.path(), 1, "ps-0").is_file());
}

#[tokio::test]
async fn flipped_byte_on_disk_is_detected_and_latest_valid_falls_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let first = save(&store, 1, CheckpointKind::Full, PARTS).await;
    let second = save(&store, 2, CheckpointKind::Full, PARTS).await;
    flip_byte(&file_of(dir.path(), 2, "dense"), 500);
    let err = store.read_part(&second, "dense").await.unwrap_err();
    match &err {
        CheckpointError::Corrupt {
            id,
            part,
            check,
            location,
            ..
        } => {
            assert_eq!((*id, part.as_str(), *check), (2, "dense", Check::Checksum));
            assert!(location.ends_with("ckpt-000000000002/dense"), "{location}");
        }
        other => panic!("expected Corrupt, got {other}"),
    }
    assert!(err.to_string().contains("dense"), "{err}");
    // The intact part of the damaged checkpoint still reads.
    store.read_part(&second, "ps-0").await.unwrap();
    assert_eq!(store.latest_valid().await.unwrap(), Some(first));
}

#[tokio::test]
async fn overwritten_part_is_detected_and_latest_valid_falls_back() {
    let dir = tempfile::tempdir().unwrap();
    scenarios::corruption_falls_back(&open(&dir)).await;
}

#[tokio::test]
async fn truncated_part_is_a_size_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let saved = save(&store, 1, CheckpointKind::Full, PARTS).await;
    let path = file_of(dir.path(), 1, "ps-0");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..100]).unwrap();
    let err = store.read_part(&saved, "ps-0").await.unwrap_err();
    assert!(
        matches!(
            err,
            CheckpointError::Corrupt {
                check: Check::Size,
                expected: 4096,
                found: 100,
                ..
            }
        ),
        "{err}"
    );
    assert!(store.verify(&saved).await.is_err());
    assert_eq!(store.latest_valid().await.unwrap(), None);
}

#[tokio::test]
async fn missing_part_makes_checkpoint_incomplete() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    save(&store, 1, CheckpointKind::Full, PARTS).await;
    let second = save(&store, 2, CheckpointKind::Full, PARTS).await;
    std::fs::remove_file(file_of(dir.path(), 2, "ps-0")).unwrap();
    let err = store.read_part(&second, "ps-0").await.unwrap_err();
    assert!(
        matches!(err, CheckpointError::Incomplete { id: 2, .. }),
        "{err}"
    );
    assert_eq!(store.latest_valid().await.unwrap().map(|m| m.id), Some(1));
    let err = store.read_part(&second, "nope").await.unwrap_err();
    assert!(
        matches!(err, CheckpointError::UnknownPart { id: 2, .. }),
        "{err}"
    );
}

#[tokio::test]
async fn crash_mid_save_is_ignored_and_cleaned_by_retain() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    scenarios::crash_mid_save_is_ignored(&store).await;
    assert!(!dir.path().join("ckpt-000000000002").exists());
}

#[tokio::test]
async fn incomplete_save_newer_than_every_checkpoint_is_kept() {
    // It may be a save in progress.
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    save(&store, 1, CheckpointKind::Full, PARTS).await;
    store
        .put_part(2, "ps-0", part_bytes(2, "ps-0", 10))
        .await
        .unwrap();
    assert!(store.retain(1).await.unwrap().is_empty());
    assert!(file_of(dir.path(), 2, "ps-0").is_file());
}

#[tokio::test]
async fn unreadable_manifest_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    save(&store, 1, CheckpointKind::Full, PARTS).await;
    save(&store, 2, CheckpointKind::Full, PARTS).await;
    std::fs::write(file_of(dir.path(), 2, "MANIFEST.json"), b"{ not json").unwrap();
    assert_eq!(ids(&store).await, vec![1]);
    assert_eq!(store.latest_valid().await.unwrap().map(|m| m.id), Some(1));
    assert!(matches!(
        store.manifest(2).await,
        Err(CheckpointError::Json { .. })
    ));
}

#[tokio::test]
async fn retention_keeps_last_k_and_bases_of_retained_deltas() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    scenarios::retention_keeps_delta_bases(&store).await;
    for gone in 1..=5 {
        assert!(
            !dir.path().join(format!("ckpt-{gone:012}")).exists(),
            "{gone}"
        );
    }
    assert!(matches!(
        store.retain(0).await,
        Err(CheckpointError::Invalid(_))
    ));
}

#[tokio::test]
async fn delta_with_corrupt_base_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    save(&store, 1, CheckpointKind::Full, PARTS).await;
    save(&store, 2, CheckpointKind::Full, PARTS).await;
    save(
        &store,
        3,
        CheckpointKind::Delta { base: 2 },
        &[("ps-0", 64)],
    )
    .await;
    flip_byte(&file_of(dir.path(), 2, "ps-0"), 0);
    assert_eq!(store.latest_valid().await.unwrap().map(|m| m.id), Some(1));
}

#[tokio::test]
async fn next_id_counts_incomplete_directories() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    assert_eq!(store.next_id().await.unwrap(), 1);
    store
        .put_part(41, "ps-0", part_bytes(41, "ps-0", 8))
        .await
        .unwrap();
    assert_eq!(store.next_id().await.unwrap(), 42);
    // Unrelated entries in the directory are not checkpoints.
    std::fs::create_dir(dir.path().join("ckpt-x")).unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"hi").unwrap();
    assert_eq!(store.next_id().await.unwrap(), 42);
    assert!(ids(&store).await.is_empty());
}

#[tokio::test]
async fn commit_refuses_missing_short_and_duplicate_parts() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let meta = store
        .put_part(1, "ps-0", part_bytes(1, "ps-0", 10))
        .await
        .unwrap();
    let missing = PartMeta::of("ps-1", b"never stored");
    let err = store
        .commit(&manifest(
            1,
            CheckpointKind::Full,
            vec![meta.clone(), missing],
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CheckpointError::Incomplete { id: 1, part, .. } if part == "ps-1"),
        "{err}"
    );
    let mut short = meta.clone();
    short.bytes = 11;
    let err = store
        .commit(&manifest(1, CheckpointKind::Full, vec![short]))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            CheckpointError::Corrupt {
                check: Check::Size,
                ..
            }
        ),
        "{err}"
    );
    let err = store
        .commit(&manifest(
            1,
            CheckpointKind::Full,
            vec![meta.clone(), meta.clone()],
        ))
        .await
        .unwrap_err();
    assert!(matches!(err, CheckpointError::Invalid(_)), "{err}");
    assert!(ids(&store).await.is_empty(), "nothing was committed");
    store
        .commit(&manifest(1, CheckpointKind::Full, vec![meta.clone()]))
        .await
        .unwrap();
    let err = store
        .commit(&manifest(1, CheckpointKind::Full, vec![meta]))
        .await
        .unwrap_err();
    assert!(
        matches!(err, CheckpointError::AlreadyCommitted { id: 1, .. }),
        "{err}"
    );
}

#[tokio::test]
async fn commit_refuses_delta_without_committed_older_base() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let meta = store
        .put_part(5, "ps-0", part_bytes(5, "ps-0", 10))
        .await
        .unwrap();
    for base in [4, 5, 6] {
        let err = store
            .commit(&manifest(
                5,
                CheckpointKind::Delta { base },
                vec![meta.clone()],
            ))
            .await
            .unwrap_err();
        assert!(
            matches!(err, CheckpointError::BrokenChain { id: 5, .. }),
            "base {base}: {err}"
        );
    }
}

#[tokio::test]
async fn bad_part_names_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    for name in ["", "a/b", "..", "../escape", "MANIFEST.json", "with space"] {
        let err = store
            .put_part(1, name, part_bytes(1, "x", 4))
            .await
            .unwrap_err();
        assert!(matches!(err, CheckpointError::Invalid(_)), "{name}: {err}");
    }
    assert_eq!(store.next_id().await.unwrap(), 1, "nothing was written");
}

#[tokio::test]
async fn bad_locations_are_config_errors() {
    for location in [
        "",
        "ftp://host/dir",
        "file://",
        "s3://",
        "s3:///prefix",
        "s3://bucket/p?not_an_s3_option=1",
        "s3://bucket/p?endpoint",
        "s3://bucket:9000/p",
        "s3://bucket/p#part",
        "s3://bucket/a//b",
    ] {
        match CheckpointStore::open(location) {
            Err(CheckpointError::Config {
                location: l,
                reason,
            }) => {
                assert_eq!(l, location);
                assert!(!reason.is_empty());
            }
            Err(other) => panic!("{location}: expected Config, got {other}"),
            Ok(store) => panic!("{location}: opened {}", store.location()),
        }
    }
}

#[tokio::test]
async fn file_urls_and_plain_paths_open_the_same_directory() {
    let dir = tempfile::tempdir().unwrap();
    let nested = dir.path().join("a").join("b");
    let by_path = CheckpointStore::open(nested.to_str().unwrap()).unwrap();
    save(&by_path, 3, CheckpointKind::Full, PARTS).await;
    let by_url = CheckpointStore::open(&format!("file://{}", nested.display())).unwrap();
    assert_eq!(ids(&by_url).await, vec![3]);
    assert_eq!(by_url.location(), by_path.location());
}

#[tokio::test]
async fn s3_locations_with_credentials_are_refused() {
    for (location, parameter) in [
        (
            "s3://bucket/jobs/j1?endpoint=http://127.0.0.1:1&region=us-east-1&access_key_id=AKIAID&secret_access_key=S3CR3T",
            "`access_key_id`",
        ),
        ("s3://bucket/p?secret_access_key=S3CR3T&bogus=1", "`secret_access_key`"),
        ("s3://bucket/p?aws_session_token=S3CR3T", "`aws_session_token`"),
        ("s3://AKIAID:S3CR3T@bucket/p", "user:password@"),
    ] {
        let err = CheckpointStore::open(location).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, CheckpointError::Config { .. }), "{msg}");
        assert!(msg.contains(parameter), "{msg} lacks {parameter}");
        assert!(msg.contains("AWS_SECRET_ACCESS_KEY"), "says what to do: {msg}");
        assert!(!msg.contains("S3CR3T") && !msg.contains("AKIAID"), "{msg}");
    }
    // Without credentials the same location opens, and messages never show its query.
    let store =
        CheckpointStore::open("s3://bucket/jobs/j1?endpoint=http://127.0.0.1:1&region=us-east-1")
            .unwrap();
    assert_eq!(store.location(), "s3://bucket/jobs/j1");
    assert_eq!(
        store.part_path(7, "ps-0").as_ref(),
        "jobs/j1/ckpt-000000000007/ps-0"
    );
}
