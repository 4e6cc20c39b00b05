//! A parameter server's checkpoint part: what is copied under the state lock (the only
//! moment training waits), its byte encoding, and the restore that may re-route rows
//! written by a different number of servers.
//!
//! Part layout (little endian): `"ERPS" | version u32 | header_len u32 | header JSON |
//! dense f32 × n | optimizer state f32 × (buffers × n) | per table: len u64 | TableSnapshot`.
//! The header names this server's slice of the flat dense vector, so slices of N old
//! servers can be glued together and cut again for M new ones.

use std::ops::Range;

use elastrec_embedding::le::{get_f32s, put_f32s, Reader, Truncated};
use elastrec_embedding::{global_row, EmbeddingStore, TableSnapshot};
use elastrec_model::DenseOptimizer;
use serde::{Deserialize, Serialize};

const MAGIC: &[u8; 4] = b"ERPS";
const VERSION: u32 = 1;

/// Name of PS `index`'s part in a checkpoint written by `num_ps` servers.
pub fn part_name(index: u32, num_ps: u32) -> String {
    format!("ps-{index}-of-{num_ps}.bin")
}

/// The header of a part.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartHeader {
    /// Writer's PS index and server count.
    pub index: u32,
    /// Servers that wrote the checkpoint.
    pub num_ps: u32,
    /// Dense updates applied when the state was copied.
    pub dense_version: u64,
    /// The writer's slice of the flat dense vector.
    pub dense_start: usize,
    /// End of that slice.
    pub dense_end: usize,
    /// Length of the whole dense vector.
    pub dense_total: usize,
    /// Optimizer state buffers (each as long as the slice).
    pub state_buffers: usize,
    /// Optimizer step count (Adam).
    pub optimizer_steps: u64,
    /// Only some rows of the large tables (a delta on top of the previous checkpoint).
    pub delta: bool,
    /// Table snapshots that follow.
    pub tables: usize,
}

/// Embedding rows as copied under the lock: a whole arena (rows implied by the shard) or
/// selected rows.
pub enum TableCopy {
    /// Every local row of the shard, in arena order.
    Arena {
        /// Table index.
        table: usize,
        /// Rows of the whole table.
        table_rows: u64,
        /// Embedding dimension.
        dim: usize,
        /// Optimizer floats per row.
        state_len: usize,
        /// The arena.
        data: Vec<f32>,
    },
    /// Selected rows (delta checkpoints).
    Rows(TableSnapshot),
}

/// The state of one PS copied out of its lock.
pub struct ShardImage {
    /// Header fields.
    pub header: PartHeader,
    /// Dense slice.
    pub dense: Vec<f32>,
    /// Optimizer state buffers.
    pub state: Vec<Vec<f32>>,
    /// Tables.
    pub tables: Vec<TableCopy>,
}

impl ShardImage {
    /// Copies every row of `store` and the dense slice with its optimizer state: plain
    /// memory copies, so the caller's lock is held about as long as a `memcpy` of the bytes.
    pub fn copy_full(
        store: &EmbeddingStore,
        dense: &[f32],
        opt: &dyn DenseOptimizer,
        header: PartHeader,
    ) -> Self {
        let tables = store
            .tables()
            .iter()
            .map(|t| match t.is_dynamic() {
                // A dynamic arena is in slot order: its rows go with their keys, and
                // with the shard's clock and admission filter.
                true => TableCopy::Rows(t.export().with_dynamic(t.dynamic_state())),
                false => TableCopy::Arena {
                    table: t.table(),
                    table_rows: t.rows(),
                    dim: t.dim(),
                    state_len: t.state_len(),
                    data: t.data().to_vec(),
                },
            })
            .collect();
        Self::with_tables(dense, opt, header, tables)
    }

    /// A copy with the given tables (delta checkpoints choose rows first).
    pub fn with_tables(
        dense: &[f32],
        opt: &dyn DenseOptimizer,
        mut header: PartHeader,
        tables: Vec<TableCopy>,
    ) -> Self {
        let state: Vec<Vec<f32>> = opt.state().iter().map(|s| s.to_vec()).collect();
        header.state_buffers = state.len();
        header.optimizer_steps = opt.steps();
        header.tables = tables.len();
        Self {
            header,
            dense: dense.to_vec(),
            state,
            tables,
        }
    }

    /// Every float held, slice by slice: dense, optimizer state, then the tables.
    fn float_slices(&self) -> impl Iterator<Item = &[f32]> {
        std::iter::once(self.dense.as_slice())
            .chain(self.state.iter().map(Vec::as_slice))
            .chain(self.tables.iter().map(|t| match t {
                TableCopy::Arena { data, .. } => data.as_slice(),
                TableCopy::Rows(s) => s.values.as_slice(),
            }))
    }

    /// Floats copied (for comparing the stall with a plain memory copy).
    pub fn floats(&self) -> usize {
        self.float_slices().map(<[f32]>::len).sum()
    }

    /// Time of a plain memory copy of every float held: the ideal the stall is compared
    /// with (`CheckpointResponse::memcpy_us`). The floats go through one reused chunk of at
    /// most 16 MiB instead of into a second full copy, so the measurement costs no memory
    /// proportional to the shard (it used to be a third copy of the shard next to the live
    /// state and this one). Writing into a warm chunk skips the page faults a fresh copy
    /// takes, so this is the copy's floor rather than its exact cost.
    pub fn time_plain_copy(&self) -> std::time::Duration {
        const CHUNK_FLOATS: usize = 4 << 20;
        let mut chunk: Vec<f32> = Vec::with_capacity(CHUNK_FLOATS.min(self.floats()));
        let t0 = std::time::Instant::now();
        for src in self.float_slices() {
            for c in src.chunks(CHUNK_FLOATS) {
                chunk.clear();
                chunk.extend_from_slice(c);
                std::hint::black_box(&mut chunk);
            }
        }
        t0.elapsed()
    }

    /// Rows held.
    pub fn rows(&self) -> u64 {
        self.tables
            .iter()
            .map(|t| match t {
                TableCopy::Arena {
                    data,
                    dim,
                    state_len,
                    ..
                } => (data.len() / (dim + state_len).max(1)) as u64,
                TableCopy::Rows(s) => s.len() as u64,
            })
            .sum()
    }

    /// Length of [`ShardImage::encode`]'s output with a header of `header_len` bytes.
    fn encoded_len(&self, header_len: usize) -> usize {
        let tables: usize = self
            .tables
            .iter()
            .map(|t| {
                8 + match t {
                    TableCopy::Rows(s) => s.encoded_len(),
                    TableCopy::Arena {
                        table,
                        table_rows,
                        dim,
                        state_len,
                        data,
                    } => {
                        // The snapshot's fixed header (from the snapshot itself, not a copy
                        // of its layout), then one row id and `stride` floats per row.
                        let fixed = TableSnapshot {
                            table: *table,
                            table_rows: *table_rows,
                            dim: *dim,
                            state_len: *state_len,
                            rows: Vec::new(),
                            values: Vec::new(),
                            usage: Vec::new(),
                            dynamic: None,
                        }
                        .encoded_len();
                        let local = data.len() / (dim + state_len).max(1);
                        fixed + local * 8 + data.len() * 4
                    }
                }
            })
            .sum();
        12 + header_len
            + (self.dense.len() + self.state.iter().map(Vec::len).sum::<usize>()) * 4
            + tables
    }

    /// Encodes the part (outside the lock), consuming the copy: the output buffer is
    /// allocated once at its exact size (a growing buffer would briefly hold two buffers of
    /// the part's size), and each table's copy is freed as soon as it is encoded, so the
    /// copy shrinks while the encoding grows.
    pub fn encode(self) -> Vec<u8> {
        let (index, num_ps) = (self.header.index, self.header.num_ps);
        let header = serde_json::to_vec(&self.header).expect("header serializes");
        let len = self.encoded_len(header.len());
        let ShardImage {
            dense,
            state,
            tables,
            ..
        } = self;
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
        out.extend_from_slice(&header);
        put_f32s(&mut out, &dense);
        drop(dense);
        for s in state {
            put_f32s(&mut out, &s);
        }
        for t in tables {
            let snap = match t {
                TableCopy::Rows(s) => s,
                TableCopy::Arena {
                    table,
                    table_rows,
                    dim,
                    state_len,
                    data,
                } => {
                    let local = data.len() / (dim + state_len).max(1);
                    TableSnapshot {
                        table,
                        table_rows,
                        dim,
                        state_len,
                        rows: (0..local as u64)
                            .map(|l| global_row(table, l, index, num_ps))
                            .collect(),
                        values: data,
                        usage: Vec::new(),
                        dynamic: None,
                    }
                }
            };
            out.extend_from_slice(&(snap.encoded_len() as u64).to_le_bytes());
            snap.encode(&mut out);
        }
        debug_assert_eq!(out.len(), len, "ShardImage::encoded_len is out of date");
        out
    }
}

/// A decoded part.
#[derive(Debug)]
pub struct DecodedPart {
    /// Header.
    pub header: PartHeader,
    /// Dense slice `[dense_start, dense_end)`.
    pub dense: Vec<f32>,
    /// Optimizer state buffers over the same slice.
    pub state: Vec<Vec<f32>>,
    /// Table snapshots.
    pub tables: Vec<TableSnapshot>,
}

fn truncated(e: Truncated) -> anyhow::Error {
    anyhow::anyhow!("checkpoint part is truncated in {}", e.what)
}

/// Decodes a part, checking every length against the buffer (parts come from storage).
pub fn decode(bytes: &[u8]) -> anyhow::Result<DecodedPart> {
    let mut r = Reader::new(bytes);
    anyhow::ensure!(
        r.take(4, "magic").map_err(truncated)? == MAGIC,
        "not a parameter-server checkpoint part (bad magic)"
    );
    let version = r.u32("version").map_err(truncated)?;
    anyhow::ensure!(
        version == VERSION,
        "checkpoint part version {version} is not supported"
    );
    let hlen = r.u32("header length").map_err(truncated)?;
    let header: PartHeader =
        serde_json::from_slice(r.take(hlen as usize, "header").map_err(truncated)?)?;
    anyhow::ensure!(
        header.dense_start <= header.dense_end && header.dense_end <= header.dense_total,
        "checkpoint part has an invalid dense range"
    );
    let n = header.dense_end - header.dense_start;
    let dense = get_f32s(r.take(n * 4, "dense values").map_err(truncated)?);
    let mut state = Vec::with_capacity(header.state_buffers.min(8));
    for _ in 0..header.state_buffers {
        state.push(get_f32s(
            r.take(n * 4, "optimizer state").map_err(truncated)?,
        ));
    }
    let mut tables = Vec::with_capacity(header.tables.min(1024));
    for _ in 0..header.tables {
        let len = r.u64("table length").map_err(truncated)?;
        let len = usize::try_from(len)?;
        tables.push(TableSnapshot::from_bytes(
            r.take(len, "table").map_err(truncated)?,
        )?);
    }
    anyhow::ensure!(r.is_empty(), "checkpoint part has trailing bytes");
    Ok(DecodedPart {
        header,
        dense,
        state,
        tables,
    })
}

/// Applies decoded parts (every old server's part of one checkpoint, or only this server's
/// when the server count is unchanged) to a freshly built shard: rows are routed to this
/// server by the stable hash, dense slices glued and cut to `my_range`. Returns the dense
/// version and optimizer step count of the checkpoint.
pub fn apply_parts(
    parts: &[DecodedPart],
    store: &mut EmbeddingStore,
    dense: &mut [f32],
    opt: &mut dyn DenseOptimizer,
    my_range: &Range<usize>,
) -> anyhow::Result<(u64, u64)> {
    let shard = store.shard();
    let mut version = 0;
    let mut steps = 0;
    for p in parts {
        let h = &p.header;
        version = version.max(h.dense_version);
        steps = steps.max(h.optimizer_steps);
        // Overlap of the part's dense slice with ours.
        let lo = h.dense_start.max(my_range.start);
        let hi = h.dense_end.min(my_range.end);
        if lo < hi {
            let src = lo - h.dense_start..hi - h.dense_start;
            let dst = lo - my_range.start..hi - my_range.start;
            dense[dst.clone()].copy_from_slice(&p.dense[src.clone()]);
            let mut mine = opt.state_mut();
            anyhow::ensure!(
                mine.len() == p.state.len(),
                "checkpoint has {} optimizer buffers, the job's dense optimizer has {}",
                p.state.len(),
                mine.len()
            );
            for (m, s) in mine.iter_mut().zip(&p.state) {
                m[dst.clone()].copy_from_slice(&s[src.clone()]);
            }
        }
        for snap in &p.tables {
            let routed;
            let mine = if h.num_ps == shard.count {
                snap
            } else {
                routed = snap.route(shard.count);
                &routed[shard.index as usize]
            };
            // A dynamic table without rows may still have counted ids in its filter.
            if !mine.is_empty() || mine.dynamic.is_some() {
                store.table_mut(mine.table)?.import(mine)?;
            }
        }
    }
    opt.set_steps(steps);
    Ok((version, steps))
}

#[cfg(test)]
mod tests {
    use super::*;
    use elastrec_embedding::{EmbeddingConfig, ShardSpec, SparseOptimizerConfig};
    use elastrec_model::DenseOptimizerConfig;

    fn store(index: u32, count: u32, seed: u64) -> EmbeddingStore {
        EmbeddingStore::new_shard(
            EmbeddingConfig {
                dim: 4,
                rows: vec![50, 7, 130],
                optimizer: SparseOptimizerConfig::RowWiseAdagrad {
                    lr: 0.1,
                    initial_accumulator: 0.0,
                    eps: 1e-8,
                },
                seed,
                dynamic: None,
            },
            ShardSpec::new(index, count).unwrap(),
        )
        .unwrap()
    }

    fn header(index: u32, num_ps: u32, range: &Range<usize>, total: usize) -> PartHeader {
        PartHeader {
            index,
            num_ps,
            dense_version: 9,
            dense_start: range.start,
            dense_end: range.end,
            dense_total: total,
            state_buffers: 0,
            optimizer_steps: 0,
            delta: false,
            tables: 0,
        }
    }

    fn slice(total: usize, n: u32, i: u32) -> Range<usize> {
        total * i as usize / n as usize..total * (i + 1) as usize / n as usize
    }

    /// Two servers' parts restored onto three: every row and every dense value lands where
    /// the three-server layout expects it, with its optimizer state.
    #[test]
    fn parts_of_two_servers_restore_onto_three() {
        let total = 101;
        let full_dense: Vec<f32> = (0..total).map(|i| i as f32 * 0.5).collect();
        let adam = DenseOptimizerConfig::Adam {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        };
        let mut parts = Vec::new();
        // Initial values depend on (seed, table, global row) only, so one unsharded store
        // with the same seed is the reference for every row.
        let reference = store(0, 1, 99);
        for i in 0..2 {
            let s = store(i, 2, 99);
            let r = slice(total, 2, i);
            let mut opt = adam.build(r.len());
            opt.set_steps(17);
            for b in opt.state_mut() {
                for (k, v) in b.iter_mut().enumerate() {
                    *v = (r.start + k) as f32;
                }
            }
            let img = ShardImage::copy_full(
                &s,
                &full_dense[r.clone()],
                opt.as_ref(),
                header(i, 2, &r, total),
            );
            parts.push(decode(&img.encode()).unwrap());
        }
        for j in 0..3u32 {
            let mut s = store(j, 3, 1); // other seed: every value must come from the parts
            let r = slice(total, 3, j);
            let mut dense = vec![0.0; r.len()];
            let mut opt = adam.build(r.len());
            let (v, steps) = apply_parts(&parts, &mut s, &mut dense, opt.as_mut(), &r).unwrap();
            assert_eq!((v, steps), (9, 17));
            assert_eq!(dense, full_dense[r.clone()].to_vec());
            assert_eq!(opt.steps(), 17);
            for b in opt.state() {
                let want: Vec<f32> = r.clone().map(|k| k as f32).collect();
                assert_eq!(b, &want[..]);
            }
            for t in 0..3 {
                for l in 0..s.table(t).unwrap().local_rows() {
                    let row = s.table(t).unwrap().global_of(l);
                    assert_eq!(
                        s.table(t).unwrap().row(row).unwrap(),
                        reference.table(t).unwrap().row(row).unwrap(),
                        "table {t} row {row}"
                    );
                }
            }
        }
    }

    /// The part is encoded into one buffer of its exact size: a buffer that grows while
    /// encoding a multi-GB shard briefly holds the old and the new allocation.
    #[test]
    fn encoding_allocates_its_buffer_once_at_the_exact_size() {
        let s = store(0, 2, 3);
        let opt = DenseOptimizerConfig::Adam {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        }
        .build(7);
        let r = 0..7;
        let full = ShardImage::copy_full(&s, &[1.0; 7], opt.as_ref(), header(0, 2, &r, 14));
        let bytes = full.encode();
        assert_eq!(bytes.capacity(), bytes.len());
        // A delta's selected rows take the other branch of the size computation.
        let rows: Vec<u64> = (0..130)
            .filter(|&g| elastrec_embedding::shard_of(2, g, 2) == 0)
            .take(5)
            .collect();
        let tables = vec![
            TableCopy::Rows(s.table(0).unwrap().export()),
            TableCopy::Rows(s.table(2).unwrap().export_rows(&rows).unwrap()),
        ];
        let delta = ShardImage::with_tables(&[1.0; 7], opt.as_ref(), header(0, 2, &r, 14), tables);
        let bytes = delta.encode();
        assert_eq!(bytes.capacity(), bytes.len());
        assert_eq!(decode(&bytes).unwrap().tables[1].len(), 5);
    }

    #[test]
    fn truncated_or_foreign_bytes_are_refused() {
        let s = store(0, 1, 3);
        let opt = DenseOptimizerConfig::Sgd {
            lr: 0.1,
            weight_decay: 0.0,
        }
        .build(5);
        let r = 0..5;
        let bytes =
            ShardImage::copy_full(&s, &[1.0; 5], opt.as_ref(), header(0, 1, &r, 5)).encode();
        assert!(decode(&bytes).is_ok());
        assert!(decode(&bytes[..bytes.len() - 3]).is_err());
        assert!(decode(b"PAR1....").is_err());
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(decode(&extra).is_err());
    }
}
