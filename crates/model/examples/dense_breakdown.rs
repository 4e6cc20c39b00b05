//! Per-phase timing of the Criteo-Kaggle dense step at batch 2048 on ONE thread (the
//! layers run single-threaded; `DenseDlrm` runs row blocks in parallel), best of several
//! runs per phase to see through machine noise, with each phase's GFLOP/s.
//!
//! `cargo run --release -p elastrec-model --example dense_breakdown`

use std::time::Instant;

use elastrec_model::{Adagrad, DenseDlrm, DenseOptimizer, DlrmConfig, Linear};

fn best(mut f: impl FnMut(), reps: usize) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let n = 2048;
    let reps = 15;
    let model = DenseDlrm::new(DlrmConfig::criteo_kaggle()).unwrap();
    let p = model.params().to_vec();
    let mut grads = vec![0.0; p.len()];
    let layers: Vec<(&str, Linear)> = model
        .bottom()
        .layers
        .iter()
        .map(|l| ("bottom", l.clone()))
        .chain(model.top().layers.iter().map(|l| ("top", l.clone())))
        .collect();
    let mut total = 0.0;
    println!("{:<22} {:>9} {:>8}", "phase", "ms", "GFLOP/s");
    for (name, l) in &layers {
        let x = vec![0.3f32; n * l.in_dim];
        let mut y = vec![0.0f32; n * l.out_dim];
        let mut dy = vec![0.01f32; n * l.out_dim];
        let mut dx = vec![0.0f32; n * l.in_dim];
        let tf = best(|| l.forward(&p, &x, n, &mut y), reps);
        let tb = best(
            || l.backward(&p, &mut grads, &x, &y, &mut dy, Some(&mut dx), n),
            reps,
        );
        let f = (n * l.in_dim * l.out_dim * 2) as f64;
        println!(
            "{:<22} {:>9.3} {:>8.1}",
            format!("{name} fwd {}x{}", l.in_dim, l.out_dim),
            tf * 1e3,
            f / tf / 1e9
        );
        println!(
            "{:<22} {:>9.3} {:>8.1}",
            "   bwd",
            tb * 1e3,
            2.0 * f / tb / 1e9
        );
        total += tf + tb;
    }
    let it = model.interaction();
    let z = vec![0.1f32; n * it.bottom_dim];
    let e = vec![0.2f32; n * it.num_tables * it.dim];
    let mut out = vec![0.0f32; n * it.out_dim()];
    let mut dz = vec![0.0f32; n * it.bottom_dim];
    let mut de = vec![0.0f32; n * it.num_tables * it.dim];
    let tf = best(|| it.forward(&z, &e, n, &mut out), reps);
    let tb = best(|| it.backward(&z, &e, &out, n, &mut dz, &mut de), reps);
    println!(
        "{:<22} {:>9.3} {:>8.1}",
        "interaction fwd",
        tf * 1e3,
        (it.forward_flops() * n as u64) as f64 / tf / 1e9
    );
    println!(
        "{:<22} {:>9.3} {:>8.1}",
        "interaction bwd",
        tb * 1e3,
        (it.backward_flops() * n as u64) as f64 / tb / 1e9
    );
    total += tf + tb;
    let mut opt = Adagrad::new(p.len(), 0.01, 0.0, 1e-10);
    let mut pp = p.clone();
    let g = vec![0.001f32; p.len()];
    let to = best(|| opt.step(&mut pp, &g), reps);
    println!("{:<22} {:>9.3}", "adagrad step", to * 1e3);
    total += to;
    println!("{:<22} {:>9.3}", "sum of phases", total * 1e3);
}
