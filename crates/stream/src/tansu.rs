//! A local Kafka-compatible broker for benchmarks and tests: Tansu (a broker in Rust that
//! speaks the Kafka protocol), started as a child process on a loopback port and stopped
//! when dropped. `elastrec bench online` and the online tests feed their jobs through it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Result, StreamError};

/// Where the test command installs Tansu (`scripts/test.sh`), under `$HOME`.
pub const INSTALL_DIR: &str = ".cache/elastrec-tools/tansu-0.6.0-sqlite/bin/tansu";

/// The Tansu binary: `ELASTREC_TANSU`, then the test command's install location, then
/// `tansu` on `PATH`.
pub fn binary() -> Option<PathBuf> {
    let from_env = std::env::var_os("ELASTREC_TANSU").map(PathBuf::from);
    let installed = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(INSTALL_DIR));
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("tansu"))
            .find(|p| p.is_file())
    });
    [from_env, installed, on_path]
        .into_iter()
        .flatten()
        .find(|p| p.is_file())
}

/// [`binary`] for a test: `None` after recording the running test as skipped (or failing
/// it where `ELASTREC_REQUIRE_TANSU` is set, see [`elastrec_common::skip_test`]).
pub fn binary_or_skip() -> Option<PathBuf> {
    let found = binary();
    if found.is_none() {
        elastrec_common::skip_test(
            "TANSU",
            "no Kafka broker: `bash scripts/test.sh` installs Tansu, or set ELASTREC_TANSU",
        );
    }
    found
}

/// A running broker, killed when dropped.
pub struct Tansu {
    child: Child,
    port: u16,
    binary: PathBuf,
    log: PathBuf,
}

/// How to start a broker.
#[derive(Debug, Clone, Default)]
pub struct TansuOptions {
    /// Require SASL authentication of every client (users made with [`Tansu::add_user`]).
    pub authentication: bool,
    /// The address clients are told to connect to (a TLS terminator in front of the
    /// broker); default: the broker's own.
    pub advertised: Option<String>,
    /// Where it keeps topics and users: a SQLite file (`sqlite://NAME.db`, in the
    /// directory of the log; default: the log's name with `.db`), which outlives the
    /// process and keeps SCRAM users, or `memory://tansu/`. Tansu 0.6's memory engine
    /// moves a partition's high watermark by one per produce request whatever its record
    /// count, so batched producers outrun it; its SQLite engine counts every record.
    pub storage: Option<String>,
    /// Extra environment of the broker process.
    pub env: Vec<(String, String)>,
}

impl Tansu {
    /// Starts `binary` on a free loopback port, its output to `log`, and waits until it
    /// accepts connections.
    pub fn start(binary: &Path, log: &Path, options: &TansuOptions) -> Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| StreamError::Invalid(format!("no free loopback port: {e}")))?
            .port();
        let listener = format!("tcp://127.0.0.1:{port}");
        let advertised = options
            .advertised
            .as_ref()
            .map_or_else(|| listener.clone(), |a| format!("tcp://{a}"));
        let out = std::fs::File::create(log)
            .map_err(|e| StreamError::Invalid(format!("{}: {e}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(|e| StreamError::Invalid(format!("{}: {e}", log.display())))?;
        let mut cmd = Command::new(binary);
        if let Some(dir) = log.parent().filter(|d| !d.as_os_str().is_empty()) {
            cmd.current_dir(dir);
        }
        let storage = options.storage.clone().unwrap_or_else(|| {
            let name = log.with_extension("db");
            let name = name
                .file_name()
                .map_or_else(|| "tansu.db".into(), |n| n.to_string_lossy().into_owned());
            format!("sqlite://{name}")
        });
        cmd.args(["broker", "--listener-url", &listener])
            .args(["--advertised-listener-url", &advertised])
            .args(["--storage-engine", &storage])
            .envs(options.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        if options.authentication {
            cmd.arg("--authentication");
        }
        let child = cmd.spawn().map_err(|e| {
            StreamError::Invalid(format!("starting the broker {}: {e}", binary.display()))
        })?;
        let mut broker = Self {
            child,
            port,
            binary: binary.to_path_buf(),
            log: log.to_path_buf(),
        };
        // Ready once it accepts connections (a probe, not a timed wait).
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = broker.child.try_wait() {
                return Err(StreamError::Invalid(format!(
                    "the broker {} exited ({status}) before it listened: see {}",
                    binary.display(),
                    log.display()
                )));
            }
            if started.elapsed() > Duration::from_secs(60) {
                return Err(StreamError::Invalid(format!(
                    "the broker did not listen on port {port} within 60 s: see {}",
                    log.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        broker.port = port;
        Ok(broker)
    }

    /// The broker's own address, `127.0.0.1:PORT`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// A connection to this broker.
    pub fn connection(&self) -> crate::Connection {
        crate::Connection::new(self.address())
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The broker's process id (to stop and continue it, as an outage would).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Adds SCRAM credentials for `user` (`mechanism`: `scram256` or `scram512`), through
    /// the broker's own admin command.
    pub fn add_user(&self, user: &str, password: &str, mechanism: &str) -> Result<()> {
        let out = Command::new(&self.binary)
            .args(["user", "create", user, password])
            .args(["--mechanism", mechanism])
            .args(["--broker", &format!("tcp://{}", self.address())])
            .output()
            .map_err(|e| StreamError::Invalid(format!("{}: {e}", self.binary.display())))?;
        if !out.status.success() {
            return Err(StreamError::Invalid(format!(
                "creating user {user}: {} (broker log: {})",
                String::from_utf8_lossy(&out.stderr).trim(),
                self.log.display()
            )));
        }
        Ok(())
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
