//! `elastrec bench sequence`: the pooling of a behaviour sequence against its candidate,
//! forward and backward, on random histories: DIN's target attention and the BST
//! transformer, and with `--pytorch PYTHON` the same layers in PyTorch
//! (`bench/pytorch_sequence.py`), timed back to back in each round.
//!
//! What one step is, on both sides: pool `[batch, len, dim]` histories against `[batch,
//! dim]` candidates, then the backward of `Σ c ⊙ pooled` (a fixed `c`) into the layer's
//! parameters, the histories and the candidates. No optimizer step: the model's own
//! update is the same on every pooling and timed by `elastrec bench`.

use std::time::Instant;

use anyhow::{ensure, Result};
use elastrec_model::{
    AttentionConfig, DenseDlrm, DlrmConfig, InteractionKind, TransformerConfig, Workspace,
};
use serde::Serialize;

use crate::bench_rounds::{self, Round};

/// Arguments of `elastrec bench sequence`.
#[derive(clap::Args)]
pub struct BenchSequenceArgs {
    /// Rows per step.
    #[arg(long, default_value_t = 2048)]
    batch_size: usize,
    /// Items of every history.
    #[arg(long, default_value_t = 50)]
    len: usize,
    /// Embedding width.
    #[arg(long, default_value_t = 16)]
    dim: usize,
    /// Hidden sizes of DIN's scoring MLP (comma-separated).
    #[arg(long, default_value = "32", value_delimiter = ',')]
    din_mlp: Vec<usize>,
    /// Transformer heads.
    #[arg(long, default_value_t = 2)]
    heads: usize,
    /// Transformer layers.
    #[arg(long, default_value_t = 1)]
    layers: usize,
    #[command(flatten)]
    common: bench_rounds::RoundArgs,
}

/// The layers compared.
const LAYERS: [&str; 2] = ["din", "transformer"];

#[derive(Serialize)]
struct Report {
    batch_size: usize,
    len: usize,
    dim: usize,
    threads: usize,
    rounds: Vec<Round>,
    /// Per layer: median samples/s of each side and the median round's ratio.
    summary: Vec<serde_json::Value>,
    torch_version: Option<String>,
}

/// Runs the benchmark and prints its report.
pub fn run(a: BenchSequenceArgs) -> Result<()> {
    ensure!(
        a.batch_size >= 1 && a.len >= 1 && a.dim >= 1,
        "--batch-size, --len and --dim must be at least 1"
    );
    ensure!(
        a.heads >= 1 && a.layers >= 1 && a.dim.is_multiple_of(a.heads),
        "--heads must divide --dim, and --heads and --layers must be at least 1"
    );
    eprintln!(
        "pooling {} histories of {} items, width {}, {} timed steps per side, {} thread(s)",
        a.batch_size, a.len, a.dim, a.common.steps, a.common.threads
    );
    let cases: Vec<String> = LAYERS.iter().map(|l| l.to_string()).collect();
    let rounds = a.common.run_cases(
        &cases,
        "pytorch_sequence.py",
        |layer| reference_args(&a, layer),
        |layer| time_ours(&a, layer),
    )?;
    let torch_version = bench_rounds::torch_version(&rounds);
    let summary = LAYERS.iter().map(|l| summarize(l, &rounds)).collect();
    let report = Report {
        batch_size: a.batch_size,
        len: a.len,
        dim: a.dim,
        threads: a.common.threads,
        rounds,
        summary,
        torch_version,
    };
    a.common
        .finish(&report, print_table, &report.rounds, &cases)
}

/// One layer's medians over the quiet rounds, and the median round's ratios.
fn summarize(layer: &str, rounds: &[Round]) -> serde_json::Value {
    let of = |f: &dyn Fn(&Round) -> Option<f64>| bench_rounds::median(rounds, layer, f);
    let full = |r: &Round| r.reference_value("samples_per_s");
    let cand = |r: &Round| r.reference_value("candidate_only_samples_per_s");
    serde_json::json!({
        "layer": layer,
        "elastrec": of(&|r| Some(r.elastrec)),
        "pytorch": of(&full),
        "pytorch_candidate_only": of(&cand),
        "ratio": of(&|r| full(r).map(|t| r.elastrec / t)),
        "ratio_candidate_only": of(&|r| cand(r).map(|t| r.elastrec / t)),
    })
}

fn print_table(r: &Report) {
    println!(
        "sequence pooling, forward + backward: batch {}, {} items, width {}, {} thread(s){}",
        r.batch_size,
        r.len,
        r.dim,
        r.threads,
        r.torch_version
            .as_ref()
            .map_or(String::new(), |v| format!(", torch {v}"))
    );
    println!(
        "{:<12} {:>16} {:>16} {:>8} {:>22} {:>8}",
        "layer", "elastrec (1/s)", "PyTorch (1/s)", "ratio", "PyTorch cand.-only (1/s)", "ratio"
    );
    let cell = bench_rounds::cell;
    for s in &r.summary {
        println!(
            "{:<12} {:>16} {:>16} {:>8} {:>22} {:>8}",
            s["layer"].as_str().unwrap_or(""),
            cell(s, "elastrec", 0),
            cell(s, "pytorch", 0),
            cell(s, "ratio", 2),
            cell(s, "pytorch_candidate_only", 0),
            cell(s, "ratio_candidate_only", 2),
        );
    }
    println!(
        "samples/s are medians over the quiet rounds ({} of {} disturbed by other \
         processes); a ratio is the median round's",
        bench_rounds::disturbed(&r.rounds),
        r.rounds.len()
    );
}

/// A model of two slots, the candidate (0) and the history (1), whose only work is the
/// history's unit.
fn model(a: &BenchSequenceArgs, layer: &str) -> Result<DenseDlrm> {
    let transformer = (layer == "transformer").then(|| TransformerConfig {
        heads: a.heads,
        layers: a.layers,
        ffn: 4 * a.dim,
        positions: true,
    });
    let config = DlrmConfig {
        bottom: vec![1, a.dim],
        top: vec![1],
        num_tables: 2,
        embedding_dim: a.dim,
        interaction: InteractionKind::Dot,
        attention: vec![AttentionConfig {
            slot: 1,
            query: 0,
            max_len: a.len,
            mlp: a.din_mlp.clone(),
            softmax: false,
            transformer,
        }],
        ..DlrmConfig::criteo_kaggle()
    };
    Ok(DenseDlrm::new(config)?)
}

/// Samples per second of our unit's forward and backward.
fn time_ours(a: &BenchSequenceArgs, layer: &str) -> Result<f64> {
    let model = model(a, layer)?;
    let (n, d, t) = (a.batch_size, a.dim, a.len);
    let mut rng = elastrec_model::init::InitRng::new(11, 0);
    let mut draw = |k: usize| -> Vec<f32> { (0..k).map(|_| rng.uniform_sym(0.5)).collect() };
    let hist = draw(n * t * d);
    let emb0 = draw(n * 2 * d);
    let c = draw(n * 2 * d);
    let lens = vec![t as u32; n];
    let mut emb = emb0.clone();
    let mut d_hist = vec![0.0; hist.len()];
    let mut ws: Workspace = model.workspace(n);
    let mut step = |ws: &mut Workspace| -> Result<()> {
        emb.copy_from_slice(&emb0);
        model.attend(&hist, &lens, &mut emb, ws)?;
        ws.d_emb_mut()[..c.len()].copy_from_slice(&c);
        model.attend_backward(&hist, &lens, &emb, &mut d_hist, ws)?;
        Ok(())
    };
    for _ in 0..2 {
        step(&mut ws)?;
    }
    let t0 = Instant::now();
    for _ in 0..a.common.steps {
        step(&mut ws)?;
    }
    Ok((a.common.steps * n) as f64 / t0.elapsed().as_secs_f64())
}

/// The arguments of `bench/pytorch_sequence.py` for one layer of these sizes.
fn reference_args(a: &BenchSequenceArgs, layer: &str) -> Vec<std::ffi::OsString> {
    let mlp: Vec<String> = a.din_mlp.iter().map(usize::to_string).collect();
    bench_rounds::flags([
        ("--layer", layer.to_string()),
        ("--batch", a.batch_size.to_string()),
        ("--len", a.len.to_string()),
        ("--dim", a.dim.to_string()),
        ("--din-mlp", mlp.join(",")),
        ("--heads", a.heads.to_string()),
        ("--layers", a.layers.to_string()),
        ("--steps", a.common.steps.to_string()),
        ("--threads", a.common.threads.to_string()),
    ])
}
