//! `elastrec serve`: click probabilities from a model file over HTTP/JSON and gRPC, with
//! model deltas and whole models pushed while it serves (docs/serving.md).

pub mod features;
pub mod grpc;
pub mod http;
pub mod named;
pub mod served;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use elastrec_metrics::Access;
use tonic::service::Interceptor as _;

pub use served::{Info, PredictError, Served, UpdateError};

/// Where and how to serve.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The HTTP/JSON endpoint.
    pub http: SocketAddr,
    /// The gRPC endpoint, when wanted.
    pub grpc: Option<SocketAddr>,
    /// The token: needed for pushes, and for every call on an endpoint beyond loopback.
    pub token: Option<String>,
    /// Largest accepted pushed delta or model, in bytes.
    pub max_push_bytes: usize,
}

/// A running server; dropping it stops serving.
pub struct Server {
    /// The bound HTTP address (the real port when port 0 was asked for).
    pub http_addr: SocketAddr,
    /// The bound gRPC address.
    pub grpc_addr: Option<SocketAddr>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

async fn bind(addr: SocketAddr, what: &str) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await.with_context(|| {
        format!("binding the {what} endpoint to {addr} (another process may use the port; choose another with --listen / --grpc-listen)")
    })
}

/// Starts serving `served` as `cfg` says.
pub async fn start(cfg: &ServeConfig, served: Arc<Served>) -> anyhow::Result<Server> {
    let token = cfg.token.clone().filter(|t| !t.is_empty());
    if let Some(t) = &token {
        elastrec_rpc::check_token(t)?;
    }
    for addr in std::iter::once(cfg.http).chain(cfg.grpc) {
        anyhow::ensure!(
            addr.ip().is_loopback() || token.is_some(),
            "serving on {addr}, beyond loopback, needs a token: set ELASTREC_TOKEN (clients send `Authorization: Bearer <token>`)"
        );
    }
    let listener = bind(cfg.http, "HTTP").await?;
    let http_addr = listener.local_addr()?;
    let state = http::Http {
        served: served.clone(),
        read: Access::for_bind(cfg.http.ip(), token.as_deref().unwrap_or_default()),
        write: token.as_deref().map(Access::token),
    };
    let app = http::router(state, cfg.max_push_bytes);
    let mut tasks = vec![tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("HTTP endpoint {http_addr} stopped: {e}");
        }
    })];
    let mut grpc_addr = None;
    if let Some(addr) = cfg.grpc {
        let listener = bind(addr, "gRPC").await?;
        grpc_addr = Some(listener.local_addr()?);
        let auth = (!addr.ip().is_loopback())
            .then(|| elastrec_rpc::ServerAuth::new(token.as_deref().unwrap_or_default()));
        let service = elastrec_proto::serve::predictor_server::PredictorServer::with_interceptor(
            grpc::Grpc { served },
            move |req| match &auth {
                Some(a) => a.clone().call(req),
                None => Ok(req),
            },
        );
        let server = elastrec_rpc::server()?.add_service(service);
        let incoming = elastrec_rpc::incoming(listener);
        tasks.push(tokio::spawn(async move {
            if let Err(e) = server.serve_with_incoming(incoming).await {
                tracing::error!("gRPC endpoint {addr} stopped: {e}");
            }
        }));
    }
    Ok(Server {
        http_addr,
        grpc_addr,
        tasks,
    })
}
