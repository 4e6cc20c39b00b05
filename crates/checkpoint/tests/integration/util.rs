//! Helpers shared by the store tests.

use bytes::Bytes;
use elastrec_checkpoint::format::{now_ms, CheckpointId, CheckpointKind, Manifest};
use elastrec_checkpoint::store::CheckpointStore;

/// Deterministic part contents that differ per checkpoint and part.
pub fn part_bytes(id: CheckpointId, name: &str, len: usize) -> Bytes {
    let seed = id.wrapping_mul(31).wrapping_add(name.len() as u64);
    (0..len)
        .map(|i| (seed.wrapping_add(i as u64 * 7) % 251) as u8)
        .collect::<Vec<_>>()
        .into()
}

/// Saves a checkpoint the way the coordinator does: every part, then the manifest.
pub async fn save(
    store: &CheckpointStore,
    id: CheckpointId,
    kind: CheckpointKind,
    parts: &[(&str, usize)],
) -> Manifest {
    let mut metas = Vec::new();
    for &(name, len) in parts {
        let meta = store
            .put_part(id, name, part_bytes(id, name, len))
            .await
            .expect("put part");
        metas.push(meta);
    }
    let manifest = manifest(id, kind, metas);
    store.commit(&manifest).await.expect("commit");
    manifest
}

/// A manifest with the given parts.
pub fn manifest(
    id: CheckpointId,
    kind: CheckpointKind,
    parts: Vec<elastrec_checkpoint::format::PartMeta>,
) -> Manifest {
    Manifest {
        id,
        created_ms: now_ms(),
        fingerprint: "test-fingerprint".into(),
        kind,
        num_ps: 2,
        step: id * 100,
        samples: id * 10_000,
        parts,
        info: [("epoch".to_string(), serde_json::json!(id))].into(),
    }
}

/// Ids of the complete checkpoints.
pub async fn ids(store: &CheckpointStore) -> Vec<CheckpointId> {
    store
        .list()
        .await
        .expect("list")
        .iter()
        .map(|m| m.id)
        .collect()
}

/// The usual two-part save.
pub const PARTS: &[(&str, usize)] = &[("ps-0", 4096), ("dense", 1000)];
