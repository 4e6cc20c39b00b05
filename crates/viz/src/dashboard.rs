//! `elastrec dashboard`: a web page over running (and finished) jobs.
//!
//! One poller reads each job's status from its master (the same `Status` RPC as
//! `elastrec status`, which takes the job's lock once per read) every `every_ms`, keeps a
//! time series per job, and publishes one JSON snapshot. Browsers get the snapshot from
//! `/api/snapshot` and every new one over server-sent events (`/api/events`): however
//! many people watch, the master is read once per interval, so the dashboard never
//! slows the job it shows. The page, its script and its style are compiled into the
//! binary (no CDN). Bound beyond loopback, every request needs the token
//! (`Authorization: Bearer TOKEN` or `?token=TOKEN`, which the page passes on).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use axum::extract::{Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use clap::Args;
use elastrec_client::history::{self, Point};
use elastrec_client::status::StatusReader;
use elastrec_client::JobDir;
use futures::Stream;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tokio_stream::StreamExt as _;

const PAGE: &str = include_str!("../assets/dashboard.html");
const SCRIPT: &str = include_str!("../assets/dashboard.js");
const STYLE: &str = include_str!("../assets/dashboard.css");
/// A browser asks for one; without it the page's console shows a failed request.
const ICON: &str = "<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 16 16'><rect width='16' height='16' rx='3' fill='#2563eb'/><path d='M3 12l3-4 3 2 4-6' stroke='#fff' stroke-width='2' fill='none'/></svg>";
/// Points of history kept per job (an hour at one read a second).
const HISTORY: usize = 3600;

/// Flags of `elastrec dashboard`.
#[derive(Debug, Clone, Args)]
pub struct DashboardArgs {
    /// Job directories to show (each job's `output.dir`).
    #[arg(required = true)]
    pub job_dirs: Vec<PathBuf>,
    /// Address to serve the page on. Beyond loopback every request needs the token of
    /// `--token-file`.
    #[arg(long, default_value = "127.0.0.1:8090")]
    pub listen: SocketAddr,
    /// Milliseconds between two reads of each job's status.
    #[arg(long, default_value_t = 1000)]
    pub every_ms: u64,
    /// File holding the token that requests must carry (required beyond loopback; a
    /// job's own `JOB_DIR/token` will do).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
}

/// A job as the page shows it.
#[derive(Debug, Clone, Serialize)]
struct JobView {
    dir: String,
    /// `"live"` (its master answers), `"ended"` (it left `result.json`) or
    /// `"unreachable"`.
    state: &'static str,
    status: Option<Value>,
    result: Option<Value>,
    error: Option<String>,
    history: VecDeque<Point>,
}

/// The points the job's master wrote before the dashboard started (its
/// `history.jsonl`), so that the charts begin at the job's start.
fn earlier_history(dir: &Path) -> VecDeque<Point> {
    match history::read(dir, HISTORY) {
        Ok((points, skipped)) => {
            if skipped > 0 {
                eprintln!(
                    "dashboard: {} lines of {} are not readings; left out",
                    skipped,
                    history::path(dir).display()
                );
            }
            points.into()
        }
        Err(e) => {
            eprintln!(
                "dashboard: no earlier history of {}: {e}",
                history::path(dir).display()
            );
            VecDeque::new()
        }
    }
}

/// Checks that `dir` is a job directory (it has, or had, a master).
fn check_job_dir(dir: &Path) -> Result<()> {
    let j = JobDir(dir.to_path_buf());
    if !dir.is_dir() {
        bail!(
            "{} is not a directory: give each job's output.dir",
            dir.display()
        );
    }
    if !(j.addr().exists() || j.db().exists() || j.result().exists()) {
        bail!(
            "{} is not a job directory (no master.addr, state database or result.json): give each job's output.dir, the directory `elastrec run` was told to write",
            dir.display()
        );
    }
    Ok(())
}

/// Reads every job once per `every` and publishes the snapshot, until the receivers
/// are gone.
async fn poll(dirs: Vec<PathBuf>, every: Duration, tx: watch::Sender<Arc<String>>) {
    let mut jobs: Vec<JobView> = dirs
        .iter()
        .map(|d| JobView {
            dir: d.display().to_string(),
            state: "unreachable",
            status: None,
            result: None,
            error: None,
            history: earlier_history(d),
        })
        .collect();
    let wait = every
        .max(Duration::from_millis(500))
        .min(Duration::from_secs(3));
    let mut readers: Vec<StatusReader> = dirs
        .iter()
        .map(|d| StatusReader::new(d.clone(), wait))
        .collect();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let reads = futures::future::join_all(readers.iter_mut().map(StatusReader::read)).await;
        let t_s = history::unix_now_s();
        for ((job, dir), read) in jobs.iter_mut().zip(&dirs).zip(reads) {
            match read {
                Ok(Some(status)) => {
                    job.history.push_back(history::point_of(&status, t_s));
                    if job.history.len() > HISTORY {
                        job.history.pop_front();
                    }
                    job.state = "live";
                    job.status = Some(status);
                    job.error = None;
                }
                other => {
                    let result = std::fs::read_to_string(JobDir(dir.clone()).result())
                        .ok()
                        .and_then(|t| serde_json::from_str::<Value>(&t).ok());
                    job.state = if result.is_some() {
                        "ended"
                    } else {
                        "unreachable"
                    };
                    job.result = result;
                    job.error = match other {
                        Err(e) => Some(format!("{e:#}")),
                        _ => Some("the master did not answer in time".into()),
                    };
                }
            }
        }
        let snapshot = serde_json::json!({
            "updated_s": t_s,
            "every_ms": every.as_millis() as u64,
            "jobs": jobs,
        });
        if tx.send(Arc::new(snapshot.to_string())).is_err() {
            return;
        }
    }
}

#[derive(Clone)]
struct App {
    token: Option<Arc<str>>,
    snapshot: watch::Receiver<Arc<String>>,
}

#[derive(serde::Deserialize)]
struct TokenQuery {
    token: Option<String>,
}

async fn authorize(
    State(app): State<App>,
    Query(q): Query<TokenQuery>,
    req: Request,
    next: Next,
) -> Response {
    if let Some(want) = &app.token {
        let bearer = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let given = bearer.or(q.token.as_deref());
        if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), want.as_bytes())) {
            return (
                StatusCode::UNAUTHORIZED,
                "this dashboard needs its token: open it with ?token=TOKEN (the contents of --token-file)\n",
            )
                .into_response();
        }
    }
    next.run(req).await
}

/// Equality whose time does not depend on where the inputs differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn get_snapshot(State(app): State<App>) -> Response {
    let body = app.snapshot.borrow().as_ref().clone();
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn events(State(app): State<App>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let stream = WatchStream::new(app.snapshot.clone())
        .map(|s| Ok(Event::default().event("snapshot").data(s.as_str())));
    Sse::new(stream).keep_alive(KeepAlive::default())
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// The page's routes over a snapshot channel.
fn router(token: Option<Arc<str>>, snapshot: watch::Receiver<Arc<String>>) -> Router {
    let app = App { token, snapshot };
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", PAGE) }),
        )
        .route(
            "/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/app.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
        .route(
            "/favicon.ico",
            get(|| async { asset("image/svg+xml", ICON) }),
        )
        .route("/api/snapshot", get(get_snapshot))
        .route("/api/events", get(events))
        .layer(middleware::from_fn_with_state(app.clone(), authorize))
        .with_state(app)
}

/// The token requests must carry: none on loopback without `--token-file`.
fn token_of(args: &DashboardArgs) -> Result<Option<Arc<str>>> {
    match &args.token_file {
        Some(f) => {
            let t = std::fs::read_to_string(f)
                .with_context(|| format!("reading the token file {}", f.display()))?;
            let t = t.trim();
            if t.is_empty() {
                bail!("the token file {} is empty", f.display());
            }
            Ok(Some(Arc::from(t)))
        }
        None if args.listen.ip().is_loopback() => Ok(None),
        None => bail!(
            "--listen {} is beyond loopback: give --token-file FILE holding the token every request must carry (a job's JOB_DIR/token will do)",
            args.listen
        ),
    }
}

/// A dashboard bound and polling: [`Dashboard::serve`] runs it.
pub struct Dashboard {
    listener: tokio::net::TcpListener,
    router: Router,
    poller: tokio::task::JoinHandle<()>,
}

impl Dashboard {
    /// Checks the arguments, binds the address and starts reading the jobs.
    pub async fn start(args: &DashboardArgs) -> Result<Self> {
        for d in &args.job_dirs {
            check_job_dir(d)?;
        }
        if args.every_ms == 0 {
            bail!("--every-ms must be at least 1");
        }
        let token = token_of(args)?;
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| {
                format!(
                    "cannot listen on {}: is another process using the port? Choose another with --listen",
                    args.listen
                )
            })?;
        let (tx, rx) = watch::channel(Arc::new(
            serde_json::json!({"updated_s": 0.0, "every_ms": args.every_ms, "jobs": []})
                .to_string(),
        ));
        let poller = tokio::spawn(poll(
            args.job_dirs.clone(),
            Duration::from_millis(args.every_ms),
            tx,
        ));
        Ok(Self {
            listener,
            router: router(token, rx),
            poller,
        })
    }

    /// The address it serves on.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.listener.local_addr()?)
    }

    /// Serves until `stop` resolves.
    pub async fn serve(
        self,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<()> {
        let r = axum::serve(self.listener, self.router)
            .with_graceful_shutdown(stop)
            .await;
        self.poller.abort();
        Ok(r?)
    }
}

/// `[dashboard]` of a job that `elastrec run` starts: the page is served from a thread
/// of the run's process once the job's master has written its address. A page that
/// cannot start (its port in use) is reported and the job goes on without it.
pub fn beside_run(cfg: &elastrec_job::config::DashboardConfig, job_dir: PathBuf) {
    let Ok(listen) = cfg.listen.parse::<SocketAddr>() else {
        return; // the job's own validation names the field
    };
    let args = DashboardArgs {
        token_file: (!listen.ip().is_loopback()).then(|| JobDir(job_dir.clone()).token()),
        job_dirs: vec![job_dir.clone()],
        listen,
        every_ms: cfg.every_ms.max(1),
    };
    std::thread::spawn(move || {
        // The master writes its address (and the token) as it starts serving.
        let addr = JobDir(job_dir).addr();
        while !addr.exists() {
            std::thread::sleep(Duration::from_millis(200));
        }
        if let Err(e) = run(&args) {
            eprintln!("dashboard: {e:#} (the job goes on without its page)");
        }
    });
}

/// `elastrec dashboard`: serves until Ctrl-C.
pub fn run(args: &DashboardArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let d = Dashboard::start(args).await?;
        let addr = d.local_addr()?;
        let hint = if args.token_file.is_some() {
            "?token=TOKEN"
        } else {
            ""
        };
        println!(
            "dashboard of {} job(s) on http://{addr}/{hint} (Ctrl-C stops it)",
            args.job_dirs.len()
        );
        d.serve(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beyond_loopback_a_token_file_is_required() {
        let args = |listen: &str, token_file: Option<PathBuf>| DashboardArgs {
            job_dirs: vec![],
            listen: listen.parse().unwrap(),
            every_ms: 1000,
            token_file,
        };
        assert!(token_of(&args("127.0.0.1:0", None)).unwrap().is_none());
        let e = token_of(&args("0.0.0.0:0", None)).unwrap_err().to_string();
        assert!(e.contains("--token-file"), "{e}");
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }

    #[test]
    fn a_directory_that_is_not_a_job_is_refused_by_name() {
        let d = tempfile::tempdir().unwrap();
        let e = check_job_dir(d.path()).unwrap_err().to_string();
        assert!(e.contains("is not a job directory"), "{e}");
        let e = check_job_dir(&d.path().join("nope"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not a directory"), "{e}");
    }
}
