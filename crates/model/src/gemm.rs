//! Thin, bounds-checked wrapper over the SGEMM backend, the `gemm` crate's f32 kernels
//! (`gemm-f32`).
//! (`examples/gemm_compare.rs` measures it against `matrixmultiply` on this model's
//! shapes.) The layers call [`sgemm`] on one thread: the model splits a batch into row
//! blocks, one per task, because on this model's shapes one core's kernel runs near its
//! peak while a GEMM split over threads loses a quarter of it to packing and barriers.
//! [`matmul`] uses every rayon thread; it measures the machine's peak.
//!
//! All matrices are described by a slice plus row/column strides, so transposed operands
//! cost nothing: the backend packs them anyway.

/// A strided, read-only matrix view.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MatRef<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a> MatRef<'a> {
    /// Row-major `rows x cols` matrix with contiguous rows.
    pub fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self {
            data,
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }

    /// The transpose of a row-major `rows x cols` matrix (a `cols x rows` view).
    pub fn row_major_t(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self {
            data,
            rows: cols,
            cols: rows,
            rs: 1,
            cs: cols,
        }
    }

    fn check(&self) {
        if self.rows > 0 && self.cols > 0 {
            let last = (self.rows - 1) * self.rs + (self.cols - 1) * self.cs;
            assert!(last < self.data.len(), "matrix view out of bounds");
        }
    }
}

/// `C = alpha * A * B + beta * C` with `C` row-major contiguous (`a.rows x b.cols`), on
/// the calling thread.
pub(crate) fn sgemm(alpha: f32, a: MatRef<'_>, b: MatRef<'_>, beta: f32, c: &mut [f32]) {
    sgemm_with(alpha, a, b, beta, c, gemm_common::Parallelism::None);
}

fn sgemm_with(
    alpha: f32,
    a: MatRef<'_>,
    b: MatRef<'_>,
    beta: f32,
    c: &mut [f32],
    par: gemm_common::Parallelism,
) {
    assert_eq!(a.cols, b.rows, "inner dimensions differ");
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert!(c.len() >= m * n, "output too small");
    a.check();
    b.check();
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: every index the kernel touches was bounds-checked above (views via `check`,
    // output by length); the output does not alias the inputs (distinct borrows).
    unsafe { ge(alpha, a, b, beta, c, m, k, n, par) }
}

/// `C[m, n] = A[m, k] B[k, n]` on contiguous row-major buffers, with the model's GEMM
/// backend on all rayon threads (used to measure the machine's GEMM peak).
pub fn matmul(a: &[f32], b: &[f32], c: &mut [f32], m: usize, k: usize, n: usize) {
    sgemm_with(
        1.0,
        MatRef::row_major(a, m, k),
        MatRef::row_major(b, k, n),
        0.0,
        c,
        all_threads(),
    );
}

/// All rayon threads, so no second pool spins (or yields) while rayon's works.
fn all_threads() -> gemm_common::Parallelism {
    let t = rayon::current_num_threads();
    if t > 1 {
        gemm_common::Parallelism::Rayon(t)
    } else {
        gemm_common::Parallelism::None
    }
}

#[allow(clippy::too_many_arguments)]
unsafe fn ge(
    alpha: f32,
    a: MatRef<'_>,
    b: MatRef<'_>,
    beta: f32,
    c: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    par: gemm_common::Parallelism,
) {
    // gemm computes dst = alpha * dst + beta * lhs * rhs (note the swapped names).
    gemm_f32::gemm::f32::get_gemm_fn()(
        m,
        n,
        k,
        c.as_mut_ptr(),
        1,
        n as isize,
        beta != 0.0,
        a.data.as_ptr(),
        a.cs as isize,
        a.rs as isize,
        b.data.as_ptr(),
        b.cs as isize,
        b.rs as isize,
        beta,
        alpha,
        false,
        false,
        false,
        par,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transposed_views_match_naive() {
        // A: 3x4 (given transposed storage 4x3), B: 4x2.
        let at: Vec<f32> = (0..12).map(|x| x as f32 * 0.5 - 2.0).collect();
        let b: Vec<f32> = (0..8).map(|x| x as f32 - 3.0).collect();
        let a = MatRef::row_major_t(&at, 4, 3);
        let mut c = vec![1.0f32; 6];
        sgemm(2.0, a, MatRef::row_major(&b, 4, 2), 0.5, &mut c);
        for i in 0..3 {
            for j in 0..2 {
                let mut s = 0.0;
                for p in 0..4 {
                    s += at[p * 3 + i] * b[p * 2 + j];
                }
                assert!((c[i * 2 + j] - (2.0 * s + 0.5)).abs() < 1e-5);
            }
        }
    }
}
