//! Dynamic embedding rows (Monolith / DeepRec style): a collision-free key → slot map that
//! grows as ids are admitted, under a memory budget, with eviction.
//!
//! # Keys
//! A dynamic table hashes an id over the whole 64-bit space: its key is
//! `row_of(t, id, DYNAMIC_KEY_SPACE)` (the same xxh3 as a hashed table, without the
//! modulo), so two ids collide with probability about `n² / 2^65` (one in 3·10^5 for ten
//! million ids) instead of sharing a row as soon as a hashed table is full. Keys are the
//! "global rows" of a dynamic table everywhere (routing with `shard_of`, the wire, snapshots),
//! so workers, parameter servers and checkpoints need no second path.
//!
//! # Rows that are not stored
//! A key without a slot reads as its seeded initial value (`init_row`), exactly the value a
//! hashed table starts that row with: with every id admitted and nothing evicted, a dynamic
//! table trains bit-identically to a hashed table with 2^64 - 1 rows. An update of a key
//! without a slot counts toward its admission; the gradient is dropped until the key is
//! admitted (Monolith's feature filter).
//!
//! # Memory budget
//! Each table gets the bytes of the hashed table it replaces (`rows × (dim + state) × 4`,
//! per shard), and fits as many slots as those bytes hold with the map, the key and the
//! eviction statistics of each slot counted ([`slots_within`]). The map holds only slot
//! numbers (4 bytes and a control byte a bucket; the key is read from the slot), and is
//! allocated at once for twice the slots: at most half full, it never grows, because its
//! deletion markers are cleared by rehashing in place. The rows grow as keys are admitted.
//!
//! # Eviction
//! When an admission finds the table full, one pass evicts the rows that scored worst
//! (least recently updated for LRU, least often updated for LFU, ties to the older), plus
//! 1/32 of the capacity so the next admissions do not pay a pass each: amortized O(1) per
//! admission. Rows updated in the current batch are never evicted by it. LFU halves every
//! count after a pass, so rows hot long ago age out. With `ttl_steps`, rows not updated for
//! that many updates of the table are removed as well (swept every `ttl_steps / 4` updates).
//! Slots stay dense (an evicted slot takes the last row), so exports and checkpoints walk
//! `0..len` and the per-slot access counters of MFU checkpointing stay aligned.

use elastrec_common::splitmix::{derive, mix64};
use hashbrown::HashTable;
use serde::{Deserialize, Serialize};

use crate::error::{EmbeddingError, Result};
use crate::snapshot::{DynamicState, RowUsage};

/// Row count of a dynamic table as seen by hashing and routing: keys are `xxh3 % (2^64 - 1)`.
pub const DYNAMIC_KEY_SPACE: u64 = u64::MAX;

/// Fraction of the capacity an eviction pass frees beyond what the admissions need (1/32).
const EVICTION_SLACK_DIVISOR: usize = 32;

/// Tables whose budget is at most this many rows keep that many slots even when the map's
/// overhead would leave fewer: a few hundred bytes over budget, instead of thrashing a
/// table of tens of values.
pub const MIN_SLOTS: u64 = 64;

/// Slots are `u32`s: no table shard has more.
const MAX_SEARCH_ROWS: u64 = u32::MAX as u64;

/// Bytes of one map bucket: a `u32` slot and a control byte.
const MAP_BUCKET_BYTES: usize = 5;

/// Per-slot bytes beside the row: its key (8), last update step (4) and update count (4).
const SLOT_META_BYTES: usize = 16;

/// How a dynamic table chooses the rows to drop when it is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Eviction {
    /// Least recently updated first.
    #[default]
    Lru,
    /// Least often updated first (counts halve after every pass).
    Lfu,
}

/// Options of dynamic embedding tables. In TOML (every field has a default):
///
/// ```toml
/// admit_count = 1      # updates an id needs before it gets a row (1: at once)
/// eviction = "lru"     # or "lfu"
/// ttl_steps = 0        # > 0: drop rows not updated for this many updates of their table
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DynamicConfig {
    /// Updates (samples) an id needs before it is given a row; counted in a counting Bloom
    /// filter (count-min, 8-bit counters, halved when it has seen 8 adds per counter), so
    /// rare ids cost one byte of shared counters instead of a row. Default 1: admit at once.
    #[serde(default = "default_admit_count")]
    pub admit_count: u32,
    /// Which rows go when the table is full. Default LRU.
    #[serde(default)]
    pub eviction: Eviction,
    /// Rows not updated for this many updates of their table are dropped; 0 (default) keeps
    /// rows until the budget needs their space.
    #[serde(default)]
    pub ttl_steps: u32,
}

fn default_admit_count() -> u32 {
    1
}

impl Default for DynamicConfig {
    fn default() -> Self {
        Self {
            admit_count: default_admit_count(),
            eviction: Eviction::default(),
            ttl_steps: 0,
        }
    }
}

impl DynamicConfig {
    /// Checks the fields.
    pub fn validate(&self) -> Result<()> {
        if self.admit_count == 0 || self.admit_count > u32::from(u8::MAX) {
            return Err(EmbeddingError::Dynamic {
                reason: format!(
                    "admit_count {} must be in 1..=255 (1 admits an id at its first update)",
                    self.admit_count
                ),
            });
        }
        Ok(())
    }
}

/// The map's hash of a key. Keys owned by one of `n` shards share `key % n`, so the low
/// bits the map indexes by must be remixed.
#[inline]
fn map_hash(key: u64) -> u64 {
    mix64(key)
}

/// Buckets hashbrown allocates for `slots` entries (7/8 load, power-of-two bucket counts,
/// at least 4).
fn map_buckets(slots: usize) -> usize {
    if slots == 0 {
        0
    } else if slots < 4 {
        4
    } else if slots < 8 {
        8
    } else {
        (slots * 8 / 7).next_power_of_two()
    }
}

/// Bytes `slots` slots take when full: rows, per-slot statistics, the map, the admission
/// filter.
pub(crate) fn dynamic_bytes(slots: usize, stride: usize, admit_count: u32) -> usize {
    let sketch = if admit_count > 1 {
        sketch_len(slots)
    } else {
        0
    };
    slots * (stride * 4 + SLOT_META_BYTES) + map_buckets(2 * slots) * MAP_BUCKET_BYTES + sketch
}

/// The most slots that fit in the bytes of `budget_rows` hashed rows of `stride` floats
/// (see the module docs), at least `min(budget_rows, MIN_SLOTS)`.
pub fn slots_within(budget_rows: u64, stride: usize, admit_count: u32) -> u64 {
    let budget = budget_rows
        .saturating_mul(stride as u64 * 4)
        .saturating_sub(std::mem::size_of::<DynamicRows>() as u64);
    let fits = |s: u64| dynamic_bytes(s as usize, stride, admit_count) as u64 <= budget;
    // A slot takes more bytes than a hashed row: the budget's rows bound the search.
    let (mut lo, mut hi) = (0u64, budget_rows.min(MAX_SEARCH_ROWS));
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo.max(budget_rows.min(MIN_SLOTS))
}

/// Slots to reserve when `len` slots are full: double, from 1024, but never past
/// `capacity` (imports may go beyond it one slot at a time).
pub(crate) fn growth(len: usize, capacity: usize) -> usize {
    capacity.saturating_sub(len).clamp(1, len.max(1024))
}

fn sketch_len(slots: usize) -> usize {
    slots.max(MIN_SLOTS as usize).next_multiple_of(2)
}

/// Counts of what a dynamic table did since it was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DynamicStats {
    /// Keys given a row.
    pub admitted: u64,
    /// Rows dropped to make room.
    pub evicted: u64,
    /// Rows dropped by the TTL.
    pub expired: u64,
    /// Gradient rows dropped because their key was not (yet) admitted.
    pub filtered: u64,
}

/// What a store's dynamic tables hold and did, summed over its tables.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DynamicSummary {
    /// Rows stored now.
    pub stored_rows: u64,
    /// Rows the budget allows.
    pub slots: u64,
    /// What the tables did.
    #[serde(flatten)]
    pub stats: DynamicStats,
}

impl DynamicSummary {
    /// Adds one table's numbers.
    pub fn add(&mut self, stored: usize, slots: usize, s: DynamicStats) {
        self.stored_rows += stored as u64;
        self.slots += slots as u64;
        self.stats.admitted += s.admitted;
        self.stats.evicted += s.evicted;
        self.stats.expired += s.expired;
        self.stats.filtered += s.filtered;
    }
}

/// The slot bookkeeping of one dynamic table shard (the rows themselves live in the
/// table's arena, slot `s` at `s * stride`).
#[derive(Debug, Clone)]
pub(crate) struct DynamicRows {
    pub config: DynamicConfig,
    /// Rows of the hashed table whose memory this table has (all shards).
    pub budget_rows: u64,
    pub capacity: usize,
    /// Seed and bound of the initial values of keys without a slot.
    pub seed: u64,
    pub bound: f32,
    /// Slot of each stored key (hashed by [`map_hash`] of the slot's key).
    slot_of: HashTable<u32>,
    /// Key of each slot.
    pub keys: Vec<u64>,
    /// Table update count at each slot's last update (wrapping).
    last_used: Vec<u32>,
    /// Updates of each slot (saturating; halved after LFU passes).
    hits: Vec<u32>,
    /// Count-min admission counters, two halves (empty when `admit_count` is 1).
    sketch: Vec<u8>,
    sketch_adds: u64,
    /// Updates of this table so far (wrapping).
    pub step: u32,
    pub stats: DynamicStats,
}

impl DynamicRows {
    pub fn new(
        config: DynamicConfig,
        budget_rows: u64,
        capacity: usize,
        (seed, bound): (u64, f32),
    ) -> Self {
        let slot_of = HashTable::with_capacity(2 * capacity);
        let sketch = if config.admit_count > 1 {
            vec![0; sketch_len(capacity)]
        } else {
            Vec::new()
        };
        Self {
            config,
            budget_rows,
            capacity,
            seed,
            bound,
            slot_of,
            keys: Vec::new(),
            last_used: Vec::new(),
            hits: Vec::new(),
            sketch,
            sketch_adds: 0,
            step: 0,
            stats: DynamicStats::default(),
        }
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    #[inline]
    pub fn slot(&self, key: u64) -> Option<usize> {
        let keys = &self.keys;
        self.slot_of
            .find(map_hash(key), |&s| keys[s as usize] == key)
            .map(|&s| s as usize)
    }

    /// Drops every slot (the rows read as their initial values again).
    pub fn clear(&mut self) {
        self.slot_of.clear();
        self.keys.clear();
        self.last_used.clear();
        self.hits.clear();
        self.sketch.fill(0);
        self.sketch_adds = 0;
    }

    /// Bytes held beside the arena.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + map_buckets(self.slot_of.capacity()) * MAP_BUCKET_BYTES
            + self.keys.capacity() * 8
            + (self.last_used.capacity() + self.hits.capacity()) * 4
            + self.sketch.capacity()
    }

    /// Starts one update of the table: advances the clock and returns the slots the TTL
    /// expires now (descending), which the caller removes.
    pub fn begin_update(&mut self) -> Vec<usize> {
        self.step = self.step.wrapping_add(1);
        let ttl = self.config.ttl_steps;
        if ttl == 0 || !self.step.is_multiple_of((ttl / 4).max(1)) {
            return Vec::new();
        }
        let step = self.step;
        let mut expired: Vec<usize> = (0..self.len())
            .filter(|&s| step.wrapping_sub(self.last_used[s]) > ttl)
            .collect();
        expired.reverse();
        self.stats.expired += expired.len() as u64;
        expired
    }

    /// Marks `slot` updated by one sample now.
    #[inline]
    pub fn touch(&mut self, slot: usize) {
        self.last_used[slot] = self.step;
        self.hits[slot] = self.hits[slot].saturating_add(1);
    }

    /// How `slot` has been used (for a snapshot).
    pub fn usage(&self, slot: usize) -> RowUsage {
        RowUsage {
            idle: self.step.wrapping_sub(self.last_used[slot]),
            hits: self.hits[slot],
        }
    }

    /// Gives `slot` a saved row's usage (a restore), relative to this table's clock.
    pub fn set_usage(&mut self, slot: usize, usage: RowUsage) {
        self.last_used[slot] = self.step.wrapping_sub(usage.idle);
        self.hits[slot] = usage.hits;
    }

    /// The clock and the admission filter, for a checkpoint.
    pub fn state(&self) -> DynamicState {
        DynamicState {
            clock: self.step,
            filter_adds: self.sketch_adds,
            filter: self.sketch.clone(),
        }
    }

    /// Takes a saved shard's clock before its rows' usage is set (usage is relative to
    /// it), and its admission filter when it has this shard's size (the same layout and
    /// `admit_count`; otherwise the filter starts empty, as on a new layout).
    pub fn restore_state(&mut self, saved: &DynamicState) {
        self.step = saved.clock;
        if !saved.filter.is_empty() && saved.filter.len() == self.sketch.len() {
            self.sketch.copy_from_slice(&saved.filter);
            self.sketch_adds = saved.filter_adds;
        }
    }

    /// Counts one update of a key without a slot; true once it has reached `admit_count`.
    pub fn count_toward_admission(&mut self, key: u64) -> bool {
        if self.config.admit_count <= 1 {
            return true;
        }
        let half = self.sketch.len() / 2;
        let a = (derive(key, 1) % half as u64) as usize;
        let b = half + (derive(key, 2) % half as u64) as usize;
        let (ca, cb) = (self.sketch[a], self.sketch[b]);
        // Conservative update: only the smaller counter(s) grow.
        let low = ca.min(cb);
        let new = low.saturating_add(1);
        if ca == low {
            self.sketch[a] = new;
        }
        if cb == low {
            self.sketch[b] = new;
        }
        self.sketch_adds += 1;
        if self.sketch_adds >= 8 * self.sketch.len() as u64 {
            self.sketch.iter_mut().for_each(|c| *c /= 2);
            self.sketch_adds = 0;
        }
        u32::from(new) >= self.config.admit_count
    }

    /// Records `key` at the next slot (the caller appends its row to the arena).
    pub fn push(&mut self, key: u64) -> usize {
        let slot = self.keys.len();
        if slot == self.keys.capacity() {
            let more = growth(slot, self.capacity);
            self.keys.reserve_exact(more);
            self.last_used.reserve_exact(more);
            self.hits.reserve_exact(more);
        }
        self.keys.push(key);
        self.last_used.push(self.step);
        self.hits.push(0);
        let keys = &self.keys;
        self.slot_of
            .insert_unique(map_hash(key), slot as u32, |&s| map_hash(keys[s as usize]));
        self.stats.admitted += 1;
        slot
    }

    /// Removes `slot`, moving the last slot into it (the caller moves the arena row the same
    /// way). Returns the slot that moved, if any.
    pub fn swap_remove(&mut self, slot: usize) -> Option<usize> {
        let last = self.keys.len() - 1;
        let at = |s: usize| move |&v: &u32| v as usize == s;
        if let Ok(entry) = self.slot_of.find_entry(map_hash(self.keys[slot]), at(slot)) {
            entry.remove();
        }
        if slot != last {
            if let Some(v) = self.slot_of.find_mut(map_hash(self.keys[last]), at(last)) {
                *v = slot as u32;
            }
        }
        self.keys.swap_remove(slot);
        self.last_used.swap_remove(slot);
        self.hits.swap_remove(slot);
        (slot != last).then_some(last)
    }

    /// Chooses up to `need` slots (plus the pass's slack) to evict, never one updated in the
    /// current step; descending, so removing them in order moves only kept rows.
    pub fn choose_victims(&mut self, need: usize) -> Vec<usize> {
        let step = self.step;
        let mut candidates: Vec<(u64, usize)> = (0..self.len())
            .filter(|&s| self.last_used[s] != step)
            .map(|s| {
                let age = u64::from(step.wrapping_sub(self.last_used[s]));
                // Smaller sorts first, i.e. is evicted first.
                let score = match self.config.eviction {
                    Eviction::Lru => u64::MAX - age,
                    Eviction::Lfu => (u64::from(self.hits[s]) << 32) | (u64::from(u32::MAX) - age),
                };
                (score, s)
            })
            .collect();
        let take = (need + self.capacity / EVICTION_SLACK_DIVISOR)
            .max(need)
            .min(candidates.len());
        if take < candidates.len() && take > 0 {
            candidates.select_nth_unstable(take - 1);
        }
        let mut victims: Vec<usize> = candidates[..take].iter().map(|&(_, s)| s).collect();
        victims.sort_unstable_by(|a, b| b.cmp(a));
        if self.config.eviction == Eviction::Lfu {
            self.hits.iter_mut().for_each(|h| *h /= 2);
        }
        self.stats.evicted += victims.len() as u64;
        victims
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_fit_the_hashed_tables_bytes() {
        // dim 16 + row-wise accumulator: 68 bytes a row.
        let stride = 17;
        let own = std::mem::size_of::<DynamicRows>() as u64;
        for rows in [1_000u64, 50_000, 1_000_000] {
            let slots = slots_within(rows, stride, 1);
            let used = dynamic_bytes(slots as usize, stride, 1) as u64 + own;
            assert!(
                used <= rows * 68,
                "{slots} slots use {used} > {}",
                rows * 68
            );
            // One more slot would not fit.
            assert!(dynamic_bytes(slots as usize + 1, stride, 1) as u64 + own > rows * 68);
            assert!(slots < rows && slots > rows / 3, "{slots} of {rows}");
        }
        // Tiny tables keep their rows.
        assert_eq!(slots_within(10, stride, 1), 10);
        assert!(slots_within(100, stride, 1) >= 64);
        // The admission filter's byte per slot is paid for with slots.
        let slots = slots_within(50_000, stride, 2) as usize;
        assert!(dynamic_bytes(slots, stride, 2) as u64 + own <= 50_000 * 68);
        assert!(dynamic_bytes(slots, stride, 2) > dynamic_bytes(slots, stride, 1));
    }

    #[test]
    fn admission_counts_repeated_updates() {
        let config = DynamicConfig {
            admit_count: 3,
            ..DynamicConfig::default()
        };
        let mut d = DynamicRows::new(config, 1000, 1000, (0, 0.1));
        assert!(!d.count_toward_admission(42));
        assert!(!d.count_toward_admission(42));
        assert!(d.count_toward_admission(42));
        // Another key has its own count (1000 counters: no collision for these two).
        assert!(!d.count_toward_admission(7));
    }

    #[test]
    fn config_rejects_a_zero_admission_count() {
        let bad = DynamicConfig {
            admit_count: 0,
            ..DynamicConfig::default()
        };
        let err = bad.validate().unwrap_err().to_string();
        assert!(err.contains("admit_count 0"), "{err}");
    }
}
