//! Store behaviour that must hold on every backend; run against a local directory and
//! against a real S3-compatible server.

use bytes::Bytes;
use elastrec_checkpoint::format::CheckpointKind;
use elastrec_checkpoint::store::CheckpointStore;
use elastrec_checkpoint::CheckpointError;
use object_store::{ObjectStoreExt, PutPayload};

use crate::util::{ids, part_bytes, save, PARTS};

/// Save, list, read back, verify, chain, next id.
pub async fn round_trip(store: &CheckpointStore) {
    assert_eq!(store.next_id().await.unwrap(), 1);
    assert!(store.latest_valid().await.unwrap().is_none());
    let saved = save(store, 1, CheckpointKind::Full, PARTS).await;
    assert_eq!(ids(store).await, vec![1]);
    assert_eq!(store.manifest(1).await.unwrap(), saved);
    for &(name, len) in PARTS {
        let bytes = store.read_part(&saved, name).await.unwrap();
        assert_eq!(bytes, part_bytes(1, name, len), "part {name}");
    }
    store.verify(&saved).await.unwrap();
    assert_eq!(store.chain(&saved).await.unwrap(), vec![saved.clone()]);
    assert_eq!(store.latest_valid().await.unwrap(), Some(saved));
    assert_eq!(store.next_id().await.unwrap(), 2);
}

/// A part overwritten behind the store's back (same size, other bytes) is caught by
/// `read_part`, and `latest_valid` falls back to the previous checkpoint.
pub async fn corruption_falls_back(store: &CheckpointStore) {
    let first = save(store, 1, CheckpointKind::Full, PARTS).await;
    let second = save(store, 2, CheckpointKind::Full, PARTS).await;
    let path = store.part_path(2, "ps-0");
    let mut damaged = part_bytes(2, "ps-0", 4096).to_vec();
    damaged[100] ^= 0x40;
    store
        .object_store()
        .put(&path, PutPayload::from(Bytes::from(damaged)))
        .await
        .unwrap();
    let err = store.read_part(&second, "ps-0").await.unwrap_err();
    assert!(
        matches!(&err, CheckpointError::Corrupt { id: 2, part, .. } if part == "ps-0"),
        "{err}"
    );
    assert!(store.verify(&second).await.unwrap_err().is_corrupt());
    assert_eq!(store.latest_valid().await.unwrap(), Some(first));
}

/// Parts without a manifest are no checkpoint, and retention cleans them up once a newer
/// checkpoint exists.
pub async fn crash_mid_save_is_ignored(store: &CheckpointStore) {
    save(store, 1, CheckpointKind::Full, PARTS).await;
    store
        .put_part(2, "ps-0", part_bytes(2, "ps-0", 64))
        .await
        .unwrap();
    assert_eq!(ids(store).await, vec![1]);
    assert_eq!(store.latest_valid().await.unwrap().map(|m| m.id), Some(1));
    assert_eq!(store.next_id().await.unwrap(), 3);
    save(store, 3, CheckpointKind::Full, PARTS).await;
    assert_eq!(store.retain(5).await.unwrap(), vec![2]);
    assert_eq!(ids(store).await, vec![1, 3]);
    assert_eq!(store.next_id().await.unwrap(), 4);
}

/// `retain(k)` keeps the newest k and whatever their delta chains need.
pub async fn retention_keeps_delta_bases(store: &CheckpointStore) {
    save(store, 1, CheckpointKind::Full, PARTS).await;
    save(
        store,
        2,
        CheckpointKind::Delta { base: 1 },
        &[("ps-0", 100)],
    )
    .await;
    save(store, 3, CheckpointKind::Full, PARTS).await;
    save(
        store,
        4,
        CheckpointKind::Delta { base: 3 },
        &[("ps-0", 100)],
    )
    .await;
    let five = save(
        store,
        5,
        CheckpointKind::Delta { base: 4 },
        &[("ps-0", 100)],
    )
    .await;
    let chain: Vec<_> = store
        .chain(&five)
        .await
        .unwrap()
        .iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(chain, vec![3, 4, 5]);
    assert_eq!(store.retain(2).await.unwrap(), vec![1, 2]);
    assert_eq!(ids(store).await, vec![3, 4, 5]);
    // Keeping only 5 still needs 3 and 4.
    assert!(store.retain(1).await.unwrap().is_empty());
    save(store, 6, CheckpointKind::Full, PARTS).await;
    assert_eq!(store.retain(1).await.unwrap(), vec![3, 4, 5]);
    assert_eq!(ids(store).await, vec![6]);
    assert_eq!(store.latest_valid().await.unwrap().map(|m| m.id), Some(6));
}
