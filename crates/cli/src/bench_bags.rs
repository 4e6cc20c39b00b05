//! `elastrec bench bags`: embedding bags of several mean lengths, pooled by sum or mean,
//! and with `--pytorch PYTHON` the same through `nn.EmbeddingBag` (`bench/pytorch_bags.py`),
//! timed back to back in each round.
//!
//! What one step is, on both sides: look up and pool one bag per row from one table
//! (`--rows` rows of `--dim` floats), then the backward of `Σ c ⊙ pooled` (a fixed `c`)
//! into the rows and the sparse Adagrad update of every row touched (elastrec's per-weight
//! `adagrad`; PyTorch's `torch.optim.Adagrad` on the bag's sparse gradient). Bag lengths
//! are uniform in `1..=2L-1` (mean `L`), ids uniform over the table; each side draws its
//! own with the same law.

use std::time::Instant;

use anyhow::{ensure, Context, Result};
use elastrec_data::schema::Pooling;
use elastrec_data::{Batch, Jagged};
use elastrec_embedding::{EmbeddingConfig, EmbeddingStore, SparseOptimizerConfig, UpdateScratch};
use elastrec_worker::pooling::{Lookups, SlotLayout};
use serde::Serialize;

use crate::bench_rounds::{self, Round};

/// Arguments of `elastrec bench bags`.
#[derive(clap::Args)]
pub struct BenchBagsArgs {
    /// Rows (bags) per step.
    #[arg(long, default_value_t = 2048)]
    batch_size: usize,
    /// Mean bag lengths to time (comma-separated).
    #[arg(long, default_value = "1,8,50", value_delimiter = ',')]
    lengths: Vec<usize>,
    /// Poolings to time (comma-separated): sum, mean.
    #[arg(long, default_value = "sum,mean", value_delimiter = ',')]
    poolings: Vec<String>,
    /// Embedding width.
    #[arg(long, default_value_t = 16)]
    dim: usize,
    /// Rows of the table.
    #[arg(long, default_value_t = 1_000_000)]
    rows: u64,
    #[command(flatten)]
    common: bench_rounds::RoundArgs,
}

#[derive(Serialize)]
struct Report {
    batch_size: usize,
    dim: usize,
    rows: u64,
    threads: usize,
    rounds: Vec<Round>,
    /// Per case (`pooling/mean length`): median samples/s of each side and the median
    /// round's ratio.
    summary: Vec<serde_json::Value>,
    torch_version: Option<String>,
}

/// Runs the benchmark and prints its report.
pub fn run(a: BenchBagsArgs) -> Result<()> {
    ensure!(
        a.batch_size >= 1 && a.dim >= 1 && a.rows >= 1,
        "--batch-size, --dim and --rows must be at least 1"
    );
    ensure!(
        !a.lengths.is_empty() && a.lengths.iter().all(|&l| l >= 1),
        "--lengths: mean bag lengths of at least 1"
    );
    let mut cases = Vec::new();
    for p in &a.poolings {
        pooling(p)?;
        for l in &a.lengths {
            cases.push(format!("{p}/{l}"));
        }
    }
    eprintln!(
        "embedding bags: {} per step from a table of {} rows x {}, {} timed steps per side, \
         {} thread(s)",
        a.batch_size, a.rows, a.dim, a.common.steps, a.common.threads
    );
    let rounds = a.common.run_cases(
        &cases,
        "pytorch_bags.py",
        |case| reference_args(&a, case),
        |case| time_ours(&a, case),
    )?;
    let torch_version = bench_rounds::torch_version(&rounds);
    let summary = cases
        .iter()
        .map(|c| {
            let of = |f: &dyn Fn(&Round) -> Option<f64>| bench_rounds::median(&rounds, c, f);
            let theirs = |r: &Round| r.reference_value("samples_per_s");
            serde_json::json!({
                "case": c,
                "elastrec": of(&|r| Some(r.elastrec)),
                "pytorch": of(&theirs),
                "ratio": of(&|r| theirs(r).map(|t| r.elastrec / t)),
            })
        })
        .collect();
    let report = Report {
        batch_size: a.batch_size,
        dim: a.dim,
        rows: a.rows,
        threads: a.common.threads,
        rounds,
        summary,
        torch_version,
    };
    a.common
        .finish(&report, print_table, &report.rounds, &cases)
}

fn pooling(name: &str) -> Result<Pooling> {
    match name {
        "sum" => Ok(Pooling::Sum),
        "mean" => Ok(Pooling::Mean),
        other => anyhow::bail!("--poolings: {other:?} is not sum or mean"),
    }
}

/// A case's pooling and mean length.
fn parse_case(case: &str) -> Result<(Pooling, usize)> {
    let (p, l) = case.split_once('/').context("a case is pooling/length")?;
    Ok((pooling(p)?, l.parse()?))
}

fn print_table(r: &Report) {
    println!(
        "embedding bags, lookup + pooling + backward + Adagrad: batch {}, table {} x {}, {} \
         thread(s){}",
        r.batch_size,
        r.rows,
        r.dim,
        r.threads,
        r.torch_version
            .as_ref()
            .map_or(String::new(), |v| format!(", torch {v}"))
    );
    println!(
        "{:<10} {:>16} {:>16} {:>8}",
        "bags", "elastrec (1/s)", "PyTorch (1/s)", "ratio"
    );
    let cell = bench_rounds::cell;
    for s in &r.summary {
        println!(
            "{:<10} {:>16} {:>16} {:>8}",
            s["case"].as_str().unwrap_or(""),
            cell(s, "elastrec", 0),
            cell(s, "pytorch", 0),
            cell(s, "ratio", 2),
        );
    }
    println!(
        "bags are pooling/mean length; samples/s are medians over the quiet rounds ({} of {} \
         disturbed by other processes); a ratio is the median round's",
        bench_rounds::disturbed(&r.rounds),
        r.rounds.len()
    );
}

/// Batches of one bag per row, lengths uniform in `1..=2 * mean - 1`.
fn batches(a: &BenchBagsArgs, mean: usize, count: usize) -> Vec<Batch> {
    let mut rng = elastrec_model::init::InitRng::new(17, mean as u64);
    (0..count)
        .map(|_| {
            let mut b = Batch::with_widths(a.batch_size, 0, 0);
            let mut jag = Jagged::default();
            for _ in 0..a.batch_size {
                b.labels.push(0.0);
                let len = 1 + (rng.next_u64() % (2 * mean as u64 - 1)) as usize;
                jag.ids.extend((0..len).map(|_| rng.next_u64() % a.rows));
                jag.end_row();
            }
            b.bags.push(jag);
            b
        })
        .collect()
}

/// Samples per second of our lookups, pooling, backward and update.
fn time_ours(a: &BenchBagsArgs, case: &str) -> Result<f64> {
    let (pooling, mean) = parse_case(case)?;
    let mut store = EmbeddingStore::new(EmbeddingConfig {
        dim: a.dim,
        optimizer: SparseOptimizerConfig::Adagrad {
            lr: 0.01,
            eps: 1e-10,
            initial_accumulator: 0.0,
        },
        ..EmbeddingConfig::with_rows(vec![a.rows])
    })?;
    let layout = SlotLayout {
        slot_tables: vec![0],
        pooling: vec![pooling],
        histories: vec![None],
    };
    let data = batches(a, mean, 4);
    let mut rng = elastrec_model::init::InitRng::new(19, 0);
    let c: Vec<f32> = (0..a.batch_size * a.dim)
        .map(|_| rng.uniform_sym(0.5))
        .collect();
    let mut emb = vec![0.0; a.batch_size * a.dim];
    let mut lookups = Lookups::default();
    let mut scratch = UpdateScratch::new();
    let mut step = |i: usize| -> Result<()> {
        let batch = &data[i % data.len()];
        lookups.gather(&layout, &store, batch, &mut emb)?;
        lookups.apply(&mut store, &c, &mut scratch)?;
        Ok(())
    };
    for i in 0..2 {
        step(i)?;
    }
    let t0 = Instant::now();
    for i in 0..a.common.steps {
        step(i)?;
    }
    Ok((a.common.steps * a.batch_size) as f64 / t0.elapsed().as_secs_f64())
}

/// The arguments of `bench/pytorch_bags.py` for one case.
fn reference_args(a: &BenchBagsArgs, case: &str) -> Vec<std::ffi::OsString> {
    let (p, l) = case.split_once('/').unwrap_or((case, "1"));
    bench_rounds::flags([
        ("--mode", p.to_string()),
        ("--mean-len", l.to_string()),
        ("--batch", a.batch_size.to_string()),
        ("--dim", a.dim.to_string()),
        ("--rows", a.rows.to_string()),
        ("--steps", a.common.steps.to_string()),
        ("--threads", a.common.threads.to_string()),
    ])
}
