//! The shuffle buffer of `elastrec train` (`train.shuffle_buffer`): rows from the reader
//! wait in a pool, and each batch is drawn from it at random, so a batch mixes rows from
//! far apart in the files (files are often sorted by time or by user). Every row is
//! delivered exactly once; the order is a function of the seed.

use elastrec_common::splitmix::SplitMix64;
use elastrec_data::Batch;

/// A pool of rows and the generator that draws from it.
///
/// Rows stay where they arrived; `live` lists the ones not yet drawn. A draw takes a
/// random entry of `live` and moves the last entry into its place, and the pool is
/// compacted once most of its rows are gone, so a draw costs the copy of its row, lists
/// (bags, sequences) of any length included.
pub struct Shuffler {
    pool: Batch,
    live: Vec<u32>,
    capacity: usize,
    rng: SplitMix64,
}

impl Shuffler {
    /// A pool that holds `capacity` rows before it starts to hand batches out.
    pub fn new(capacity: usize, seed: u64) -> Self {
        Self {
            pool: Batch::default(),
            live: Vec::new(),
            capacity,
            rng: SplitMix64::new(seed),
        }
    }

    /// Adds the rows of `batch` (its layout becomes the pool's).
    pub fn push(&mut self, batch: &Batch) {
        if self.pool.is_empty() {
            self.pool.take_layout(batch);
        }
        let from = self.pool.len() as u32;
        self.pool.extend_from(batch, 0..batch.len());
        self.live.extend(from..self.pool.len() as u32);
    }

    /// Rows waiting.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// True when no row waits.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// A batch of `rows` rows drawn at random, once the pool holds more than its capacity
    /// (or, with `drain`, whatever is left); `None` otherwise.
    pub fn pop(&mut self, rows: usize, out: &mut Batch, drain: bool) -> Option<usize> {
        let ready = if drain {
            !self.is_empty()
        } else {
            self.len() >= self.capacity + rows
        };
        if !ready {
            return None;
        }
        let n = rows.min(self.len());
        out.clear();
        out.take_layout(&self.pool);
        for _ in 0..n {
            let i = (self.rng.next_u64() % self.live.len() as u64) as usize;
            let row = self.live.swap_remove(i) as usize;
            out.extend_from(&self.pool, row..row + 1);
        }
        self.compact();
        Some(n)
    }

    /// Drops the drawn rows once they are most of the pool, keeping the live rows in
    /// `live`'s order (so draws continue exactly as before).
    fn compact(&mut self) {
        if self.live.len() * 2 > self.pool.len() {
            return;
        }
        let mut kept = Batch::default();
        kept.take_layout(&self.pool);
        for &row in &self.live {
            kept.extend_from(&self.pool, row as usize..row as usize + 1);
        }
        self.pool = kept;
        self.live.clear();
        self.live.extend(0..self.pool.len() as u32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows whose every value names the row.
    fn numbered(from: usize, n: usize) -> Batch {
        let mut b = Batch::with_widths(n, 2, 3);
        for r in from..from + n {
            b.labels.push((r % 2) as f32);
            b.dense.extend([r as f32, r as f32 + 0.5]);
            b.sparse.extend([r as u64, r as u64 + 1, r as u64 + 2]);
        }
        b
    }

    fn shuffled(seed: u64) -> Vec<u64> {
        let mut s = Shuffler::new(100, seed);
        let mut out = Batch::default();
        let mut rows = Vec::new();
        for k in 0..10 {
            s.push(&numbered(k * 32, 32));
            while s.pop(32, &mut out, false).is_some() {
                rows.extend(check(&out));
            }
        }
        while s.pop(32, &mut out, true).is_some() {
            rows.extend(check(&out));
        }
        assert!(s.is_empty());
        rows
    }

    /// The row ids of `b`, after checking each row kept its values together.
    fn check(b: &Batch) -> Vec<u64> {
        (0..b.len())
            .map(|i| {
                let id = b.sparse_row(i)[0];
                assert_eq!(b.sparse_row(i), &[id, id + 1, id + 2]);
                assert_eq!(b.dense_row(i), &[id as f32, id as f32 + 0.5]);
                assert_eq!(b.labels[i], (id % 2) as f32);
                id
            })
            .collect()
    }

    #[test]
    fn every_row_comes_out_once_mixed_and_the_seed_decides_the_order() {
        let a = shuffled(1);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            (0..320).collect::<Vec<u64>>(),
            "each row exactly once"
        );
        assert_ne!(a, sorted, "mixed");
        // Rows travel up to the pool's size: the first batch holds rows past the first 32.
        assert!(a[..32].iter().any(|&r| r >= 32));
        assert_eq!(a, shuffled(1));
        assert_ne!(a, shuffled(2));
    }
}
