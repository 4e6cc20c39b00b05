//! The sample ledger: every consumed row range, per epoch and file, with the proof that
//! each sample was trained exactly once (`consumed N, duplicated D, missing M`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Rows `[start, end)` of file `file`, trained in epoch `epoch`: the ledger's unit.
///
/// Stored (checkpoints, `master.db`) as the tuple `(epoch, file, start, end)`, the form
/// earlier versions wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "(u32, u32, u64, u64)", into = "(u32, u32, u64, u64)")]
pub struct ConsumedRange {
    /// Epoch the rows were trained for.
    pub epoch: u32,
    /// Index of the file (or stream partition) in the data set.
    pub file: u32,
    /// First row.
    pub start: u64,
    /// One past the last row.
    pub end: u64,
}

impl ConsumedRange {
    /// Rows in the range.
    pub fn rows(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }
}

impl From<(u32, u32, u64, u64)> for ConsumedRange {
    fn from((epoch, file, start, end): (u32, u32, u64, u64)) -> Self {
        Self {
            epoch,
            file,
            start,
            end,
        }
    }
}

impl From<ConsumedRange> for (u32, u32, u64, u64) {
    fn from(r: ConsumedRange) -> Self {
        (r.epoch, r.file, r.start, r.end)
    }
}

/// A set of disjoint half-open row intervals `[start, end)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IntervalSet {
    /// start → end, disjoint and non-adjacent.
    spans: BTreeMap<u64, u64>,
}

impl IntervalSet {
    /// Inserts `[start, end)` and returns how many of its rows were already present.
    pub fn insert(&mut self, start: u64, end: u64) -> u64 {
        if start >= end {
            return 0;
        }
        let mut new_start = start;
        let mut new_end = end;
        let mut overlap = 0;
        // The span starting at or before `start` may overlap or touch it.
        if let Some((&s, &e)) = self.spans.range(..=start).next_back() {
            if e >= start {
                overlap += e.min(end).saturating_sub(start);
                new_start = s;
                new_end = new_end.max(e);
                self.spans.remove(&s);
            }
        }
        // Spans starting inside (start, end] overlap or touch it.
        let inside: Vec<(u64, u64)> = self
            .spans
            .range(start..=end)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in inside {
            overlap += e.min(end).saturating_sub(s.max(start));
            new_end = new_end.max(e);
            self.spans.remove(&s);
        }
        self.spans.insert(new_start, new_end);
        overlap
    }

    /// Number of rows covered.
    pub fn covered(&self) -> u64 {
        self.spans.iter().map(|(s, e)| e - s).sum()
    }

    /// Rows of `[0, total)` not covered.
    pub fn missing_below(&self, total: u64) -> u64 {
        let inside: u64 = self
            .spans
            .iter()
            .map(|(&s, &e)| e.min(total).saturating_sub(s.min(total)))
            .sum();
        total - inside
    }

    /// Rows of `[from, to)` not covered.
    pub fn missing_between(&self, from: u64, to: u64) -> u64 {
        let inside: u64 = self
            .spans
            .range(..to)
            .map(|(&s, &e)| e.clamp(from, to) - s.clamp(from, to))
            .sum();
        to.saturating_sub(from) - inside
    }

    /// The end of the covered span that contains `from`, or `from` itself: the first row
    /// at or after `from` not covered.
    pub fn covered_from(&self, from: u64) -> u64 {
        match self.spans.range(..=from).next_back() {
            Some((_, &e)) if e >= from => e,
            _ => from,
        }
    }

    /// The covered intervals in order.
    pub fn spans(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.spans.iter().map(|(&s, &e)| (s, e))
    }
}

/// The ledger's verdict for one epoch (or, summed, for the job).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerSummary {
    /// Rows reported as trained (duplicates included).
    pub consumed: u64,
    /// Rows reported more than once.
    pub duplicated: u64,
    /// Rows of the data set never reported.
    pub missing: u64,
}

impl LedgerSummary {
    /// Exactly once: nothing duplicated, nothing missing.
    pub fn exactly_once(&self) -> bool {
        self.duplicated == 0 && self.missing == 0
    }

    /// Adds another epoch's numbers.
    pub fn add(&mut self, other: &LedgerSummary) {
        self.consumed += other.consumed;
        self.duplicated += other.duplicated;
        self.missing += other.missing;
    }
}

impl std::fmt::Display for LedgerSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "consumed {}, duplicated {}, missing {}",
            self.consumed, self.duplicated, self.missing
        )
    }
}

/// Consumed ranges of every epoch and file.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    /// Rows of each file (the expected coverage of every epoch): `[start, rows)`.
    file_rows: Vec<u64>,
    /// First row of each file the job covers (stream partitions' start offsets); empty
    /// for files (every file from row 0).
    file_start: Vec<u64>,
    /// (epoch, file) → consumed rows.
    sets: BTreeMap<(u32, u32), IntervalSet>,
    /// epoch → (consumed, duplicated).
    counts: BTreeMap<u32, (u64, u64)>,
}

impl Ledger {
    /// An empty ledger for files of the given row counts.
    pub fn new(file_rows: Vec<u64>) -> Self {
        Self {
            file_rows,
            ..Self::default()
        }
    }

    /// Sets the first row each file's coverage starts at (stream partitions).
    pub fn set_starts(&mut self, starts: Vec<u64>) {
        self.file_start = starts;
    }

    /// A file of `rows` rows joins the data set (a following job's new partition).
    pub fn add_file(&mut self, rows: u64) {
        self.file_rows.push(rows);
        if !self.file_start.is_empty() {
            self.file_start.push(0);
        }
    }

    /// The expected coverage of `file` now ends at `end` (a stream partition grew).
    pub fn extend_file(&mut self, file: usize, end: u64) {
        if let Some(rows) = self.file_rows.get_mut(file) {
            *rows = (*rows).max(end);
        }
    }

    /// The first row at or after `from` of `file` in epoch 0 not yet recorded.
    pub fn covered_from(&self, file: u32, from: u64) -> u64 {
        self.sets
            .get(&(0, file))
            .map_or(from, |s| s.covered_from(from))
    }

    /// Records that range `r` was trained; returns the number of its rows that had been
    /// recorded before (duplicates).
    pub fn record(&mut self, r: ConsumedRange) -> u64 {
        let dup = self
            .sets
            .entry((r.epoch, r.file))
            .or_default()
            .insert(r.start, r.end);
        let c = self.counts.entry(r.epoch).or_default();
        c.0 += r.rows();
        c.1 += dup;
        dup
    }

    /// Rows recorded over all epochs (duplicates included), without the per-file
    /// coverage walk [`Ledger::summary`] does for `missing`.
    pub fn consumed(&self) -> u64 {
        self.counts.values().map(|c| c.0).sum()
    }

    /// The verdict for one epoch.
    pub fn summary(&self, epoch: u32) -> LedgerSummary {
        let (consumed, duplicated) = self.counts.get(&epoch).copied().unwrap_or((0, 0));
        let missing = self
            .file_rows
            .iter()
            .enumerate()
            .map(|(f, &rows)| {
                let start = self.file_start.get(f).copied().unwrap_or(0);
                match self.sets.get(&(epoch, f as u32)) {
                    Some(set) => set.missing_between(start, rows),
                    None => rows.saturating_sub(start),
                }
            })
            .sum();
        LedgerSummary {
            consumed,
            duplicated,
            missing,
        }
    }

    /// The covered ranges, merged, in order.
    pub fn spans(&self) -> Vec<ConsumedRange> {
        self.sets
            .iter()
            .flat_map(|(&(epoch, file), set)| {
                set.spans().map(move |(start, end)| ConsumedRange {
                    epoch,
                    file,
                    start,
                    end,
                })
            })
            .collect()
    }

    /// Per epoch `(epoch, consumed, duplicated)`.
    pub fn counts(&self) -> Vec<(u32, u64, u64)> {
        self.counts.iter().map(|(&e, &(c, d))| (e, c, d)).collect()
    }

    /// Adds to an epoch's counters without covering rows: what merged spans cannot say
    /// (rows reported twice before a checkpoint) when a ledger is rebuilt from them.
    pub fn adjust(&mut self, epoch: u32, consumed: u64, duplicated: u64) {
        let c = self.counts.entry(epoch).or_default();
        c.0 += consumed;
        c.1 += duplicated;
    }

    /// The verdict summed over epochs `0..epochs`.
    pub fn total(&self, epochs: u32) -> LedgerSummary {
        let mut t = LedgerSummary::default();
        for e in 0..epochs {
            t.add(&self.summary(e));
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_set_merges_and_counts_overlap() {
        let mut s = IntervalSet::default();
        assert_eq!(s.insert(10, 20), 0);
        assert_eq!(s.insert(20, 30), 0); // adjacent
        assert_eq!(s.spans().collect::<Vec<_>>(), vec![(10, 30)]);
        assert_eq!(s.insert(5, 12), 2);
        assert_eq!(s.insert(40, 50), 0);
        assert_eq!(s.insert(0, 100), 25 + 10);
        assert_eq!(s.spans().collect::<Vec<_>>(), vec![(0, 100)]);
        assert_eq!(s.covered(), 100);
        assert_eq!(s.missing_below(120), 20);
        assert_eq!(s.insert(3, 3), 0);
    }

    #[test]
    fn interval_set_matches_a_bitmap() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..200 {
            let mut s = IntervalSet::default();
            let mut bits = [false; 200];
            for _ in 0..20 {
                let a = rng.random_range(0..200u64);
                let b = rng.random_range(a..=200u64);
                let expect = (a..b).filter(|&i| bits[i as usize]).count() as u64;
                (a..b).for_each(|i| bits[i as usize] = true);
                assert_eq!(s.insert(a, b), expect);
                assert_eq!(s.covered(), bits.iter().filter(|&&x| x).count() as u64);
            }
        }
    }

    #[test]
    fn ledger_summary_per_epoch() {
        let mut l = Ledger::new(vec![100, 50]);
        l.record((0, 0, 0, 60).into());
        l.record((0, 0, 50, 100).into());
        l.record((0, 1, 0, 50).into());
        let s = l.summary(0);
        assert_eq!(
            s,
            LedgerSummary {
                consumed: 160,
                duplicated: 10,
                missing: 0
            }
        );
        assert_eq!(l.summary(1).missing, 150);
        assert_eq!(s.to_string(), "consumed 160, duplicated 10, missing 0");
    }
}
