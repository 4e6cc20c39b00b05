//! `elastrec serve MODEL`: answers predictions from a model file until stopped
//! (docs/serving.md).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;

/// `elastrec serve` flags.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// Model file (`model.bin` of a job, or an export of a `run` checkpoint). Without one
    /// the server answers 503 until a model is pushed (`PUT /v1/model`, or a job's
    /// `output.push`).
    pub model: Option<PathBuf>,
    /// HTTP/JSON endpoint. Beyond loopback every call needs the token of ELASTREC_TOKEN.
    #[arg(long, default_value = "127.0.0.1:8500")]
    pub listen: SocketAddr,
    /// gRPC endpoint (`elastrec.serve.v1.Predictor`); none when absent.
    #[arg(long)]
    pub grpc_listen: Option<SocketAddr>,
    /// Most rows in one request.
    #[arg(long, default_value_t = 1024)]
    pub max_batch: usize,
    /// Largest pushed delta or model accepted, in MiB.
    #[arg(long, default_value_t = 4096)]
    pub max_push_mib: usize,
}

/// The server's settings from flags and the environment.
pub fn config(args: &ServeArgs) -> elastrec_serve::ServeConfig {
    elastrec_serve::ServeConfig {
        http: args.listen,
        grpc: args.grpc_listen,
        token: std::env::var(elastrec_rpc::TOKEN_ENV).ok(),
        max_push_bytes: args.max_push_mib.saturating_mul(1 << 20),
    }
}

/// Loads the model file (if any) for serving.
pub fn load(
    path: Option<&std::path::Path>,
    max_batch: usize,
) -> anyhow::Result<Arc<elastrec_serve::Served>> {
    anyhow::ensure!(max_batch >= 1, "--max-batch must be at least 1");
    let loaded = match path {
        None => None,
        Some(path) => Some((
            elastrec_worker::model_file::load_model(path).with_context(|| {
                format!(
                    "loading {} (write one with `elastrec train` or `elastrec export`)",
                    path.display()
                )
            })?,
            path,
        )),
    };
    Ok(Arc::new(elastrec_serve::Served::new(loaded, max_batch)?))
}

/// Runs `elastrec serve`.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let served = load(args.model.as_deref(), args.max_batch)?;
    let cfg = config(&args);
    crate::commands::on_runtime(async move {
        let server = elastrec_serve::start(&cfg, served.clone()).await?;
        let info = served.info();
        let what = match (&args.model, info.checkpoint) {
            (None, _) => "no model until one is pushed".to_string(),
            (Some(m), Some(c)) => format!("{} (checkpoint {c})", m.display()),
            (Some(m), None) => format!("{} (from `train`)", m.display()),
        };
        let grpc = server
            .grpc_addr
            .map_or(String::new(), |a| format!(", gRPC on {a}"));
        // One line a script (or a test) can read the bound ports from.
        println!("serving {what} on http://{}{grpc}", server.http_addr);
        wait_for_stop().await;
        eprintln!(
            "serve: stopping after {} requests ({} rows)",
            served.info().requests,
            served.info().rows
        );
        drop(server);
        Ok(())
    })
}

/// SIGINT or SIGTERM.
async fn wait_for_stop() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
