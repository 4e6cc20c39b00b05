//! How elastrec talks to the brokers: the connection's settings (security, timeouts,
//! compression), read from the job's `[stream] properties` under the names Kafka clients
//! use, and one Kafka client per connection on the crate's own runtime.
//!
//! The client is rskafka, a Kafka client in Rust with no C build. It is asynchronous; the
//! crate's readers, watcher and replay are called from plain threads (a worker's input
//! thread, the master's blocking pool), so every call is run on a small runtime of this
//! crate's and waited for: callers never need a runtime of their own, and a caller inside
//! one (a `spawn_blocking` task) does not nest runtimes.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;
use rskafka::client::partition::{Compression, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder, Credentials, SaslConfig};
use rskafka::BackoffConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::{Result, StreamError};
use crate::topic::Connection;

/// The properties elastrec understands, with what each does (shown when a job names
/// another).
pub const PROPERTIES: &[(&str, &str)] = &[
    (
        "security.protocol",
        "plaintext (default), ssl, sasl_plaintext or sasl_ssl",
    ),
    (
        "ssl.ca.location",
        "PEM file of the CA certificates that sign the brokers' (default: the system's roots)",
    ),
    (
        "ssl.certificate.location",
        "PEM file of this client's certificate chain (mutual TLS; with ssl.key.location)",
    ),
    (
        "ssl.key.location",
        "PEM file of this client's private key (with ssl.certificate.location)",
    ),
    (
        "sasl.mechanism",
        "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (with security.protocol sasl_*)",
    ),
    ("sasl.username", "the SASL user"),
    ("sasl.password", "the SASL password"),
    (
        "sasl.password.env",
        "name of an environment variable that holds the SASL password (kept out of the job file)",
    ),
    ("client.id", "the name the brokers log this client under"),
    (
        "fetch.wait.max.ms",
        "how long a broker may hold a fetch that found no new data, ms (default 10)",
    ),
    (
        "compression.type",
        "how `elastrec replay` compresses batches: none (default), gzip, snappy, lz4 or zstd",
    ),
    (
        "batch.num.messages",
        "most messages `elastrec replay` sends in one produce request (default 10000)",
    ),
    (
        "request.timeout.ms",
        "how long a call may keep retrying an unreachable broker before it fails, ms (default 30000)",
    ),
];

/// Transport security of a connection (`security.protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// No TLS, no authentication.
    Plaintext,
    /// TLS.
    Ssl,
    /// SASL over plain TCP.
    SaslPlaintext,
    /// SASL over TLS.
    SaslSsl,
}

impl Protocol {
    fn tls(self) -> bool {
        matches!(self, Self::Ssl | Self::SaslSsl)
    }

    fn sasl(self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }
}

/// SASL mechanism (`sasl.mechanism`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    /// RFC 4616: the password in the clear (use it over TLS).
    Plain,
    /// RFC 7677.
    ScramSha256,
    /// SCRAM with SHA-512.
    ScramSha512,
}

/// A connection's settings, parsed and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Bootstrap brokers.
    pub brokers: Vec<String>,
    /// `security.protocol`.
    pub protocol: Protocol,
    /// `ssl.ca.location`.
    pub ca: Option<PathBuf>,
    /// `ssl.certificate.location` and `ssl.key.location`.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// Mechanism, user and password.
    pub sasl: Option<(Mechanism, String, String)>,
    /// `client.id`.
    pub client_id: Option<String>,
    /// `fetch.wait.max.ms`.
    pub fetch_wait_ms: i32,
    /// `compression.type`.
    pub compression: Compression,
    /// `batch.num.messages`.
    pub batch_messages: usize,
    /// `request.timeout.ms`.
    pub request_timeout: Duration,
}

/// Default `fetch.wait.max.ms`: every range a worker reads starts with a fetch, and an
/// online range is small (a linger's worth of one partition), so a broker holding an empty
/// fetch long would leave workers waiting most of the time. The price is more empty
/// fetches while a partition has nothing new.
pub const FETCH_WAIT_MS: i32 = 10;

impl Settings {
    /// Parses `conn`'s properties; an unknown property, a bad value or a missing companion
    /// (a key without its certificate, SASL without a user) is an error naming it.
    pub fn parse(conn: &Connection) -> Result<Self> {
        let bad = |message: String| StreamError::Client {
            brokers: conn.brokers.clone(),
            message,
        };
        let brokers: Vec<String> = conn
            .brokers
            .split(',')
            .map(str::trim)
            .filter(|b| !b.is_empty())
            .map(str::to_string)
            .collect();
        if brokers.is_empty() {
            return Err(bad("no brokers given (`host:port[,host:port...]`)".into()));
        }
        let props = &conn.properties;
        if let Some(k) = props
            .keys()
            .find(|k| !PROPERTIES.iter().any(|(name, _)| name == k) && *k != "sasl.mechanisms")
        {
            return Err(bad(format!(
                "unknown property {k:?}; elastrec understands {}",
                PROPERTIES
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let get = |k: &str| props.get(k).map(|v| v.trim());
        let protocol = match get("security.protocol")
            .unwrap_or("plaintext")
            .to_ascii_lowercase()
            .as_str()
        {
            "plaintext" => Protocol::Plaintext,
            "ssl" => Protocol::Ssl,
            "sasl_plaintext" => Protocol::SaslPlaintext,
            "sasl_ssl" => Protocol::SaslSsl,
            other => {
                return Err(bad(format!(
                    "security.protocol {other:?}: expected plaintext, ssl, sasl_plaintext or \
                     sasl_ssl"
                )))
            }
        };
        let ca = get("ssl.ca.location").map(PathBuf::from);
        let identity = match (get("ssl.certificate.location"), get("ssl.key.location")) {
            (Some(c), Some(k)) => Some((PathBuf::from(c), PathBuf::from(k))),
            (None, None) => None,
            _ => {
                return Err(bad(
                    "ssl.certificate.location and ssl.key.location go together".into(),
                ))
            }
        };
        if !protocol.tls() && (ca.is_some() || identity.is_some()) {
            return Err(bad(format!(
                "ssl.* properties need security.protocol ssl or sasl_ssl (it is {})",
                get("security.protocol").unwrap_or("plaintext")
            )));
        }
        let sasl = if protocol.sasl() {
            let mechanism = get("sasl.mechanism").or_else(|| get("sasl.mechanisms"));
            let mechanism = match mechanism.unwrap_or("PLAIN").to_ascii_uppercase().as_str() {
                "PLAIN" => Mechanism::Plain,
                "SCRAM-SHA-256" => Mechanism::ScramSha256,
                "SCRAM-SHA-512" => Mechanism::ScramSha512,
                other => {
                    return Err(bad(format!(
                        "sasl.mechanism {other:?}: expected PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"
                    )))
                }
            };
            let user = get("sasl.username")
                .ok_or_else(|| bad(format!("{protocol:?} needs sasl.username")))?;
            let password = match (get("sasl.password"), get("sasl.password.env")) {
                (Some(p), None) => p.to_string(),
                (None, Some(var)) => std::env::var(var).map_err(|_| {
                    bad(format!(
                        "sasl.password.env names {var:?}, which is not set in this process's \
                         environment"
                    ))
                })?,
                (Some(_), Some(_)) => {
                    return Err(bad(
                        "give sasl.password or sasl.password.env, not both".into()
                    ))
                }
                (None, None) => {
                    return Err(bad(format!(
                        "{protocol:?} needs sasl.password or sasl.password.env"
                    )))
                }
            };
            Some((mechanism, user.to_string(), password))
        } else {
            if let Some(k) = props.keys().find(|k| k.starts_with("sasl.")) {
                return Err(bad(format!(
                    "{k} needs security.protocol sasl_plaintext or sasl_ssl"
                )));
            }
            None
        };
        let number = |k: &str, default: i64, max: i64| -> Result<i64> {
            match get(k) {
                None => Ok(default),
                Some(v) => v
                    .parse::<i64>()
                    .ok()
                    .filter(|n| (0..=max).contains(n))
                    .ok_or_else(|| bad(format!("{k} {v:?}: expected a whole number 0..={max}"))),
            }
        };
        let compression = match get("compression.type")
            .or_else(|| get("compression.codec"))
            .unwrap_or("none")
            .to_ascii_lowercase()
            .as_str()
        {
            "none" => Compression::NoCompression,
            "gzip" => Compression::Gzip,
            "snappy" => Compression::Snappy,
            "lz4" => Compression::Lz4,
            "zstd" => Compression::Zstd,
            other => {
                return Err(bad(format!(
                    "compression.type {other:?}: expected none, gzip, snappy, lz4 or zstd"
                )))
            }
        };
        Ok(Self {
            brokers,
            protocol,
            ca,
            identity,
            sasl,
            client_id: get("client.id").map(str::to_string),
            fetch_wait_ms: number("fetch.wait.max.ms", FETCH_WAIT_MS.into(), 60_000)? as i32,
            compression,
            batch_messages: number("batch.num.messages", 10_000, 1_000_000)?.max(1) as usize,
            request_timeout: Duration::from_millis(
                number("request.timeout.ms", 30_000, 3_600_000)? as u64,
            ),
        })
    }

    /// The TLS configuration, for `ssl` and `sasl_ssl`.
    fn tls(&self) -> std::result::Result<Option<rustls::ClientConfig>, String> {
        if !self.protocol.tls() {
            return Ok(None);
        }
        let mut roots = rustls::RootCertStore::empty();
        match &self.ca {
            Some(path) => {
                for cert in read_certs(path)? {
                    roots
                        .add(cert)
                        .map_err(|e| format!("ssl.ca.location {}: {e}", path.display()))?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                let (added, _) = roots.add_parsable_certificates(found.certs);
                if added == 0 {
                    return Err(
                        "no CA certificates found on this system: set ssl.ca.location".into(),
                    );
                }
            }
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots);
        Ok(Some(match &self.identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = read_certs(cert)?;
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| format!("ssl.key.location {}: {e}", key.display()))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| format!("client certificate {}: {e}", cert.display()))?
            }
        }))
    }
}

fn read_certs(path: &Path) -> std::result::Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no PEM certificate in it", path.display()));
    }
    Ok(certs)
}

/// The crate's runtime: one thread does all the I/O of this process's Kafka clients.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("elastrec-kafka")
            .enable_all()
            .build()
            .expect("a one-thread tokio runtime can always be built")
    })
}

/// Runs `f` on the crate's runtime and waits for it.
pub(crate) fn block_on<F>(f: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime().spawn(async move {
        let _ = tx.send(f.await);
    });
    rx.recv()
        .expect("the Kafka runtime ran the call to its end (it never drops a task)")
}

/// A connection's client, built on first use, and its partition clients.
pub(crate) struct Kafka {
    pub settings: Settings,
    client: tokio::sync::Mutex<Option<Arc<Client>>>,
    partitions: Mutex<HashMap<(String, i32), Arc<PartitionClient>>>,
}

impl Kafka {
    pub fn new(conn: &Connection, default_client_id: &str) -> Result<Arc<Self>> {
        let mut settings = Settings::parse(conn)?;
        settings
            .client_id
            .get_or_insert_with(|| default_client_id.to_string());
        Ok(Arc::new(Self {
            settings,
            client: tokio::sync::Mutex::new(None),
            partitions: Mutex::new(HashMap::new()),
        }))
    }

    pub fn brokers(&self) -> String {
        self.settings.brokers.join(",")
    }

    /// Retries of one request end after `deadline` of backing off.
    fn backoff(deadline: Duration) -> BackoffConfig {
        BackoffConfig {
            init_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(500),
            base: 2.0,
            deadline: Some(deadline),
        }
    }

    /// A client builder with this connection's TLS and SASL settings, whose retries back
    /// off for at most `deadline`.
    fn builder(&self, deadline: Duration) -> Result<ClientBuilder> {
        let s = &self.settings;
        let mut b = ClientBuilder::new(s.brokers.clone())
            .backoff_config(Self::backoff(deadline))
            .client_id(s.client_id.clone().unwrap_or_default());
        if let Some(tls) = s.tls().map_err(|message| StreamError::Client {
            brokers: self.brokers(),
            message,
        })? {
            b = b.tls_config(Arc::new(tls));
        }
        if let Some((mechanism, user, password)) = &s.sasl {
            let c = Credentials::new(user.clone(), password.clone());
            b = b.sasl_config(match mechanism {
                Mechanism::Plain => SaslConfig::Plain(c),
                Mechanism::ScramSha256 => SaslConfig::ScramSha256(c),
                Mechanism::ScramSha512 => SaslConfig::ScramSha512(c),
            });
        }
        Ok(b)
    }

    /// Builds a client within `request_timeout` of backing off; the outer bound only
    /// catches a broker that accepts and then never answers.
    async fn build(&self, deadline: Duration) -> Result<Client> {
        let bound = self.settings.request_timeout + Duration::from_secs(2);
        tokio::time::timeout(bound, self.builder(deadline)?.build())
            .await
            .map_err(|_| StreamError::Unreachable {
                brokers: self.brokers(),
                message: format!("no answer within {:.0} s", bound.as_secs_f64()),
            })?
            .map_err(|e| self.error(e))
    }

    /// The cluster client, connecting (TLS, SASL) on first use.
    pub async fn client(&self) -> Result<Arc<Client>> {
        let mut slot = self.client.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        // One attempt first: the client retries every failed connection, refused
        // credentials and certificates included, until the deadline (under load, well past
        // it: only its back-off counts), so those would surface late and as a timeout. The
        // attempt's client is not kept: a client's back-off governs all its requests.
        if let Err(e) = self.build(Duration::ZERO).await {
            if !e.is_transient() {
                return Err(e);
            }
        }
        let c = Arc::new(self.build(self.settings.request_timeout).await?);
        *slot = Some(c.clone());
        Ok(c)
    }

    /// The client of one partition (its leader found through the cluster's metadata).
    pub async fn partition(&self, topic: &str, partition: i32) -> Result<Arc<PartitionClient>> {
        let key = (topic.to_string(), partition);
        if let Some(p) = self.partitions.lock().get(&key) {
            return Ok(p.clone());
        }
        let client = self.client().await?;
        let p = Arc::new(
            client
                .partition_client(topic, partition, UnknownTopicHandling::Error)
                .await
                .map_err(|e| self.error(e))?,
        );
        self.partitions.lock().insert(key, p.clone());
        Ok(p)
    }

    /// The crate's error for a client error.
    pub fn error(&self, e: rskafka::client::error::Error) -> StreamError {
        StreamError::from_client(&self.brokers(), e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(props: &[(&str, &str)]) -> Connection {
        Connection {
            brokers: "b1:9092, b2:9092".into(),
            properties: props
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn settings_read_kafka_property_names() {
        let s = Settings::parse(&conn(&[
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "SCRAM-SHA-512"),
            ("sasl.username", "alice"),
            ("sasl.password", "secret"),
            ("ssl.ca.location", "/etc/ca.pem"),
            ("compression.type", "zstd"),
            ("fetch.wait.max.ms", "100"),
        ]))
        .unwrap();
        assert_eq!(s.brokers, ["b1:9092", "b2:9092"]);
        assert_eq!(s.protocol, Protocol::SaslSsl);
        assert_eq!(
            s.sasl,
            Some((Mechanism::ScramSha512, "alice".into(), "secret".into()))
        );
        assert_eq!(s.ca, Some(PathBuf::from("/etc/ca.pem")));
        assert_eq!(s.compression, Compression::Zstd);
        assert_eq!(s.fetch_wait_ms, 100);
        let plain = Settings::parse(&conn(&[])).unwrap();
        assert_eq!(plain.protocol, Protocol::Plaintext);
        assert_eq!(plain.fetch_wait_ms, FETCH_WAIT_MS);
    }

    #[test]
    fn bad_settings_name_the_property() {
        for (props, says) in [
            (
                vec![("socket.timeout.ms", "5")],
                "unknown property \"socket.timeout.ms\"",
            ),
            (
                vec![("security.protocol", "tls")],
                "security.protocol \"tls\"",
            ),
            (
                vec![("security.protocol", "ssl"), ("ssl.key.location", "k.pem")],
                "go together",
            ),
            (vec![("ssl.ca.location", "ca.pem")], "ssl.* properties need"),
            (
                vec![("security.protocol", "sasl_ssl")],
                "needs sasl.username",
            ),
            (
                vec![
                    ("security.protocol", "sasl_plaintext"),
                    ("sasl.username", "u"),
                ],
                "needs sasl.password",
            ),
            (
                vec![
                    ("security.protocol", "sasl_plaintext"),
                    ("sasl.username", "u"),
                    ("sasl.password.env", "ELASTREC_TEST_NO_SUCH_VARIABLE"),
                ],
                "ELASTREC_TEST_NO_SUCH_VARIABLE",
            ),
            (
                vec![("sasl.username", "u")],
                "sasl.username needs security.protocol",
            ),
            (
                vec![("compression.type", "brotli")],
                "compression.type \"brotli\"",
            ),
            (
                vec![("fetch.wait.max.ms", "-1")],
                "fetch.wait.max.ms \"-1\"",
            ),
        ] {
            let e = Settings::parse(&conn(&props)).unwrap_err().to_string();
            assert!(e.contains(says), "{props:?}: {e}");
            assert!(e.contains("b1:9092"), "names the brokers: {e}");
        }
    }

    #[test]
    fn a_missing_ca_file_is_named() {
        let s = Settings::parse(&conn(&[
            ("security.protocol", "ssl"),
            ("ssl.ca.location", "/nonexistent/ca.pem"),
        ]))
        .unwrap();
        let e = s.tls().unwrap_err();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
    }
}
