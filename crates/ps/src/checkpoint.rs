//! Flash checkpoints and restores of one parameter server.
//!
//! A checkpoint copies the state under the lock (the training stall: plain memory copies),
//! releases it, then encodes the copy, writes it to a shared-memory image (so a PS
//! relaunched on this host reloads without storage) and to checkpoint storage. Delta
//! checkpoints (CPR-MFU / CPR-SSU) copy only the hottest `ratio` of each large table's
//! rows, plus the small tables and the dense slice whole.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use elastrec_checkpoint::format::{checksum, Manifest};
use elastrec_checkpoint::priority::select_mfu;
use elastrec_checkpoint::shm::ShmImage;
use elastrec_checkpoint::store::CheckpointStore;
use elastrec_proto::master::RestorePlan;
use elastrec_proto::ps::{CheckpointRequest, CheckpointResponse};
use parking_lot::Mutex;
use tonic::Status;

use crate::image::{apply_parts, decode, part_name, PartHeader, ShardImage, TableCopy};
use crate::server::{PsShard, State};

/// Open checkpoint stores by location (opening an S3 client is not free).
#[derive(Default)]
pub struct Stores(Mutex<HashMap<String, Arc<CheckpointStore>>>);

impl Stores {
    /// The store at `location`, opened once.
    pub fn get(&self, location: &str) -> anyhow::Result<Arc<CheckpointStore>> {
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

fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

impl PsShard {
    fn header(&self, st: &State, delta: bool) -> PartHeader {
        PartHeader {
            index: self.index,
            num_ps: self.count,
            dense_version: self.version_locked(st),
            dense_start: self.range.start,
            dense_end: self.range.end,
            dense_total: self.dense_total,
            state_buffers: 0,
            optimizer_steps: 0,
            delta,
            tables: 0,
        }
    }

    /// Copies the state for checkpoint `delta`-or-full; the caller holds the lock.
    fn copy_state(&self, st: &mut State, delta: bool, ratio: f64) -> anyhow::Result<ShardImage> {
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
        for t in 0..st.store.num_tables() {
            let n = self.count;
            let table = st.store.table_mut(t)?;
            let copy = if !self.large[t] {
                TableCopy::Rows(table.export())
            } else {
                let k = ((table.local_rows() as f64) * ratio).ceil() as usize;
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
                let rows: Vec<u64> = locals
                    .iter()
                    .take(k)
                    .map(|&l| elastrec_embedding::global_row(t, l as u64, self.index, n))
                    .collect();
                TableCopy::Rows(table.export_rows(&rows)?)
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

    /// Serves a checkpoint request: flash copy, then encode, shared-memory image and
    /// storage in the background of training.
    pub async fn checkpoint(&self, req: CheckpointRequest) -> Result<CheckpointResponse, Status> {
        if !(req.ratio.is_finite() && req.ratio > 0.0 && req.ratio <= 1.0) && req.delta {
            return Err(Status::invalid_argument("ratio must be in (0, 1]"));
        }
        let store = self.stores.get(&req.location).map_err(internal)?;
        let t0 = Instant::now();
        let image = {
            let mut st = self.state.lock();
            self.copy_state(&mut st, req.delta, req.ratio)
                .map_err(internal)?
        };
        let stall = t0.elapsed();
        // The ideal to compare with: a plain copy of as many bytes, outside the lock.
        let t1 = Instant::now();
        let probe: Vec<Vec<f32>> = image
            .tables
            .iter()
            .map(|t| match t {
                TableCopy::Arena { data, .. } => data.clone(),
                TableCopy::Rows(s) => s.values.clone(),
            })
            .chain(std::iter::once(image.dense.clone()))
            .chain(image.state.iter().cloned())
            .collect();
        let memcpy = t1.elapsed();
        drop(std::hint::black_box(probe));
        let rows = image.rows();
        let dense_version = image.header.dense_version;
        let t2 = Instant::now();
        let (index, count, id) = (self.index, self.count, req.id);
        let ns = req.shm_namespace.clone();
        let bytes = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<u8>> {
            let bytes = image.encode();
            if !ns.is_empty() {
                ShmImage::new(&ns, &shm_name(index, count, id)).write(id, &bytes)?;
            }
            Ok(bytes)
        })
        .await
        .map_err(internal)?
        .map_err(internal)?;
        let name = part_name(self.index, self.count);
        let meta = store
            .put_part(req.id, &name, bytes::Bytes::from(bytes))
            .await
            .map_err(internal)?;
        if !req.shm_namespace.is_empty() {
            self.forget_old_shm(&req.shm_namespace, req.id, req.delta);
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

    /// Shared-memory images older than the newest full checkpoint are of no use.
    fn forget_old_shm(&self, ns: &str, id: u64, delta: bool) {
        let mut ids = self.shm_ids.lock();
        ids.push(id);
        if !delta {
            for &old in ids.iter().filter(|&&o| o < id) {
                let _ = ShmImage::new(ns, &shm_name(self.index, self.count, old)).remove();
            }
            ids.retain(|&o| o >= id);
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
        let sources: Vec<u32> = if old == self.count {
            vec![self.index]
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
                    .then(|| ShmImage::new(&plan.shm_namespace, &shm_name(j, old, *id)).read())
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
            let (v, _) = apply_parts(&parts, emb, dense, opt.as_mut(), &self.range)?;
            version = v;
            self.set_version(&mut st, v);
            // Batches applied before the restore are the checkpoint's business now.
            st.last_batch.clear();
        }
        self.version_tx.send_replace(version);
        Ok((version, from_shm, from_store))
    }
}
