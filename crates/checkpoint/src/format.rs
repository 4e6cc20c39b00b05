//! What a checkpoint is on storage: checksummed parts plus one manifest.
//!
//! A checkpoint is a directory of opaque *parts* (one per PS shard, the dense model, the
//! data position, ...) and a `MANIFEST.json` that lists every part with its size and xxh3
//! checksum. The manifest is written last, so its presence is what makes a checkpoint
//! complete: a save that crashes half way leaves parts without a manifest, which readers
//! ignore. The checksums let a restore detect a part that rotted or was truncated, and fall
//! back to an older checkpoint instead of loading garbage.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Identifies a checkpoint; ids grow with time, so the newest checkpoint has the largest id.
pub type CheckpointId = u64;

/// File name of the manifest inside a checkpoint directory (reserved: no part may use it).
pub const MANIFEST_FILE: &str = "MANIFEST.json";

/// Checksum of a part's bytes: xxh3 (64 bits), fast enough to check every byte on restore.
pub fn checksum(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// Milliseconds since the Unix epoch, for [`Manifest::created_ms`].
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// One stored part of a checkpoint, as the manifest records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartMeta {
    /// Part name, unique within the checkpoint (a file name: no `/`).
    pub name: String,
    /// Size in bytes.
    pub bytes: u64,
    /// [`checksum`] of the bytes.
    pub checksum: u64,
}

impl PartMeta {
    /// Describes `bytes` stored under `name`.
    pub fn of(name: impl Into<String>, bytes: &[u8]) -> Self {
        Self {
            name: name.into(),
            bytes: bytes.len() as u64,
            checksum: checksum(bytes),
        }
    }
}

/// Whether a checkpoint stands alone or must be applied on top of another one.
///
/// CPR saves the most-updated embedding rows more often than the whole model; such a
/// partial save is a `Delta` and only makes sense on top of its base chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CheckpointKind {
    /// The whole state: restorable alone.
    Full,
    /// Only some embedding rows; restore `base` (itself maybe a delta) first.
    Delta {
        /// The checkpoint this one applies to; always an older id.
        base: CheckpointId,
    },
}

/// The record that makes a checkpoint complete: what it holds and where training was.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// This checkpoint's id (also its directory name).
    pub id: CheckpointId,
    /// When the checkpoint was committed, ms since the Unix epoch.
    pub created_ms: u64,
    /// Fingerprint of the job config the state belongs to; opaque here, compared by callers
    /// so that a checkpoint of another model shape is never loaded.
    pub fingerprint: String,
    /// Full or delta.
    pub kind: CheckpointKind,
    /// Number of parameter servers the embedding state was sharded over.
    pub num_ps: u32,
    /// Training step reached.
    pub step: u64,
    /// Samples consumed (the data position).
    pub samples: u64,
    /// Every stored part.
    pub parts: Vec<PartMeta>,
    /// Free-form extra facts (data position details, metrics, ...).
    #[serde(default)]
    pub info: BTreeMap<String, serde_json::Value>,
}

impl Manifest {
    /// The part called `name`, if this checkpoint has one.
    pub fn part(&self, name: &str) -> Option<&PartMeta> {
        self.parts.iter().find(|p| p.name == name)
    }

    /// The checkpoint this one must be applied on top of (`None` for a full one).
    pub fn base(&self) -> Option<CheckpointId> {
        match self.kind {
            CheckpointKind::Full => None,
            CheckpointKind::Delta { base } => Some(base),
        }
    }

    /// Total size of all parts, in bytes.
    pub fn total_bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.bytes).sum()
    }

    /// Pretty JSON, as stored in [`MANIFEST_FILE`] (readable by people who debug a restore).
    pub fn to_json(&self) -> serde_json::Result<Vec<u8>> {
        serde_json::to_vec_pretty(self)
    }

    /// Parses a stored manifest.
    pub fn from_json(bytes: &[u8]) -> serde_json::Result<Self> {
        serde_json::from_slice(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(kind: CheckpointKind) -> Manifest {
        Manifest {
            id: 7,
            created_ms: 1,
            fingerprint: "fp".into(),
            kind,
            num_ps: 2,
            step: 10,
            samples: 1000,
            parts: vec![PartMeta::of("dense", b"abc")],
            info: BTreeMap::new(),
        }
    }

    #[test]
    fn kind_is_tagged_in_json() {
        let m = manifest(CheckpointKind::Delta { base: 3 });
        let json = String::from_utf8(m.to_json().unwrap()).unwrap();
        assert!(json.contains(r#""type": "delta""#), "{json}");
        assert_eq!(Manifest::from_json(json.as_bytes()).unwrap(), m);
        assert_eq!(m.base(), Some(3));
        assert_eq!(manifest(CheckpointKind::Full).base(), None);
    }

    #[test]
    fn part_lookup_and_sizes() {
        let m = manifest(CheckpointKind::Full);
        assert_eq!(m.part("dense").map(|p| p.bytes), Some(3));
        assert!(m.part("nope").is_none());
        assert_eq!(m.total_bytes(), 3);
        assert_eq!(m.part("dense").unwrap().checksum, checksum(b"abc"));
    }

    #[test]
    fn info_defaults_to_empty() {
        let json = r#"{"id":1,"created_ms":0,"fingerprint":"","kind":{"type":"full"},
            "num_ps":1,"step":0,"samples":0,"parts":[]}"#;
        let m = Manifest::from_json(json.as_bytes()).unwrap();
        assert!(m.info.is_empty());
        assert_eq!(m.kind, CheckpointKind::Full);
    }
}
