//! Non-negative least squares: `min ||A x - b||_2` subject to `x >= 0`.
//!
//! Lawson-Hanson active-set method. Each passive-set subproblem is solved by a Householder
//! QR with column pivoting and a numerical rank cut-off, so rank-deficient and
//! ill-conditioned inputs give a (minimum-support) solution instead of garbage. Columns are
//! scaled to unit norm before solving, and a column that enters the passive set but cannot
//! take a positive value (it is linearly dependent on the passive columns) is barred until
//! the iterate moves, which prevents the classic cycling on degenerate inputs.

use crate::error::{BrainError, Result};

/// A dense row-major matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct Matrix {
    rows: usize,
    cols: usize,
    data: Vec<f64>,
}

impl Matrix {
    /// A `rows x cols` matrix of zeros.
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Self {
            rows,
            cols,
            data: vec![0.0; rows * cols],
        }
    }

    /// Builds a matrix from rows; every row must have the same length.
    pub fn from_rows(rows: &[Vec<f64>]) -> Result<Self> {
        let cols = rows.first().map_or(0, Vec::len);
        let mut m = Self::zeros(rows.len(), cols);
        for (i, r) in rows.iter().enumerate() {
            if r.len() != cols {
                return Err(BrainError::invalid(
                    "matrix",
                    format!("row {i} has {} columns, expected {cols}", r.len()),
                ));
            }
            m.data[i * cols..(i + 1) * cols].copy_from_slice(r);
        }
        Ok(m)
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Element `(i, j)`.
    pub fn get(&self, i: usize, j: usize) -> f64 {
        self.data[i * self.cols + j]
    }

    /// Sets element `(i, j)`.
    pub fn set(&mut self, i: usize, j: usize, v: f64) {
        self.data[i * self.cols + j] = v;
    }

    /// Sets row `i` (`row.len()` must equal the columns).
    pub fn set_row(&mut self, i: usize, row: &[f64]) {
        self.data[i * self.cols..(i + 1) * self.cols].copy_from_slice(row);
    }

    /// `A x`.
    pub fn mul_vec(&self, x: &[f64]) -> Vec<f64> {
        (0..self.rows)
            .map(|i| {
                let row = &self.data[i * self.cols..(i + 1) * self.cols];
                row.iter().zip(x).map(|(a, b)| a * b).sum()
            })
            .collect()
    }

    /// `A^T y`.
    pub fn tmul_vec(&self, y: &[f64]) -> Vec<f64> {
        let mut out = vec![0.0; self.cols];
        for (i, yi) in y.iter().enumerate() {
            let row = &self.data[i * self.cols..(i + 1) * self.cols];
            for (o, a) in out.iter_mut().zip(row) {
                *o += a * yi;
            }
        }
        out
    }
}

/// Result of [`nnls`].
#[derive(Debug, Clone, PartialEq)]
pub struct NnlsSolution {
    /// The non-negative minimizer.
    pub x: Vec<f64>,
    /// `||A x - b||_2`.
    pub residual_norm: f64,
    /// Outer iterations used.
    pub iterations: usize,
}

/// Solves `min ||A x - b||` with `x >= 0`.
///
/// Rejects non-finite inputs and shape mismatches. Always returns a feasible `x`.
pub fn nnls(a: &Matrix, b: &[f64]) -> Result<NnlsSolution> {
    if b.len() != a.rows {
        return Err(BrainError::invalid(
            "b",
            format!("length {} does not match {} rows", b.len(), a.rows),
        ));
    }
    if a.data.iter().chain(b).any(|v| !v.is_finite()) {
        return Err(BrainError::invalid(
            "A, b",
            "contain NaN or infinite values",
        ));
    }
    let (m, n) = (a.rows, a.cols);
    if n == 0 {
        let r = b.iter().map(|v| v * v).sum::<f64>().sqrt();
        return Ok(NnlsSolution {
            x: vec![],
            residual_norm: r,
            iterations: 0,
        });
    }
    // Scale columns to unit norm: the active-set tests become scale free.
    let mut scale = vec![0.0; n];
    for (j, s) in scale.iter_mut().enumerate() {
        *s = (0..m).map(|i| a.get(i, j).powi(2)).sum::<f64>().sqrt();
    }
    let mut s_a = a.clone();
    for i in 0..m {
        for (j, s) in scale.iter().enumerate() {
            let v = if *s > 0.0 { a.get(i, j) / s } else { 0.0 };
            s_a.set(i, j, v);
        }
    }
    let bnorm = b.iter().map(|v| v * v).sum::<f64>().sqrt();
    let tol = 10.0 * f64::EPSILON * (m.max(n) as f64) * bnorm.max(1.0);

    let mut x = vec![0.0; n];
    let mut passive = vec![false; n];
    let mut barred = vec![false; n];
    let usable: Vec<bool> = scale.iter().map(|s| *s > 0.0).collect();
    let max_outer = 3 * n + 10;
    let mut iterations = 0;
    loop {
        let r: Vec<f64> = s_a
            .mul_vec(&x)
            .iter()
            .zip(b)
            .map(|(ax, bi)| bi - ax)
            .collect();
        let w = s_a.tmul_vec(&r);
        let cand = (0..n)
            .filter(|&j| !passive[j] && !barred[j] && usable[j] && w[j] > tol)
            .max_by(|&i, &j| w[i].total_cmp(&w[j]));
        let Some(t) = cand else { break };
        if iterations >= max_outer {
            break;
        }
        iterations += 1;
        passive[t] = true;
        let mut moved = false;
        // Inner loop: keep the passive subproblem solution feasible.
        for _ in 0..(3 * n + 10) {
            let idx: Vec<usize> = (0..n).filter(|&j| passive[j]).collect();
            let z = lstsq_columns(&s_a, &idx, b);
            let mut s = vec![0.0; n];
            for (k, &j) in idx.iter().enumerate() {
                s[j] = z[k];
            }
            if idx.iter().all(|&j| s[j] > 0.0) {
                moved |= s.iter().zip(&x).any(|(a, b)| a != b);
                x = s;
                break;
            }
            // Step from x toward s until the first passive variable hits zero.
            let mut alpha = f64::INFINITY;
            for &j in &idx {
                if s[j] <= 0.0 {
                    let d = x[j] - s[j];
                    let a = if d > 0.0 { x[j] / d } else { 0.0 };
                    alpha = alpha.min(a);
                }
            }
            let alpha = alpha.clamp(0.0, 1.0);
            for j in 0..n {
                let nx = x[j] + alpha * (s[j] - x[j]);
                moved |= (nx - x[j]).abs() > 0.0;
                x[j] = nx;
            }
            for &j in &idx {
                if x[j] <= tol * 1e-3 || s[j] <= 0.0 && x[j] <= f64::EPSILON {
                    x[j] = 0.0;
                    passive[j] = false;
                }
            }
            if !passive.iter().any(|p| *p) {
                break;
            }
        }
        if moved {
            barred.iter_mut().for_each(|b| *b = false);
        } else {
            // Column t could not enter (dependent on the passive set): bar it until x moves.
            barred[t] = true;
            passive[t] = false;
            x[t] = 0.0;
        }
    }
    let x: Vec<f64> = x
        .iter()
        .zip(&scale)
        .map(|(v, s)| if *s > 0.0 { (v / s).max(0.0) } else { 0.0 })
        .collect();
    let residual_norm = a
        .mul_vec(&x)
        .iter()
        .zip(b)
        .map(|(ax, bi)| (ax - bi).powi(2))
        .sum::<f64>()
        .sqrt();
    Ok(NnlsSolution {
        x,
        residual_norm,
        iterations,
    })
}

/// Unconstrained least squares over the columns `idx` of `a`, by Householder QR with
/// column pivoting; columns beyond the numerical rank get zero.
pub(crate) fn lstsq_columns(a: &Matrix, idx: &[usize], b: &[f64]) -> Vec<f64> {
    let m = a.rows;
    let k = idx.len();
    if k == 0 {
        return vec![];
    }
    // Column-major working copy.
    let mut q: Vec<Vec<f64>> = idx
        .iter()
        .map(|&j| (0..m).map(|i| a.get(i, j)).collect())
        .collect();
    let mut rhs = b.to_vec();
    let mut perm: Vec<usize> = (0..k).collect();
    let mut norms: Vec<f64> = q.iter().map(|c| c.iter().map(|v| v * v).sum()).collect();
    let steps = k.min(m);
    let mut rank = 0;
    let mut r00 = 0.0;
    for p in 0..steps {
        // Pivot: the remaining column with the largest remaining norm.
        let (best, _) = (p..k)
            .map(|c| (c, norms[c]))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or((p, 0.0));
        q.swap(p, best);
        norms.swap(p, best);
        perm.swap(p, best);
        let col = &q[p];
        let alpha: f64 = col[p..].iter().map(|v| v * v).sum::<f64>().sqrt();
        if p == 0 {
            r00 = alpha;
        }
        if alpha <= 1e3 * f64::EPSILON * (m.max(k) as f64) * r00.max(f64::MIN_POSITIVE) {
            break;
        }
        rank += 1;
        // Householder vector v = x - beta e1 with beta = -sign(x0) |x|.
        let beta = if col[p] >= 0.0 { -alpha } else { alpha };
        let mut v: Vec<f64> = col[p..].to_vec();
        v[0] -= beta;
        let vnorm2: f64 = v.iter().map(|x| x * x).sum();
        if vnorm2 > 0.0 {
            for c in q.iter_mut().skip(p) {
                let dot: f64 = v.iter().zip(&c[p..]).map(|(a, b)| a * b).sum();
                let f = 2.0 * dot / vnorm2;
                for (ci, vi) in c[p..].iter_mut().zip(&v) {
                    *ci -= f * vi;
                }
            }
            let dot: f64 = v.iter().zip(&rhs[p..]).map(|(a, b)| a * b).sum();
            let f = 2.0 * dot / vnorm2;
            for (ri, vi) in rhs[p..].iter_mut().zip(&v) {
                *ri -= f * vi;
            }
        }
        for c in p + 1..k {
            norms[c] = q[c][p + 1..].iter().map(|v| v * v).sum();
        }
    }
    // Back substitution on the leading rank x rank triangle.
    let mut z = vec![0.0; k];
    for i in (0..rank).rev() {
        let mut s = rhs[i];
        for j in i + 1..rank {
            s -= q[j][i] * z[j];
        }
        z[i] = s / q[i][i];
    }
    let mut out = vec![0.0; k];
    for (pos, &orig) in perm.iter().enumerate() {
        out[orig] = z[pos];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mat(rows: &[&[f64]]) -> Matrix {
        Matrix::from_rows(&rows.iter().map(|r| r.to_vec()).collect::<Vec<_>>()).unwrap()
    }

    fn resid(a: &Matrix, x: &[f64], b: &[f64]) -> f64 {
        a.mul_vec(x)
            .iter()
            .zip(b)
            .map(|(p, q)| (p - q).powi(2))
            .sum::<f64>()
            .sqrt()
    }

    /// Reference: best feasible least-squares solution over every support set (n <= 8).
    fn brute_force(a: &Matrix, b: &[f64]) -> f64 {
        let n = a.cols();
        let mut best = resid(a, &vec![0.0; n], b);
        for mask in 1u32..(1 << n) {
            let idx: Vec<usize> = (0..n).filter(|j| mask & (1 << j) != 0).collect();
            let z = lstsq_columns(a, &idx, b);
            if z.iter().any(|v| *v < -1e-12) {
                continue;
            }
            let mut x = vec![0.0; n];
            for (k, &j) in idx.iter().enumerate() {
                x[j] = z[k].max(0.0);
            }
            best = best.min(resid(a, &x, b));
        }
        best
    }

    /// KKT: x >= 0, gradient >= 0 on zeros, ~0 on positives.
    fn assert_kkt(a: &Matrix, b: &[f64], x: &[f64], tol: f64) {
        let r: Vec<f64> = a.mul_vec(x).iter().zip(b).map(|(p, q)| q - p).collect();
        let w = a.tmul_vec(&r);
        for (j, (&xj, &wj)) in x.iter().zip(&w).enumerate() {
            assert!(xj >= 0.0, "x[{j}] = {xj} negative");
            if xj > 0.0 {
                assert!(wj.abs() <= tol, "w[{j}] = {wj} should be ~0 for positive x");
            } else {
                assert!(wj <= tol, "w[{j}] = {wj} > 0 for zero x: not optimal");
            }
        }
    }

    #[test]
    fn exact_positive_solution_is_recovered() {
        let a = mat(&[&[1.0, 0.0], &[0.0, 2.0], &[1.0, 1.0]]);
        let x_true = [3.0, 0.5];
        let b = a.mul_vec(&x_true);
        let s = nnls(&a, &b).unwrap();
        assert!(
            (s.x[0] - 3.0).abs() < 1e-10 && (s.x[1] - 0.5).abs() < 1e-10,
            "{:?}",
            s.x
        );
        assert!(s.residual_norm < 1e-10);
    }

    #[test]
    fn identity_clips_negative_components() {
        let a = mat(&[&[1.0, 0.0, 0.0], &[0.0, 1.0, 0.0], &[0.0, 0.0, 1.0]]);
        let s = nnls(&a, &[2.0, -1.0, 0.5]).unwrap();
        assert_eq!(s.x, vec![2.0, 0.0, 0.5]);
        assert!((s.residual_norm - 1.0).abs() < 1e-12);
    }

    #[test]
    fn known_textbook_case() {
        // The unconstrained fit is 4 - t (negative slope); with x >= 0 the best support is
        // {0}: x = (mean(b), 0) = (2, 0), residual sqrt(2). Support {1} leaves 48/7 > 2.
        let a = mat(&[&[1.0, 1.0], &[1.0, 2.0], &[1.0, 3.0]]);
        let b = [3.0, 2.0, 1.0];
        let s = nnls(&a, &b).unwrap();
        // Support {0}: x0 = mean(b) = 2, residual sqrt(2); support {1}: 10/14.
        assert!((s.x[0] - 2.0).abs() < 1e-10 && s.x[1] == 0.0, "{:?}", s.x);
        assert!((s.residual_norm - 2f64.sqrt()).abs() < 1e-10);
    }

    #[test]
    fn rank_deficient_duplicate_columns() {
        let a = mat(&[
            &[1.0, 1.0, 0.0],
            &[2.0, 2.0, 1.0],
            &[3.0, 3.0, 1.0],
            &[0.0, 0.0, 1.0],
        ]);
        let b = [2.0, 5.0, 7.0, 1.0];
        let s = nnls(&a, &b).unwrap();
        assert!(s.x.iter().all(|v| *v >= 0.0));
        assert!((s.residual_norm - brute_force(&a, &b)).abs() < 1e-9);
        // Duplicate columns share the weight: their sum is what is identifiable.
        assert!((s.x[0] + s.x[1] - 2.0).abs() < 1e-9 && (s.x[2] - 1.0).abs() < 1e-9);
    }

    #[test]
    fn zero_column_and_zero_rhs() {
        let a = mat(&[&[0.0, 1.0], &[0.0, 1.0]]);
        let s = nnls(&a, &[0.0, 0.0]).unwrap();
        assert_eq!(s.x, vec![0.0, 0.0]);
        let s = nnls(&a, &[2.0, 4.0]).unwrap();
        assert_eq!(s.x[0], 0.0);
        assert!((s.x[1] - 3.0).abs() < 1e-12);
    }

    #[test]
    fn more_unknowns_than_equations() {
        let a = mat(&[&[1.0, 2.0, 3.0, 4.0], &[4.0, 3.0, 2.0, 1.0]]);
        let b = [10.0, 10.0];
        let s = nnls(&a, &b).unwrap();
        assert!(s.residual_norm < 1e-9, "{s:?}");
        assert!(s.x.iter().all(|v| *v >= 0.0));
    }

    #[test]
    fn ill_conditioned_hilbert_matches_brute_force() {
        let n = 7;
        let rows: Vec<Vec<f64>> = (0..10)
            .map(|i| (0..n).map(|j| 1.0 / (i + j + 1) as f64).collect())
            .collect();
        let a = Matrix::from_rows(&rows).unwrap();
        let b: Vec<f64> = (0..10).map(|i| ((i as f64) * 0.7).sin()).collect();
        let s = nnls(&a, &b).unwrap();
        let reference = brute_force(&a, &b);
        assert!(
            s.residual_norm <= reference + 1e-8,
            "{} vs {reference}",
            s.residual_norm
        );
    }

    #[test]
    fn random_problems_satisfy_kkt_and_match_brute_force() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for trial in 0..200 {
            let m = rng.random_range(2..9);
            let n = rng.random_range(1..7);
            let rows: Vec<Vec<f64>> = (0..m)
                .map(|_| (0..n).map(|_| rng.random_range(-1.0..1.0)).collect())
                .collect();
            let a = Matrix::from_rows(&rows).unwrap();
            let b: Vec<f64> = (0..m).map(|_| rng.random_range(-2.0..2.0)).collect();
            let s = nnls(&a, &b).unwrap();
            assert_kkt(&a, &b, &s.x, 1e-7);
            let reference = brute_force(&a, &b);
            assert!(
                s.residual_norm <= reference + 1e-8,
                "trial {trial}: {} vs {reference}",
                s.residual_norm
            );
        }
    }

    #[test]
    fn rejects_nan_and_shape_mismatch() {
        let a = mat(&[&[1.0, f64::NAN]]);
        assert!(matches!(
            nnls(&a, &[1.0]),
            Err(BrainError::InvalidInput { .. })
        ));
        let a = mat(&[&[1.0, 2.0]]);
        assert!(nnls(&a, &[1.0, 2.0]).is_err());
        assert!(Matrix::from_rows(&[vec![1.0], vec![1.0, 2.0]]).is_err());
    }
}
