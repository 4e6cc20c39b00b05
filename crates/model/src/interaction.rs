//! Feature interactions between the bottom-MLP output and the embedding vectors.
//!
//! Inputs are the bottom output `z [n, db]` and the embeddings `e [n, T, d]`
//! (row-major, one sample's `T` vectors contiguous).
//!
//! * [`InteractionKind::Dot`] (needs `db == d`): with features `f_0 = z`, `f_{t+1} = e_t`
//!   (`F = T + 1`), the output row is `[z, <f_i, f_j> for i in 1..F for j in 0..i]`,
//!   width `d + F(F-1)/2`, the strictly-lower-triangular pairwise dot products in row-major
//!   order, as in the DLRM reference.
//! * [`InteractionKind::Concat`]: the output row is `[z, e_0, ..., e_{T-1}]`, width
//!   `db + T d`.

/// Which interaction the model uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InteractionKind {
    /// Pairwise dot products (DLRM default).
    Dot,
    /// Plain concatenation.
    Concat,
}

/// Shape of an interaction: bottom width, table count, embedding dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interaction {
    /// Kind of interaction.
    pub kind: InteractionKind,
    /// Bottom-MLP output width `db`.
    pub bottom_dim: usize,
    /// Number of embedding vectors per sample `T`.
    pub num_tables: usize,
    /// Embedding dimension `d`.
    pub dim: usize,
}

#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent lanes so the compiler can vectorize without reassociation flags.
    let mut acc = [0.0f32; 8];
    let (ac, ar) = a.split_at(a.len() / 8 * 8);
    let (bc, br) = b.split_at(ac.len());
    for (x, y) in ac.chunks_exact(8).zip(bc.chunks_exact(8)) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    let mut s = (acc[0] + acc[4]) + (acc[1] + acc[5]) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ar.iter().zip(br) {
        s += x * y;
    }
    s
}

#[inline]
fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (yy, xx) in y.iter_mut().zip(x) {
        *yy += alpha * xx;
    }
}

impl Interaction {
    /// Output width per sample.
    pub fn out_dim(&self) -> usize {
        match self.kind {
            InteractionKind::Dot => {
                let f = self.num_tables + 1;
                self.bottom_dim + f * (f - 1) / 2
            }
            InteractionKind::Concat => self.bottom_dim + self.num_tables * self.dim,
        }
    }

    /// Forward FLOPs per sample (dot products; concat is a copy and counts 0).
    pub fn forward_flops(&self) -> u64 {
        match self.kind {
            InteractionKind::Dot => {
                let f = self.num_tables + 1;
                (f * (f - 1) / 2 * 2 * self.dim) as u64
            }
            InteractionKind::Concat => 0,
        }
    }

    /// Backward FLOPs per sample.
    pub fn backward_flops(&self) -> u64 {
        2 * self.forward_flops()
    }

    /// Forward: `out [n, out_dim]` from `z [n, db]` and `emb [n, T, d]`.
    pub fn forward(&self, z: &[f32], emb: &[f32], n: usize, out: &mut [f32]) {
        let (db, t, d, od) = (self.bottom_dim, self.num_tables, self.dim, self.out_dim());
        let out = &mut out[..n * od];
        let z = &z[..n * db];
        let emb = &emb[..n * t * d];
        let kind = self.kind;
        let lanes = self.lane_kernel_fits();
        let (oc, zc, ec) = (out, z, emb);
        let mut rows = n;
        if kind == InteractionKind::Dot && lanes {
            let blocks = rows / L;
            let sh = Shape { db, t, d };
            dispatch_fwd(
                sh,
                &zc[..blocks * L * db],
                &ec[..blocks * L * t * d],
                &mut oc[..blocks * L * od],
            );
            rows -= blocks * L;
        }
        let start = n - rows;
        for ((orow, zrow), erow) in oc[start * od..]
            .chunks_exact_mut(od)
            .zip(zc[start * db..].chunks_exact(db))
            .zip(ec[start * t * d..].chunks_exact(t * d))
        {
            orow[..db].copy_from_slice(zrow);
            match kind {
                InteractionKind::Concat => orow[db..].copy_from_slice(erow),
                InteractionKind::Dot => dot_forward_row(zrow, erow, &mut orow[db..], d),
            }
        }
    }

    /// Whether the sample-lane SIMD kernels' stack buffers hold this shape.
    fn lane_kernel_fits(&self) -> bool {
        let f = self.num_tables + 1;
        self.kind == InteractionKind::Dot
            && f * self.dim * L <= MAX_LANE_FLOATS
            && f * (f - 1) / 2 * L <= MAX_LANE_FLOATS
    }

    /// Backward: from `dout [n, out_dim]` writes (overwrites) `dz [n, db]` and
    /// `demb [n, T, d]`. Needs the forward inputs `z` and `emb`.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        z: &[f32],
        emb: &[f32],
        dout: &[f32],
        n: usize,
        dz: &mut [f32],
        demb: &mut [f32],
    ) {
        let (db, t, d, od) = (self.bottom_dim, self.num_tables, self.dim, self.out_dim());
        let kind = self.kind;
        let dz = &mut dz[..n * db];
        let demb = &mut demb[..n * t * d];
        let lanes = self.lane_kernel_fits();
        let (dzc, dec, goc, zc, ec) = (dz, demb, &dout[..n * od], &z[..n * db], &emb[..n * t * d]);
        let mut rows = n;
        if lanes {
            let blocks = rows / L;
            let sh = Shape { db, t, d };
            dispatch_bwd(
                sh,
                &zc[..blocks * L * db],
                &ec[..blocks * L * t * d],
                &goc[..blocks * L * od],
                &mut dzc[..blocks * L * db],
                &mut dec[..blocks * L * t * d],
            );
            rows -= blocks * L;
        }
        let start = n - rows;
        for ((((dzr, der), gr), zr), er) in dzc[start * db..]
            .chunks_exact_mut(db)
            .zip(dec[start * t * d..].chunks_exact_mut(t * d))
            .zip(goc[start * od..].chunks_exact(od))
            .zip(zc[start * db..].chunks_exact(db))
            .zip(ec[start * t * d..].chunks_exact(t * d))
        {
            dzr.copy_from_slice(&gr[..db]);
            match kind {
                InteractionKind::Concat => der.copy_from_slice(&gr[db..]),
                InteractionKind::Dot => dot_backward_row(zr, er, &gr[db..], dzr, der, d),
            }
        }
    }
}

fn dot_forward_row(z: &[f32], e: &[f32], out: &mut [f32], d: usize) {
    let t = e.len() / d;
    let feat = |i: usize| -> &[f32] {
        if i == 0 {
            z
        } else {
            &e[(i - 1) * d..i * d]
        }
    };
    let mut k = 0;
    for i in 1..=t {
        let fi = feat(i);
        for j in 0..i {
            out[k] = dot(fi, feat(j));
            k += 1;
        }
    }
}

/// Gather form: `df_i = sum_{j<i} g(i,j) f_j + sum_{j>i} g(j,i) f_j`, so each output row is
/// written by exactly one loop and nothing aliases.
fn dot_backward_row(z: &[f32], e: &[f32], g: &[f32], dz: &mut [f32], de: &mut [f32], d: usize) {
    let t = e.len() / d;
    let feat = |i: usize| -> &[f32] {
        if i == 0 {
            z
        } else {
            &e[(i - 1) * d..i * d]
        }
    };
    let pair = |i: usize, j: usize| i * (i - 1) / 2 + j; // i > j
                                                         // feature 0 (bottom output): only pairs (j, 0) with j > 0.
    for j in 1..=t {
        axpy(g[pair(j, 0)], feat(j), dz);
    }
    for i in 1..=t {
        let di = &mut de[(i - 1) * d..i * d];
        di.fill(0.0);
        for j in 0..i {
            axpy(g[pair(i, j)], feat(j), di);
        }
        for j in i + 1..=t {
            axpy(g[pair(j, i)], feat(j), di);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Sample-lane kernels for the dot interaction.
//
// A block of `L = 8` samples is transposed so that one SIMD lane holds one sample:
// `tb[(i * d + k) * L + s]` is coordinate `k` of feature `i` of sample `s`. A pairwise dot
// product for 8 samples is then `d` lane-wise FMAs with no horizontal reduction. The code
// is written once over `[f32; L]` arrays and compiled twice: a baseline version and an
// AVX2+FMA version selected at run time.

/// Samples per SIMD block.
const L: usize = 8;
/// Floats of each on-stack lane buffer (16 KiB).
const MAX_LANE_FLOATS: usize = 4096;

#[derive(Clone, Copy)]
struct Shape {
    db: usize,
    t: usize,
    d: usize,
}

#[inline(always)]
fn fmadd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

type Lanes = [f32; L];

/// Transposes `L` samples' features (bottom output first) into `tb`.
#[inline(always)]
fn load_block(sh: Shape, z: &[f32], e: &[f32], tb: &mut [Lanes]) {
    let (db, td, d) = (sh.db, sh.t * sh.d, sh.d);
    for s in 0..L {
        let zr = &z[s * db..s * db + d];
        for (k, &v) in zr.iter().enumerate() {
            tb[k][s] = v;
        }
        let er = &e[s * td..(s + 1) * td];
        for (q, &v) in er.iter().enumerate() {
            tb[d + q][s] = v;
        }
    }
}

#[inline(always)]
fn fwd_blocks<const FMA: bool>(sh: Shape, z: &[f32], e: &[f32], out: &mut [f32]) {
    let (db, t, d) = (sh.db, sh.t, sh.d);
    let f = t + 1;
    let od = db + f * (f - 1) / 2;
    let mut tb = [[0.0f32; L]; MAX_LANE_FLOATS / L];
    for ((zb, eb), ob) in z
        .chunks_exact(L * db)
        .zip(e.chunks_exact(L * t * d))
        .zip(out.chunks_exact_mut(L * od))
    {
        load_block(sh, zb, eb, &mut tb);
        for s in 0..L {
            ob[s * od..s * od + db].copy_from_slice(&zb[s * db..(s + 1) * db]);
        }
        let mut p = db;
        for i in 1..f {
            let fi = &tb[i * d..(i + 1) * d];
            let mut j = 0;
            while j + 4 <= i {
                let f0 = &tb[j * d..(j + 1) * d];
                let f1 = &tb[(j + 1) * d..(j + 2) * d];
                let f2 = &tb[(j + 2) * d..(j + 3) * d];
                let f3 = &tb[(j + 3) * d..(j + 4) * d];
                let (mut a0, mut a1, mut a2, mut a3) =
                    ([0.0f32; L], [0.0f32; L], [0.0f32; L], [0.0f32; L]);
                for k in 0..d {
                    lane_fma::<FMA>(&mut a0, &fi[k], &f0[k]);
                    lane_fma::<FMA>(&mut a1, &fi[k], &f1[k]);
                    lane_fma::<FMA>(&mut a2, &fi[k], &f2[k]);
                    lane_fma::<FMA>(&mut a3, &fi[k], &f3[k]);
                }
                for s in 0..L {
                    let o = &mut ob[s * od + p..s * od + p + 4];
                    o[0] = a0[s];
                    o[1] = a1[s];
                    o[2] = a2[s];
                    o[3] = a3[s];
                }
                p += 4;
                j += 4;
            }
            while j < i {
                let fj = &tb[j * d..(j + 1) * d];
                let mut acc = [0.0f32; L];
                for k in 0..d {
                    lane_fma::<FMA>(&mut acc, &fi[k], &fj[k]);
                }
                for s in 0..L {
                    ob[s * od + p] = acc[s];
                }
                p += 1;
                j += 1;
            }
        }
    }
}

#[inline(always)]
fn bwd_blocks<const FMA: bool>(
    sh: Shape,
    z: &[f32],
    e: &[f32],
    g: &[f32],
    dz: &mut [f32],
    de: &mut [f32],
) {
    let (db, t, d) = (sh.db, sh.t, sh.d);
    let f = t + 1;
    let np = f * (f - 1) / 2;
    let od = db + np;
    let mut tb = [[0.0f32; L]; MAX_LANE_FLOATS / L];
    let mut gt = [[0.0f32; L]; MAX_LANE_FLOATS / L];
    for ((((zb, eb), gb), dzb), deb) in z
        .chunks_exact(L * db)
        .zip(e.chunks_exact(L * t * d))
        .zip(g.chunks_exact(L * od))
        .zip(dz.chunks_exact_mut(L * db))
        .zip(de.chunks_exact_mut(L * t * d))
    {
        load_block(sh, zb, eb, &mut tb);
        for s in 0..L {
            for (p, &v) in gb[s * od + db..(s + 1) * od].iter().enumerate() {
                gt[p][s] = v;
            }
        }
        // df_i = sum_{j<i} g(i,j) f_j + sum_{j>i} g(j,i) f_j, 8 coordinates at a time.
        for i in 0..f {
            let mut k0 = 0;
            while k0 < d {
                let kc = (d - k0).min(8);
                let mut acc = [[0.0f32; L]; 8];
                for j in 0..f {
                    if j == i {
                        continue;
                    }
                    let p = if j < i {
                        i * (i - 1) / 2 + j
                    } else {
                        j * (j - 1) / 2 + i
                    };
                    let gv = &gt[p];
                    let fj = &tb[j * d + k0..j * d + k0 + kc];
                    if let Ok(fj8) = <&[Lanes; 8]>::try_from(fj) {
                        // Full 8-coordinate chunk: fixed trip counts, all in registers.
                        for (a, b) in acc.iter_mut().zip(fj8) {
                            lane_fma::<FMA>(a, gv, b);
                        }
                    } else {
                        for (a, b) in acc.iter_mut().zip(fj) {
                            lane_fma::<FMA>(a, gv, b);
                        }
                    }
                }
                // scatter back to sample-major rows
                for s in 0..L {
                    if i == 0 {
                        let base = s * db + k0;
                        for kk in 0..kc {
                            dzb[base + kk] = gb[s * od + k0 + kk] + acc[kk][s];
                        }
                    } else {
                        let base = s * t * d + (i - 1) * d + k0;
                        for kk in 0..kc {
                            deb[base + kk] = acc[kk][s];
                        }
                    }
                }
                k0 += kc;
            }
        }
    }
}

/// `acc[s] += a[s] * b[s]` over the lanes.
///
/// `FMA = true` is only instantiated inside the AVX2+FMA entry points, so the intrinsics
/// run only on CPUs that have them; explicit intrinsics keep LLVM from vectorizing across
/// accumulators instead of across lanes.
#[inline(always)]
fn lane_fma<const FMA: bool>(acc: &mut Lanes, a: &Lanes, b: &Lanes) {
    #[cfg(target_arch = "x86_64")]
    if FMA {
        use std::arch::x86_64::{_mm256_fmadd_ps, _mm256_loadu_ps, _mm256_storeu_ps};
        // SAFETY: 8-float unaligned loads/stores of `[f32; 8]` arrays; reached only from
        // `*_avx2` functions, called after AVX2+FMA detection.
        unsafe {
            let r = _mm256_fmadd_ps(
                _mm256_loadu_ps(a.as_ptr()),
                _mm256_loadu_ps(b.as_ptr()),
                _mm256_loadu_ps(acc.as_ptr()),
            );
            _mm256_storeu_ps(acc.as_mut_ptr(), r);
        }
        return;
    }
    for s in 0..L {
        acc[s] = fmadd::<FMA>(a[s], b[s], acc[s]);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fwd_blocks_avx2(sh: Shape, z: &[f32], e: &[f32], out: &mut [f32]) {
    fwd_blocks::<true>(sh, z, e, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn bwd_blocks_avx2(
    sh: Shape,
    z: &[f32],
    e: &[f32],
    g: &[f32],
    dz: &mut [f32],
    de: &mut [f32],
) {
    bwd_blocks::<true>(sh, z, e, g, dz, de)
}

fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn dispatch_fwd(sh: Shape, z: &[f32], e: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked just above).
        unsafe { fwd_blocks_avx2(sh, z, e, out) };
        return;
    }
    fwd_blocks::<false>(sh, z, e, out)
}

fn dispatch_bwd(sh: Shape, z: &[f32], e: &[f32], g: &[f32], dz: &mut [f32], de: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked just above).
        unsafe { bwd_blocks_avx2(sh, z, e, g, dz, de) };
        return;
    }
    bwd_blocks::<false>(sh, z, e, g, dz, de)
}
