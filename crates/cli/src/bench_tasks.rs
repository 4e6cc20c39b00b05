//! `elastrec bench tasks`: data task graph generation at Primus scale (§6, Fig. 9: about
//! 4 million tasks over 56 million files from two sources and 20 days of hourly
//! partitions; 149 s on 1 thread, 42 s on 4).
//!
//! The listing is generated ([`GeneratedLister`]): every partition "holds" the same number
//! of files, produced on demand, so what is measured is the planner (timers, parallel
//! sources, the listing cache, joiners, the sink) and not this machine's disk. Names,
//! sizes and tasks are materialized exactly as for a real listing.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use elastrec_common::quiet::LoadProbe;
use elastrec_orchestrate::{
    parse_time, Dataset, GeneratedLister, TaskGraph, TaskLimits, WindowSpec,
};
use serde::Serialize;

/// Arguments of `elastrec bench tasks`.
#[derive(clap::Args)]
pub struct BenchTasksArgs {
    /// Data tasks to generate (rounded up to whole partitions).
    #[arg(long, default_value_t = 4_000_000)]
    tasks: u64,
    /// Files per task (Primus: 56M files / 4M tasks = 14).
    #[arg(long, default_value_t = 14)]
    files_per_task: u32,
    /// Days of hourly partitions per source.
    #[arg(long, default_value_t = 20)]
    days: u32,
    /// Datasets (sources) joined by time.
    #[arg(long, default_value_t = 2)]
    sources: u32,
    /// Planner threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Report {
    tasks: usize,
    files: u64,
    partitions: usize,
    threads: usize,
    seconds: f64,
    tasks_per_s: f64,
    files_per_s: f64,
    /// Re-planning one hour later: only the new partitions are listed.
    replan_ms: f64,
    replan_listed: usize,
    replan_tasks: usize,
    listing_cache_mb: f64,
    peak_rss_mb: Option<f64>,
    /// Share of the machine's CPU that other processes used while it planned
    /// (`elastrec_common::quiet`): above a few percent the seconds are not comparable.
    foreign_load: Option<f64>,
}

/// Runs the benchmark and prints its report.
pub fn run(a: BenchTasksArgs) -> Result<()> {
    ensure!(
        a.sources >= 1 && a.days >= 1,
        "--sources and --days must be at least 1"
    );
    ensure!(a.files_per_task >= 1, "--files-per-task must be at least 1");
    let partitions = u64::from(a.days) * 24 * u64::from(a.sources);
    let files_per_partition = (a.tasks * u64::from(a.files_per_task)).div_ceil(partitions);
    let files_per_partition = u32::try_from(files_per_partition)
        .context("too many files per partition: raise --days or --sources")?;
    let lister = Arc::new(GeneratedLister::new(files_per_partition, 1 << 20));
    let from = parse_time("2026-01-01").expect("valid time");
    let end = from + chrono::Duration::days(i64::from(a.days));
    let datasets = (0..a.sources)
        .map(|s| {
            // Growing windows, so that a later round has a new hour to plan.
            Dataset::with_lister(
                &format!("source{s}"),
                &format!("source{s}/dt={{date}}/hour={{hour}}"),
                WindowSpec::Range { from, to: None },
                lister.clone(),
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let limits = TaskLimits {
        files: a.files_per_task,
        bytes: u64::MAX,
    };
    let threads = if a.threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        a.threads
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .context("building the planner's thread pool")?;
    let mut graph = TaskGraph::new(datasets, limits);
    eprintln!(
        "planning {} sources x {} days x 24 hours = {partitions} partitions of {files_per_partition} files on {threads} thread(s)...",
        a.sources, a.days
    );
    let probe = LoadProbe::start();
    let started = Instant::now();
    let round = pool.install(|| graph.plan(end))?;
    let seconds = started.elapsed().as_secs_f64();
    let load = probe.and_then(|p| p.stop());
    let replan_started = Instant::now();
    let replan = pool.install(|| graph.plan(end + chrono::Duration::hours(1)))?;
    let replan_ms = replan_started.elapsed().as_secs_f64() * 1e3;
    let report = Report {
        tasks: round.tasks.len(),
        files: round.files,
        partitions: round.listed,
        threads,
        seconds,
        tasks_per_s: round.tasks.len() as f64 / seconds,
        files_per_s: round.files as f64 / seconds,
        replan_ms,
        replan_listed: replan.listed,
        replan_tasks: replan.tasks.len(),
        listing_cache_mb: graph.listing_bytes() as f64 / 1e6,
        peak_rss_mb: peak_rss_mb(),
        foreign_load: load.map(|l| l.foreign_share()),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!("data task graph generation (generated listing, {threads} thread(s))");
    println!("  tasks            {:>14}", report.tasks);
    println!("  files            {:>14}", report.files);
    println!("  partitions       {:>14}", report.partitions);
    println!("  seconds          {:>14.2}", report.seconds);
    println!("  tasks/s          {:>14.0}", report.tasks_per_s);
    println!("  files/s          {:>14.0}", report.files_per_s);
    println!(
        "  re-plan +1 hour  {:>11.1} ms ({} partitions listed, {} new tasks)",
        report.replan_ms, report.replan_listed, report.replan_tasks
    );
    println!("  listing cache    {:>11.0} MB", report.listing_cache_mb);
    match report.peak_rss_mb {
        Some(mb) => println!("  peak RSS         {mb:>11.0} MB"),
        None => println!("  peak RSS         (unknown: no /proc/self/status)"),
    }
    match report.foreign_load {
        Some(f) => println!(
            "  foreign CPU      {:>13.1}% of the machine while planning",
            100.0 * f
        ),
        None => println!("  foreign CPU      (unknown: no /proc/stat)"),
    }
    println!("  (Primus, Fig. 9: ~4M tasks over 56M files in 149 s on 1 thread, 42 s on 4)");
    Ok(())
}

/// The process's peak resident memory (`VmHWM`), in MB.
fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1e3)
}
