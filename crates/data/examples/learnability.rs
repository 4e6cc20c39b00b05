//! Checks that the generator's teacher signal is learnable: trains a small factorization
//! machine (per-id weights, bucketized integers, 4-dim latent pairwise dots over all
//! fields, Adagrad) on the first days and compares its held-out lift (AUC - 0.5) with the
//! teacher's.
//!
//! `cargo run --release -p elastrec-data --example learnability -- [rows] [scale] [epochs]`
//! (defaults: 500000 rows, scale 0.01, 2 epochs; the last of 5 days is held out).

#![allow(clippy::needless_range_loop)] // index loops mirror the FM formulas

use elastrec_common::mix64;
use elastrec_data::gen::exact_auc;
use elastrec_data::{criteo, generate, read_all, BadRowPolicy, Batch, GenSpec};

const K: usize = 4;
const BITS: u32 = 22;
const FIELDS: usize = criteo::DENSE + criteo::CATEGORICAL;

struct Fm {
    w: Vec<f32>,
    v: Vec<f32>,
    gw: Vec<f32>,
    gv: Vec<f32>,
    bias: f32,
    gb: f32,
}

fn slots(b: &Batch, i: usize, out: &mut [usize; FIELDS]) {
    for (f, &x) in b.dense_row(i).iter().enumerate() {
        let bucket = (x * 2.0) as u64; // ln(1+x) in half-units
        out[f] = (mix64(((f as u64) << 40) ^ bucket) >> (64 - BITS)) as usize;
    }
    for (f, &id) in b.sparse_row(i).iter().enumerate() {
        out[criteo::DENSE + f] =
            (mix64((((criteo::DENSE + f) as u64) << 40) ^ id) >> (64 - BITS)) as usize;
    }
}

impl Fm {
    fn new() -> Self {
        let n = 1usize << BITS;
        let mut seed = 1u64;
        let v = (0..n * K)
            .map(|_| {
                seed = mix64(seed.wrapping_add(0x9E37_79B9_7F4A_7C15));
                ((seed >> 11) as f32 / (1u64 << 53) as f32 - 0.5) * 0.02
            })
            .collect();
        Self {
            w: vec![0.0; n],
            v,
            gw: vec![1e-6; n],
            gv: vec![1e-6; n * K],
            bias: 0.0,
            gb: 1e-6,
        }
    }

    fn logit(&self, s: &[usize; FIELDS], sum: &mut [f32; K]) -> f32 {
        let mut z = self.bias;
        *sum = [0.0; K];
        let mut sq = 0.0;
        for &j in s {
            z += self.w[j];
            for k in 0..K {
                let x = self.v[j * K + k];
                sum[k] += x;
                sq += x * x;
            }
        }
        z + 0.5 * (sum.iter().map(|x| x * x).sum::<f32>() - sq)
    }

    fn step(&mut self, s: &[usize; FIELDS], y: f32, lr: f32) {
        let mut sum = [0.0; K];
        let p = 1.0 / (1.0 + (-self.logit(s, &mut sum)).exp());
        let g = p - y;
        self.gb += g * g;
        self.bias -= lr * g / self.gb.sqrt();
        for &j in s {
            self.gw[j] += g * g;
            self.w[j] -= lr * g / self.gw[j].sqrt();
            for k in 0..K {
                let x = self.v[j * K + k];
                let gk = g * (sum[k] - x) + 1e-5 * x;
                self.gv[j * K + k] += gk * gk;
                self.v[j * K + k] -= lr * gk / self.gv[j * K + k].sqrt();
            }
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rows: u64 = args.get(1).map_or(500_000, |s| s.parse().unwrap());
    let scale: f64 = args.get(2).map_or(0.01, |s| s.parse().unwrap());
    let epochs: usize = args.get(3).map_or(2, |s| s.parse().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let spec = GenSpec {
        out: dir.path().to_path_buf(),
        rows,
        scale,
        days: 5,
        ..GenSpec::new("", 0)
    };
    let report = generate(&spec).unwrap();
    println!(
        "generated {rows} rows in {:.2}s ({:.0} rows/s), click rate {:.4}, teacher AUC {:.4}",
        report.generation_secs, report.rows_per_sec, report.click_rate, report.teacher_auc
    );
    let mut train = Batch::default();
    for d in 0..4 {
        let (b, _) =
            read_all(&dir.path().join(format!("day_{d}.tsv")), BadRowPolicy::Fail).unwrap();
        train.extend_from(&b, 0..b.len());
    }
    let (test, _) = read_all(&dir.path().join("day_4.tsv"), BadRowPolicy::Fail).unwrap();
    let mut fm = Fm::new();
    let mut s = [0usize; FIELDS];
    for epoch in 0..epochs {
        for i in 0..train.len() {
            slots(&train, i, &mut s);
            fm.step(&s, train.labels[i], 0.05);
        }
        let mut sum = [0.0; K];
        let scores: Vec<f32> = (0..test.len())
            .map(|i| {
                slots(&test, i, &mut s);
                fm.logit(&s, &mut sum)
            })
            .collect();
        let labels: Vec<u8> = test.labels.iter().map(|&l| l as u8).collect();
        let auc = exact_auc(&scores, &labels).unwrap();
        println!(
            "epoch {}: held-out AUC {auc:.4}, lift ratio {:.3} of teacher",
            epoch + 1,
            (auc - 0.5) / (report.teacher_auc - 0.5)
        );
    }
}
