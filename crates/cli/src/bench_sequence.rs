//! `elastrec bench sequence`: the pooling of a behaviour sequence against its candidate,
//! forward and backward, on random histories: DIN's target attention and the BST
//! transformer, and with `--pytorch PYTHON` the same layers in PyTorch
//! (`bench/pytorch_sequence.py`), timed back to back in each round.
//!
//! What one step is, on both sides: pool `[batch, len, dim]` histories against `[batch,
//! dim]` candidates, then the backward of `Σ c ⊙ pooled` (a fixed `c`) into the layer's
//! parameters, the histories and the candidates. No optimizer step: the model's own
//! update is the same on every pooling and timed by `elastrec bench`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use elastrec_common::quiet::LoadProbe;
use elastrec_model::{
    AttentionConfig, DenseDlrm, DlrmConfig, InteractionKind, TransformerConfig, Workspace,
};
use serde::Serialize;

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
    /// Timed steps per side and round (after two warm-up steps).
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// Math threads of each side.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Rounds; each times every layer of both sides back to back, and the median
    /// round's ratio is reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// A Python with torch installed: times the same layers in PyTorch in each round.
    #[arg(long)]
    pytorch: Option<PathBuf>,
    /// A round in which other processes used more than this share of the machine's CPU
    /// is disturbed: its timings are kept in the report but not used.
    #[arg(long, default_value_t = 0.05)]
    max_foreign_load: f64,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// The layers compared.
const LAYERS: [&str; 2] = ["din", "transformer"];

#[derive(Serialize, Clone)]
struct Round {
    layer: String,
    elastrec: f64,
    pytorch: Option<f64>,
    /// PyTorch's layer computing only the candidate's output in the last layer, as ours
    /// does (the transformer only).
    pytorch_candidate_only: Option<f64>,
    foreign_load: Option<f64>,
    /// `false`: other processes used more than `--max-foreign-load`; not used.
    quiet: Option<bool>,
}

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
        a.batch_size >= 1 && a.len >= 1 && a.dim >= 1 && a.steps >= 1 && a.rounds >= 1,
        "--batch-size, --len, --dim, --steps and --rounds must be at least 1"
    );
    ensure!(
        a.heads >= 1 && a.layers >= 1 && a.dim.is_multiple_of(a.heads),
        "--heads must divide --dim, and --heads and --layers must be at least 1"
    );
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(a.threads.max(1))
        .build()
        .context("starting the math threads")?;
    eprintln!(
        "pooling {} histories of {} items, width {}, {} timed steps per side, {} thread(s)",
        a.batch_size, a.len, a.dim, a.steps, a.threads
    );
    let mut rounds = Vec::new();
    let mut torch_version = None;
    for round in 0..a.rounds {
        for layer in LAYERS {
            let probe = LoadProbe::start();
            let ours = pool.install(|| time_ours(&a, layer))?;
            let theirs = match &a.pytorch {
                Some(py) => Some(time_pytorch(py, &a, layer)?),
                None => None,
            };
            let load = probe.and_then(|p| p.stop());
            let get = |k: &str| theirs.as_ref().and_then(|v| v[k].as_f64());
            if torch_version.is_none() {
                torch_version = theirs
                    .as_ref()
                    .and_then(|v| v["torch"].as_str().map(String::from));
            }
            eprintln!(
                "round {}: {layer}: elastrec {ours:.0} samples/s{}",
                round + 1,
                get("samples_per_s").map_or(String::new(), |t| format!(
                    ", PyTorch {t:.0} ({:.2}x)",
                    ours / t
                ))
            );
            rounds.push(Round {
                layer: layer.into(),
                elastrec: ours,
                pytorch: get("samples_per_s"),
                pytorch_candidate_only: get("candidate_only_samples_per_s"),
                foreign_load: load.map(|l| l.foreign_share()),
                quiet: load.map(|l| l.is_quiet(a.max_foreign_load)),
            });
        }
    }
    let summary = LAYERS.iter().map(|l| summarize(l, &rounds)).collect();
    let report = Report {
        batch_size: a.batch_size,
        len: a.len,
        dim: a.dim,
        threads: a.threads,
        rounds,
        summary,
        torch_version,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    if report.summary.iter().any(|s| s["elastrec"].is_null()) {
        bail!(
            "other processes used more than {:.1}% of the CPU in every round of a layer; its \
             numbers are not reported (null). Stop other work and run the bench again",
            100.0 * a.max_foreign_load
        );
    }
    Ok(())
}

/// One layer's medians over its quiet rounds, and the median round's ratios.
fn summarize(layer: &str, rounds: &[Round]) -> serde_json::Value {
    let of = |f: &dyn Fn(&Round) -> Option<f64>| {
        let quiet = rounds
            .iter()
            .filter(|r| r.layer == layer && r.quiet != Some(false));
        median(quiet.filter_map(f))
    };
    serde_json::json!({
        "layer": layer,
        "elastrec": of(&|r| Some(r.elastrec)),
        "pytorch": of(&|r| r.pytorch),
        "pytorch_candidate_only": of(&|r| r.pytorch_candidate_only),
        "ratio": of(&|r| r.pytorch.map(|t| r.elastrec / t)),
        "ratio_candidate_only": of(&|r| r.pytorch_candidate_only.map(|t| r.elastrec / t)),
    })
}

fn median(values: impl Iterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
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
    let cell = |v: &serde_json::Value, k: &str, digits: usize| {
        v[k].as_f64()
            .map_or("-".to_string(), |x| format!("{x:.digits$}"))
    };
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
    let disturbed = r.rounds.iter().filter(|x| x.quiet == Some(false)).count();
    println!(
        "samples/s are medians over the quiet rounds ({disturbed} of {} disturbed by other \
         processes); a ratio is the median round's",
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
    for _ in 0..a.steps {
        step(&mut ws)?;
    }
    Ok((a.steps * n) as f64 / t0.elapsed().as_secs_f64())
}

/// Runs `bench/pytorch_sequence.py` for one layer; its JSON line.
fn time_pytorch(python: &Path, a: &BenchSequenceArgs, layer: &str) -> Result<serde_json::Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/pytorch_sequence.py");
    let mlp: Vec<String> = a.din_mlp.iter().map(usize::to_string).collect();
    let out = std::process::Command::new(python)
        .arg(&script)
        .args(["--layer", layer])
        .args(["--batch", &a.batch_size.to_string()])
        .args(["--len", &a.len.to_string()])
        .args(["--dim", &a.dim.to_string()])
        .args(["--din-mlp", &mlp.join(",")])
        .args(["--heads", &a.heads.to_string()])
        .args(["--layers", &a.layers.to_string()])
        .args(["--steps", &a.steps.to_string()])
        .args(["--threads", &a.threads.to_string()])
        .output()
        .with_context(|| format!("running {} {}", python.display(), script.display()))?;
    if !out.status.success() {
        bail!(
            "the PyTorch layers failed ({}); is torch installed in that interpreter? See \
             bench/README.md.\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .context("the PyTorch layers printed no JSON line")?;
    Ok(serde_json::from_str(line)?)
}
