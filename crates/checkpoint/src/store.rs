//! Where checkpoints live: a local directory by default, S3 (or any S3-compatible server)
//! by URL, both through `object_store` so the protocol below is the same everywhere.
//!
//! Layout under the store's prefix:
//!
//! ```text
//! ckpt-000000000007/ps-0            parts, written first (any order, in parallel)
//! ckpt-000000000007/dense
//! ckpt-000000000007/MANIFEST.json   written last: its presence commits the checkpoint
//! ```
//!
//! Ids are zero-padded to 12 digits so that listings sort by age for people looking at the
//! bucket; the code itself always sorts by the parsed id. A directory without a manifest is
//! a save that crashed (or is still running); readers ignore it and [`CheckpointStore::retain`]
//! removes it once a newer checkpoint is committed.
//!
//! The store assumes one writer at a time (the job master's checkpoint coordinator): ids
//! come from [`CheckpointStore::next_id`] and retention may delete an incomplete directory
//! older than the newest complete checkpoint.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path as FsPath, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use url::Url;

use crate::error::{Check, CheckpointError, Result};
use crate::format::{checksum, CheckpointId, Manifest, PartMeta, MANIFEST_FILE};

/// Parts at least this large are checksummed on a blocking thread, so hashing a big
/// embedding shard never stalls the async runtime that also serves training RPCs.
const BLOCKING_HASH_BYTES: usize = 4 << 20;

/// How many objects are read or checked at the same time (manifests, parts, deletions).
const CONCURRENCY: usize = 8;

/// Remote parts at least this large are uploaded as multipart uploads, several chunks at a
/// time: one HTTP stream to S3 tops out far below what a host can send.
const MULTIPART_BYTES: usize = 64 << 20;

/// Chunk size of multipart uploads (S3 requires at least 5 MiB for all but the last).
const MULTIPART_CHUNK: usize = 16 << 20;

/// Chunks of one part in flight at once.
const UPLOAD_CONCURRENCY: usize = 8;

/// Longest accepted part name (a common file-name limit).
const MAX_PART_NAME: usize = 200;

/// Checkpoints in one object store under one prefix.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    location: String,
    /// The directory of a local store, to remove the leftovers `object_store` cannot see
    /// (empty directories, staging files of a crashed write).
    local_root: Option<PathBuf>,
    /// Remote parts of at least this many bytes go up as multipart uploads.
    multipart_bytes: usize,
    /// Chunk size of those uploads.
    multipart_chunk: usize,
}

impl CheckpointStore {
    /// Opens the store at `location`:
    ///
    /// * a plain path or `file:///path`: a local directory, created if needed;
    /// * `s3://bucket/prefix`: S3 or an S3-compatible server, configured from the usual
    ///   `AWS_*` environment variables (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ALLOW_HTTP`,
    ///   ...). Query parameters override them with any non-secret `object_store` S3 key,
    ///   e.g. `?endpoint=http://127.0.0.1:9000&region=us-east-1`; an `http://` endpoint
    ///   allows plain HTTP (S3-compatible servers on a private network).
    ///
    /// S3 credentials come only from the environment: `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN`, or what `object_store` finds by
    /// itself (a web identity token file, ECS container credentials, EC2 instance metadata;
    /// it reads no `~/.aws/credentials` file). A location carrying a credential — a query
    /// parameter named like a key id, secret, token or password, or `user:password@` — is
    /// refused with [`CheckpointError::Config`]: locations are logged, stored in the job
    /// database and sent to every process, so a secret in one would leak to all of them.
    pub fn open(location: &str) -> Result<Self> {
        let trimmed = location.trim();
        if trimmed.is_empty() {
            return Err(config_error(location, "empty location"));
        }
        if trimmed.starts_with("s3://") {
            return Self::open_s3(trimmed);
        }
        if let Some(path) = trimmed.strip_prefix("file://") {
            if path.is_empty() {
                return Err(config_error(location, "file:// URL without a path"));
            }
            return Self::open_local(FsPath::new(path));
        }
        if let Some((scheme, _)) = trimmed.split_once("://") {
            return Err(config_error(
                location,
                &format!("unsupported scheme `{scheme}` (use a path, file:// or s3://)"),
            ));
        }
        Self::open_local(FsPath::new(trimmed))
    }

    /// Opens (and creates) a local directory. Writes are fsynced: a committed checkpoint
    /// must survive a power loss, as it would on S3.
    pub fn open_local(dir: &FsPath) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| CheckpointError::io(dir, e))?;
        let root = std::fs::canonicalize(dir).map_err(|e| CheckpointError::io(dir, e))?;
        let fs = LocalFileSystem::new_with_prefix(&root)
            .map_err(|e| CheckpointError::storage(root.display().to_string(), e))?
            .with_fsync(true)
            .with_automatic_cleanup(true);
        Ok(Self {
            store: Arc::new(fs),
            prefix: Path::default(),
            location: root.display().to_string(),
            local_root: Some(root),
            multipart_bytes: MULTIPART_BYTES,
            multipart_chunk: MULTIPART_CHUNK,
        })
    }

    fn open_s3(location: &str) -> Result<Self> {
        // A refused location may hold a secret: its message quotes it redacted. Past this
        // point the location holds none.
        let url = S3Url::parse(location)
            .map_err(|reason| config_error(&redact_location(location), &reason))?;
        let mut builder = AmazonS3Builder::from_env().with_bucket_name(&url.bucket);
        for (key, value) in &url.options {
            let parsed = AmazonS3ConfigKey::from_str(key)
                .map_err(|_| config_error(location, &format!("unknown S3 option `{key}`")))?;
            if parsed == AmazonS3ConfigKey::Endpoint && value.starts_with("http://") {
                builder = builder.with_allow_http(true);
            }
            builder = builder.with_config(parsed, value);
        }
        let s3 = builder
            .build()
            .map_err(|e| config_error(location, &e.to_string()))?;
        let location = url.display();
        Ok(Self::with_prefix(Arc::new(s3), url.prefix, location))
    }

    /// Wraps an already built store (tests, in-memory stores, custom clients). `location`
    /// is only used in messages.
    pub fn from_object_store(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        location: impl Into<String>,
    ) -> Self {
        Self::with_prefix(store, Path::from(prefix), location.into())
    }

    fn with_prefix(store: Arc<dyn ObjectStore>, prefix: Path, location: String) -> Self {
        Self {
            store,
            prefix,
            location,
            local_root: None,
            multipart_bytes: MULTIPART_BYTES,
            multipart_chunk: MULTIPART_CHUNK,
        }
    }

    /// Uploads remote parts of at least `threshold` bytes in `chunk`-byte pieces, several
    /// at once (defaults: 64 MiB, 16 MiB). S3 needs `chunk` >= 5 MiB. Local directories
    /// always write a part in one go.
    pub fn with_multipart(mut self, threshold: usize, chunk: usize) -> Self {
        self.multipart_bytes = threshold;
        self.multipart_chunk = chunk.max(1);
        self
    }

    /// Where this store is, for messages (`s3://bucket/prefix` or a directory; never
    /// credentials).
    pub fn location(&self) -> String {
        self.location.clone()
    }

    /// The underlying object store.
    pub fn object_store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The prefix every path of this store lies under (empty for a local directory).
    pub fn prefix(&self) -> &Path {
        &self.prefix
    }

    /// Object path of part `name` of checkpoint `id`.
    pub fn part_path(&self, id: CheckpointId, name: &str) -> Path {
        self.dir_path(id).join(name)
    }

    /// Object path of the manifest of checkpoint `id`.
    pub fn manifest_path(&self, id: CheckpointId) -> Path {
        self.dir_path(id).join(MANIFEST_FILE)
    }

    fn dir_path(&self, id: CheckpointId) -> Path {
        self.prefix.clone().join(dir_name(id))
    }

    /// Human-readable location of an object path, for errors.
    fn describe(&self, path: &Path) -> String {
        let relative: Vec<_> = match path.prefix_match(&self.prefix) {
            Some(parts) => parts.map(|p| p.as_ref().to_string()).collect(),
            None => vec![path.to_string()],
        };
        format!(
            "{}/{}",
            self.location.trim_end_matches('/'),
            relative.join("/")
        )
    }

    /// Stores one part of checkpoint `id` and returns what the manifest must record.
    /// Overwrites a part of the same name (a retried save), which is safe because the
    /// checkpoint is not committed yet.
    pub async fn put_part(&self, id: CheckpointId, name: &str, bytes: Bytes) -> Result<PartMeta> {
        validate_part_name(name)?;
        let sum = checksum_bytes(&bytes).await;
        let meta = PartMeta {
            name: name.to_string(),
            bytes: bytes.len() as u64,
            checksum: sum,
        };
        let path = self.part_path(id, name);
        self.put_object(&path, bytes)
            .await
            .map_err(|e| CheckpointError::storage(self.describe(&path), e))?;
        Ok(meta)
    }

    /// One PUT for small objects and local files; a concurrent multipart upload for large
    /// remote ones (aborted on failure so no orphaned parts are billed).
    async fn put_object(&self, path: &Path, bytes: Bytes) -> object_store::Result<()> {
        if self.local_root.is_some() || bytes.len() < self.multipart_bytes {
            self.store.put(path, PutPayload::from_bytes(bytes)).await?;
            return Ok(());
        }
        let upload = self.store.put_multipart(path).await?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, self.multipart_chunk);
        let mut rest = bytes;
        while !rest.is_empty() {
            if let Err(e) = writer.wait_for_capacity(UPLOAD_CONCURRENCY).await {
                // The upload error is the one worth reporting; abort is best effort.
                let _ = writer.abort().await;
                return Err(e);
            }
            let chunk = rest.split_to(rest.len().min(self.multipart_chunk));
            writer.put(chunk);
        }
        writer.finish().await?;
        Ok(())
    }

    /// Commits a checkpoint by writing its manifest, after checking that every listed part
    /// is stored with the recorded size and (for a delta) that its base is committed. The
    /// manifest is the last write of a save: until it lands, the checkpoint does not exist.
    pub async fn commit(&self, manifest: &Manifest) -> Result<()> {
        validate_manifest(manifest)?;
        let path = self.manifest_path(manifest.id);
        match self.store.head(&path).await {
            Ok(_) => {
                return Err(CheckpointError::AlreadyCommitted {
                    id: manifest.id,
                    location: self.describe(&path),
                })
            }
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(CheckpointError::storage(self.describe(&path), e)),
        }
        if let Some(base) = manifest.base() {
            self.manifest(base).await.map_err(|e| match e {
                CheckpointError::NotFound { .. } => CheckpointError::BrokenChain {
                    id: manifest.id,
                    reason: format!("its base checkpoint {base} is not committed"),
                },
                other => other,
            })?;
        }
        self.check_parts_stored(manifest).await?;
        let json = manifest.to_json().map_err(|source| CheckpointError::Json {
            location: self.describe(&path),
            source,
        })?;
        self.store
            .put(&path, PutPayload::from(json))
            .await
            .map_err(|e| CheckpointError::storage(self.describe(&path), e))?;
        Ok(())
    }

    /// Checks (by metadata only) that every part of `manifest` is stored with its size.
    async fn check_parts_stored(&self, manifest: &Manifest) -> Result<()> {
        futures::stream::iter(&manifest.parts)
            .map(|part| self.check_part_stored(manifest.id, part))
            .buffer_unordered(CONCURRENCY)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }

    async fn check_part_stored(&self, id: CheckpointId, part: &PartMeta) -> Result<()> {
        let path = self.part_path(id, &part.name);
        let meta = self
            .store
            .head(&path)
            .await
            .map_err(|e| self.part_error(id, &part.name, &path, e))?;
        if meta.size != part.bytes {
            return Err(self.corrupt(id, &part.name, &path, Check::Size, part.bytes, meta.size));
        }
        Ok(())
    }

    /// Reads the manifest of checkpoint `id` ([`CheckpointError::NotFound`] when the
    /// checkpoint was never committed).
    pub async fn manifest(&self, id: CheckpointId) -> Result<Manifest> {
        let path = self.manifest_path(id);
        let bytes = match self.store.get(&path).await {
            Ok(got) => got
                .bytes()
                .await
                .map_err(|e| CheckpointError::storage(self.describe(&path), e))?,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(CheckpointError::NotFound {
                    id,
                    location: self.describe(&path),
                })
            }
            Err(e) => return Err(CheckpointError::storage(self.describe(&path), e)),
        };
        let manifest = Manifest::from_json(&bytes).map_err(|source| CheckpointError::Json {
            location: self.describe(&path),
            source,
        })?;
        if manifest.id != id {
            return Err(CheckpointError::BrokenChain {
                id,
                reason: format!(
                    "manifest at {} records id {} instead",
                    self.describe(&path),
                    manifest.id
                ),
            });
        }
        Ok(manifest)
    }

    /// Ids of every checkpoint directory, complete or not, ascending.
    async fn list_dirs(&self) -> Result<Vec<CheckpointId>> {
        let prefix = (!self.prefix.as_ref().is_empty()).then_some(&self.prefix);
        let listing = self
            .store
            .list_with_delimiter(prefix)
            .await
            .map_err(|e| CheckpointError::storage(self.location.clone(), e))?;
        let mut ids: Vec<_> = listing
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().and_then(parse_dir_name))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        Ok(ids)
    }

    /// Complete checkpoints (those with a readable manifest), oldest first. Directories
    /// without a manifest are saves that never finished and are not checkpoints; an
    /// unreadable manifest is skipped with a warning.
    pub async fn list(&self) -> Result<Vec<Manifest>> {
        let ids = self.list_dirs().await?;
        let found: Vec<Option<Manifest>> = futures::stream::iter(ids)
            .map(|id| self.try_manifest(id))
            .buffered(CONCURRENCY)
            .try_collect()
            .await?;
        Ok(found.into_iter().flatten().collect())
    }

    /// The manifest of `id`, `None` when it is absent or unusable (logged); storage
    /// failures are errors, since they say nothing about the checkpoint itself.
    async fn try_manifest(&self, id: CheckpointId) -> Result<Option<Manifest>> {
        match self.manifest(id).await {
            Ok(m) => Ok(Some(m)),
            Err(CheckpointError::NotFound { .. }) => {
                tracing::debug!(id, store = %self.location, "checkpoint directory without manifest (incomplete save)");
                Ok(None)
            }
            Err(e @ (CheckpointError::Json { .. } | CheckpointError::BrokenChain { .. })) => {
                tracing::warn!(id, error = %e, "skipping checkpoint with an unreadable manifest");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Reads part `name` of `manifest`, verifying its size and checksum
    /// ([`CheckpointError::Corrupt`] on mismatch, [`CheckpointError::Incomplete`] when it
    /// is gone).
    pub async fn read_part(&self, manifest: &Manifest, name: &str) -> Result<Bytes> {
        let part = manifest
            .part(name)
            .ok_or_else(|| CheckpointError::UnknownPart {
                id: manifest.id,
                part: name.to_string(),
            })?;
        let path = self.part_path(manifest.id, name);
        let bytes = self
            .store
            .get(&path)
            .await
            .map_err(|e| self.part_error(manifest.id, name, &path, e))?
            .bytes()
            .await
            .map_err(|e| self.part_error(manifest.id, name, &path, e))?;
        let size = bytes.len() as u64;
        if size != part.bytes {
            return Err(self.corrupt(manifest.id, name, &path, Check::Size, part.bytes, size));
        }
        let found = checksum_bytes(&bytes).await;
        if found != part.checksum {
            return Err(self.corrupt(
                manifest.id,
                name,
                &path,
                Check::Checksum,
                part.checksum,
                found,
            ));
        }
        Ok(bytes)
    }

    /// Reads every part of `manifest` and checks it, streaming (a part is never held in
    /// memory whole), a few parts at a time.
    pub async fn verify(&self, manifest: &Manifest) -> Result<()> {
        futures::stream::iter(&manifest.parts)
            .map(|part| self.verify_part(manifest.id, part))
            .buffer_unordered(CONCURRENCY)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }

    async fn verify_part(&self, id: CheckpointId, part: &PartMeta) -> Result<()> {
        let path = self.part_path(id, &part.name);
        let mut stream = self
            .store
            .get(&path)
            .await
            .map_err(|e| self.part_error(id, &part.name, &path, e))?
            .into_stream();
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        let mut size = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| self.part_error(id, &part.name, &path, e))?;
            size += chunk.len() as u64;
            hasher.update(&chunk);
        }
        if size != part.bytes {
            return Err(self.corrupt(id, &part.name, &path, Check::Size, part.bytes, size));
        }
        let found = hasher.digest();
        if found != part.checksum {
            return Err(self.corrupt(id, &part.name, &path, Check::Checksum, part.checksum, found));
        }
        Ok(())
    }

    /// Base-first list of the manifests needed to restore `manifest`: itself for a full
    /// checkpoint; for a delta, its bases down to a full checkpoint, then itself.
    pub async fn chain(&self, manifest: &Manifest) -> Result<Vec<Manifest>> {
        let mut chain = vec![manifest.clone()];
        let mut current = manifest.clone();
        while let Some(base) = current.base() {
            check_base_order(&current, base)?;
            current = self.manifest(base).await.map_err(|e| match e {
                CheckpointError::NotFound { .. } => missing_base(manifest.id, base),
                other => other,
            })?;
            chain.push(current.clone());
        }
        chain.reverse();
        Ok(chain)
    }

    /// The newest checkpoint that can be restored: every part of it and of its base chain
    /// verifies. A damaged checkpoint is skipped with a warning naming the damage, and the
    /// next older one is tried. `None` when no checkpoint is usable.
    pub async fn latest_valid(&self) -> Result<Option<Manifest>> {
        let manifests = self.list().await?;
        let by_id: BTreeMap<_, _> = manifests.iter().map(|m| (m.id, m)).collect();
        let mut verified: HashMap<CheckpointId, bool> = HashMap::new();
        for candidate in manifests.iter().rev() {
            match self.verify_chain(&by_id, candidate, &mut verified).await {
                Ok(()) => return Ok(Some(candidate.clone())),
                Err(e) if is_damage(&e) => {
                    tracing::warn!(id = candidate.id, error = %e, "checkpoint unusable, falling back to an older one");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// Verifies `manifest` and its bases, remembering results so a base shared by several
    /// deltas is read once.
    async fn verify_chain(
        &self,
        by_id: &BTreeMap<CheckpointId, &Manifest>,
        manifest: &Manifest,
        verified: &mut HashMap<CheckpointId, bool>,
    ) -> Result<()> {
        for link in chain_from(by_id, manifest)? {
            match verified.get(&link.id) {
                Some(true) => continue,
                Some(false) => {
                    return Err(CheckpointError::BrokenChain {
                        id: manifest.id,
                        reason: format!("its base checkpoint {} is damaged", link.id),
                    })
                }
                None => {}
            }
            let result = self.verify(link).await;
            if let Err(e) = &result {
                if is_damage(e) {
                    verified.insert(link.id, false);
                }
            } else {
                verified.insert(link.id, true);
            }
            result?;
        }
        Ok(())
    }

    /// Keeps the newest `keep` complete checkpoints and every checkpoint their chains need;
    /// deletes the other complete ones and the incomplete directories older than the newest
    /// complete checkpoint (leftovers of crashed saves; newer ones may be saves in
    /// progress). Returns the deleted ids, ascending.
    pub async fn retain(&self, keep: usize) -> Result<Vec<CheckpointId>> {
        if keep == 0 {
            return Err(CheckpointError::Invalid(
                "retain(0) would delete every checkpoint; keep at least 1".into(),
            ));
        }
        let dirs = self.list_dirs().await?;
        let manifests = self.list().await?;
        let doomed = retention_victims(&dirs, &manifests, keep);
        for &id in &doomed {
            self.delete_checkpoint(id).await?;
        }
        Ok(doomed)
    }

    /// Deletes one checkpoint directory, manifest first so that a deletion interrupted
    /// half way leaves an incomplete directory, never a committed checkpoint missing parts.
    async fn delete_checkpoint(&self, id: CheckpointId) -> Result<()> {
        let manifest = self.manifest_path(id);
        match self.store.delete(&manifest).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(CheckpointError::storage(self.describe(&manifest), e)),
        }
        let dir = self.dir_path(id);
        let objects = self
            .store
            .list(Some(&dir))
            .map_ok(|meta| meta.location)
            .boxed();
        self.store
            .delete_stream(objects)
            .try_for_each(|_| futures::future::ready(Ok(())))
            .await
            .or_else(|e| match e {
                object_store::Error::NotFound { .. } => Ok(()),
                other => Err(other),
            })
            .map_err(|e| CheckpointError::storage(self.describe(&dir), e))?;
        if let Some(root) = &self.local_root {
            let path = root.join(dir_name(id));
            match std::fs::remove_dir_all(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(CheckpointError::io(path, e)),
            }
        }
        tracing::debug!(id, store = %self.location, "deleted checkpoint");
        Ok(())
    }

    /// The id for the next save: one more than any checkpoint directory, complete or not,
    /// so a crashed save's leftovers are never mixed into a new checkpoint.
    pub async fn next_id(&self) -> Result<CheckpointId> {
        let dirs = self.list_dirs().await?;
        Ok(dirs.last().map_or(1, |max| max + 1))
    }
}

/// Which checkpoint directories [`CheckpointStore::retain`] deletes (pure, for testing).
fn retention_victims(
    dirs: &[CheckpointId],
    complete: &[Manifest],
    keep: usize,
) -> Vec<CheckpointId> {
    let by_id: BTreeMap<_, _> = complete.iter().map(|m| (m.id, m)).collect();
    let mut protected = BTreeSet::new();
    for m in by_id.values().rev().take(keep) {
        protected.insert(m.id);
        let mut current = *m;
        // A broken chain protects what it can reach; nothing beyond it exists anyway.
        while let Some(base) = current.base() {
            match by_id.get(&base) {
                Some(next) if base < current.id => {
                    protected.insert(base);
                    current = next;
                }
                _ => break,
            }
        }
    }
    let newest_complete = by_id.keys().next_back().copied();
    dirs.iter()
        .copied()
        .filter(|id| !protected.contains(id))
        .filter(|id| by_id.contains_key(id) || newest_complete.is_some_and(|newest| *id < newest))
        .collect()
}

/// Base-first chain of `manifest` among the listed manifests.
fn chain_from<'a>(
    by_id: &BTreeMap<CheckpointId, &'a Manifest>,
    manifest: &'a Manifest,
) -> Result<Vec<&'a Manifest>> {
    let mut chain = vec![manifest];
    let mut current = manifest;
    while let Some(base) = current.base() {
        check_base_order(current, base)?;
        current = by_id
            .get(&base)
            .copied()
            .ok_or_else(|| missing_base(manifest.id, base))?;
        chain.push(current);
    }
    chain.reverse();
    Ok(chain)
}

/// A base must be older than its delta; this also rules out cycles.
fn check_base_order(manifest: &Manifest, base: CheckpointId) -> Result<()> {
    if base >= manifest.id {
        return Err(CheckpointError::BrokenChain {
            id: manifest.id,
            reason: format!("delta {} has base {base}, which is not older", manifest.id),
        });
    }
    Ok(())
}

fn missing_base(id: CheckpointId, base: CheckpointId) -> CheckpointError {
    CheckpointError::BrokenChain {
        id,
        reason: format!("base checkpoint {base} is missing"),
    }
}

/// Errors that mean "this checkpoint cannot be used" rather than "storage is failing".
fn is_damage(e: &CheckpointError) -> bool {
    matches!(
        e,
        CheckpointError::Corrupt { .. }
            | CheckpointError::Incomplete { .. }
            | CheckpointError::BrokenChain { .. }
            | CheckpointError::NotFound { .. }
            | CheckpointError::Json { .. }
    )
}

impl CheckpointStore {
    /// Maps a store error on a part: a missing object makes the checkpoint incomplete.
    fn part_error(
        &self,
        id: CheckpointId,
        name: &str,
        path: &Path,
        e: object_store::Error,
    ) -> CheckpointError {
        match e {
            object_store::Error::NotFound { .. } => CheckpointError::Incomplete {
                id,
                part: name.to_string(),
                location: self.describe(path),
            },
            other => CheckpointError::storage(self.describe(path), other),
        }
    }

    fn corrupt(
        &self,
        id: CheckpointId,
        name: &str,
        path: &Path,
        check: Check,
        expected: u64,
        found: u64,
    ) -> CheckpointError {
        CheckpointError::Corrupt {
            id,
            part: name.to_string(),
            location: self.describe(path),
            check,
            expected,
            found,
        }
    }
}

/// Directory name of checkpoint `id`.
fn dir_name(id: CheckpointId) -> String {
    format!("ckpt-{id:012}")
}

/// The id of a checkpoint directory name, `None` for anything else in the prefix.
fn parse_dir_name(name: &str) -> Option<CheckpointId> {
    let digits = name.strip_prefix("ckpt-")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Part names are single path segments of a portable character set, so the same name maps
/// to the same object on every store (no escaping) and cannot escape the checkpoint.
pub fn validate_part_name(name: &str) -> Result<()> {
    let bad = |why: &str| {
        Err(CheckpointError::Invalid(format!(
            "part name `{name}` {why}"
        )))
    };
    if name.is_empty() || name.len() > MAX_PART_NAME {
        return bad(&format!("must have 1 to {MAX_PART_NAME} characters"));
    }
    if name == MANIFEST_FILE {
        return bad("is reserved for the manifest");
    }
    if name.contains("..") {
        return bad("must not contain `..`");
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return bad(&format!("contains `{c}` (allowed: A-Z a-z 0-9 _ - .)"));
    }
    if name.starts_with('.') {
        return bad("must not start with `.`");
    }
    Ok(())
}

/// Refuses manifests that could never be restored: bad or duplicate part names, a delta
/// whose base is not older.
fn validate_manifest(manifest: &Manifest) -> Result<()> {
    let mut seen = BTreeSet::new();
    for part in &manifest.parts {
        validate_part_name(&part.name)?;
        if !seen.insert(part.name.as_str()) {
            return Err(CheckpointError::Invalid(format!(
                "checkpoint {} lists part `{}` twice",
                manifest.id, part.name
            )));
        }
    }
    if let Some(base) = manifest.base() {
        check_base_order(manifest, base)?;
    }
    Ok(())
}

/// Checksums on a blocking thread when the data is large.
async fn checksum_bytes(bytes: &Bytes) -> u64 {
    if bytes.len() < BLOCKING_HASH_BYTES {
        return checksum(bytes);
    }
    let owned = bytes.clone();
    match tokio::task::spawn_blocking(move || checksum(&owned)).await {
        Ok(sum) => sum,
        // The blocking pool is gone (runtime shutting down): hash here rather than fail.
        Err(_) => checksum(bytes),
    }
}

fn config_error(location: &str, reason: &str) -> CheckpointError {
    CheckpointError::Config {
        location: location.to_string(),
        reason: reason.to_string(),
    }
}

/// `location` with its credentials replaced by `***` (the values of secret query
/// parameters, a `user:password@` part), for logging a location that did not come through
/// [`CheckpointStore::open`], which refuses such locations. Returned unchanged when it holds
/// nothing secret or is not a URL (a plain path); a URL that does not parse keeps only its
/// scheme, since where its secrets are cannot be known.
pub fn redact_location(location: &str) -> String {
    let mut url = match Url::parse(location) {
        Ok(url) => url,
        Err(_) => {
            return match location.split_once("://") {
                Some((scheme, _)) => format!("{scheme}://<unparsable location hidden>"),
                None => location.to_string(),
            }
        }
    };
    let mut changed = false;
    if !url.username().is_empty() || url.password().is_some() {
        // Only fails for URLs without a host, which have no user part to hide.
        let _ = url.set_username("***");
        let _ = url.set_password(None);
        changed = true;
    }
    if url.query_pairs().any(|(key, _)| is_secret_key(&key)) {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(key, value)| {
                let value = if is_secret_key(&key) {
                    "***".to_string()
                } else {
                    value.into_owned()
                };
                (key.into_owned(), value)
            })
            .collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
        changed = true;
    }
    if changed {
        url.to_string()
    } else {
        location.to_string()
    }
}

/// Query parameters that hold credentials (keys, secrets, tokens, passwords, SSE-C keys).
/// Matched by substring so that every alias and any future key of the kind is caught.
fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    ["secret", "token", "password", "key_id", "customer_key"]
        .iter()
        .any(|s| key.contains(s))
}

/// Why a location with the secret query parameter `key` is refused, and what to do.
fn secret_parameter(key: &str) -> String {
    // The variable object_store reads for this key, when it knows the key.
    let variable = AmazonS3ConfigKey::from_str(key).ok().map(|k| {
        let name = k.as_ref().to_ascii_uppercase();
        if name.starts_with("AWS_") {
            name
        } else {
            format!("AWS_{name}")
        }
    });
    let set = match variable {
        Some(v) => format!("set {v} in the environment instead"),
        None => "set the credentials in the environment instead".to_string(),
    };
    format!(
        "query parameter `{key}` is a credential, and a checkpoint location must carry none \
         (it is logged, stored and sent to other processes): remove it and {set} (S3 \
         credentials come from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN)"
    )
}

/// An `s3://bucket/prefix?key=value&...` location, split.
#[derive(Debug, PartialEq)]
struct S3Url {
    bucket: String,
    prefix: Path,
    options: Vec<(String, String)>,
}

impl S3Url {
    /// Parses an `s3://` location.
    fn parse(location: &str) -> std::result::Result<Self, String> {
        let url = Url::parse(location).map_err(|e| format!("not a valid URL: {e}"))?;
        if url.scheme() != "s3" {
            return Err(format!("scheme `{}` is not s3", url.scheme()));
        }
        // Credentials first: whatever else is wrong, a location holding one must be fixed
        // by moving it to the environment.
        if !url.username().is_empty() || url.password().is_some() {
            return Err(
                "credentials before the bucket (`user:password@`) are refused: remove \
                 them and set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment \
                 instead"
                    .into(),
            );
        }
        if let Some((key, _)) = url.query_pairs().find(|(key, _)| is_secret_key(key)) {
            return Err(secret_parameter(&key));
        }
        let bucket = url.host_str().unwrap_or_default();
        if bucket.is_empty() {
            return Err("missing bucket name (s3://BUCKET/prefix)".into());
        }
        if url.port().is_some() {
            return Err(
                "a port after the bucket is not allowed; name the server with \
                 `?endpoint=http://host:port`"
                    .into(),
            );
        }
        if url.fragment().is_some() {
            return Err("`#` is not allowed (write it as %23 in a prefix)".into());
        }
        let prefix = Path::from_url_path(url.path()).map_err(|e| format!("bad prefix: {e}"))?;
        let mut options = Vec::new();
        for (key, value) in url.query_pairs() {
            if value.is_empty() {
                return Err(format!("query parameter `{key}` has no value"));
            }
            options.push((key.into_owned(), value.into_owned()));
        }
        Ok(Self {
            bucket: bucket.to_string(),
            prefix,
            options,
        })
    }

    /// `s3://bucket/prefix` without the query.
    fn display(&self) -> String {
        if self.prefix.as_ref().is_empty() {
            format!("s3://{}", self.bucket)
        } else {
            format!("s3://{}/{}", self.bucket, self.prefix)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::CheckpointKind;

    fn manifest(id: CheckpointId, kind: CheckpointKind) -> Manifest {
        Manifest {
            id,
            created_ms: 0,
            fingerprint: String::new(),
            kind,
            num_ps: 1,
            step: id,
            samples: id,
            parts: vec![],
            info: Default::default(),
        }
    }

    #[test]
    fn dir_names_round_trip() {
        assert_eq!(dir_name(7), "ckpt-000000000007");
        assert_eq!(parse_dir_name("ckpt-000000000007"), Some(7));
        assert_eq!(parse_dir_name(&dir_name(u64::MAX)), Some(u64::MAX));
        for bad in ["ckpt-", "ckpt-12a", "other", "ckpt--1"] {
            assert_eq!(parse_dir_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn part_names_are_checked() {
        for ok in ["ps-0", "dense.bin", "emb_table.3"] {
            assert!(validate_part_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "a/b",
            "..",
            "a..b",
            MANIFEST_FILE,
            ".hidden",
            "sp ace",
            "x#1",
        ] {
            assert!(validate_part_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn s3_urls_parse() {
        let url =
            S3Url::parse("s3://bucket/a/b%20c/?endpoint=http://127.0.0.1:9000&region=us%2Deast-1")
                .unwrap();
        assert_eq!(url.bucket, "bucket");
        assert_eq!(url.prefix.as_ref(), "a/b c");
        assert_eq!(
            url.options,
            vec![
                ("endpoint".into(), "http://127.0.0.1:9000".into()),
                ("region".into(), "us-east-1".into())
            ]
        );
        assert_eq!(url.display(), "s3://bucket/a/b c");
        assert_eq!(S3Url::parse("s3://b").unwrap().display(), "s3://b");
        for (bad, why) in [
            ("s3:///x", "missing bucket"),
            ("s3://b?novalue", "no value"),
            ("s3://b:9000/p", "endpoint="),
            ("s3://b/p#x", "`#`"),
            ("s3://b/a//c", "bad prefix"),
        ] {
            let err = S3Url::parse(bad).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn credentials_in_s3_urls_are_refused() {
        for (location, key, variable) in [
            (
                "s3://b/p?access_key_id=AKIA",
                "access_key_id",
                "AWS_ACCESS_KEY_ID",
            ),
            (
                "s3://b/p?region=r&aws_secret_access_key=S",
                "aws_secret_access_key",
                "AWS_SECRET_ACCESS_KEY",
            ),
            ("s3://b/p?token=T", "token", "AWS_SESSION_TOKEN"),
            (
                "s3://b/p?secret%5Faccess%5Fkey=S",
                "secret_access_key",
                "AWS_SECRET_ACCESS_KEY",
            ),
            (
                "s3://b/p?sse_customer_key_base64=K",
                "sse_customer_key_base64",
                "AWS_SSE_CUSTOMER_KEY_BASE64",
            ),
            ("s3://b/p?PASSWORD=P", "PASSWORD", "AWS_SECRET_ACCESS_KEY"),
        ] {
            let err = S3Url::parse(location).unwrap_err();
            assert!(err.contains(&format!("`{key}`")), "{err}");
            assert!(err.contains(variable), "{err}");
        }
        let err = S3Url::parse("s3://AKIA:S@b/p").unwrap_err();
        assert!(err.contains("user:password@"), "{err}");
        assert!(!err.contains("AKIA"), "{err}");
    }

    #[test]
    fn secrets_are_redacted() {
        let redacted =
            redact_location("s3://b/p?region=r&secret_access_key=S1&aws_session_token=T1&x");
        assert_eq!(
            redacted,
            "s3://b/p?region=r&secret_access_key=***&aws_session_token=***&x="
        );
        let redacted = redact_location("s3://AKIA:S2@b/p");
        assert!(
            !redacted.contains("AKIA") && !redacted.contains("S2"),
            "{redacted}"
        );
        assert!(redacted.ends_with("@b/p"), "{redacted}");
        // Nothing secret: unchanged, spelling included.
        for plain in [
            "s3://b/p",
            "s3://b/p?endpoint=http://h:1&region=r",
            "/data/ckpt?x",
            "file:///data/ckpt",
        ] {
            assert_eq!(redact_location(plain), plain);
        }
        assert_eq!(
            redact_location("s3://b:port/p?secret_access_key=S3"),
            "s3://<unparsable location hidden>"
        );
    }

    #[test]
    fn retention_keeps_bases_of_retained_deltas() {
        let complete = vec![
            manifest(1, CheckpointKind::Full),
            manifest(3, CheckpointKind::Full),
            manifest(4, CheckpointKind::Delta { base: 3 }),
            manifest(5, CheckpointKind::Delta { base: 4 }),
        ];
        // 2 and 6 are incomplete: 2 is a crashed save, 6 may be in progress.
        let dirs = [1, 2, 3, 4, 5, 6];
        assert_eq!(retention_victims(&dirs, &complete, 1), vec![1, 2]);
        assert_eq!(retention_victims(&dirs, &complete, 4), vec![2]);
    }

    #[test]
    fn chains_are_base_first_and_reject_bad_bases() {
        let ms = [
            manifest(1, CheckpointKind::Full),
            manifest(2, CheckpointKind::Delta { base: 1 }),
            manifest(3, CheckpointKind::Delta { base: 2 }),
            manifest(4, CheckpointKind::Delta { base: 4 }),
            manifest(6, CheckpointKind::Delta { base: 5 }),
        ];
        let by_id: BTreeMap<_, _> = ms.iter().map(|m| (m.id, m)).collect();
        let ids: Vec<_> = chain_from(&by_id, &ms[2])
            .unwrap()
            .iter()
            .map(|m| m.id)
            .collect();
        assert_eq!(ids, vec![1, 2, 3]);
        assert!(matches!(
            chain_from(&by_id, &ms[3]),
            Err(CheckpointError::BrokenChain { id: 4, .. })
        ));
        assert!(matches!(
            chain_from(&by_id, &ms[4]),
            Err(CheckpointError::BrokenChain { id: 6, .. })
        ));
    }

    #[test]
    fn streaming_hash_matches_one_shot() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for chunk in data.chunks(4097) {
            h.update(chunk);
        }
        assert_eq!(h.digest(), checksum(&data));
    }
}
