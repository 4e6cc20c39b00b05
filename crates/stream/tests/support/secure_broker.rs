//! A broker as a managed Kafka presents itself: TLS with a certificate of a test CA and
//! client certificates required, SASL SCRAM users. Tansu 0.6 has no TLS listener, so
//! stunnel (Debian's `stunnel4`) terminates TLS in front of it and the broker advertises
//! stunnel's address. Shared by the stream crate's tests and the online job tests
//! (included by path).

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use elastrec_stream::tansu::{Tansu, TansuOptions};
use elastrec_stream::Connection;

/// The users it knows: `alice` (SCRAM-SHA-512) and `bob` (SCRAM-SHA-256).
pub const USERS: [(&str, &str, &str); 2] = [
    ("alice", "alice-secret", "scram512"),
    ("bob", "bob-secret", "scram256"),
];

/// The broker and its TLS terminator, stopped when dropped.
pub struct SecureBroker {
    _stunnel: Stunnel,
    _broker: Tansu,
    dir: PathBuf,
    port: u16,
}

impl SecureBroker {
    /// Starts it with its files in `dir`; `None` (the test skips, counted) where Tansu or
    /// stunnel is not installed.
    pub fn start(dir: &Path) -> Option<Self> {
        let bin = elastrec_stream::tansu::binary_or_skip()?;
        let stunnel_bin = ["/usr/bin/stunnel4", "/usr/bin/stunnel"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.is_file());
        let Some(stunnel_bin) = stunnel_bin else {
            elastrec_common::skip_test(
                "STUNNEL",
                "no TLS terminator: `bash scripts/test.sh` installs stunnel4",
            );
            return None;
        };
        let m = elastrec_rpc::tls::TlsMaterial::issue("kafka-test").unwrap();
        for (name, pem) in [
            ("ca.pem", &m.ca),
            ("cert.pem", &m.cert),
            ("key.pem", &m.key),
        ] {
            std::fs::write(dir.join(name), pem).unwrap();
        }
        // SCRAM credentials are made through the broker, and an authenticating Tansu 0.6
        // refuses the unauthenticated call that makes them: a first broker without
        // authentication stores the users in a SQLite file (its engine that keeps users),
        // and the broker under test starts on the same file with authentication required.
        let storage = TansuOptions {
            storage: Some("sqlite://tansu.db".into()),
            ..Default::default()
        };
        {
            let setup = Tansu::start(&bin, &dir.join("tansu-setup.log"), &storage).unwrap();
            for (user, password, mechanism) in USERS {
                setup.add_user(user, password, mechanism).unwrap();
            }
        }
        let port = free_port();
        let options = TansuOptions {
            authentication: true,
            advertised: Some(format!("localhost:{port}")),
            ..storage
        };
        let broker = Tansu::start(&bin, &dir.join("tansu.log"), &options).unwrap();
        let stunnel = Stunnel::start(&stunnel_bin, dir, port, broker.port());
        Some(Self {
            _stunnel: stunnel,
            _broker: broker,
            dir: dir.to_path_buf(),
            port,
        })
    }

    /// `localhost:PORT` (the name its certificate carries).
    pub fn address(&self) -> String {
        format!("localhost:{}", self.port)
    }

    /// The client properties of `user` with `mechanism` (`SCRAM-SHA-512`, ...): TLS with
    /// the test CA and the client certificate, zstd batches, one message per produce
    /// request (see `Tansu::connection`).
    pub fn properties(&self, user: &str, password: &str, mechanism: &str) -> Vec<(String, String)> {
        let file = |name: &str| self.dir.join(name).display().to_string();
        [
            ("security.protocol", "sasl_ssl".to_string()),
            ("ssl.ca.location", file("ca.pem")),
            ("ssl.certificate.location", file("cert.pem")),
            ("ssl.key.location", file("key.pem")),
            ("sasl.mechanism", mechanism.to_string()),
            ("sasl.username", user.to_string()),
            ("sasl.password", password.to_string()),
            ("compression.type", "zstd".to_string()),
            ("request.timeout.ms", "5000".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// A connection as [`SecureBroker::properties`] describes.
    pub fn connection(&self, user: &str, password: &str, mechanism: &str) -> Connection {
        Connection {
            brokers: self.address(),
            properties: self
                .properties(user, password, mechanism)
                .into_iter()
                .collect(),
        }
    }
}

/// stunnel in front of the broker: presents `cert.pem` (signed by `ca.pem`) and accepts
/// only clients with a certificate `ca.pem` signed.
struct Stunnel(Child);

impl Stunnel {
    fn start(bin: &Path, dir: &Path, accept: u16, backend: u16) -> Self {
        let conf = dir.join("stunnel.conf");
        let d = dir.display();
        std::fs::write(
            &conf,
            format!(
                "foreground = yes\npid =\n[kafka]\naccept = 127.0.0.1:{accept}\n\
                 connect = 127.0.0.1:{backend}\ncert = {d}/cert.pem\nkey = {d}/key.pem\n\
                 CAfile = {d}/ca.pem\nverifyChain = yes\nrequireCert = yes\n"
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("stunnel.log")).unwrap();
        let child = std::process::Command::new(bin)
            .arg(&conf)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let s = Self(child);
        // Ready once it accepts connections (a probe, not a timed wait).
        let t0 = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", accept)).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "stunnel did not listen"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    }
}

impl Drop for Stunnel {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
