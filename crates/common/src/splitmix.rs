//! SplitMix64 (Steele, Lea, Flood 2014), the variant with Stafford's "Mix13" finalizer,
//! as in Vigna's reference `splitmix64.c`.
//!
//! Implemented here rather than taken from `rand` so values never change with a
//! dependency's version: initial parameters, embedding rows and generated data are all
//! derived from it, and checkpoints and tests freeze them.

/// The increment of the SplitMix64 state (2^64 / golden ratio, odd).
pub const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The SplitMix64 finalizer (Mix13): a bijective 64-bit mixer, `mix64(0) == 0`.
///
/// Used on its own as a counter-based hash (a key plus `j * GOLDEN_GAMMA`).
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A value derived from `key` and a counter `j`: `mix64(key ^ j · GOLDEN_GAMMA)`. Keys
/// independent streams from one seed (a layer's, a row's, a worker's, a step's).
#[inline]
pub fn derive(key: u64, j: u64) -> u64 {
    mix64(key ^ j.wrapping_mul(GOLDEN_GAMMA))
}

/// The output of one SplitMix64 step from state `z`: `mix64(z + GOLDEN_GAMMA)`, i.e. the
/// first value of [`SplitMix64::new(z)`](SplitMix64::new). A stateless 64-bit hash.
#[inline]
pub fn splitmix64(z: u64) -> u64 {
    mix64(z.wrapping_add(GOLDEN_GAMMA))
}

/// The SplitMix64 generator.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator whose state is `state`; the first output is `splitmix64(state)`.
    pub const fn new(state: u64) -> Self {
        Self(state)
    }

    /// Next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN_GAMMA);
        mix64(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The golden values below were produced by the three copies this module replaced
    // (model's init generator, embedding's and data's `mix64`); they must never change.

    #[test]
    fn finalizer_is_frozen() {
        let got = [0u64, 1, 42, u64::MAX].map(mix64);
        assert_eq!(
            got,
            [
                0x0000_0000_0000_0000,
                0x5692_161d_100b_05e5,
                0xa759_ea27_d472_7622,
                0xb4d0_55fc_f2cb_bd7b
            ]
        );
    }

    #[test]
    fn step_is_frozen_and_matches_reference() {
        let got = [0u64, 1, 42, u64::MAX].map(splitmix64);
        // 0xe220a8397b1dcdaf is also the first output of Vigna's splitmix64.c for seed 0.
        assert_eq!(
            got,
            [
                0xe220_a839_7b1d_cdaf,
                0x910a_2dec_8902_5cc1,
                0xbdd7_3226_2feb_6e95,
                0xe4d9_7177_1b65_2c20
            ]
        );
    }

    #[test]
    fn generator_is_the_stepped_hash() {
        let mut g = SplitMix64::new(42);
        let mut x = 42u64;
        for _ in 0..100 {
            assert_eq!(g.next_u64(), splitmix64(x));
            x = x.wrapping_add(GOLDEN_GAMMA);
        }
    }
}
