//! `elastrec bench serve`: the model server's queries per second and latency percentiles,
//! over HTTP/JSON and gRPC, for requests of 1 and of 64 rows (docs/serving.md).
//!
//! The server runs in this process on its own runtime (`--server-threads` threads) and the
//! clients on another, on loopback: the numbers include the clients' own CPU, which on a
//! small machine competes with the server's. Every request is a real request through the
//! socket, parsed, checked and predicted as any client's would be.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use elastrec_common::quiet::LoadProbe;
use serde::Serialize;

/// Arguments of `elastrec bench serve`.
#[derive(clap::Args)]
pub struct BenchServeArgs {
    /// Model file to serve.
    #[arg(long)]
    model: std::path::PathBuf,
    /// Criteo TSV file whose rows the requests carry (cycled).
    #[arg(long)]
    data: std::path::PathBuf,
    /// Rows per request, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    batch: Vec<usize>,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Seconds each case runs (after a warm-up of a tenth of it).
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Worker threads of the server's runtime.
    #[arg(long, default_value_t = 1)]
    server_threads: usize,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Case {
    protocol: &'static str,
    batch: usize,
    requests: usize,
    qps: f64,
    rows_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    /// Share of the machine's CPU other processes used during the case.
    foreign_load: Option<f64>,
}

#[derive(Serialize)]
struct Report {
    model: String,
    concurrency: usize,
    server_threads: usize,
    cores: usize,
    cases: Vec<Case>,
}

/// What one client sends: the HTTP body and the gRPC message of the same rows.
struct Request {
    json: Vec<u8>,
    proto: elastrec_proto::serve::PredictRequest,
}

/// Requests of `batch` rows each, cut from the rows of `data`.
fn requests(data: &std::path::Path, batch: usize) -> Result<Vec<Arc<Request>>> {
    use elastrec_serve::features::{json_row, proto_row};
    let text = std::fs::read_to_string(data).with_context(|| format!("{}", data.display()))?;
    let mut rows: Vec<(serde_json::Value, elastrec_proto::serve::Row)> = Vec::new();
    for (n, line) in text.lines().take(4096).enumerate() {
        let mut row = elastrec_data::RawRow::default();
        elastrec_data::tsv::parse_line(line.as_bytes(), &mut row).map_err(|(field, e)| {
            anyhow::anyhow!("{}:{}: field {}: {e}", data.display(), n + 1, field + 1)
        })?;
        rows.push((json_row(&row), proto_row(&row)));
    }
    anyhow::ensure!(!rows.is_empty(), "{} holds no rows", data.display());
    let count = (rows.len() / batch).clamp(1, 64);
    Ok((0..count)
        .map(|i| {
            let pick: Vec<_> = (0..batch).map(|j| &rows[(i * batch + j) % rows.len()]).collect();
            Arc::new(Request {
                json: serde_json::to_vec(
                    &serde_json::json!({ "rows": pick.iter().map(|r| r.0.clone()).collect::<Vec<_>>() }),
                )
                .expect("JSON"),
                proto: elastrec_proto::serve::PredictRequest {
                    rows: pick.iter().map(|r| r.1.clone()).collect(),
                },
            })
        })
        .collect())
}

/// Sends one request; an error is a failed request (the bench stops on it).
async fn send(
    protocol: &'static str,
    req: &Request,
    http: &reqwest::Client,
    url: &str,
    grpc: &mut elastrec_proto::serve::predictor_client::PredictorClient<tonic::transport::Channel>,
) -> Result<()> {
    if protocol == "http" {
        let reply = http.post(url).body(req.json.clone()).send().await?;
        anyhow::ensure!(reply.status().is_success(), "HTTP {}", reply.status());
        reply.bytes().await?;
    } else {
        grpc.predict(req.proto.clone()).await?;
    }
    Ok(())
}

/// One case: `concurrency` clients for `seconds`; returns the latencies in seconds.
async fn run_case(
    protocol: &'static str,
    reqs: &[Arc<Request>],
    args: &BenchServeArgs,
    http_url: &str,
    grpc: &elastrec_proto::serve::predictor_client::PredictorClient<tonic::transport::Channel>,
) -> Result<(Vec<f64>, f64)> {
    let http = reqwest::Client::builder().build()?;
    let mut tasks = Vec::new();
    let warmup = Duration::from_secs_f64(args.seconds / 10.0);
    let start = Instant::now() + warmup;
    let end = start + Duration::from_secs_f64(args.seconds);
    let stride = args.concurrency;
    for c in 0..args.concurrency {
        let (http, url, mut grpc) = (http.clone(), http_url.to_string(), grpc.clone());
        let reqs: Vec<Arc<Request>> = reqs.to_vec();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = c;
            loop {
                let t0 = Instant::now();
                if t0 >= end {
                    return Ok::<_, anyhow::Error>(lat);
                }
                send(protocol, &reqs[i % reqs.len()], &http, &url, &mut grpc).await?;
                if t0 >= start {
                    lat.push(t0.elapsed().as_secs_f64());
                }
                i += stride;
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    Ok((all, args.seconds))
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// Runs `elastrec bench serve`.
pub fn run(args: BenchServeArgs) -> Result<()> {
    anyhow::ensure!(args.concurrency >= 1, "--concurrency must be at least 1");
    anyhow::ensure!(args.seconds > 0.0, "--seconds must be positive");
    let max_batch = args.batch.iter().copied().max().unwrap_or(1).max(1);
    let served = crate::serve::load(Some(&args.model), max_batch)?;
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.server_threads.max(1))
        .enable_all()
        .build()?;
    let cfg = elastrec_serve::ServeConfig {
        http: "127.0.0.1:0".parse()?,
        grpc: Some("127.0.0.1:0".parse()?),
        token: None,
        max_push_bytes: 1 << 20,
    };
    let server = server_rt.block_on(elastrec_serve::start(&cfg, served))?;
    let http_url = format!("http://{}/v1/predict", server.http_addr);
    let grpc_addr = format!("http://{}", server.grpc_addr.context("gRPC endpoint")?);
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let grpc = client_rt
        .block_on(elastrec_proto::serve::predictor_client::PredictorClient::connect(grpc_addr))?;
    let mut cases = Vec::new();
    for &batch in &args.batch {
        anyhow::ensure!(batch >= 1, "--batch sizes must be at least 1");
        let reqs = requests(&args.data, batch)?;
        for protocol in ["http", "grpc"] {
            if !args.json {
                eprintln!(
                    "bench serve: {protocol}, {batch} rows per request, {} s",
                    args.seconds
                );
            }
            let probe = LoadProbe::start();
            let (mut lat, seconds) =
                client_rt.block_on(run_case(protocol, &reqs, &args, &http_url, &grpc))?;
            let load = probe.and_then(|p| p.stop());
            lat.sort_by(f64::total_cmp);
            let qps = lat.len() as f64 / seconds;
            cases.push(Case {
                protocol,
                batch,
                requests: lat.len(),
                qps,
                rows_per_s: qps * batch as f64,
                p50_ms: percentile(&lat, 0.5) * 1e3,
                p99_ms: percentile(&lat, 0.99) * 1e3,
                max_ms: lat.last().copied().unwrap_or(f64::NAN) * 1e3,
                foreign_load: load.map(|l| l.foreign_share()),
            });
        }
    }
    drop(server);
    let report = Report {
        model: args.model.display().to_string(),
        concurrency: args.concurrency,
        server_threads: args.server_threads.max(1),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cases,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "{} clients in flight, server on {} thread(s), {} cores",
        report.concurrency, report.server_threads, report.cores
    );
    println!(
        "{:<8} {:>5} {:>9} {:>11} {:>9} {:>9} {:>9} {:>8}",
        "protocol", "rows", "QPS", "rows/s", "p50 ms", "p99 ms", "max ms", "foreign"
    );
    for c in &report.cases {
        println!(
            "{:<8} {:>5} {:>9.0} {:>11.0} {:>9.3} {:>9.3} {:>9.3} {:>8}",
            c.protocol,
            c.batch,
            c.qps,
            c.rows_per_s,
            c.p50_ms,
            c.p99_ms,
            c.max_ms,
            c.foreign_load
                .map_or("n/a".into(), |l| format!("{:.1}%", l * 100.0))
        );
    }
    Ok(())
}
