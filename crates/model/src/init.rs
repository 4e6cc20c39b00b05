//! Deterministic, version-stable random numbers for parameter initialization.
//!
//! A SplitMix64 stream per layer, keyed by `(seed, layer index)`, so every process that
//! builds the same config gets bit-identical parameters, independent of `rand` versions.

/// SplitMix64 generator (Steele, Lea, Flood 2014).
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A stream for `(seed, stream)`.
    pub fn new(seed: u64, stream: u64) -> Self {
        let mut g = Self(seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03));
        g.next_u64();
        g
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[-a, a)`.
    pub fn uniform_sym(&mut self, a: f32) -> f32 {
        // 24 random bits -> [0, 1).
        let u = (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32);
        (2.0 * u - 1.0) * a
    }
}
