//! Table sizes of the Criteo Kaggle display-advertising dataset, for defaults and benchmarks.

/// Distinct values of each of the 26 categorical features of Criteo Kaggle, as counted by the
/// DLRM reference preprocessing (no frequency threshold).
pub const CRITEO_KAGGLE_CARDINALITIES: [u64; 26] = [
    1460, 583, 10_131_227, 2_202_608, 305, 24, 12_517, 633, 3, 93_145, 5683, 8_351_593, 3194, 27,
    14_992, 5_461_306, 10, 5652, 2173, 4, 7_046_547, 18, 15, 286_181, 105, 142_572,
];

/// Row counts for hashed tables: each cardinality capped at `cap` (the hashing trick folds
/// larger vocabularies into `cap` rows). `cap` of 0 is treated as 1.
pub fn capped_rows(cardinalities: &[u64], cap: u64) -> Vec<u64> {
    cardinalities
        .iter()
        .map(|&c| c.clamp(1, cap.max(1)))
        .collect()
}
