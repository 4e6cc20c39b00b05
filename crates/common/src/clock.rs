//! The one clock every policy reads: milliseconds on a monotonic clock, as a plain `u64`
//! passed in by the caller. The live processes read [`monotonic_ms`]; tests and the
//! cluster simulator pass their own readings, so a whole schedule runs without waiting.

use std::time::Instant;

/// Milliseconds since this process first asked, on the monotonic clock (never 0: 0 can
/// mean "never").
pub fn monotonic_ms() -> u64 {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// Seconds from `from_ms` to `to_ms` (0 when the second is earlier).
pub fn seconds_between(from_ms: u64, to_ms: u64) -> f64 {
    to_ms.saturating_sub(from_ms) as f64 / 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_moves_forward_from_one() {
        let a = monotonic_ms();
        let b = monotonic_ms();
        assert!(a >= 1 && b >= a);
        assert_eq!(seconds_between(1_000, 3_500), 2.5);
        assert_eq!(seconds_between(3_500, 1_000), 0.0);
    }
}
