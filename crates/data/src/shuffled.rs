//! Rows of a data task in a seeded order: `train.shuffle_buffer` in `elastrec run`.
//!
//! A distributed job keeps its exactly-once ledger in row ranges: a worker reports "the
//! first `k` rows of my task are trained", a lost worker's remainder goes back to the queue
//! as a range, and a straggler's task is cut in two ranges. A shuffle buffer in the worker
//! would break all three (the rows trained would no longer be a prefix). So the shuffle is
//! moved below the ranges instead: the master's ranges count *slots*, and the rows of each
//! block of `block_rows` slots sit in them in a permuted order that is a function of the
//! seed alone. A range of slots then names the same rows on any worker, after any split,
//! and across a master restart; the ledger's proof that every slot was trained once per
//! epoch is a proof that every row was.
//!
//! Bad rows skipped under `on_bad_row = "skip"` keep their slots: a block of `n` slots with
//! `g` good rows permutes `n` items, the good rows in file order followed by `n - g`
//! placeholders, and a slot holding a placeholder counts as a skipped row. Which slots
//! those are depends only on the file, so every worker agrees.

use elastrec_common::splitmix::{derive, SplitMix64};

use crate::error::{DataError, Result};
use crate::reader::{BatchReader, ReadStats, MAX_KEPT_ERRORS};
use crate::Batch;

/// The largest permutation block a worker accepts from the wire (rows it holds at once).
pub const MAX_BLOCK_ROWS: u64 = 1 << 22;

/// How the rows of one file are permuted in one epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowShuffle {
    /// Slots per block; block `k` is slots `[k·block_rows, (k+1)·block_rows)` of the file,
    /// the last one cut at `file_rows`.
    pub block_rows: u64,
    /// Slots of the file (its training rows).
    pub file_rows: u64,
    /// The epoch's and file's seed; each block derives its own from it.
    pub seed: u64,
}

impl RowShuffle {
    /// Checks values read from the wire: a block of at most [`MAX_BLOCK_ROWS`] rows and a
    /// slot range `[start, end)` inside the file.
    pub fn check(&self, start: u64, end: u64) -> Result<()> {
        if self.block_rows == 0 || self.block_rows > MAX_BLOCK_ROWS {
            return Err(DataError::InvalidSpec(format!(
                "shuffle block of {} rows (1 to {MAX_BLOCK_ROWS})",
                self.block_rows
            )));
        }
        if start > end || end > self.file_rows {
            return Err(DataError::InvalidSpec(format!(
                "rows {start}..{end} are not inside a file of {} rows",
                self.file_rows
            )));
        }
        Ok(())
    }

    /// The physical rows `[start, end)` of block `k`.
    pub fn block(&self, k: u64) -> (u64, u64) {
        let start = k * self.block_rows;
        (start, (start + self.block_rows).min(self.file_rows))
    }

    /// Which of the block's items sits in each of its `len` slots: a Fisher–Yates
    /// permutation drawn from the block's own seed, so it never depends on which rows of
    /// the block a task covers.
    pub fn order(&self, k: u64, len: usize) -> Vec<u32> {
        let mut order: Vec<u32> = (0..len as u32).collect();
        let mut rng = SplitMix64::new(derive(self.seed, k));
        for i in (1..len).rev() {
            let j = (rng.next_u64() % (i as u64 + 1)) as usize;
            order.swap(i, j);
        }
        order
    }
}

/// Opens a reader of physical rows `[start, end)` of the task's file.
pub type RangeOpener = Box<dyn FnMut(u64, u64) -> Result<Box<dyn BatchReader>> + Send>;

/// A block's rows in memory and the items of its slots.
struct LoadedBlock {
    index: u64,
    first_slot: u64,
    rows: Batch,
    order: Vec<u32>,
}

/// Delivers the rows of slots `[from, end)` of a file in the order [`RowShuffle`] gives
/// them. It reads each block it touches whole, once, through `open`.
pub struct ShuffledReader {
    open: RangeOpener,
    shuffle: RowShuffle,
    at: u64,
    end: u64,
    block: Option<LoadedBlock>,
    stats: ReadStats,
}

impl ShuffledReader {
    /// A reader of slots `[from, end)`; `shuffle` must pass [`RowShuffle::check`].
    pub fn new(open: RangeOpener, shuffle: RowShuffle, from: u64, end: u64) -> Result<Self> {
        shuffle.check(from, end)?;
        Ok(Self {
            open,
            shuffle,
            at: from,
            end,
            block: None,
            stats: ReadStats::default(),
        })
    }

    /// Reads block `k` whole. Its skipped rows are counted when their slots are passed, not
    /// here; their messages are kept now.
    fn load(&mut self, k: u64) -> Result<LoadedBlock> {
        let (start, end) = self.shuffle.block(k);
        let mut reader = (self.open)(start, end)?;
        let (rows, inner) = crate::reader::drain(reader.as_mut())?;
        let passed = rows.len() as u64 + inner.rows_skipped;
        if passed != end - start {
            return Err(DataError::InvalidSpec(format!(
                "rows {start}..{end} of the task's file: only {passed} rows there"
            )));
        }
        for e in &inner.first_errors {
            if self.stats.first_errors.len() < MAX_KEPT_ERRORS {
                self.stats.first_errors.push(e.clone());
            }
        }
        let order = self.shuffle.order(k, (end - start) as usize);
        Ok(LoadedBlock {
            index: k,
            first_slot: start,
            rows,
            order,
        })
    }
}

impl BatchReader for ShuffledReader {
    fn next_batch(&mut self, batch: &mut Batch, max_rows: usize) -> Result<usize> {
        batch.clear();
        let mut delivered = 0;
        while delivered < max_rows && self.at < self.end {
            let k = self.at / self.shuffle.block_rows;
            if self.block.as_ref().is_none_or(|b| b.index != k) {
                self.block = Some(self.load(k)?);
            }
            let block = self.block.as_ref().expect("loaded above");
            if batch.is_empty() {
                batch.take_layout(&block.rows);
            }
            let item = block.order[(self.at - block.first_slot) as usize] as usize;
            if item < block.rows.len() {
                batch.extend_from(&block.rows, item..item + 1);
                delivered += 1;
                self.stats.rows_read += 1;
            } else {
                // A bad row's slot (the items past the good rows).
                self.stats.rows_skipped += 1;
            }
            self.at += 1;
        }
        Ok(delivered)
    }

    fn stats(&self) -> &ReadStats {
        &self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reader::BadRowPolicy;
    use std::io::Write as _;

    /// A TSV file whose row `i` has label `i % 2` and first integer `i`, with the rows in
    /// `bad` malformed.
    fn file(rows: u64, bad: &[u64]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        for i in 0..rows {
            if bad.contains(&i) {
                writeln!(f, "not a row").unwrap();
                continue;
            }
            let ints = std::iter::once(i.to_string())
                .chain((1..13).map(|_| String::new()))
                .collect::<Vec<_>>()
                .join("\t");
            let cats = vec!["0000000a"; 26].join("\t");
            writeln!(f, "{}\t{ints}\t{cats}", i % 2).unwrap();
        }
        f.flush().unwrap();
        f
    }

    fn opener(path: &std::path::Path) -> RangeOpener {
        let path = path.to_path_buf();
        Box::new(move |s, e| crate::open_reader_range(&path, s, e, BadRowPolicy::Skip))
    }

    /// The file rows (first integers) read from slots `[from, end)`, `rows` at a time, and
    /// the skipped count.
    fn read(
        f: &tempfile::NamedTempFile,
        shuffle: RowShuffle,
        from: u64,
        end: u64,
    ) -> (Vec<u64>, u64) {
        let mut r = ShuffledReader::new(opener(f.path()), shuffle, from, end).unwrap();
        let mut b = Batch::default();
        let mut out = Vec::new();
        while r.next_batch(&mut b, 7).unwrap() > 0 {
            // The reader stored ln(1 + i).
            out.extend(
                (0..b.len()).map(|i| (f64::from(b.dense_row(i)[0]).exp() - 1.0).round() as u64),
            );
        }
        assert_eq!(r.at, end, "0 rows before the range's end");
        (out, r.stats().rows_skipped)
    }

    const SHUFFLE: RowShuffle = RowShuffle {
        block_rows: 40,
        file_rows: 100,
        seed: 7,
    };

    #[test]
    fn every_row_comes_once_permuted_within_its_block() {
        let f = file(100, &[]);
        let (rows, skipped) = read(&f, SHUFFLE, 0, 100);
        assert_eq!(skipped, 0);
        let mut sorted = rows.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..100).collect::<Vec<_>>());
        assert_ne!(rows, sorted, "the order is not the file's");
        for (slot, row) in rows.iter().enumerate() {
            assert_eq!(slot / 40, *row as usize / 40, "row {row} left its block");
        }
    }

    #[test]
    fn the_order_is_the_seeds_and_survives_any_cut_of_the_range() {
        let f = file(100, &[]);
        let (whole, _) = read(&f, SHUFFLE, 0, 100);
        assert_eq!(read(&f, SHUFFLE, 0, 100).0, whole, "same seed, same order");
        // A task cut at a lost worker's offset and at a straggler's split, read by
        // different readers, delivers the same rows in the same slots.
        let mut pieces = Vec::new();
        for (s, e) in [(0, 13), (13, 41), (41, 42), (42, 100)] {
            pieces.extend(read(&f, SHUFFLE, s, e).0);
        }
        assert_eq!(pieces, whole);
        let other = RowShuffle { seed: 8, ..SHUFFLE };
        assert_ne!(
            read(&f, other, 0, 100).0,
            whole,
            "another epoch, another order"
        );
    }

    #[test]
    fn a_bad_rows_slot_is_a_skipped_row_wherever_the_range_is_cut() {
        let f = file(100, &[3, 50, 51]);
        let (whole, skipped) = read(&f, SHUFFLE, 0, 100);
        assert_eq!(skipped, 3);
        let mut sorted = whole.clone();
        sorted.sort_unstable();
        let good: Vec<u64> = (0..100).filter(|i| ![3, 50, 51].contains(i)).collect();
        assert_eq!(sorted, good);
        let (mut pieces, mut skips) = (Vec::new(), 0);
        for (s, e) in [(0, 30), (30, 77), (77, 100)] {
            let (rows, k) = read(&f, SHUFFLE, s, e);
            pieces.extend(rows);
            skips += k;
        }
        assert_eq!((pieces, skips), (whole, 3));
    }

    #[test]
    fn values_from_the_wire_are_checked() {
        let f = file(10, &[]);
        let too_big = RowShuffle {
            block_rows: MAX_BLOCK_ROWS + 1,
            ..SHUFFLE
        };
        assert!(ShuffledReader::new(opener(f.path()), too_big, 0, 10).is_err());
        let past_end = RowShuffle {
            file_rows: 10,
            ..SHUFFLE
        };
        assert!(ShuffledReader::new(opener(f.path()), past_end, 5, 11).is_err());
        // The master says the file has 100 rows; it has 10.
        let mut r = ShuffledReader::new(opener(f.path()), SHUFFLE, 0, 40).unwrap();
        let err = r.next_batch(&mut Batch::default(), 8).unwrap_err();
        assert!(err.to_string().contains("10 rows"), "{err}");
    }
}
