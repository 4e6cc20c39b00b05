//! The operators' kernels: one pass over a block of rows of one column, nulls as sentinels
//! ([`super::types`]), no allocation. Written so that the compiler vectorizes the simple
//! ones (selects instead of branches); `ln`, `powf` and the hashes are scalar.

use std::sync::OnceLock;

use elastrec_common::splitmix::{mix64, splitmix64, GOLDEN_GAMMA};

use crate::columns::{NULL_ID, NULL_INT};

/// `fill_null` on ints.
pub fn fill_null_int(v: &mut [i64], fill: i64) {
    for x in v {
        *x = if *x == NULL_INT { fill } else { *x };
    }
}

/// `fill_null` on floats.
pub fn fill_null_float(v: &mut [f64], fill: f64) {
    for x in v {
        *x = if x.is_nan() { fill } else { *x };
    }
}

/// `fill_null` on ids.
pub fn fill_null_id(v: &mut [u64], fill: u64) {
    for x in v {
        *x = if *x == NULL_ID { fill } else { *x };
    }
}

/// `clamp` on ints; nulls stay null.
pub fn clamp_int(v: &mut [i64], lo: i64, hi: i64) {
    for x in v {
        let c = (*x).clamp(lo, hi);
        *x = if *x == NULL_INT { NULL_INT } else { c };
    }
}

/// `clamp` on floats; NaN (null) stays NaN.
pub fn clamp_float(v: &mut [f64], lo: f64, hi: f64) {
    for x in v {
        // Comparisons with NaN are false, so a null passes through unchanged.
        *x = if *x < lo {
            lo
        } else if *x > hi {
            hi
        } else {
            *x
        };
    }
}

/// `clamp` on ids; nulls stay null.
pub fn clamp_id(v: &mut [u64], lo: u64, hi: u64) {
    for x in v {
        let c = (*x).clamp(lo, hi);
        *x = if *x == NULL_ID { NULL_ID } else { c };
    }
}

/// Entries of the `ln(x + 1)` table for small integers.
const LN_TABLE: usize = 4096;

fn ln_table() -> &'static [f64] {
    static TABLE: OnceLock<Vec<f64>> = OnceLock::new();
    TABLE.get_or_init(|| (0..LN_TABLE).map(|x| (x as f64 + 1.0).ln()).collect())
}

/// `log1p` of ints: `ln(x + 1)` computed in `f64` from the exact `x + 1` (so the default
/// Criteo graph gives the bits of `Batch::transform_dense`); `x <= -1` and null give null.
pub fn log1p_int(src: &[i64], dst: &mut [f64]) {
    let table = ln_table();
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = match table.get(x as u64 as usize) {
            Some(&v) => v,
            None if x > -1 && x != NULL_INT => (x as f64 + 1.0).ln(),
            None => f64::NAN,
        };
    }
}

/// `log1p` of floats; `x <= -1` gives null.
pub fn log1p_float(v: &mut [f64]) {
    for x in v {
        let y = x.ln_1p();
        *x = if y.is_finite() { y } else { f64::NAN };
    }
}

/// `logit(eps)`: `ln(p / (1 - p))`, `p` clamped to `[eps, 1 - eps]`.
pub fn logit(v: &mut [f64], eps: f64) {
    for x in v {
        let p = if *x < eps {
            eps
        } else if *x > 1.0 - eps {
            1.0 - eps
        } else {
            *x
        };
        *x = (p / (1.0 - p)).ln();
    }
}

/// `box_cox(lambda)`; `x <= 0` gives null.
pub fn box_cox(v: &mut [f64], lambda: f64) {
    for x in v {
        let y = if *x <= 0.0 || x.is_nan() {
            f64::NAN
        } else if lambda == 0.0 {
            x.ln()
        } else {
            (x.powf(lambda) - 1.0) / lambda
        };
        *x = if y.is_finite() { y } else { f64::NAN };
    }
}

/// `bucketize(borders)`: the number of borders `<= x`; null stays null.
pub fn bucketize(src: &[f64], borders: &[f64], dst: &mut [u64]) {
    if borders.len() <= 16 {
        // A branch-free count beats a binary search on short lists.
        for (d, &x) in dst.iter_mut().zip(src) {
            let n = borders.iter().map(|&b| u64::from(b <= x)).sum::<u64>();
            *d = if x.is_nan() { NULL_ID } else { n };
        }
    } else {
        for (d, &x) in dst.iter_mut().zip(src) {
            *d = if x.is_nan() {
                NULL_ID
            } else {
                borders.partition_point(|&b| b <= x) as u64
            };
        }
    }
}

/// `bucketize(borders)` of ints, compared as `f64`; null stays null.
pub fn bucketize_int(src: &[i64], borders: &[f64], dst: &mut [u64]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        let v = x as f64;
        *d = if x == NULL_INT {
            NULL_ID
        } else if borders.len() <= 16 {
            borders.iter().map(|&b| u64::from(b <= v)).sum::<u64>()
        } else {
            borders.partition_point(|&b| b <= v) as u64
        };
    }
}

/// The salt as the hash uses it.
pub fn sigrid_salt(salt: u64) -> u64 {
    splitmix64(salt)
}

/// One `sigrid_hash`: `mix64(id ^ splitmix64(salt))` reduced to `0..modulus` by a
/// multiply-shift (Lemire's fast range), which is uniform like `%` and much cheaper.
#[inline]
pub fn sigrid_one(id: u64, mixed_salt: u64, modulus: u64) -> u64 {
    ((u128::from(mix64(id ^ mixed_salt)) * u128::from(modulus)) >> 64) as u64
}

/// `sigrid_hash` in place; null stays null.
pub fn sigrid_hash(v: &mut [u64], mixed_salt: u64, modulus: u64) {
    for x in v {
        let h = sigrid_one(*x, mixed_salt, modulus);
        *x = if *x == NULL_ID { NULL_ID } else { h };
    }
}

/// `ngram`: one gram from the columns of its window (see [`gram`]).
pub fn ngram(window: &[&[u64]], dst: &mut [u64]) {
    for (r, d) in dst.iter_mut().enumerate() {
        *d = gram(window.iter().map(|col| col[r]));
    }
}

/// One gram of `ids` in order: `h = GOLDEN_GAMMA`, then `h = mix64(h ^ x)` for each id.
/// A null anywhere gives null; a gram that lands on the null sentinel is moved one below
/// it.
#[inline]
pub fn gram(ids: impl IntoIterator<Item = u64>) -> u64 {
    let mut h = GOLDEN_GAMMA;
    let mut null = false;
    for x in ids {
        null |= x == NULL_ID;
        h = mix64(h ^ x);
    }
    if null {
        NULL_ID
    } else if h == NULL_ID {
        NULL_ID - 1
    } else {
        h
    }
}

/// `map_id`: `map` sorted by key; unlisted ids become `default` (null without one).
pub fn map_id(v: &mut [u64], map: &[(u64, u64)], default: Option<u64>) {
    let other = default.unwrap_or(NULL_ID);
    for x in v {
        if *x == NULL_ID {
            continue;
        }
        *x = match map.binary_search_by_key(x, |&(k, _)| k) {
            Ok(i) => map[i].1,
            Err(_) => other,
        };
    }
}

/// `onehot(n)`: column `j` of `dst` is 1 where the id is `j`.
pub fn onehot(src: &[u64], dst: &mut [&mut [f64]]) {
    for (j, col) in dst.iter_mut().enumerate() {
        for (d, &x) in col.iter_mut().zip(src) {
            *d = f64::from(u8::from(x == j as u64));
        }
    }
}

/// `multihot(n)`: column `j` of `dst` is 1 where any id of the list is `j`.
pub fn multihot(src: &[&[u64]], dst: &mut [&mut [f64]]) {
    for (j, col) in dst.iter_mut().enumerate() {
        col.fill(0.0);
        for s in src {
            for (d, &x) in col.iter_mut().zip(s.iter()) {
                *d = if x == j as u64 { 1.0 } else { *d };
            }
        }
    }
}

/// `cast(float)` of ints; null stays null.
pub fn int_to_float(src: &[i64], dst: &mut [f64]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = if x == NULL_INT { f64::NAN } else { x as f64 };
    }
}

/// `cast(float)` of ids; null stays null.
pub fn id_to_float(src: &[u64], dst: &mut [f64]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = if x == NULL_ID { f64::NAN } else { x as f64 };
    }
}

/// 2^63 and 2^64, exact in `f64`.
const TWO_63: f64 = (1u64 << 63) as f64;
const TWO_64: f64 = 2.0 * TWO_63;

/// `cast(int)` of floats: toward zero; null, NaN and values out of range give null.
pub fn float_to_int(src: &[f64], dst: &mut [i64]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        let t = x.trunc();
        // Both bounds are exact in f64 (±2^63); -2^63 itself is the null sentinel.
        *d = if t > -TWO_63 && t < TWO_63 {
            t as i64
        } else {
            NULL_INT
        };
    }
}

/// `cast(int)` of ids: above `i64::MAX` gives null.
pub fn id_to_int(src: &[u64], dst: &mut [i64]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = i64::try_from(x).unwrap_or(NULL_INT);
    }
}

/// `cast(id)` of ints: negative values and null give null.
pub fn int_to_id(src: &[i64], dst: &mut [u64]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = if x < 0 { NULL_ID } else { x as u64 };
    }
}

/// `cast(id)` of floats: toward zero; negative, NaN and too large give null.
pub fn float_to_id(src: &[f64], dst: &mut [u64]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        let t = x.trunc();
        *d = if (0.0..TWO_64).contains(&t) {
            t as u64
        } else {
            NULL_ID
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log1p_of_ints_has_the_bits_of_the_criteo_transform() {
        let xs: Vec<i64> = vec![0, 1, 2, 7, 4095, 4096, 4097, 123_456_789, i64::MAX];
        let mut out = vec![0.0; xs.len()];
        log1p_int(&xs, &mut out);
        for (x, y) in xs.iter().zip(&out) {
            assert_eq!(
                (*y as f32).to_bits(),
                crate::Batch::transform_dense(*x).to_bits(),
                "x = {x}"
            );
        }
        let mut out = vec![0.0; 3];
        log1p_int(&[-1, -5, NULL_INT], &mut out);
        assert!(out.iter().all(|v| v.is_nan()));
    }

    #[test]
    fn clamp_keeps_nulls() {
        let mut v = vec![f64::NAN, -3.0, 0.5, 9.0];
        clamp_float(&mut v, 0.0, 1.0);
        assert!(v[0].is_nan());
        assert_eq!(&v[1..], &[0.0, 0.5, 1.0]);
        let mut v = vec![NULL_INT, -3, 5];
        clamp_int(&mut v, 0, 4);
        assert_eq!(v, vec![NULL_INT, 0, 4]);
    }

    #[test]
    fn bucketize_short_and_long_border_lists_agree() {
        let short: Vec<f64> = (0..10).map(|i| (i * i) as f64).collect();
        let long: Vec<f64> = (0..40).map(|i| (i * i) as f64).collect();
        let xs: Vec<f64> = (-3..90)
            .map(|i| i as f64 * 0.97)
            .chain([f64::NAN])
            .collect();
        let (mut a, mut b) = (vec![0; xs.len()], vec![0; xs.len()]);
        bucketize(&xs, &short, &mut a);
        bucketize(&xs, &long[..10], &mut b);
        assert_eq!(a, b);
        bucketize(&xs, &long, &mut b);
        for (x, (&n, &m)) in xs.iter().zip(a.iter().zip(&b)) {
            if x.is_nan() {
                assert_eq!((n, m), (NULL_ID, NULL_ID));
            } else {
                assert_eq!(m as usize, long.iter().filter(|&&l| l <= *x).count());
                assert_eq!(n as usize, short.iter().filter(|&&l| l <= *x).count());
            }
        }
    }
}
