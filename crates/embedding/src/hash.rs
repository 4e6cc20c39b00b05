//! Stable id hashing, shard routing and deterministic initialization.
//!
//! Everything here is a pure function of its integer arguments, computed with integer
//! arithmetic only (plus one correctly rounded `sqrt`), so every process on every platform
//! agrees on it. Changing any formula here invalidates every checkpoint: the frozen-value
//! tests in this module guard against that.

use elastrec_common::splitmix::{mix64, GOLDEN_GAMMA};
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::error::{EmbeddingError, Result};

/// Which shard of how many a store or table holds. A single-process store is `SINGLE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ShardSpec {
    /// This shard's index, `< count`.
    pub index: u32,
    /// Number of shards every table is split into.
    pub count: u32,
}

impl ShardSpec {
    /// The whole table in one shard.
    pub const SINGLE: ShardSpec = ShardSpec { index: 0, count: 1 };

    /// Shard `index` of `count`, checked.
    pub fn new(index: u32, count: u32) -> Result<Self> {
        if count == 0 || index >= count {
            return Err(EmbeddingError::InvalidShard { index, count });
        }
        Ok(Self { index, count })
    }
}

/// Salt mixed into the id hash: the ASCII bytes of `"elastrec"` read as a big-endian `u64`.
pub const HASH_SALT: u64 = 0x656c_6173_7472_6563;

/// Salt mixed into the initialization hash, so init values are unrelated to id routing.
pub const INIT_SALT: u64 = 0x696e_6974_5f72_6f77; // "init_row"

/// Row of table `table` (with `rows` rows) that stores raw categorical value `id`.
///
/// Exact formula (frozen; see the crate docs):
///
/// ```text
/// row_of(table, id, rows) = xxh3_64_with_seed(id.to_le_bytes(), HASH_SALT ^ table) % rows
/// ```
///
/// `MISSING_CATEGORY` (`1 << 32`) is hashed like any other id, so empty fields share one
/// learned "missing" row per table.
///
/// # Panics
/// If `rows == 0` (a validated [`crate::EmbeddingConfig`] never has an empty table).
#[inline]
pub fn row_of(table: usize, id: u64, rows: u64) -> u64 {
    xxh3_64_with_seed(&id.to_le_bytes(), HASH_SALT ^ table as u64) % rows
}

/// Parameter-server shard that owns `row` of `table` among `num_shards` shards.
///
/// Exact formula: `(row % num_shards + table % num_shards) % num_shards`, i.e. rows are dealt
/// round-robin and each table's deal starts one shard later than the previous table's, so the
/// many tiny Criteo tables do not all land their row 0 on shard 0.
///
/// Routing needs only `(table, row, num_shards)`, so rows exported under one shard count can be
/// re-routed to another shard count without any other information.
#[inline]
pub fn shard_of(table: usize, row: u64, num_shards: u32) -> u32 {
    let n = u64::from(num_shards);
    ((row % n + table as u64 % n) % n) as u32
}

/// Dense position of a global row inside the shard that owns it: `row / num_shards`.
///
/// The rows owned by one shard are `residue, residue + n, residue + 2n, ...`, so their local
/// indices are exactly `0, 1, 2, ...`: a shard is a dense arena with no per-row map.
#[inline]
pub fn local_index(row: u64, num_shards: u32) -> u64 {
    row / u64::from(num_shards)
}

/// Smallest global row owned by `shard` in `table`: every owned row is `residue + k * n`.
#[inline]
pub fn shard_residue(table: usize, shard: u32, num_shards: u32) -> u64 {
    let n = u64::from(num_shards);
    (u64::from(shard) + n - table as u64 % n) % n
}

/// Number of rows of a `rows`-row table that `shard` of `num_shards` owns.
#[inline]
pub fn shard_rows(table: usize, rows: u64, shard: u32, num_shards: u32) -> u64 {
    let residue = shard_residue(table, shard, num_shards);
    if residue >= rows {
        0
    } else {
        (rows - residue).div_ceil(u64::from(num_shards))
    }
}

/// Inverse of [`local_index`] for the rows of `shard`: the global row stored at `local`.
#[inline]
pub fn global_row(table: usize, local: u64, shard: u32, num_shards: u32) -> u64 {
    local * u64::from(num_shards) + shard_residue(table, shard, num_shards)
}

/// Half-width of the initial uniform distribution of a `rows`-row table: `1 / sqrt(rows)`
/// (as DLRM initializes its embedding bags), computed in `f64` and rounded to `f32`.
#[inline]
pub fn init_bound(rows: u64) -> f32 {
    (1.0 / (rows as f64).sqrt()) as f32
}

/// Writes the initial weights of global row `row` of `table` into `out` (`out.len()` = dim).
///
/// Counter-based, so a row's values depend only on `(seed, table, row, component)`, never on
/// the order of initialization or on sharding:
///
/// ```text
/// key   = xxh3_64_with_seed(table.to_le_bytes() ++ row.to_le_bytes(), seed ^ INIT_SALT)
/// u_j   = (mix64(key + (j + 1) * 0x9e3779b97f4a7c15) >> 40) * 2^-24        // in [0, 1)
/// w_j   = (2 * u_j - 1) * bound                                           // bound = init_bound(rows)
/// ```
///
/// `mix64` is the SplitMix64 finalizer ([`elastrec_common::mix64`]).
#[inline]
pub fn init_row(seed: u64, table: usize, row: u64, bound: f32, out: &mut [f32]) {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&(table as u64).to_le_bytes());
    bytes[8..].copy_from_slice(&row.to_le_bytes());
    let key = xxh3_64_with_seed(&bytes, seed ^ INIT_SALT);
    const INV_2_24: f32 = 1.0 / (1u32 << 24) as f32;
    for (j, w) in out.iter_mut().enumerate() {
        let h = mix64(key.wrapping_add((j as u64 + 1).wrapping_mul(GOLDEN_GAMMA)));
        let u = (h >> 40) as f32 * INV_2_24;
        *w = (2.0 * u - 1.0) * bound;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frozen forever: these rows are baked into every checkpoint ever written. If this test
    /// fails, the hash changed and old checkpoints would silently map ids to wrong rows.
    #[test]
    fn row_of_is_frozen() {
        let cases: [(usize, u64, u64); 8] = [
            (0, 0, 1_000_000),
            (0, 1, 1_000_000),
            (1, 1, 1_000_000),
            (3, 0x68fd_1e64, 10_131_227),
            (25, 0xdead_beef, 142_572),
            (7, 1 << 32, 633),
            (12, u64::MAX, 4_000_000),
            (25, 42, 3),
        ];
        let got: Vec<u64> = cases
            .iter()
            .map(|&(t, id, rows)| row_of(t, id, rows))
            .collect();
        let expected: [u64; 8] = [
            155_355, 382_125, 509_340, 2_252_772, 71_980, 482, 389_060, 1,
        ];
        assert_eq!(
            got, expected,
            "row_of changed: checkpoints would be remapped"
        );
    }

    #[test]
    fn init_row_is_frozen() {
        let mut w = [0f32; 4];
        init_row(7, 2, 12345, 0.5, &mut w);
        let bits: Vec<u32> = w.iter().map(|x| x.to_bits()).collect();
        assert_eq!(
            bits,
            [1_054_972_140, 3_191_973_228, 3_202_996_376, 1_040_382_176],
            "init_row changed"
        );
        assert!(w.iter().all(|x| x.abs() <= 0.5));
    }

    #[test]
    fn shard_layout_is_dense_and_invertible() {
        for num_shards in 1..=5u32 {
            for table in 0..7usize {
                for rows in [1u64, 2, 3, 4, 5, 17, 100] {
                    let mut seen = vec![0u64; num_shards as usize];
                    for row in 0..rows {
                        let s = shard_of(table, row, num_shards);
                        let local = local_index(row, num_shards);
                        assert_eq!(local, seen[s as usize], "shard arena must be dense");
                        seen[s as usize] += 1;
                        assert_eq!(global_row(table, local, s, num_shards), row);
                    }
                    for s in 0..num_shards {
                        assert_eq!(seen[s as usize], shard_rows(table, rows, s, num_shards));
                    }
                }
            }
        }
    }

    #[test]
    fn shard_of_is_frozen() {
        assert_eq!(shard_of(0, 10, 3), 1);
        assert_eq!(shard_of(2, 10, 3), 0);
        assert_eq!(shard_of(5, 0, 2), 1);
        assert_eq!(shard_of(9, 123_456_789, 1), 0);
    }
}
