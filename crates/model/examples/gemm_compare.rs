//! Compares the two candidate SGEMM crates (`matrixmultiply`, `gemm`) on large square
//! matrices and on every GEMM shape of a Criteo-Kaggle DLRM step at batch 2048, using
//! all rayon / matrixmultiply threads.
//!
//! `cargo run --release -p elastrec-model --example gemm_compare`

use std::time::Instant;

#[derive(Clone, Copy)]
struct Op {
    name: &'static str,
    m: usize,
    k: usize,
    n: usize,
    /// A stored transposed (column-major view of a row-major buffer).
    at: bool,
    /// B stored transposed.
    bt: bool,
}

fn strides(rows: usize, cols: usize, t: bool) -> (isize, isize) {
    if t {
        (1, rows as isize)
    } else {
        (cols as isize, 1)
    }
}

fn run_mm(op: Op, a: &[f32], b: &[f32], c: &mut [f32]) {
    let (rsa, csa) = strides(op.m, op.k, op.at);
    let (rsb, csb) = strides(op.k, op.n, op.bt);
    unsafe {
        matrixmultiply::sgemm(
            op.m,
            op.k,
            op.n,
            1.0,
            a.as_ptr(),
            rsa,
            csa,
            b.as_ptr(),
            rsb,
            csb,
            0.0,
            c.as_mut_ptr(),
            op.n as isize,
            1,
        );
    }
}

fn run_gemm(op: Op, a: &[f32], b: &[f32], c: &mut [f32], threads: usize) {
    let (rsa, csa) = strides(op.m, op.k, op.at);
    let (rsb, csb) = strides(op.k, op.n, op.bt);
    let par = if threads > 1 {
        gemm_common::Parallelism::Rayon(threads)
    } else {
        gemm_common::Parallelism::None
    };
    unsafe {
        gemm_f32::gemm::f32::get_gemm_fn()(
            op.m,
            op.n,
            op.k,
            c.as_mut_ptr(),
            1,
            op.n as isize,
            false,
            a.as_ptr(),
            csa,
            rsa,
            b.as_ptr(),
            csb,
            rsb,
            0.0,
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}

fn time(mut f: impl FnMut(), flops: f64) -> f64 {
    f();
    let mut iters = 1;
    loop {
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        let s = t.elapsed().as_secs_f64();
        if s > 0.3 {
            return flops * iters as f64 / s / 1e9;
        }
        iters *= 2;
    }
}

fn main() {
    let threads = rayon::current_num_threads();
    let nb = 2048;
    let mut ops = vec![
        Op {
            name: "square 1024",
            m: 1024,
            k: 1024,
            n: 1024,
            at: false,
            bt: false,
        },
        Op {
            name: "square 2048",
            m: 2048,
            k: 2048,
            n: 2048,
            at: false,
            bt: false,
        },
    ];
    let layers = [
        (13, 512),
        (512, 256),
        (256, 64),
        (64, 16),
        (367, 512),
        (512, 256),
        (256, 1),
    ];
    let names_f = [
        "fwd 13x512",
        "fwd 512x256",
        "fwd 256x64",
        "fwd 64x16",
        "fwd 367x512",
        "fwd 512x256t",
        "fwd 256x1",
    ];
    for (i, &(inp, out)) in layers.iter().enumerate() {
        ops.push(Op {
            name: names_f[i],
            m: nb,
            k: inp,
            n: out,
            at: false,
            bt: true,
        });
        ops.push(Op {
            name: "  dW",
            m: out,
            k: nb,
            n: inp,
            at: true,
            bt: false,
        });
        if i != 0 {
            ops.push(Op {
                name: "  dX",
                m: nb,
                k: out,
                n: inp,
                at: false,
                bt: false,
            });
        }
    }
    println!("threads={threads}");
    println!(
        "{:<14} {:>5} {:>5} {:>5} {:>10} {:>10} {:>10}",
        "op", "m", "k", "n", "mm GF/s", "gemm GF/s", "gemm1t"
    );
    let (mut tm, mut tg) = (0.0, 0.0);
    for op in ops {
        let a: Vec<f32> = (0..op.m * op.k).map(|i| (i % 7) as f32 * 0.1).collect();
        let b: Vec<f32> = (0..op.k * op.n).map(|i| (i % 5) as f32 * 0.1).collect();
        let mut c = vec![0.0f32; op.m * op.n];
        let flops = 2.0 * (op.m * op.k * op.n) as f64;
        let g_mm = time(|| run_mm(op, &a, &b, &mut c), flops);
        let g_ge = time(|| run_gemm(op, &a, &b, &mut c, threads), flops);
        let g_g1 = time(|| run_gemm(op, &a, &b, &mut c, 1), flops);
        if !op.name.starts_with("square") {
            tm += flops / g_mm;
            tg += flops / g_ge.max(g_g1);
        }
        println!(
            "{:<14} {:>5} {:>5} {:>5} {:>10.1} {:>10.1} {:>10.1}",
            op.name, op.m, op.k, op.n, g_mm, g_ge, g_g1
        );
    }
    println!(
        "sum of DLRM-step GEMM time: matrixmultiply {:.2} ms, gemm(best of 1t/{}t) {:.2} ms",
        tm / 1e6,
        threads,
        tg / 1e6
    );
}
