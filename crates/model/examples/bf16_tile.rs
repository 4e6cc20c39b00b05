//! Whether bf16 products pay on this CPU without AMX: the same `12 x 32` register tile
//! (24 accumulators, operands in L1) run with AVX-512 fp32 FMAs and with AVX512-BF16's
//! `vdpbf16ps` (two bf16 products per fp32 lane per instruction). A bf16 GEMM can only
//! beat the fp32 one if its tile does: packing and rounding come on top.
//!
//! `cargo run --release -p elastrec-model --example bf16_tile`

use std::time::Instant;

const MR: usize = 12;
const NR: usize = 32;

fn main() {
    #[cfg(target_arch = "x86_64")]
    {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            println!("no AVX-512 on this CPU");
            return;
        }
        let k = 256;
        let reps = 200_000;
        let flops = (reps * k * MR * NR * 2) as f64;
        let (a, b) = (vec![1.0f32; k * MR], vec![1.0f32; k * NR]);
        let mut tile = [0f32; MR * NR];
        let t = Instant::now();
        for _ in 0..reps {
            // SAFETY: AVX-512F checked above; `a` and `b` hold `k` rows of the tile.
            unsafe { x86::fp32_tile(k, &a, &b, &mut tile) };
            std::hint::black_box(&tile);
        }
        let fp32 = flops / t.elapsed().as_secs_f64() / 1e9;
        println!("fp32 FMA tile:   {fp32:>6.1} GFLOP/s (one core)");
        if !std::arch::is_x86_feature_detected!("avx512bf16") {
            println!("no AVX512-BF16 on this CPU");
            return;
        }
        // bf16 1.0 is 0x3f80; a word holds the pair of k = 2p and 2p + 1.
        let (a, b) = (
            vec![0x3f80_3f80u32; k / 2 * MR],
            vec![0x3f80_3f80u32; k / 2 * NR],
        );
        let t = Instant::now();
        for _ in 0..reps {
            // SAFETY: AVX512-BF16 checked above; `k / 2` packed pairs per row and column.
            unsafe { x86::bf16_tile(k / 2, &a, &b, &mut tile) };
            std::hint::black_box(&tile);
        }
        let bf16 = flops / t.elapsed().as_secs_f64() / 1e9;
        assert_eq!(tile[0], k as f32, "the bf16 tile sums k products of 1 x 1");
        println!(
            "bf16 dpbf16 tile: {bf16:>6.1} GFLOP/s (one core), {:.2}x fp32",
            bf16 / fp32
        );
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{MR, NR};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f")]
    pub unsafe fn fp32_tile(k: usize, a: &[f32], b: &[f32], tile: &mut [f32; MR * NR]) {
        assert!(a.len() >= k * MR && b.len() >= k * NR);
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        for p in 0..k {
            // SAFETY: row p of b is NR floats inside b (asserted above).
            let (b0, b1) = unsafe {
                (
                    _mm512_loadu_ps(b.as_ptr().add(p * NR)),
                    _mm512_loadu_ps(b.as_ptr().add(p * NR + 16)),
                )
            };
            for (r, acc) in acc.iter_mut().enumerate() {
                // SAFETY: p * MR + r < k * MR <= a.len().
                let x = _mm512_set1_ps(unsafe { *a.as_ptr().add(p * MR + r) });
                acc[0] = _mm512_fmadd_ps(x, b0, acc[0]);
                acc[1] = _mm512_fmadd_ps(x, b1, acc[1]);
            }
        }
        store(&acc, tile);
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub unsafe fn bf16_tile(pairs: usize, a: &[u32], b: &[u32], tile: &mut [f32; MR * NR]) {
        assert!(a.len() >= pairs * MR && b.len() >= pairs * NR);
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        for p in 0..pairs {
            // SAFETY: row p of b is NR words inside b (asserted above); bf16 vectors are
            // 512-bit patterns like the integer loads.
            let (b0, b1) = unsafe {
                let row = b.as_ptr().add(p * NR) as *const i32;
                (
                    std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_epi32(row)),
                    std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_epi32(row.add(16))),
                )
            };
            for (r, acc) in acc.iter_mut().enumerate() {
                // SAFETY: p * MR + r < pairs * MR <= a.len().
                let word = _mm512_set1_epi32(unsafe { *a.as_ptr().add(p * MR + r) } as i32);
                let pair = std::mem::transmute::<__m512i, __m512bh>(word);
                acc[0] = _mm512_dpbf16_ps(acc[0], pair, b0);
                acc[1] = _mm512_dpbf16_ps(acc[1], pair, b1);
            }
        }
        store(&acc, tile);
    }

    #[target_feature(enable = "avx512f")]
    fn store(acc: &[[__m512; 2]; MR], tile: &mut [f32; MR * NR]) {
        for (r, acc) in acc.iter().enumerate() {
            // SAFETY: row r of the tile is NR floats.
            unsafe {
                _mm512_storeu_ps(tile.as_mut_ptr().add(r * NR), acc[0]);
                _mm512_storeu_ps(tile.as_mut_ptr().add(r * NR + 16), acc[1]);
            }
        }
    }
}
