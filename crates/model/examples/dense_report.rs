//! Measures the dense DLRM training step (forward + backward + dense Adagrad) on the
//! Criteo-Kaggle model and the machine's SGEMM peak with the same GEMM library and thread
//! count, interleaved so that both see the same machine load; prints one JSON line.
//!
//! `cargo run --release -p elastrec-model --example dense_report -- [batch] [rounds]`

use std::time::Instant;

use elastrec_model::{Adagrad, DenseDlrm, DenseOptimizer, DlrmConfig};

fn lcg(state: &mut u64) -> f32 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*state >> 40) as f32) / (1u64 << 24) as f32
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("number"))
        .collect();
    let n = args.first().copied().unwrap_or(2048);
    let rounds = args.get(1).copied().unwrap_or(10);
    let steps_per_round = 5;

    let cfg = DlrmConfig::criteo_kaggle();
    let (t, d, nd) = (cfg.num_tables, cfg.embedding_dim, cfg.num_dense());
    let mut model = DenseDlrm::new(cfg).expect("valid config");
    let mut ws = model.workspace(n);
    let mut opt = Adagrad::new(model.num_params(), 0.01, 0.0, 1e-10);
    let mut s = 1u64;
    let dense: Vec<f32> = (0..n * nd).map(|_| lcg(&mut s) * 3.0).collect();
    let emb: Vec<f32> = (0..n * t * d).map(|_| (lcg(&mut s) - 0.5) * 0.2).collect();
    let labels: Vec<f32> = (0..n).map(|_| f32::from(lcg(&mut s) < 0.25)).collect();

    let pk = 2048;
    let a: Vec<f32> = (0..pk * pk).map(|_| lcg(&mut s)).collect();
    let b: Vec<f32> = (0..pk * pk).map(|_| lcg(&mut s)).collect();
    let mut c = vec![0.0f32; pk * pk];
    let peak_flops = 2.0 * (pk * pk * pk) as f64;
    let sgemm = |c: &mut [f32]| elastrec_model::gemm::matmul(&a, &b, c, pk, pk, pk);

    let mut step = |model: &mut DenseDlrm| {
        let loss = model
            .forward_backward(&dense, &emb, &labels, &mut ws)
            .expect("shapes");
        opt.step(model.params_mut(), ws.grads());
        loss
    };
    for _ in 0..3 {
        step(&mut model);
        sgemm(&mut c);
    }
    let (mut step_s, mut peak_gf) = (Vec::new(), Vec::new());
    let mut loss = 0.0;
    for _ in 0..rounds {
        let t0 = Instant::now();
        sgemm(&mut c);
        peak_gf.push(peak_flops / t0.elapsed().as_secs_f64() / 1e9);
        let t0 = Instant::now();
        for _ in 0..steps_per_round {
            loss = step(&mut model);
        }
        step_s.push(t0.elapsed().as_secs_f64() / steps_per_round as f64);
    }
    let fl = model.flops_per_sample();
    let step_flops = fl.total() as f64 * n as f64;
    let best_step = step_s.iter().copied().fold(f64::INFINITY, f64::min);
    let med_step = median(&mut step_s);
    let best_peak = peak_gf.iter().copied().fold(0.0, f64::max);
    let med_peak = median(&mut peak_gf);
    let threads = rayon::current_num_threads();
    println!(
        "{{\"impl\":\"elastrec-model\",\"mode\":\"dense\",\"batch\":{n},\"threads\":{threads},\
\"samples_per_s_median\":{:.1},\"samples_per_s_best\":{:.1},\"ms_per_step_median\":{:.3},\
\"flops_per_sample\":{},\"gflops_median\":{:.2},\"gflops_best\":{:.2},\
\"sgemm{pk}_peak_gflops_median\":{:.2},\"sgemm{pk}_peak_gflops_best\":{:.2},\
\"pct_of_peak_median\":{:.1},\"pct_of_peak_best\":{:.1},\"last_loss\":{loss:.5}}}",
        n as f64 / med_step,
        n as f64 / best_step,
        med_step * 1e3,
        fl.total(),
        step_flops / med_step / 1e9,
        step_flops / best_step / 1e9,
        med_peak,
        best_peak,
        100.0 * step_flops / med_step / 1e9 / med_peak,
        100.0 * step_flops / best_step / 1e9 / best_peak,
    );
}
