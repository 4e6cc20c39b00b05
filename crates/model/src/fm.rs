//! The factorization-machine term of DeepFM (Guo et al., IJCAI 2017): the second-order
//! interactions of the embedding vectors, added to the logit of the deep part.
//!
//! `fm = Σ_{i<j} ⟨e_i, e_j⟩ = ½ (‖Σ_t e_t‖² − Σ_t ‖e_t‖²)` per sample, in `O(T d)`;
//! `∂fm/∂e_t = Σ_s e_s − e_t`. The embeddings are the deep part's (shared, as in the
//! paper).

/// Adds each sample's FM term to `logits [n]`, from `emb [n, T, d]`.
pub fn forward(emb: &[f32], n: usize, tables: usize, dim: usize, logits: &mut [f32]) {
    let mut sum = vec![0.0f32; dim];
    for (row, logit) in emb[..n * tables * dim]
        .chunks_exact(tables * dim)
        .zip(logits.iter_mut())
    {
        sum.fill(0.0);
        let mut squares = 0.0f32;
        for e in row.chunks_exact(dim) {
            for (s, &v) in sum.iter_mut().zip(e) {
                *s += v;
                squares += v * v;
            }
        }
        let total: f32 = sum.iter().map(|s| s * s).sum();
        *logit += 0.5 * (total - squares);
    }
}

/// Adds `dlogit · (Σ_s e_s − e_t)` to each sample's `demb [n, T, d]`.
pub fn backward(
    emb: &[f32],
    dlogits: &[f32],
    n: usize,
    tables: usize,
    dim: usize,
    demb: &mut [f32],
) {
    let mut sum = vec![0.0f32; dim];
    let w = tables * dim;
    for ((row, drow), &g) in emb[..n * w]
        .chunks_exact(w)
        .zip(demb[..n * w].chunks_exact_mut(w))
        .zip(dlogits)
    {
        sum.fill(0.0);
        for e in row.chunks_exact(dim) {
            for (s, &v) in sum.iter_mut().zip(e) {
                *s += v;
            }
        }
        for (e, de) in row.chunks_exact(dim).zip(drow.chunks_exact_mut(dim)) {
            for ((d, &v), &s) in de.iter_mut().zip(e).zip(&sum) {
                *d += g * (s - v);
            }
        }
    }
}

/// FLOPs per sample, forward and backward.
pub fn flops(tables: usize, dim: usize) -> u64 {
    (7 * tables * dim) as u64
}

#[cfg(test)]
mod tests {
    /// The closed form equals the pairwise sum, by hand on three 2-d vectors.
    #[test]
    fn the_closed_form_is_the_sum_of_pairwise_dots() {
        let e = [1.0, 2.0, -1.0, 0.5, 3.0, -2.0];
        let mut logit = [0.25];
        super::forward(&e, 1, 3, 2, &mut logit);
        // <a,b> = -1 + 1 = 0; <a,c> = 3 - 4 = -1; <b,c> = -3 - 1 = -4.
        assert!((logit[0] - (0.25 - 5.0)).abs() < 1e-6, "{logit:?}");
    }
}
