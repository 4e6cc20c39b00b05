//! Flash checkpoints and restores of one parameter server.
//!
//! A checkpoint copies the state under the lock (the training stall: plain memory copies),
//! releases it, then encodes the copy once and writes those bytes to a shared-memory image
//! (so a PS relaunched on this host reloads without storage) and to checkpoint storage.
//! Delta checkpoints (CPR-MFU / CPR-SSU) copy only the hottest `ratio` of each large
//! table's rows, plus the small tables and the dense slice whole.
//!
//! Memory: besides the live state, a checkpoint holds the copy, which the encoding consumes
//! table by table, so at any moment about one extra shard's worth of bytes (the copy's rest
//! plus the encoding so far), then the encoded bytes and the shared-memory file. The copy
//! and the encoding are CPU-bound for seconds on a large shard, so they run on the blocking
//! pool: on a runtime thread they would keep pulls, pushes and heartbeats waiting.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use elastrec_checkpoint::format::{checksum, Manifest};
use elastrec_checkpoint::priority::select_mfu;
use elastrec_checkpoint::shm::ShmImage;
use elastrec_checkpoint::store::CheckpointStore;
use elastrec_embedding::EmbeddingError;
use elastrec_proto::master::RestorePlan;
use elastrec_proto::ps::{CheckpointRequest, CheckpointResponse};
use parking_lot::Mutex;

use crate::error::PsError;
use crate::image::{apply_parts, decode, part_name, PartHeader, ShardImage, TableCopy};
use crate::shard::{PsShard, State};

/// Open checkpoint stores by location (opening an S3 client is not free).
#[derive(Default)]
pub struct Stores(Mutex<HashMap<String, Arc<CheckpointStore>>>);

impl Stores {
    /// The store at `location`, opened once.
    pub fn get(&self, location: &str) -> elastrec_checkpoint::Result<Arc<CheckpointStore>> {
        let mut m = self.0.lock();
        if let Some(s) = m.get(location) {
            return Ok(s.clone());
        }
        let s = Arc::new(CheckpointStore::open(location)?);
        m.insert(location.to_string(), s.clone());
        Ok(s)
    }
}

/// Name of the shared-memory image of PS `index` of `num_ps` for checkpoint `id`.
fn shm_name(index: u32, num_ps: u32, id: u64) -> String {
    format!("ps-{index}-of-{num_ps}-ckpt-{id}")
}

impl PsShard {
    /// The part header for the state `st` (the lock is held, so the version matches it).
    fn header(&self, st: &State, delta: bool) -> PartHeader {
        PartHeader {
            index: st.layout.index,
            num_ps: st.layout.count,
            dense_version: self.version_locked(st),
            dense_start: st.layout.range.start,
            dense_end: st.layout.range.end,
            dense_total: self.config.dense_total,
            state_buffers: 0,
            optimizer_steps: 0,
            delta,
            tables: 0,
        }
    }

    /// Copies the state for checkpoint `delta`-or-full; the caller holds the lock.
    fn copy_state(
        &self,
        st: &mut State,
        delta: bool,
        ratio: f64,
    ) -> Result<ShardImage, EmbeddingError> {
        let header = self.header(st, delta);
        if !delta {
            // Everything is saved: the hotness statistics start over.
            for t in 0..st.store.num_tables() {
                if let Some(c) = st.store.table_mut(t)?.access_counts_mut() {
                    c.fill(0);
                }
            }
            for s in st.ssu.iter_mut().flatten() {
                s.take();
            }
            return Ok(ShardImage::copy_full(
                &st.store,
                &st.dense,
                st.opt.as_ref(),
                header,
            ));
        }
        let mut tables = Vec::with_capacity(st.store.num_tables());
        let (index, n) = (st.layout.index, st.layout.count);
        for t in 0..st.store.num_tables() {
            let table = st.store.table_mut(t)?;
            let state = table.dynamic_state();
            let copy = if !self.config.large[t] {
                TableCopy::Rows(table.export().with_dynamic(state))
            } else {
                let k = ((table.local_rows() as f64) * ratio).ceil() as usize;
                let dynamic = table.is_dynamic();
                let locals: Vec<usize> = if let Some(c) = table.access_counts_mut() {
                    let chosen = select_mfu(c, k);
                    for &l in &chosen {
                        c[l] = 0;
                    }
                    chosen
                } else if let Some(ssu) = st.ssu[t].as_mut() {
                    ssu.take()
                } else {
                    Vec::new()
                };
                // Counters are by local row (a dynamic table's slot); SSU records a dynamic
                // table's keys themselves.
                let from_ssu = table.access_counts().is_none();
                let rows: Vec<u64> = locals
                    .iter()
                    .take(k)
                    .map(|&l| match (dynamic, from_ssu) {
                        (false, _) => elastrec_embedding::global_row(t, l as u64, index, n),
                        (true, false) => table.global_of(l),
                        (true, true) => l as u64,
                    })
                    .collect();
                TableCopy::Rows(table.export_rows(&rows)?.with_dynamic(state))
            };
            tables.push(copy);
        }
        Ok(ShardImage::with_tables(
            &st.dense,
            st.opt.as_ref(),
            header,
            tables,
        ))
    }

    /// Serves a checkpoint request: flash copy, then one encoding written to the
    /// shared-memory image and to storage in the background of training. A failed
    /// shared-memory write is logged and skipped: the image only speeds up a relaunch on
    /// this host, storage is what the checkpoint needs.
    pub async fn checkpoint(
        self: &Arc<Self>,
        req: CheckpointRequest,
    ) -> Result<CheckpointResponse, PsError> {
        if req.delta && !(req.ratio.is_finite() && req.ratio > 0.0 && req.ratio <= 1.0) {
            return Err(PsError::BadRatio(req.ratio));
        }
        self.lease.check()?;
        let store = self.stores.get(&req.location)?;
        let shard = self.clone();
        let (delta, ratio) = (req.delta, req.ratio);
        let (image, stall) = tokio::task::spawn_blocking(move || {
            let t0 = Instant::now();
            let mut st = shard.state.lock();
            // A checkpoint is of one layout: not while the servers are being re-sharded.
            st.check_layout(st.layout.version)?;
            let image = shard.copy_state(&mut st, delta, ratio)?;
            drop(st);
            Ok::<_, PsError>((image, t0.elapsed()))
        })
        .await??;
        let rows = image.rows();
        let dense_version = image.header.dense_version;
        let (index, count, id) = (image.header.index, image.header.num_ps, req.id);
        let shm = (!req.shm_namespace.is_empty())
            .then(|| ShmImage::new(&req.shm_namespace, &shm_name(index, count, req.id)));
        let (bytes, memcpy, t2, shm_written) = tokio::task::spawn_blocking(move || {
            let memcpy = image.time_plain_copy();
            let t2 = Instant::now();
            let bytes = image.encode();
            let written = shm.map(|img| match img.and_then(|img| img.write(id, &bytes)) {
                Ok(()) => true,
                Err(e) => {
                    eprintln!(
                        "PS {index}: warning: checkpoint {id}: skipped the shared-memory image \
                         ({e}); the part goes to storage only, so a PS relaunched on this host \
                         restores it from storage"
                    );
                    false
                }
            });
            (bytes, memcpy, t2, written)
        })
        .await?;
        let name = part_name(index, count);
        // Persisting took a while: a server replaced meanwhile must not write a part that
        // its replacement may write for the same checkpoint id.
        self.lease.check()?;
        let meta = store
            .put_part(req.id, &name, bytes::Bytes::from(bytes))
            .await?;
        if let Some(written) = shm_written {
            self.forget_old_shm(
                &req.shm_namespace,
                (index, count, req.id),
                req.delta,
                written,
            );
        }
        Ok(CheckpointResponse {
            part: meta.name,
            bytes: meta.bytes,
            checksum: meta.checksum,
            stall_us: stall.as_micros() as u64,
            memcpy_us: memcpy.as_micros() as u64,
            persist_us: t2.elapsed().as_micros() as u64,
            rows,
            dense_version,
        })
    }

    /// Records checkpoint `id`'s image (when it was `written`) and, after a full
    /// checkpoint, removes the older images: restores start from the newest full
    /// checkpoint, so they are of no use. They go even when this image could not be
    /// written, which frees the shared memory a full `/dev/shm` needs for the next one.
    /// Images are named by the layout that wrote them (index and server count), so the
    /// ones of a layout this server served before a re-sharding go too.
    fn forget_old_shm(&self, ns: &str, image: (u32, u32, u64), delta: bool, written: bool) {
        let id = image.2;
        let mut ids = self.shm_ids.lock();
        if written {
            ids.push(image);
        }
        if !delta {
            for &(index, count, old) in ids.iter().filter(|o| o.2 < id) {
                if let Ok(img) = ShmImage::new(ns, &shm_name(index, count, old)) {
                    let _ = img.remove();
                }
            }
            ids.retain(|o| o.2 >= id);
        }
    }

    /// Loads the checkpoint chain of `plan` into this (fresh) shard: each part from the
    /// shared-memory image when one with the manifest's checksum exists, from storage
    /// otherwise; rows of a checkpoint written by another number of servers are re-routed.
    /// Returns (dense version, parts read from shared memory, parts read from storage).
    pub async fn restore(&self, plan: &RestorePlan) -> anyhow::Result<(u64, usize, usize)> {
        let store = self.stores.get(&plan.location)?;
        let manifests = store.list().await?;
        let old = plan.num_ps.max(1);
        let layout = self.layout().layout;
        let sources: Vec<u32> = if old == layout.count {
            vec![layout.index]
        } else {
            (0..old).collect()
        };
        let (mut from_shm, mut from_store) = (0, 0);
        let mut version = 0;
        for id in &plan.chain {
            let m: &Manifest = manifests
                .iter()
                .find(|m| m.id == *id)
                .ok_or_else(|| anyhow::anyhow!("checkpoint {id} is not in {}", store.location()))?;
            let mut parts = Vec::with_capacity(sources.len());
            for &j in &sources {
                let name = part_name(j, old);
                let want = m
                    .part(&name)
                    .ok_or_else(|| anyhow::anyhow!("checkpoint {id} has no part {name}"))?;
                let shm = (!plan.shm_namespace.is_empty())
                    .then(|| {
                        ShmImage::new(&plan.shm_namespace, &shm_name(j, old, *id))
                            .and_then(|img| img.read())
                    })
                    .and_then(|r| r.ok().flatten())
                    .filter(|(sid, b)| *sid == *id && checksum(b) == want.checksum);
                let bytes = match shm {
                    Some((_, b)) => {
                        from_shm += 1;
                        bytes::Bytes::from(b)
                    }
                    None => {
                        from_store += 1;
                        store.read_part(m, &name).await?
                    }
                };
                parts.push(tokio::task::spawn_blocking(move || decode(&bytes)).await??);
            }
            let mut st = self.state.lock();
            let State {
                store: emb,
                dense,
                opt,
                ..
            } = &mut *st;
            let (v, _) = apply_parts(&parts, emb, dense, opt.as_mut(), &layout.range)?;
            version = v;
            self.set_version(&mut st, v);
            // Batches applied before the restore are the checkpoint's business now.
            st.last_batch.clear();
        }
        self.version_tx.send_replace(version);
        Ok((version, from_shm, from_store))
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    use elastrec_checkpoint::format::{CheckpointKind, PartMeta};
    use elastrec_job::config::JobConfig;
    use elastrec_proto::ps::PullRequest;
    use elastrec_rpc as rpc;

    use super::*;

    fn shard() -> Arc<PsShard> {
        let job = JobConfig::from_toml(
            "[model]\nbottom_mlp = [8, 4]\ntop_mlp = [8, 1]\nembedding_dim = 4\ntable_rows = 300\n",
            Path::new("job.toml"),
        )
        .unwrap();
        Arc::new(PsShard::new(&job, 0, 1).unwrap())
    }

    fn request(id: u64, location: &Path, ns: &str) -> CheckpointRequest {
        CheckpointRequest {
            version: rpc::version(),
            id,
            location: location.to_string_lossy().into_owned(),
            delta: false,
            ratio: 1.0,
            shm_namespace: ns.to_string(),
        }
    }

    /// A shared-memory namespace of this test process only, removed when dropped.
    struct Namespace(String);

    impl Namespace {
        fn new(test: &str) -> Self {
            Self(format!("ps-unit-{test}-{}", std::process::id()))
        }

        /// The directory that holds the namespace's images.
        fn dir(&self) -> PathBuf {
            let img = ShmImage::new(&self.0, "x").unwrap();
            img.path().parent().unwrap().to_path_buf()
        }
    }

    impl Drop for Namespace {
        fn drop(&mut self) {
            let dir = self.dir();
            let _ = std::fs::remove_dir_all(&dir).or_else(|_| std::fs::remove_file(&dir));
        }
    }

    /// The part a checkpoint reply describes, read back from storage through a manifest
    /// committed for it.
    async fn stored_part(root: &Path, id: u64, r: &CheckpointResponse) -> bytes::Bytes {
        let store = CheckpointStore::open(&root.to_string_lossy()).unwrap();
        let manifest = Manifest {
            id,
            created_ms: 0,
            fingerprint: "test".into(),
            kind: CheckpointKind::Full,
            num_ps: 1,
            step: 0,
            samples: 0,
            parts: vec![PartMeta {
                name: r.part.clone(),
                bytes: r.bytes,
                checksum: r.checksum,
            }],
            info: Default::default(),
        };
        store.commit(&manifest).await.unwrap();
        store.read_part(&manifest, &r.part).await.unwrap()
    }

    /// The bytes in shared memory and in storage are the one encoding the reply describes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shared_memory_and_storage_hold_the_same_encoding() {
        let dir = tempfile::tempdir().unwrap();
        let ns = Namespace::new("same-bytes");
        let ps = shard();
        let r = ps.checkpoint(request(3, dir.path(), &ns.0)).await.unwrap();
        let (id, shm) = ShmImage::new(&ns.0, &shm_name(0, 1, 3))
            .unwrap()
            .read()
            .unwrap()
            .expect("a shared-memory image");
        let stored = stored_part(dir.path(), 3, &r).await;
        assert_eq!(id, 3);
        assert_eq!(shm.len() as u64, r.bytes);
        assert_eq!(checksum(&shm), r.checksum);
        assert_eq!(checksum(&stored), r.checksum);
        assert_eq!(decode(&shm).unwrap().header.dense_version, r.dense_version);
    }

    /// `/dev/shm` unusable (here: the namespace's directory is a plain file, as good as a
    /// full or read-only tmpfs for the write): the checkpoint still reaches storage.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_shared_memory_write_leaves_the_checkpoint_to_storage() {
        let dir = tempfile::tempdir().unwrap();
        let ns = Namespace::new("shm-fails");
        let blocked = ns.dir();
        std::fs::create_dir_all(blocked.parent().unwrap()).unwrap();
        std::fs::write(&blocked, b"not a directory").unwrap();
        let ps = shard();
        let r = ps
            .checkpoint(request(1, dir.path(), &ns.0))
            .await
            .expect("the checkpoint must not fail because of shared memory");
        let stored = stored_part(dir.path(), 1, &r).await;
        assert_eq!(checksum(&stored), r.checksum);
        assert_eq!(decode(&stored).unwrap().tables.len(), 26);
        assert!(ShmImage::new(&ns.0, &shm_name(0, 1, 1))
            .unwrap()
            .read()
            .is_err());
        assert!(ps.shm_ids.lock().is_empty(), "no image was recorded");
    }

    /// While a checkpoint waits for the state lock (or copies under it), the runtime's
    /// threads keep serving other requests: with one runtime thread, a task spawned after
    /// the checkpoint still runs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_checkpoint_does_not_hold_a_runtime_thread_while_it_copies() {
        let dir = tempfile::tempdir().unwrap();
        let ps = shard();
        let guard = ps.state.lock();
        let ckpt = tokio::spawn({
            let ps = ps.clone();
            let req = request(1, dir.path(), "");
            async move { ps.checkpoint(req).await }
        });
        // Let the checkpoint task reach the lock before the probe is queued behind it.
        std::thread::sleep(Duration::from_millis(100));
        let (tx, rx) = std::sync::mpsc::channel();
        let probe = tokio::spawn({
            let ps = ps.clone();
            async move {
                let _ = tx.send(ps.version());
            }
        });
        // A std channel: the runtime's own timers need the thread that may be blocked.
        let served = rx.recv_timeout(Duration::from_secs(10));
        drop(guard);
        probe.await.unwrap();
        let r = ckpt.await.unwrap().unwrap();
        assert_eq!(
            served,
            Ok(0),
            "the runtime thread was blocked by the checkpoint"
        );
        assert_eq!(r.rows, 26 * 300);
        let pulled = ps.pull(&PullRequest {
            version: rpc::version(),
            tables: vec![0],
            rows: vec![0],
            want_dense: false,
            layout_version: 0,
            packed: false,
        });
        assert!(pulled.is_ok());
    }
}
