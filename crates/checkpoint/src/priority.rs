//! Which embedding rows to save first (CPR §4.2): instead of the whole table every
//! `T_save`, save the `r·N` rows most likely to have changed every `r·T_save` (`r < 1`, CPR
//! uses `r = 1/8`), on the large tables only ([`large_tables`]); small tables are saved
//! whole at every `T_save`.
//!
//! * **MFU** (most frequently used): a 4-byte access counter per row; at each save the `r·N`
//!   rows with the highest counts are chosen ([`select_mfu`]) and their counters cleared
//!   ([`clear_counts`]). Memory: `4·N` bytes ([`mfu_memory_bytes`]).
//! * **SSU** (sub-sampled used): a duplicate-free list of at most `r·N` rows fed by every
//!   `sample_period`-th batch of accesses, with random eviction when full ([`SsuList`]).
//!   Sub-sampling acts as a high-pass filter: frequently used rows are the likeliest to be in
//!   the list at save time. Memory: about `(4/3)·4·r·N` bytes.
//!
//! Row indices are a shard's local indices (`< u32::MAX`, which the embedding crate's
//! `MAX_SHARD_ROWS` guarantees). Pure code: no I/O, no clock.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The fewest largest tables (by row count) that together hold at least `coverage` (a
/// fraction) of all rows, as ascending table indices; ties go to the lower index. The
/// other tables are small and saved whole. CPR prioritizes the 7 largest of Criteo's 26
/// tables, which hold 99.6% of the rows (`coverage = 0.995` selects the same 7).
pub fn large_tables(rows_per_table: &[u64], coverage: f64) -> Vec<usize> {
    let total: u128 = rows_per_table.iter().map(|&r| u128::from(r)).sum();
    if total == 0 || coverage.is_nan() || coverage <= 0.0 {
        return Vec::new();
    }
    let need = coverage.min(1.0) * total as f64;
    let mut order: Vec<usize> = (0..rows_per_table.len()).collect();
    order.sort_by(|&a, &b| rows_per_table[b].cmp(&rows_per_table[a]).then(a.cmp(&b)));
    let mut covered = 0u128;
    let mut out = Vec::new();
    for t in order {
        if covered as f64 >= need {
            break;
        }
        out.push(t);
        covered += u128::from(rows_per_table[t]);
    }
    out.sort_unstable();
    out
}

/// Local indices of the `k` most-accessed rows, ascending. Ties in count go to the lower
/// index (deterministic); rows never accessed (count 0) are never selected, so fewer than
/// `k` come back when fewer rows were used.
///
/// Average O(N) time (`select_nth_unstable` on packed `(count, index)` keys) plus
/// O(k log k) to sort the result; transient memory 8 bytes per row with a non-zero count.
pub fn select_mfu(counts: &[u32], k: usize) -> Vec<usize> {
    debug_assert!(counts.len() as u64 <= 1 << 32, "local indices fit 32 bits");
    if k == 0 {
        return Vec::new();
    }
    // Smaller key = better: inverted count in the high half, index in the low half.
    let mut keys: Vec<u64> = counts
        .iter()
        .enumerate()
        .filter(|&(_, &c)| c > 0)
        .map(|(i, &c)| (u64::from(!c) << 32) | i as u64)
        .collect();
    if keys.len() > k {
        keys.select_nth_unstable(k - 1);
        keys.truncate(k);
    }
    let mut out: Vec<usize> = keys
        .iter()
        .map(|&key| (key & 0xFFFF_FFFF) as usize)
        .collect();
    out.sort_unstable();
    out
}

/// Clears the counters of the rows just saved (MFU restarts counting for them).
pub fn clear_counts(counts: &mut [u32], saved: &[usize]) {
    for &i in saved {
        if let Some(c) = counts.get_mut(i) {
            *c = 0;
        }
    }
}

/// Bytes of MFU's access counters for `rows` rows: one `u32` each.
pub fn mfu_memory_bytes(rows: u64) -> u64 {
    4 * rows
}

/// Marks an empty slot of [`SsuList`]'s table.
const EMPTY: u32 = u32::MAX;

/// CPR-SSU's list: at most `cap` distinct local row indices, recorded from every
/// `sample_period`-th call to [`SsuList::observe`]. When a new row arrives at a full list,
/// one of the `cap + 1` candidates (the stored rows and the newcomer) is discarded uniformly
/// at random (seeded, so runs repeat).
///
/// # Memory
/// The list is a single open-addressed hash table of `u32` row indices (linear probing,
/// backward-shift deletion) with `cap + ⌊cap/3⌋ + 1` slots, so it never exceeds a load of
/// 3/4 and needs no separate membership structure:
/// [`SsuList::memory_bytes`] `= 4·(cap + ⌊cap/3⌋ + 1) ≤ (4/3)·4·cap + 4` bytes of heap
/// (0 for `cap = 0`), whatever the table size. With `cap = r·N` and `r = 1/8` that is
/// `2N/3` bytes, 1/6 of MFU's counters (CPR's ideal is 1/8).
///
/// Insert and membership test: O(1) expected; random eviction: O(1) expected (rejection
/// sampling over the slots, at most 4/3 tries on average when full); [`SsuList::take`]:
/// O(cap log cap).
#[derive(Debug, Clone)]
pub struct SsuList {
    cap: usize,
    sample_period: u32,
    calls: u64,
    len: usize,
    slots: Vec<u32>,
    rng: StdRng,
    evicted: u64,
}

impl SsuList {
    /// A list of at most `cap` rows recording every `sample_period`-th call (0 is taken as
    /// 1: every call), evicting with an rng seeded by `seed`.
    pub fn new(cap: usize, sample_period: u32, seed: u64) -> Self {
        let n_slots = if cap == 0 { 0 } else { cap + cap / 3 + 1 };
        Self {
            cap,
            sample_period: sample_period.max(1),
            calls: 0,
            len: 0,
            slots: vec![EMPTY; n_slots],
            rng: StdRng::seed_from_u64(seed),
            evicted: 0,
        }
    }

    /// Records the rows of one access batch (a training step's rows of this table shard),
    /// if this call is a sampled one: calls 0, `p`, `2p`, … with `p = sample_period`.
    /// Duplicates are stored once. Indices `≥ u32::MAX` are ignored.
    pub fn observe(&mut self, rows: &[usize]) {
        let sampled = self.calls.is_multiple_of(u64::from(self.sample_period));
        self.calls += 1;
        if !sampled || self.cap == 0 {
            return;
        }
        for &r in rows {
            if r < EMPTY as usize {
                self.insert(r as u32);
            }
        }
    }

    /// The stored rows, ascending; the list is empty afterwards (the rows were saved).
    pub fn take(&mut self) -> Vec<usize> {
        let mut out = Vec::with_capacity(self.len);
        for s in &mut self.slots {
            if *s != EMPTY {
                out.push(*s as usize);
                *s = EMPTY;
            }
        }
        self.len = 0;
        out.sort_unstable();
        out
    }

    /// Rows stored.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no row is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Most rows the list holds.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// True when `row` is stored.
    pub fn contains(&self, row: usize) -> bool {
        if self.slots.is_empty() || row >= EMPTY as usize {
            return false;
        }
        self.find(row as u32).is_ok()
    }

    /// Rows discarded because the list was full (newcomers included).
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Heap bytes of the list: `4·(cap + ⌊cap/3⌋ + 1)` (see the type's docs).
    pub fn memory_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<u32>()
    }

    fn home(&self, row: u32) -> usize {
        // Fibonacci hashing, then a multiply-shift range reduction onto the slots.
        let h = u64::from(row).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
        ((h * self.slots.len() as u64) >> 32) as usize
    }

    /// `Ok(slot)` holding `row`, or `Err(first empty slot)` where it would go.
    fn find(&self, row: u32) -> Result<usize, usize> {
        let n = self.slots.len();
        let mut i = self.home(row);
        loop {
            match self.slots[i] {
                v if v == row => return Ok(i),
                EMPTY => return Err(i),
                _ => i = (i + 1) % n,
            }
        }
    }

    fn insert(&mut self, row: u32) {
        let Err(mut at) = self.find(row) else {
            return;
        };
        if self.len == self.cap {
            self.evicted += 1;
            if self.rng.random_range(0..=self.cap) == self.cap {
                return; // the newcomer is the one discarded
            }
            let n = self.slots.len();
            let victim = loop {
                let i = self.rng.random_range(0..n);
                if self.slots[i] != EMPTY {
                    break i;
                }
            };
            self.remove_at(victim);
            at = self.find(row).expect_err("row was absent");
        }
        self.slots[at] = row;
        self.len += 1;
    }

    /// Empties slot `hole` and shifts later entries of its probe run back so every entry
    /// stays reachable from its home slot (no tombstones).
    fn remove_at(&mut self, mut hole: usize) {
        let n = self.slots.len();
        let mut j = hole;
        loop {
            j = (j + 1) % n;
            let v = self.slots[j];
            if v == EMPTY {
                break;
            }
            let k = self.home(v);
            // The entry at j may stay if its home lies cyclically in (hole, j].
            let stays = if hole <= j {
                hole < k && k <= j
            } else {
                hole < k || k <= j
            };
            if !stays {
                self.slots[hole] = v;
                hole = j;
            }
        }
        self.slots[hole] = EMPTY;
        self.len -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Criteo Kaggle's per-feature cardinalities.
    const KAGGLE: [u64; 26] = [
        1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27,
        14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
    ];

    #[test]
    fn large_tables_by_hand() {
        // Total 100: 50 alone covers 0.5; 50 + 30 covers 0.8; ties go to the lower index.
        let rows = [10, 50, 30, 5, 5];
        assert_eq!(large_tables(&rows, 0.5), vec![1]);
        assert_eq!(large_tables(&rows, 0.51), vec![1, 2]);
        assert_eq!(large_tables(&rows, 0.8), vec![1, 2]);
        assert_eq!(large_tables(&rows, 0.95), vec![0, 1, 2, 3]);
        assert_eq!(large_tables(&rows, 1.0), vec![0, 1, 2, 3, 4]);
        assert_eq!(large_tables(&rows, 0.0), Vec::<usize>::new());
        assert_eq!(large_tables(&[0, 0], 0.9), Vec::<usize>::new());
    }

    #[test]
    fn large_tables_of_criteo_are_cprs_seven() {
        let big = large_tables(&KAGGLE, 0.995);
        assert_eq!(big, vec![2, 3, 11, 15, 20, 23, 25]);
        let covered: u64 = big.iter().map(|&t| KAGGLE[t]).sum();
        let total: u64 = KAGGLE.iter().sum();
        assert!(covered as f64 / total as f64 > 0.995);
    }

    #[test]
    fn mfu_top_k_with_ties() {
        //            0  1  2  3  4  5  6  7
        let counts = [3, 0, 7, 3, 1, 7, 0, 3];
        assert_eq!(select_mfu(&counts, 2), vec![2, 5]);
        // Third place is a three-way tie at 3: the lowest index wins.
        assert_eq!(select_mfu(&counts, 3), vec![0, 2, 5]);
        assert_eq!(select_mfu(&counts, 4), vec![0, 2, 3, 5]);
        // Never a row with count 0, even when k allows it.
        assert_eq!(select_mfu(&counts, 8), vec![0, 2, 3, 4, 5, 7]);
        assert_eq!(select_mfu(&counts, 0), Vec::<usize>::new());
        assert_eq!(select_mfu(&[0, 0], 1), Vec::<usize>::new());
        assert_eq!(select_mfu(&[u32::MAX, 1], 1), vec![0]);
    }

    #[test]
    fn mfu_matches_a_full_sort() {
        let mut rng = StdRng::seed_from_u64(5);
        let counts: Vec<u32> = (0..5000).map(|_| rng.random_range(0..20)).collect();
        let mut order: Vec<usize> = (0..counts.len()).filter(|&i| counts[i] > 0).collect();
        order.sort_by(|&a, &b| counts[b].cmp(&counts[a]).then(a.cmp(&b)));
        for k in [1, 10, 625, 4999] {
            let mut want = order[..k.min(order.len())].to_vec();
            want.sort_unstable();
            assert_eq!(select_mfu(&counts, k), want, "k = {k}");
        }
    }

    #[test]
    fn clear_counts_and_memory() {
        let mut counts = [4, 5, 6];
        clear_counts(&mut counts, &[0, 2, 9]);
        assert_eq!(counts, [0, 5, 0]);
        assert_eq!(mfu_memory_bytes(1_000_000), 4_000_000);
    }

    #[test]
    fn ssu_dedupes_and_takes_sorted() {
        let mut s = SsuList::new(10, 1, 0);
        s.observe(&[5, 3, 5, 9]);
        s.observe(&[3, 1]);
        assert_eq!(s.len(), 4);
        assert!(s.contains(9) && !s.contains(2));
        assert_eq!(s.take(), vec![1, 3, 5, 9]);
        assert!(s.is_empty());
        assert_eq!(s.take(), Vec::<usize>::new());
        s.observe(&[7]);
        assert_eq!(s.take(), vec![7]);
    }

    #[test]
    fn ssu_sub_samples_calls() {
        let mut s = SsuList::new(100, 2, 0);
        s.observe(&[1]); // call 0: recorded
        s.observe(&[2]); // call 1: skipped
        s.observe(&[3]); // call 2: recorded
        s.observe(&[4]); // call 3: skipped
        assert_eq!(s.take(), vec![1, 3]);
        let mut every = SsuList::new(100, 0, 0);
        every.observe(&[1]);
        every.observe(&[2]);
        assert_eq!(every.len(), 2);
    }

    #[test]
    fn ssu_never_exceeds_cap_and_stays_consistent() {
        let cap = 100;
        let mut s = SsuList::new(cap, 1, 42);
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..200 {
            let rows: Vec<usize> = (0..50).map(|_| rng.random_range(0..10_000)).collect();
            s.observe(&rows);
            assert!(s.len() <= cap);
        }
        assert_eq!(s.len(), cap);
        assert!(s.evicted() > 0);
        // Every stored row is findable after all the backward shifts.
        let rows = s.clone().take();
        assert_eq!(rows.len(), cap);
        assert!(rows.iter().all(|&r| s.contains(r)));
        assert!(rows.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn ssu_favors_frequent_rows() {
        // Row 0 is in every batch, the others are drawn from 100k: row 0 survives.
        let mut s = SsuList::new(64, 2, 3);
        let mut rng = StdRng::seed_from_u64(2);
        for _ in 0..1000 {
            let mut rows: Vec<usize> = (0..32).map(|_| rng.random_range(1..100_000)).collect();
            rows.push(0);
            s.observe(&rows);
        }
        assert!(s.contains(0));
    }

    #[test]
    fn ssu_memory_bound() {
        for cap in [0usize, 1, 2, 3, 7, 100, 125_000] {
            let s = SsuList::new(cap, 2, 0);
            let bound = 4 * (cap + cap / 3 + 1);
            let expected = if cap == 0 { 0 } else { bound };
            assert_eq!(s.memory_bytes(), expected, "cap {cap}");
            assert!(s.memory_bytes() as f64 <= 4.0 * cap as f64 * 4.0 / 3.0 + 4.0);
        }
        // r = 1/8 of a 1M-row table: 1/6 of MFU's counters, give or take a slot.
        let s = SsuList::new(125_000, 2, 0);
        assert!(s.memory_bytes() as u64 <= mfu_memory_bytes(1_000_000) / 6 + 4);
        // Filling it never grows it.
        let mut s = SsuList::new(1000, 1, 0);
        s.observe(&(0..50_000).collect::<Vec<_>>());
        assert_eq!(s.memory_bytes(), 4 * 1334);
    }
}
