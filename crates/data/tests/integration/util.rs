//! Shared helpers: deterministic random raw rows and file writers.

use elastrec_data::tsv::write_row;
use elastrec_data::{criteo, RawBatch, RawRow};
use std::io::Write;
use std::path::Path;

/// A tiny LCG so the tests do not depend on the generator under test.
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 16
    }
}

/// `n` random raw rows exercising empties, negatives, large values and all hex digits.
pub fn random_rows(n: usize, seed: u64) -> RawBatch {
    let mut rng = Lcg(seed);
    let mut out = RawBatch::with_capacity(n);
    for _ in 0..n {
        let mut r = RawRow {
            label: (rng.next() % 2) as u8,
            ..RawRow::default()
        };
        for f in 0..criteo::DENSE {
            r.ints[f] = match rng.next() % 10 {
                0 => None,
                1 => Some(-((rng.next() % 3) as i64)),
                2 => Some((rng.next() as i64) << 8),
                _ => Some((rng.next() % 1000) as i64),
            };
        }
        for f in 0..criteo::CATEGORICAL {
            r.cats[f] = if rng.next().is_multiple_of(7) {
                None
            } else {
                Some(rng.next() as u32)
            };
        }
        out.push(&r);
    }
    out
}

pub fn tsv_bytes(rows: &RawBatch) -> Vec<u8> {
    let mut buf = Vec::new();
    for i in 0..rows.len() {
        write_row(&rows.row(i), &mut buf);
    }
    buf
}

pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

pub fn write(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
}
