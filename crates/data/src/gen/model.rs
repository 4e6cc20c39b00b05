//! The synthetic world: per-feature marginals ([`Features`]) and the hidden teacher that
//! turns a row into a click probability ([`Teacher`]).

use super::rng::{fmix32, splitmix64, unit, Rng};
use crate::criteo;
use crate::raw::RawRow;

/// Published per-feature cardinalities of the Criteo Kaggle (display advertising) data.
pub const CRITEO_KAGGLE_CARDINALITIES: [u64; criteo::CATEGORICAL] = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992,
    5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
];

/// Missing rate of each integer feature (close to the real Criteo data).
const INT_MISSING: [f64; criteo::DENSE] = [
    0.45, 0.001, 0.21, 0.22, 0.026, 0.22, 0.043, 0.0005, 0.043, 0.45, 0.043, 0.76, 0.22,
];
/// Lomax scale of each integer feature (roughly its typical magnitude).
const INT_SCALE: [f64; criteo::DENSE] = [
    1.5, 30.0, 8.0, 4.0, 3000.0, 60.0, 6.0, 10.0, 50.0, 0.4, 2.0, 0.3, 5.0,
];
/// Lomax tail exponent of each integer feature (smaller = heavier tail).
const INT_ALPHA: [f64; criteo::DENSE] = [
    1.6, 1.1, 1.3, 2.0, 1.2, 1.3, 1.3, 2.0, 1.4, 3.0, 1.6, 1.5, 1.8,
];
/// Largest generated integer.
const INT_CAP: f64 = 1e8;
/// Missing rate of each categorical feature (close to the real Criteo data; at least
/// 0.05% so that every field is sometimes empty).
const CAT_MISSING: [f64; criteo::CATEGORICAL] = [
    0.0005, 0.0005, 0.034, 0.034, 0.0005, 0.12, 0.0005, 0.0005, 0.0005, 0.0005, 0.0005, 0.034,
    0.0005, 0.0005, 0.0005, 0.034, 0.0005, 0.0005, 0.44, 0.44, 0.034, 0.76, 0.0005, 0.034, 0.44,
    0.44,
];

/// Knots of the tabulated inverse CDFs (linear interpolation between knots).
const KNOTS: usize = 1024;
/// Integer features use the table below this quantile and the exact formula above it
/// (the Lomax tail is too steep to interpolate).
const INT_TABLE_MAX_U: f64 = 0.99;

/// A monotone function of `u in [0, 1]` tabulated at `KNOTS + 1` points.
#[derive(Debug, Clone)]
struct Table {
    knots: Vec<f64>,
}

impl Table {
    fn new(f: impl Fn(f64) -> f64) -> Self {
        Self {
            knots: (0..=KNOTS).map(|i| f(i as f64 / KNOTS as f64)).collect(),
        }
    }

    #[inline]
    fn eval(&self, u: f64) -> f64 {
        let t = u * KNOTS as f64;
        let i = (t as usize).min(KNOTS - 1);
        let fr = t - i as f64;
        let (a, b) = (self.knots[i], self.knots[i + 1]);
        a + fr * (b - a)
    }
}

/// Rank used for an empty categorical field in the teacher (its own "id").
pub(crate) const MISSING_RANK: u32 = u32::MAX;

/// Per-feature marginal distributions (independent of the seed: the data's shape depends
/// only on `scale`).
#[derive(Debug, Clone)]
pub(crate) struct Features {
    pub(crate) cards: [u64; criteo::CATEGORICAL],
    /// Inverse CDF of each categorical feature's rank distribution (`x >= 1`).
    zipf: Vec<Table>,
    /// Inverse CDF of each integer feature below [`INT_TABLE_MAX_U`], in units of the
    /// scale.
    lomax: Vec<Table>,
    keys: [u32; criteo::CATEGORICAL],
}

impl Features {
    pub(crate) fn new(scale: f64) -> Self {
        let mut cards = [0u64; criteo::CATEGORICAL];
        let mut zipf = Vec::with_capacity(criteo::CATEGORICAL);
        let mut keys = [0u32; criteo::CATEGORICAL];
        for f in 0..criteo::CATEGORICAL {
            let n = ((CRITEO_KAGGLE_CARDINALITIES[f] as f64 * scale).round() as u64).max(2);
            cards[f] = n;
            // Exponent in [1.05, 1.2], fixed per feature.
            let s = 1.05 + 0.15 * unit(splitmix64(0xC0FFEE ^ f as u64));
            // Inverse CDF of the continuous power law on [1, n+1).
            let a = ((n + 1) as f64).powf(1.0 - s) - 1.0;
            let inv = 1.0 / (1.0 - s);
            zipf.push(Table::new(|u| (1.0 + u * a).powf(inv)));
            keys[f] = splitmix64(0x5EED_0000 + f as u64) as u32;
        }
        let lomax = (0..criteo::DENSE)
            .map(|f| {
                let alpha = INT_ALPHA[f];
                Table::new(|t| (1.0 - t * INT_TABLE_MAX_U).powf(-1.0 / alpha) - 1.0)
            })
            .collect();
        Self {
            cards,
            zipf,
            lomax,
            keys,
        }
    }

    /// Zipf-like rank in `0..card`.
    #[inline]
    fn rank(&self, f: usize, u: f64) -> u32 {
        let x = self.zipf[f].eval(u);
        ((x as u64).saturating_sub(1)).min(self.cards[f] - 1) as u32
    }

    /// Heavy-tailed (Lomax) count of integer feature `f` at quantile `u`.
    #[inline]
    fn count(&self, f: usize, u: f64) -> i64 {
        let unit = if u < INT_TABLE_MAX_U {
            self.lomax[f].eval(u / INT_TABLE_MAX_U)
        } else {
            (1.0 - u).powf(-1.0 / INT_ALPHA[f]) - 1.0
        };
        (INT_SCALE[f] * unit).min(INT_CAP) as i64
    }

    /// The 32-bit value written for `rank` of feature `f`: a bijective scramble, so
    /// frequent ids are not small numbers and distinct ranks never collide.
    #[inline]
    pub(crate) fn hex_value(&self, f: usize, rank: u32) -> u32 {
        fmix32(rank.wrapping_mul(0x9E37_79B1) ^ self.keys[f])
    }

    /// Samples one row's features; `ranks[f]` gets the rank (or [`MISSING_RANK`]).
    #[inline]
    pub(crate) fn sample(
        &self,
        rng: &mut Rng,
        row: &mut RawRow,
        ranks: &mut [u32; criteo::CATEGORICAL],
    ) {
        for (f, slot) in row.ints.iter_mut().enumerate() {
            let u = rng.f64();
            *slot = if u < INT_MISSING[f] {
                None
            } else {
                let u = (u - INT_MISSING[f]) / (1.0 - INT_MISSING[f]);
                if f == 1 && u < 0.03 {
                    // Like Criteo's I2, a few small negative values.
                    Some(if u < 0.006 { -2 } else { -1 })
                } else {
                    Some(self.count(f, u))
                }
            };
        }
        for f in 0..criteo::CATEGORICAL {
            let u = rng.f64();
            if u < CAT_MISSING[f] {
                row.cats[f] = None;
                ranks[f] = MISSING_RANK;
            } else {
                let r = self.rank(f, (u - CAT_MISSING[f]) / (1.0 - CAT_MISSING[f]));
                ranks[f] = r;
                row.cats[f] = Some(self.hex_value(f, r));
            }
        }
    }
}

const HIDDEN: usize = 4;
const LATENT: usize = 4;
/// Feature pairs whose latent vectors interact (what DLRM's dot interaction learns).
const PAIRS: [(usize, usize); 6] = [(0, 1), (4, 5), (7, 13), (2, 8), (12, 16), (3, 10)];
/// Share of the logit variance of each component: dense linear, dense nonlinear, per-id
/// effects, pairwise latent dots.
const SHARES: [f64; 4] = [0.30, 0.10, 0.42, 0.18];
/// Number of components.
pub(crate) const COMPONENTS: usize = 4;

/// The hidden teacher model. Per-id parameters are hashes of (seed, feature, rank), so
/// no table is stored whatever the cardinality.
#[derive(Debug, Clone)]
pub(crate) struct Teacher {
    key: u64,
    dense_mean: [f64; criteo::DENSE],
    dense_inv_std: [f64; criteo::DENSE],
    w: [f64; criteo::DENSE],
    a: [[f64; criteo::DENSE]; HIDDEN],
    c: [f64; HIDDEN],
    amp: [f64; criteo::CATEGORICAL],
    /// Ranks below about `r0` carry most of the per-id signal.
    r0: [f64; criteo::CATEGORICAL],
    pub(crate) scales: [f64; COMPONENTS],
    pub(crate) bias: f64,
}

/// Uniform with unit variance, from a hash.
#[inline]
fn hash_unif(h: u64) -> f64 {
    (unit(splitmix64(h)) * 2.0 - 1.0) * 1.732_050_807_568_877_2
}

impl Teacher {
    /// A teacher with random weights from `seed`; normalization and scales still unset.
    pub(crate) fn new(seed: u64) -> Self {
        let mut rng = Rng::new(seed ^ 0x7EAC_4E55);
        let mut g = || rng.f64() * 2.0 - 1.0;
        let w = std::array::from_fn(|_| g());
        let a = std::array::from_fn(|_| std::array::from_fn(|_| g()));
        let c = std::array::from_fn(|_| g());
        let amp = std::array::from_fn(|_| 0.3 + 0.7 * (g() * 0.5 + 0.5));
        Teacher {
            key: splitmix64(seed ^ 0x1D5_1D5),
            dense_mean: [0.0; criteo::DENSE],
            dense_inv_std: [1.0; criteo::DENSE],
            w,
            a,
            c,
            amp,
            r0: [40.0; criteo::CATEGORICAL],
            scales: [1.0; COMPONENTS],
            bias: 0.0,
        }
    }

    #[inline]
    fn id_hash(&self, f: usize, rank: u32, k: usize) -> u64 {
        self.key ^ ((f as u64) << 56) ^ ((k as u64) << 48) ^ (rank as u64).wrapping_mul(0x9E37_79B9)
    }

    #[inline]
    fn decay(&self, f: usize, rank: u32) -> f64 {
        if rank == MISSING_RANK {
            1.0
        } else {
            self.r0[f] / (self.r0[f] + rank as f64)
        }
    }

    /// Unscaled component values of a row.
    #[inline]
    pub(crate) fn components(
        &self,
        row: &RawRow,
        ranks: &[u32; criteo::CATEGORICAL],
    ) -> [f64; COMPONENTS] {
        let z: [f64; criteo::DENSE] = std::array::from_fn(|f| {
            let g = crate::raw::transform_dense_fast(row.ints[f].unwrap_or(0)) as f64;
            (g - self.dense_mean[f]) * self.dense_inv_std[f]
        });
        let lin: f64 = z.iter().zip(&self.w).map(|(z, w)| z * w).sum();
        let mut nl = 0.0;
        for h in 0..HIDDEN {
            let pre: f64 = z.iter().zip(&self.a[h]).map(|(z, a)| z * a).sum();
            nl += self.c[h] * (0.5 * pre).tanh();
        }
        let mut ids = 0.0;
        for (f, &rank) in ranks.iter().enumerate() {
            ids += self.amp[f] * self.decay(f, rank) * hash_unif(self.id_hash(f, rank, 0));
        }
        let mut pairs = 0.0;
        for &(fa, fb) in &PAIRS {
            let (ra, rb) = (ranks[fa], ranks[fb]);
            let d = self.decay(fa, ra) * self.decay(fb, rb);
            let mut dot = 0.0;
            for k in 1..=LATENT {
                dot += hash_unif(self.id_hash(fa, ra, k)) * hash_unif(self.id_hash(fb, rb, k));
            }
            pairs += d * dot;
        }
        [lin, nl, ids, pairs]
    }

    /// The teacher's logit for a row.
    #[inline]
    pub(crate) fn logit(&self, row: &RawRow, ranks: &[u32; criteo::CATEGORICAL]) -> f64 {
        self.bias + self.signal(row, ranks)
    }

    /// The logit without the bias: the scaled components.
    #[inline]
    pub(crate) fn signal(&self, row: &RawRow, ranks: &[u32; criteo::CATEGORICAL]) -> f64 {
        let c = self.components(row, ranks);
        c.iter().zip(&self.scales).map(|(c, s)| c * s).sum::<f64>()
    }

    /// Fits normalization, component scales (total logit std `target_std`, split by
    /// [`SHARES`]) and the bias (mean click probability `ctr`) on a calibration sample.
    pub(crate) fn calibrate(
        &mut self,
        features: &Features,
        seed: u64,
        n: usize,
        target_std: f64,
        ctr: f64,
    ) {
        let rows = calibration_rows(features, seed, n);
        for f in 0..criteo::DENSE {
            let g: Vec<f64> = rows
                .iter()
                .map(|(r, _)| crate::raw::transform_dense_fast(r.ints[f].unwrap_or(0)) as f64)
                .collect();
            let (mean, std) = mean_std(&g);
            self.dense_mean[f] = mean;
            self.dense_inv_std[f] = if std > 1e-9 { 1.0 / std } else { 0.0 };
        }
        let comps: Vec<[f64; COMPONENTS]> =
            rows.iter().map(|(r, k)| self.components(r, k)).collect();
        for c in 0..COMPONENTS {
            let v: Vec<f64> = comps.iter().map(|x| x[c]).collect();
            let (_, std) = mean_std(&v);
            self.scales[c] = if std > 1e-12 {
                target_std * SHARES[c].sqrt() / std
            } else {
                0.0
            };
        }
        let signals: Vec<f64> = comps
            .iter()
            .map(|x| x.iter().zip(&self.scales).map(|(c, s)| c * s).sum())
            .collect();
        self.bias = bias_for_ctr(&signals, ctr);
    }
}

/// The calibration sample: `n` rows drawn from `features` with a seed of its own.
pub(crate) fn calibration_rows(
    features: &Features,
    seed: u64,
    n: usize,
) -> Vec<(RawRow, [u32; criteo::CATEGORICAL])> {
    let mut rng = Rng::new(seed ^ 0xCA11_B8A7E);
    (0..n)
        .map(|_| {
            let mut row = RawRow::default();
            let mut ranks = [0u32; criteo::CATEGORICAL];
            features.sample(&mut rng, &mut row, &mut ranks);
            (row, ranks)
        })
        .collect()
}

/// The bias that gives logits `signals + bias` a mean click probability of `ctr`
/// (bisection).
pub(crate) fn bias_for_ctr(signals: &[f64], ctr: f64) -> f64 {
    let n = signals.len().max(1) as f64;
    let (mut lo, mut hi) = (-30.0f64, 30.0f64);
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        let mean = signals.iter().map(|l| sigmoid(l + mid)).sum::<f64>() / n;
        if mean < ctr {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

fn mean_std(v: &[f64]) -> (f64, f64) {
    let n = v.len().max(1) as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    (mean, var.sqrt())
}

/// Logistic function.
#[inline]
pub(crate) fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}
