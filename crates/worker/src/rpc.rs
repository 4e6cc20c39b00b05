//! gRPC plumbing shared by the master, PS and worker processes: the per-job token (sent
//! as `authorization: Bearer <token>` metadata, checked by a server interceptor), the
//! protocol version check, and client connections.

use std::time::Duration;

use elastrec_proto::common::ProtocolVersion;
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

fn bearer(token: &str) -> MetadataValue<Ascii> {
    format!("Bearer {token}")
        .parse()
        .expect("token is ASCII hex")
}

/// Adds the job token to every outgoing request.
#[derive(Clone)]
pub struct ClientAuth(MetadataValue<Ascii>);

impl ClientAuth {
    /// For `token`.
    pub fn new(token: &str) -> Self {
        Self(bearer(token))
    }
}

impl Interceptor for ClientAuth {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        req.metadata_mut().insert("authorization", self.0.clone());
        Ok(req)
    }
}

/// Rejects requests without the job token (`Unauthenticated`).
#[derive(Clone)]
pub struct ServerAuth(Vec<u8>);

impl ServerAuth {
    /// Accepts only `token`.
    pub fn new(token: &str) -> Self {
        Self(format!("Bearer {token}").into_bytes())
    }
}

impl Interceptor for ServerAuth {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let got = req
            .metadata()
            .get("authorization")
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        // Constant-time comparison.
        let same = got.len() == self.0.len()
            && got.iter().zip(&self.0).fold(0u8, |a, (x, y)| a | (x ^ y)) == 0;
        if same {
            Ok(req)
        } else {
            Err(Status::unauthenticated("missing or wrong job token"))
        }
    }
}

/// Master client with the token attached.
pub type Master = MasterClient<InterceptedService<Channel, ClientAuth>>;
/// PS client with the token attached.
pub type Ps = ParameterServerClient<InterceptedService<Channel, ClientAuth>>;

/// The accepted connections of a server's `listener`, with Nagle's algorithm off.
///
/// `Server::tcp_nodelay` does not reach sockets of `serve_with_incoming`; without this a
/// reply written in two segments (HTTP/2 headers, then data) waits for the client's
/// delayed ACK, 40 ms on Linux, on every call.
pub fn incoming(listener: tokio::net::TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// A lazily connecting channel to `addr` (`host:port`); reconnects by itself.
pub fn channel(addr: &str) -> anyhow::Result<Channel> {
    Ok(Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .connect_lazy())
}

/// Master client for `addr`.
pub fn master_client(addr: &str, token: &str, max_bytes: usize) -> anyhow::Result<Master> {
    Ok(
        MasterClient::with_interceptor(channel(addr)?, ClientAuth::new(token))
            .max_decoding_message_size(max_bytes)
            .max_encoding_message_size(max_bytes),
    )
}

/// PS client for `addr`.
pub fn ps_client(addr: &str, token: &str, max_bytes: usize) -> anyhow::Result<Ps> {
    Ok(
        ParameterServerClient::with_interceptor(channel(addr)?, ClientAuth::new(token))
            .max_decoding_message_size(max_bytes)
            .max_encoding_message_size(max_bytes),
    )
}

/// Reads the job token from [`TOKEN_ENV`].
pub fn token_from_env() -> anyhow::Result<String> {
    let t = std::env::var(TOKEN_ENV).map_err(|_| {
        anyhow::anyhow!("{TOKEN_ENV} is not set: role processes are started by `elastrec run`")
    })?;
    anyhow::ensure!(
        !t.is_empty() && t.bytes().all(|b| b.is_ascii_alphanumeric()),
        "{TOKEN_ENV} must be a non-empty alphanumeric token"
    );
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_auth_checks_the_token() {
        let mut s = ServerAuth::new("abc123");
        let mut c = ClientAuth::new("abc123");
        assert!(s.call(c.call(Request::new(())).unwrap()).is_ok());
        let mut wrong = ClientAuth::new("abc124");
        let e = s.call(wrong.call(Request::new(())).unwrap()).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        assert_eq!(
            s.call(Request::new(())).unwrap_err().code(),
            tonic::Code::Unauthenticated
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
