//! gRPC plumbing shared by every elastrec process (master, PS, worker, brain): tokens
//! (sent as `authorization: Bearer <token>` metadata, checked by a server interceptor that
//! records the caller's role), the per-job mutual TLS (`tls`), the protocol version
//! check, client channels with deadlines and keepalive, servers, and retries.

pub mod beats;
pub mod tls;

use std::time::Duration;

use elastrec_proto::common::ProtocolVersion;
use elastrec_proto::executor::data_executor_client::DataExecutorClient;
use elastrec_proto::master::master_client::MasterClient;
use elastrec_proto::ps::parameter_server_client::ParameterServerClient;
use elastrec_proto::PROTOCOL_MAJOR;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};

/// Environment variable carrying the job token to child processes (never argv, which
/// other users can read).
pub const TOKEN_ENV: &str = "ELASTREC_TOKEN";

/// The version every request carries.
pub fn version() -> Option<ProtocolVersion> {
    Some(ProtocolVersion {
        major: PROTOCOL_MAJOR,
        minor: 0,
    })
}

/// Refuses a request without a version or with another major version.
#[allow(clippy::result_large_err)]
pub fn check_version(v: &Option<ProtocolVersion>) -> Result<(), Status> {
    match v {
        Some(v) if v.major == PROTOCOL_MAJOR => Ok(()),
        Some(v) => Err(Status::failed_precondition(format!(
            "protocol major version {} is not supported (this server speaks {PROTOCOL_MAJOR})",
            v.major
        ))),
        None => Err(Status::invalid_argument(
            "request carries no protocol version",
        )),
    }
}

/// Checks that `token` can be a job token: non-empty ASCII letters and digits (what the
/// master generates), so that it fits an HTTP header and nothing else hides in it.
pub fn check_token(token: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        !token.is_empty() && token.len() <= 256 && token.bytes().all(|b| b.is_ascii_alphanumeric()),
        "the job token must be 1 to 256 ASCII letters and digits"
    );
    Ok(())
}

/// Adds the job token to every outgoing request.
#[derive(Clone)]
pub struct ClientAuth(MetadataValue<Ascii>);

impl ClientAuth {
    /// For `token` (refused when it is not a valid token, see [`check_token`]).
    pub fn new(token: &str) -> anyhow::Result<Self> {
        check_token(token)?;
        Ok(Self(format!("Bearer {token}").parse()?))
    }
}

impl Interceptor for ClientAuth {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        req.metadata_mut().insert("authorization", self.0.clone());
        Ok(req)
    }
}

/// Who is calling, as the token it presents says. A job has one secret (the `token` file
/// of its directory, used by the person who runs it: [`Caller::Admin`]); each role gets a
/// token derived from it ([`role_token`]) that cannot be turned back into the secret or
/// into another role's token, so a worker cannot call what only the master may.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// The job's owner (the secret itself): every call.
    Admin,
    /// The job master.
    Master,
    /// A parameter server.
    Ps,
    /// A worker.
    Worker,
}

impl Caller {
    /// Lowercase name (in accept lists and errors).
    pub fn name(self) -> &'static str {
        match self {
            Self::Admin => "admin",
            Self::Master => "master",
            Self::Ps => "ps",
            Self::Worker => "worker",
        }
    }

    fn parse(name: &str) -> Option<Self> {
        [Self::Admin, Self::Master, Self::Ps, Self::Worker]
            .into_iter()
            .find(|c| c.name() == name)
    }
}

/// Environment variable of a server node's accept list: `role:sha256hex,...` (digests
/// of the tokens it accepts, so a server never holds another role's token).
pub const ACCEPT_ENV: &str = "ELASTREC_ACCEPT";

/// The token of `role` in the job whose secret is `secret`: HMAC-SHA256, hex.
pub fn role_token(secret: &str, role: Caller) -> String {
    if role == Caller::Admin {
        return secret.to_string();
    }
    let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, secret.as_bytes());
    let tag = aws_lc_rs::hmac::sign(&key, format!("elastrec/{}", role.name()).as_bytes());
    hex(tag.as_ref())
}

fn digest(token: &[u8]) -> [u8; 32] {
    let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, token);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// The digest a server keeps of `role`'s token in the job with `secret`.
fn role_digest(secret: &str, role: Caller) -> [u8; 32] {
    digest(role_token(secret, role).as_bytes())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The accept list a PS of the job with `secret` gets: the master, its peers, the workers.
pub fn ps_accept_list(secret: &str) -> String {
    [Caller::Master, Caller::Ps, Caller::Worker]
        .iter()
        .map(|&c| format!("{}:{}", c.name(), hex(&role_digest(secret, c))))
        .collect::<Vec<_>>()
        .join(",")
}

/// Checks the token of every request and records who called ([`Caller`], a request
/// extension that [`require`] reads); a request without a known token is refused
/// (`Unauthenticated`).
#[derive(Clone)]
pub struct ServerAuth(Vec<(Caller, [u8; 32])>);

impl ServerAuth {
    /// Accepts only `token`, with every right (a standalone server, tests).
    pub fn new(token: &str) -> Self {
        Self(vec![(Caller::Admin, digest(token.as_bytes()))])
    }

    /// The master's server of the job with `secret`: the owner and every role.
    pub fn for_job(secret: &str) -> Self {
        Self(
            [Caller::Admin, Caller::Master, Caller::Ps, Caller::Worker]
                .iter()
                .map(|&c| (c, role_digest(secret, c)))
                .collect(),
        )
    }

    /// A node's server: the accept list of [`ACCEPT_ENV`] when set, else only its own
    /// `token` (a node started by hand with one token).
    pub fn for_node(token: &str) -> anyhow::Result<Self> {
        match std::env::var(ACCEPT_ENV) {
            Ok(list) if !list.is_empty() => Self::from_accept_list(&list),
            _ => Ok(Self::new(token)),
        }
    }

    /// Parses `role:sha256hex,...`.
    pub fn from_accept_list(list: &str) -> anyhow::Result<Self> {
        let mut out = Vec::new();
        for entry in list.split(',') {
            let (role, hexd) = entry
                .split_once(':')
                .ok_or_else(|| anyhow::anyhow!("{ACCEPT_ENV}: `{entry}` is not role:digest"))?;
            let role = Caller::parse(role)
                .ok_or_else(|| anyhow::anyhow!("{ACCEPT_ENV}: unknown role `{role}`"))?;
            anyhow::ensure!(
                hexd.len() == 64 && hexd.bytes().all(|b| b.is_ascii_hexdigit()),
                "{ACCEPT_ENV}: the digest of `{}` is not 64 hex digits",
                role.name()
            );
            let mut d = [0u8; 32];
            for (i, byte) in d.iter_mut().enumerate() {
                *byte = u8::from_str_radix(&hexd[2 * i..2 * i + 2], 16)?;
            }
            out.push((role, d));
        }
        Ok(Self(out))
    }
}

impl Interceptor for ServerAuth {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let got = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
            .map(digest);
        // Digests compared in constant time; every entry is looked at.
        let caller = got.and_then(|got| {
            self.0.iter().fold(None, |found, (role, want)| {
                let same = got.iter().zip(want).fold(0u8, |a, (x, y)| a | (x ^ y)) == 0;
                if same && found.is_none() {
                    Some(*role)
                } else {
                    found
                }
            })
        });
        match caller {
            Some(c) => {
                req.extensions_mut().insert(c);
                Ok(req)
            }
            None => Err(Status::unauthenticated("missing or wrong token")),
        }
    }
}

/// Refuses (`PermissionDenied`) a call whose caller is not in `allowed` (the owner may
/// call anything); a request that did not pass [`ServerAuth`] is refused too.
#[allow(clippy::result_large_err)]
pub fn require<T>(req: &Request<T>, allowed: &[Caller]) -> Result<Caller, Status> {
    match req.extensions().get::<Caller>() {
        Some(&c) if c == Caller::Admin || allowed.contains(&c) => Ok(c),
        Some(c) => Err(Status::permission_denied(format!(
            "a {} may not make this call (it needs: {})",
            c.name(),
            allowed
                .iter()
                .map(|c| c.name())
                .collect::<Vec<_>>()
                .join(" or ")
        ))),
        None => Err(Status::unauthenticated("the call carries no checked token")),
    }
}

/// Master client with the token attached.
pub type Master = MasterClient<InterceptedService<Channel, ClientAuth>>;
/// PS client with the token attached.
pub type Ps = ParameterServerClient<InterceptedService<Channel, ClientAuth>>;
/// Authenticated data-executor client.
pub type Executor = DataExecutorClient<InterceptedService<Channel, ClientAuth>>;

/// The accepted connections of a server's `listener`, with Nagle's algorithm off.
///
/// `Server::tcp_nodelay` does not reach sockets of `serve_with_incoming`; without this a
/// reply written in two segments (HTTP/2 headers, then data) waits for the client's
/// delayed ACK, 40 ms on Linux, on every call.
pub fn incoming(listener: tokio::net::TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// Deadline of a call to the master: every master call is a short state change.
pub const MASTER_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// HTTP/2 PING interval on idle and busy connections alike: a peer that vanished without
/// closing its socket (power loss, network partition) is noticed within
/// `KEEPALIVE_INTERVAL + KEEPALIVE_TIMEOUT` instead of never.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// How long a PING may go unanswered before the connection is dropped.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// A lazily connecting channel to `addr` (`host:port`); reconnects by itself. Every call
/// on it fails with `DeadlineExceeded` after `call_timeout`, so a hung peer cannot block
/// its caller forever.
///
/// With TLS installed in this process ([`crate::tls::install`]) the channel checks the
/// server's certificate and presents the job's own.
pub fn channel(addr: &str, call_timeout: Duration) -> anyhow::Result<Channel> {
    let tls = crate::tls::installed();
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))?
        .connect_timeout(Duration::from_secs(2))
        .timeout(call_timeout)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .tcp_nodelay(true);
    if let Some(m) = tls {
        endpoint = endpoint.tls_config(m.client())?;
    }
    Ok(endpoint.connect_lazy())
}

/// A server with the same HTTP/2 keepalive as the clients (dead clients' connections are
/// closed instead of held), and with TLS (client certificates required) when this
/// process has it installed.
pub fn server() -> anyhow::Result<tonic::transport::Server> {
    let server = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT));
    Ok(match crate::tls::installed() {
        Some(m) => server.tls_config(m.server())?,
        None => server,
    })
}

/// Master client for `addr` (calls time out after [`MASTER_CALL_TIMEOUT`]).
pub fn master_client(addr: &str, token: &str, max_bytes: usize) -> anyhow::Result<Master> {
    master_client_with_timeout(addr, token, max_bytes, MASTER_CALL_TIMEOUT)
}

/// Master client whose calls time out after `call_timeout` (a call that waits for long
/// work, such as re-sharding the parameter servers).
pub fn master_client_with_timeout(
    addr: &str,
    token: &str,
    max_bytes: usize,
    call_timeout: Duration,
) -> anyhow::Result<Master> {
    let auth = ClientAuth::new(token)?;
    Ok(
        MasterClient::with_interceptor(channel(addr, call_timeout)?, auth)
            .max_decoding_message_size(max_bytes)
            .max_encoding_message_size(max_bytes),
    )
}

/// PS client for `addr` whose calls time out after `call_timeout`.
pub fn ps_client(
    addr: &str,
    token: &str,
    max_bytes: usize,
    call_timeout: Duration,
) -> anyhow::Result<Ps> {
    let auth = ClientAuth::new(token)?;
    Ok(
        ParameterServerClient::with_interceptor(channel(addr, call_timeout)?, auth)
            .max_decoding_message_size(max_bytes)
            .max_encoding_message_size(max_bytes),
    )
}

/// Data-executor client for `addr` whose calls time out after `call_timeout`.
pub fn executor_client(
    addr: &str,
    token: &str,
    max_bytes: usize,
    call_timeout: Duration,
) -> anyhow::Result<Executor> {
    let auth = ClientAuth::new(token)?;
    Ok(
        DataExecutorClient::with_interceptor(channel(addr, call_timeout)?, auth)
            .max_decoding_message_size(max_bytes)
            .max_encoding_message_size(max_bytes),
    )
}

/// Reads the job token from [`TOKEN_ENV`].
pub fn token_from_env() -> anyhow::Result<String> {
    let t = std::env::var(TOKEN_ENV).map_err(|_| {
        anyhow::anyhow!("{TOKEN_ENV} is not set: role processes are started by `elastrec run`")
    })?;
    check_token(&t).map_err(|e| anyhow::anyhow!("{TOKEN_ENV}: {e}"))?;
    Ok(t)
}

/// The contiguous slice `[start, end)` of the flat dense parameters held by PS `i` of `n`.
pub fn dense_slice(num_params: usize, n: usize, i: usize) -> std::ops::Range<usize> {
    (num_params * i / n)..(num_params * (i + 1) / n)
}

/// True for errors that mean "the other side is (temporarily) unreachable": retry.
pub fn is_transient(s: &Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::Unavailable
            | tonic::Code::Unknown
            | tonic::Code::DeadlineExceeded
            | tonic::Code::Cancelled
    )
}

/// Start of the message of a parameter server's refusal of a request routed by another
/// layout than the one it serves (code `ABORTED`; see [`is_layout_refusal`]).
pub const LAYOUT_REFUSAL: &str = "layout changing";

/// A parameter server's refusal of a request because the set of servers is being changed
/// (or was changed): the request was routed by a layout the server does not serve. The
/// caller waits for the master to publish the current layout and routes the request again.
/// Code `ABORTED` (a version check failed, the gRPC meaning of it) and a message starting
/// with [`LAYOUT_REFUSAL`]; the rest of the message says which layouts.
pub fn layout_refusal(detail: impl std::fmt::Display) -> Status {
    Status::aborted(format!("{LAYOUT_REFUSAL}: {detail}"))
}

/// Start of the message of a parameter server's refusal while its lease from the master
/// has run out (code `UNAVAILABLE`; see [`is_fence_refusal`]).
pub const FENCE_REFUSAL: &str = "fenced";

/// A parameter server's refusal because the master has not acknowledged it for longer
/// than its lease: it may have been declared dead and replaced. The caller retries the
/// same server a little later, or switches to a replacement the master publishes.
pub fn fence_refusal(detail: impl std::fmt::Display) -> Status {
    Status::unavailable(format!("{FENCE_REFUSAL}: {detail}"))
}

/// True for a refusal made by [`fence_refusal`].
pub fn is_fence_refusal(s: &Status) -> bool {
    s.code() == tonic::Code::Unavailable && s.message().starts_with(FENCE_REFUSAL)
}

/// Metadata of a layout refusal naming a newer committed layout: its version and its
/// servers' addresses by index, comma-separated.
const LAYOUT_VERSION_KEY: &str = "elastrec-layout-version";
const LAYOUT_ADDRS_KEY: &str = "elastrec-layout-addrs";

/// [`layout_refusal`] naming `layout` (version and addresses), a committed layout newer
/// than the request's: the worker can switch without waiting for the master's next
/// heartbeat reply. Addresses that cannot be metadata are left out (the worker then waits).
pub fn layout_refusal_naming(detail: impl std::fmt::Display, layout: (u64, &[String])) -> Status {
    let mut s = layout_refusal(detail);
    let addrs = layout.1.join(",");
    if let (Ok(v), Ok(a)) = (
        layout.0.to_string().parse::<MetadataValue<Ascii>>(),
        addrs.parse::<MetadataValue<Ascii>>(),
    ) {
        s.metadata_mut().insert(LAYOUT_VERSION_KEY, v);
        s.metadata_mut().insert(LAYOUT_ADDRS_KEY, a);
    }
    s
}

/// True for a refusal made by [`layout_refusal`].
pub fn is_layout_refusal(s: &Status) -> bool {
    s.code() == tonic::Code::Aborted && s.message().starts_with(LAYOUT_REFUSAL)
}

/// The layout a refusal names ([`layout_refusal_naming`]), if any.
pub fn refusal_layout(s: &Status) -> Option<(u64, Vec<String>)> {
    if !is_layout_refusal(s) {
        return None;
    }
    let m = s.metadata();
    let version = m.get(LAYOUT_VERSION_KEY)?.to_str().ok()?.parse().ok()?;
    let addrs = m.get(LAYOUT_ADDRS_KEY)?.to_str().ok()?;
    let addrs: Vec<String> = addrs.split(',').map(str::to_string).collect();
    (!addrs.iter().any(String::is_empty)).then_some((version, addrs))
}

/// Pause between two attempts of a call that failed transiently.
pub const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// Runs `call` until it succeeds or fails with a non-transient status (returned), retrying
/// transient failures (see [`is_transient`]) every [`RETRY_PAUSE`]; with `give_up_after`,
/// the last transient status is returned once that much time has passed.
pub async fn retry_transient<T, F, Fut>(
    give_up_after: Option<Duration>,
    mut call: F,
) -> Result<T, Status>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Status>>,
{
    let start = std::time::Instant::now();
    loop {
        match call().await {
            Err(s) if is_transient(&s) && give_up_after.is_none_or(|d| start.elapsed() < d) => {
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            r => return r,
        }
    }
}

/// Runs futures concurrently and collects their outputs in order.
pub async fn join_all<F>(futs: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("rpc task panicked"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Role tokens: each role is told apart, none is the secret or another's, and
    /// `require` lets through only the roles a call allows (the owner always).
    #[test]
    fn role_tokens_tell_callers_apart() {
        let secret = "s3cret";
        let mut master = ServerAuth::for_job(secret);
        let call = |auth: &mut ServerAuth, token: &str| {
            let mut c = ClientAuth::new(token).unwrap();
            auth.call(c.call(Request::new(())).unwrap())
        };
        let worker = role_token(secret, Caller::Worker);
        assert_ne!(worker, role_token(secret, Caller::Ps));
        assert!(!worker.contains(secret));
        check_token(&worker).unwrap();
        let req = call(&mut master, &worker).unwrap();
        assert_eq!(
            require(&req, &[Caller::Worker, Caller::Ps]).unwrap(),
            Caller::Worker
        );
        let denied = require(&req, &[Caller::Master]).unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied);
        assert!(denied.message().contains("a worker may not"), "{denied:?}");
        let owner = call(&mut master, secret).unwrap();
        assert_eq!(require(&owner, &[Caller::Master]).unwrap(), Caller::Admin);
        // A PS knows digests only, and accepts each role as itself.
        let mut ps = ServerAuth::from_accept_list(&ps_accept_list(secret)).unwrap();
        let from_master = call(&mut ps, &role_token(secret, Caller::Master)).unwrap();
        assert_eq!(
            require(&from_master, &[Caller::Master]).unwrap(),
            Caller::Master
        );
        let from_worker = call(&mut ps, &worker).unwrap();
        assert!(require(&from_worker, &[Caller::Master]).is_err());
        assert_eq!(
            call(&mut ps, secret).unwrap_err().code(),
            tonic::Code::Unauthenticated,
            "the PS accept list does not hold the owner's secret"
        );
        assert!(require(&Request::new(()), &[Caller::Worker]).is_err());
        for bad in [
            "worker",
            "worker:zz",
            "boss:00",
            &format!("x:{}", "0".repeat(64)),
        ] {
            assert!(ServerAuth::from_accept_list(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn server_auth_checks_the_token() {
        let mut s = ServerAuth::new("abc123");
        let mut c = ClientAuth::new("abc123").unwrap();
        assert!(s.call(c.call(Request::new(())).unwrap()).is_ok());
        let mut wrong = ClientAuth::new("abc124").unwrap();
        let e = s.call(wrong.call(Request::new(())).unwrap()).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        assert_eq!(
            s.call(Request::new(())).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
    }

    /// A peer that accepts connections and then never answers (a hung process, a stopped
    /// VM): a call still ends, with `DeadlineExceeded`, after its deadline.
    #[tokio::test]
    async fn a_call_to_a_hung_peer_times_out() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        // Accepted, never read or answered.
        let held = std::thread::spawn(move || {
            let conns: Vec<_> = listener.incoming().take(2).collect();
            std::thread::park_timeout(Duration::from_secs(30));
            drop(conns);
        });
        let mut ps = ps_client(&addr, "abc", 1 << 20, Duration::from_millis(300)).unwrap();
        let call = ps.info(elastrec_proto::ps::InfoRequest { version: version() });
        let r = tokio::time::timeout(Duration::from_secs(20), call)
            .await
            .expect("the call ended by its own deadline");
        let e = r.unwrap_err();
        assert!(
            matches!(
                e.code(),
                tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
            ),
            "{e:?}"
        );
        assert!(is_transient(&e), "a timed-out call is retried: {e:?}");
        held.thread().unpark();
        drop(held);
    }

    #[test]
    fn a_corrupt_token_is_an_error_not_a_panic() {
        for bad in ["", "abc\n123", "ab c", "tök", "abc\u{0}"] {
            assert!(ClientAuth::new(bad).is_err(), "{bad:?}");
            assert!(
                master_client("127.0.0.1:1", bad, 1 << 20).is_err(),
                "{bad:?}"
            );
        }
    }

    #[tokio::test]
    async fn transient_failures_are_retried_and_others_returned() {
        let mut n = 0;
        let r = retry_transient(None, || {
            n += 1;
            let attempt = n;
            async move {
                if attempt < 3 {
                    Err(Status::unavailable("down"))
                } else {
                    Ok(attempt)
                }
            }
        })
        .await;
        assert_eq!(r.unwrap(), 3);
        let r: Result<(), _> =
            retry_transient(None, || async { Err(Status::not_found("gone")) }).await;
        assert_eq!(r.unwrap_err().code(), tonic::Code::NotFound);
        let r: Result<(), _> = retry_transient(Some(Duration::ZERO), || async {
            Err(Status::unavailable("down"))
        })
        .await;
        assert_eq!(r.unwrap_err().code(), tonic::Code::Unavailable);
    }

    #[test]
    fn layout_refusals_are_told_apart_from_other_aborts() {
        let s = layout_refusal("PS 1 serves layout 3, the request was routed by layout 2");
        assert!(is_layout_refusal(&s));
        assert!(
            !is_transient(&s),
            "a refusal is not retried as a dead server"
        );
        assert!(!is_layout_refusal(&Status::aborted("something else")));
        assert!(!is_layout_refusal(&Status::unavailable(LAYOUT_REFUSAL)));
        assert_eq!(refusal_layout(&s), None);
        let addrs = vec!["127.0.0.1:1".to_string(), "10.0.0.2:80".to_string()];
        let named = layout_refusal_naming("PS 0 serves layout 4", (4, &addrs));
        assert!(is_layout_refusal(&named));
        assert_eq!(refusal_layout(&named), Some((4, addrs)));
        let odd = layout_refusal_naming("x", (4, &["a\nb".to_string()]));
        assert!(is_layout_refusal(&odd));
        assert_eq!(
            refusal_layout(&odd),
            None,
            "no metadata rather than a broken one"
        );
    }

    #[test]
    fn versions_and_slices() {
        assert!(check_version(&version()).is_ok());
        assert!(check_version(&None).is_err());
        assert!(check_version(&Some(ProtocolVersion { major: 9, minor: 0 })).is_err());
        let parts: Vec<_> = (0..3).map(|i| dense_slice(10, 3, i)).collect();
        assert_eq!(parts, vec![0..3, 3..6, 6..10]);
    }
}
