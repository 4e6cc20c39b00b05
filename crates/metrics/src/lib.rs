//! The Prometheus `/metrics` endpoint of every elastrec process (master, PS, worker,
//! brain): one implementation of binding, access control and the exposition format.
//! [`tensorboard`] writes a job's scalars as TensorBoard event files.
//!
//! Access policy ([`Access::for_bind`]): an endpoint bound to a loopback address is open,
//! so an operator on the machine can `curl localhost:PORT/metrics` and a local Prometheus
//! needs no secret; users of the same host can already read far more of a job than its
//! counters. An endpoint on any other address (including `0.0.0.0`) is reachable from
//! the network and answers only requests carrying `Authorization: Bearer <token>`, the
//! token of the job (or of the brain), compared in constant time; others get 401.

pub mod process;
pub mod tensorboard;

use std::io::{Read as _, Write as _};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
pub use prometheus_client;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Content type of the OpenMetrics text format that `prometheus-client` writes, served
/// to scrapers that ask for it (Prometheus does).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Content type of the classic Prometheus text format, served to every other client
/// (`curl`, `promtool check metrics`).
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Who may read an endpoint.
#[derive(Clone)]
pub enum Access {
    /// Anyone who can connect (loopback endpoints).
    Open,
    /// Only requests whose `Authorization` header is exactly this (`Bearer <token>`).
    Bearer(Vec<u8>),
}

impl Access {
    /// Requires `Authorization: Bearer <token>`.
    pub fn token(token: &str) -> Self {
        Self::Bearer(format!("Bearer {token}").into_bytes())
    }

    /// The policy for an endpoint bound to `ip`: open on loopback, the token otherwise.
    pub fn for_bind(ip: IpAddr, token: &str) -> Self {
        if ip.is_loopback() {
            Self::Open
        } else {
            Self::token(token)
        }
    }

    /// Whether a request with `headers` may read the endpoint.
    pub fn allows(&self, headers: &HeaderMap) -> bool {
        match self {
            Self::Open => true,
            Self::Bearer(want) => {
                let got = headers
                    .get(header::AUTHORIZATION)
                    .map(|v| v.as_bytes())
                    .unwrap_or_default();
                // Constant time in the content: the length of the expected value is no
                // secret (tokens have a fixed format), its bytes are.
                got.len() == want.len()
                    && got.iter().zip(want).fold(0u8, |a, (x, y)| a | (x ^ y)) == 0
            }
        }
    }
}

/// A running endpoint; dropping it stops serving.
///
/// It serves from a thread and runtime of its own, not the process's: a node whose
/// runtime is saturated by training, a checkpoint copy or a blocking call still answers a
/// scrape, which is when an operator needs its figures most.
pub struct Endpoint {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Endpoint {
    /// The bound address (the real port when port 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Binds `bind` and serves `render()` on `/metrics` under [`Access::for_bind`]. Refuses a
/// non-loopback address without a token (the endpoint would be open to the network).
pub async fn serve(
    bind: SocketAddr,
    token: &str,
    render: impl Fn() -> String + Send + Sync + 'static,
) -> std::io::Result<Endpoint> {
    if !bind.ip().is_loopback() && token.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("metrics on non-loopback address {bind} need a token"),
        ));
    }
    let listener = tokio::net::TcpListener::bind(bind).await?;
    serve_on(listener, Access::for_bind(bind.ip(), token), render)
}

/// Serves `render()` on `/metrics` of an already bound `listener` with `access` (tests
/// use it to check the token on a loopback socket).
pub fn serve_on(
    listener: tokio::net::TcpListener,
    access: Access,
    render: impl Fn() -> String + Send + Sync + 'static,
) -> std::io::Result<Endpoint> {
    let addr = listener.local_addr()?;
    let render = Arc::new(render);
    let access = Arc::new(access);
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move |headers: HeaderMap| {
            let (render, access) = (render.clone(), access.clone());
            async move { respond(&access, &headers, &*render) }
        }),
    );
    let listener = listener.into_std()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("elastrec-metrics".into())
        .spawn(move || {
            let served = runtime.block_on(async move {
                // Registered with this thread's runtime, which alone polls it.
                let listener = tokio::net::TcpListener::from_std(listener)?;
                axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await
            });
            if let Err(e) = served {
                eprintln!("metrics endpoint {addr} stopped: {e}");
            }
        })?;
    Ok(Endpoint {
        addr,
        stop: Some(stop),
    })
}

fn respond(access: &Access, headers: &HeaderMap, render: &dyn Fn() -> String) -> Response {
    if !access.allows(headers) {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "missing or wrong token\n",
        )
            .into_response();
    }
    let openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    if openmetrics {
        ([(header::CONTENT_TYPE, CONTENT_TYPE)], render()).into_response()
    } else {
        let text = to_prometheus_text(&render());
        ([(header::CONTENT_TYPE, TEXT_CONTENT_TYPE)], text).into_response()
    }
}

/// The classic Prometheus text format (version 0.0.4) of OpenMetrics text as
/// `prometheus-client` writes it. The two differ in the comments only: a counter's
/// `# HELP` and `# TYPE` name its `_total` series and an info metric's its `_info`
/// series (a gauge); `# UNIT` lines and the closing `# EOF` are OpenMetrics' own.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // A family's HELP comes before its TYPE, which says what to call it.
    let mut help: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = Some(rest.split_once(' ').unwrap_or((rest, "")));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let (series, kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "info" => (format!("{name}_info"), "gauge"),
                "unknown" => (name.to_string(), "untyped"),
                other => (name.to_string(), other),
            };
            if let Some((_, text)) = help.take().filter(|(h, _)| *h == name) {
                out += &format!("# HELP {series} {text}\n");
            }
            out += &format!("# TYPE {series} {kind}\n");
            continue;
        }
        if let Some((name, text)) = help.take() {
            out += &format!("# HELP {name} {text}\n");
        }
        out += line;
        out.push('\n');
    }
    out
}

/// The OpenMetrics text of `registry`.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)
        .expect("writing to a String cannot fail");
    out
}

/// A histogram of request latencies in seconds: 50 µs to about 26 s in factors of 2
/// (RPCs in a job range from a local pull to a pull stuck behind a checkpoint).
pub fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(50e-6, 2.0, 20))
}

/// A blocking `GET http://addr/path` with an optional bearer token, asking for
/// OpenMetrics as Prometheus does, for tests and tools: returns the status code and the
/// body. HTTP/1.0, so the reply is never chunked and ends with the connection.
pub fn http_get(addr: &str, path: &str, token: Option<&str>) -> std::io::Result<(u16, String)> {
    http_get_accepting(addr, path, token, Some(CONTENT_TYPE))
}

/// [`http_get`] with the `Accept` header given (none: what `curl` sends).
pub fn http_get_accepting(
    addr: &str,
    path: &str,
    token: Option<&str>,
    accept: Option<&str>,
) -> std::io::Result<(u16, String)> {
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\n{auth}{accept}\r\n"
    )?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)?;
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "malformed HTTP reply");
    let (head, body) = reply.split_once("\r\n\r\n").ok_or_else(bad)?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(bad)?;
    Ok((code, body.to_string()))
}

/// Checks that `text` is OpenMetrics text as `prometheus-client` writes it (`# HELP`,
/// `# TYPE`, `# UNIT` comments, `name{labels} value` samples with numeric values, a final
/// `# EOF`) and returns the names of its samples.
pub fn parse_exposition(text: &str) -> Result<Vec<String>, String> {
    let body = text
        .strip_suffix("# EOF\n")
        .ok_or("the exposition does not end with `# EOF`")?;
    let mut names = Vec::new();
    for line in body.lines() {
        if let Some(c) = line.strip_prefix("# ") {
            let kind = c.split(' ').next().unwrap_or_default();
            if !["HELP", "TYPE", "UNIT"].contains(&kind) {
                return Err(format!("unknown comment {line:?}"));
            }
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .ok_or_else(|| format!("sample without a value: {line:?}"))?;
        value
            .parse::<f64>()
            .map_err(|_| format!("non-numeric value in {line:?}"))?;
        let name = series.split('{').next().unwrap_or_default();
        let valid = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':');
        if !valid || (series.contains('{') && !series.ends_with('}')) {
            return Err(format!("malformed series {series:?}"));
        }
        names.push(name.to_string());
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    fn registry() -> (Registry, Counter, Histogram) {
        let mut r = Registry::with_prefix("elastrec_test");
        let c = Counter::default();
        r.register("pulls", "Pulls served", c.clone());
        let h = latency_histogram();
        r.register("pull_latency_seconds", "Pull latency", h.clone());
        (r, c, h)
    }

    async fn get(addr: SocketAddr, token: Option<&'static str>) -> (u16, String) {
        tokio::task::spawn_blocking(move || http_get(&addr.to_string(), "/metrics", token))
            .await
            .unwrap()
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn loopback_is_open_and_serves_openmetrics() {
        let (r, c, h) = registry();
        c.inc_by(3);
        h.observe(0.002);
        let ep = serve("127.0.0.1:0".parse().unwrap(), "tok", move || encode(&r))
            .await
            .unwrap();
        let (code, body) = get(ep.addr(), None).await;
        assert_eq!(code, 200, "{body}");
        let names = parse_exposition(&body).unwrap();
        assert!(
            names.contains(&"elastrec_test_pulls_total".to_string()),
            "{body}"
        );
        assert!(body.contains("elastrec_test_pulls_total 3\n"), "{body}");
        assert!(
            names.contains(&"elastrec_test_pull_latency_seconds_bucket".to_string()),
            "{body}"
        );
        // Other paths do not exist.
        let addr = ep.addr().to_string();
        let (code, _) = tokio::task::spawn_blocking(move || http_get(&addr, "/", None))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(code, 404);
    }

    /// The endpoint answers while the runtime that started it cannot run anything: here
    /// its only thread is inside a blocking call (the scrape itself), which on the
    /// caller's runtime would wait for ever.
    #[tokio::test(flavor = "current_thread")]
    async fn it_answers_while_the_callers_runtime_is_blocked() {
        let (r, c, _) = registry();
        c.inc_by(5);
        let ep = serve("127.0.0.1:0".parse().unwrap(), "", move || encode(&r))
            .await
            .unwrap();
        let (code, body) = http_get(&ep.addr().to_string(), "/metrics", None).unwrap();
        assert_eq!(code, 200, "{body}");
        assert!(body.contains("elastrec_test_pulls_total 5\n"), "{body}");
    }

    /// Dropping the endpoint closes its port.
    #[tokio::test(flavor = "current_thread")]
    async fn a_dropped_endpoint_stops_serving() {
        let ep = serve("127.0.0.1:0".parse().unwrap(), "", String::new)
            .await
            .unwrap();
        let addr = ep.addr();
        drop(ep);
        let closed = tokio::task::spawn_blocking(move || {
            // The server thread closes the listener once it has seen the stop; until
            // then a connection may still be accepted, never answered by a new request.
            loop {
                if std::net::TcpStream::connect(addr).is_err() {
                    return true;
                }
                std::thread::yield_now();
            }
        });
        assert!(closed.await.unwrap());
    }

    /// A client that does not ask for OpenMetrics (`curl`, `promtool`) gets the classic
    /// text format of the same samples: a counter's comments name its `_total` series.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_without_accept_gets_the_classic_text_format() {
        let (r, c, h) = registry();
        c.inc_by(3);
        h.observe(0.002);
        let ep = serve("127.0.0.1:0".parse().unwrap(), "tok", move || encode(&r))
            .await
            .unwrap();
        let addr = ep.addr().to_string();
        let (code, body) = tokio::task::spawn_blocking(move || {
            http_get_accepting(&addr, "/metrics", None, None).unwrap()
        })
        .await
        .unwrap();
        assert_eq!(code, 200, "{body}");
        assert!(!body.contains("# EOF"), "{body}");
        assert!(
            body.contains(
                "# HELP elastrec_test_pulls_total Pulls served.\n\
                 # TYPE elastrec_test_pulls_total counter\n\
                 elastrec_test_pulls_total 3\n"
            ),
            "{body}"
        );
        assert!(
            body.contains("# TYPE elastrec_test_pull_latency_seconds histogram\n"),
            "{body}"
        );
        // The samples are the OpenMetrics ones, line for line.
        let samples = |t: &str| -> Vec<String> {
            t.lines()
                .filter(|l| !l.starts_with('#'))
                .map(str::to_string)
                .collect()
        };
        let (_, open) = get(ep.addr(), None).await;
        assert_eq!(samples(&body), samples(&open));
    }

    #[test]
    fn info_and_unknown_families_become_their_classic_types() {
        let om = "# HELP build Build.\n# TYPE build info\nbuild_info{v=\"1\"} 1\n\
                  # TYPE x unknown\n# UNIT x seconds\nx 2\n# EOF\n";
        assert_eq!(
            to_prometheus_text(om),
            "# HELP build_info Build.\n# TYPE build_info gauge\nbuild_info{v=\"1\"} 1\n\
             # TYPE x untyped\nx 2\n"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_token_endpoint_refuses_missing_and_wrong_tokens() {
        let (r, _, _) = registry();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ep = serve_on(listener, Access::token("s3cret"), move || encode(&r)).unwrap();
        assert_eq!(get(ep.addr(), None).await.0, 401);
        assert_eq!(get(ep.addr(), Some("wrong!")).await.0, 401);
        // A prefix or an extension of the token is no token.
        assert_eq!(get(ep.addr(), Some("s3cre")).await.0, 401);
        assert_eq!(get(ep.addr(), Some("s3cret0")).await.0, 401);
        let (code, body) = get(ep.addr(), Some("s3cret")).await;
        assert_eq!(code, 200, "{body}");
        assert!(parse_exposition(&body)
            .unwrap()
            .contains(&"elastrec_test_pulls_total".to_string()));
    }

    #[tokio::test]
    async fn non_loopback_needs_a_token() {
        let e = serve("0.0.0.0:0".parse().unwrap(), "", String::new)
            .await
            .err()
            .unwrap();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        assert!(matches!(
            Access::for_bind("0.0.0.0".parse().unwrap(), "t"),
            Access::Bearer(_)
        ));
        assert!(matches!(
            Access::for_bind("10.1.2.3".parse().unwrap(), "t"),
            Access::Bearer(_)
        ));
        assert!(matches!(
            Access::for_bind("::1".parse().unwrap(), "t"),
            Access::Open
        ));
    }

    #[test]
    fn the_parser_rejects_what_is_not_openmetrics() {
        assert!(parse_exposition("a 1\n").is_err());
        assert!(parse_exposition("a x\n# EOF\n").is_err());
        assert!(parse_exposition("a{b=\"c\" 1\n# EOF\n").is_err());
        assert!(parse_exposition("# NOTE hi\n# EOF\n").is_err());
        assert_eq!(
            parse_exposition("# TYPE a counter\na_total{x=\"1\"} 2\n# EOF\n").unwrap(),
            vec!["a_total".to_string()]
        );
    }
}
