//! A real S3-compatible server for tests: `moto_server` on a free loopback port.
//!
//! Shared by the integration tests and the persistence-rate bench (included by path).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `moto_server`; dropping it kills the process.
pub struct Moto {
    child: Child,
    port: u16,
}

impl Moto {
    /// Starts `moto_server` and waits until it answers HTTP. Panics (does not skip) when
    /// it is not installed: the S3 path must be tested.
    pub fn start() -> Self {
        let bin = find_on_path("moto_server").unwrap_or_else(|| {
            panic!(
                "moto_server is not on PATH; the S3 checkpoint tests need a real S3-compatible \
                 server: install it with `pip install 'moto[server]'`"
            )
        });
        let port = free_port();
        let child = Command::new(&bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let mut moto = Self { child, port };
        moto.wait_ready(Duration::from_secs(60));
        moto
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A checkpoint location for `bucket`/`prefix` on this server. It holds no credentials
    /// (the store refuses locations that do): a process opening it needs
    /// [`credentials_env`] in its environment, e.g. through [`set_credentials_env`].
    pub fn url(&self, bucket: &str, prefix: &str) -> String {
        format!(
            "s3://{bucket}/{prefix}?endpoint={}&region=us-east-1",
            self.endpoint()
        )
    }

    /// Creates a bucket (moto accepts an unsigned `PUT /bucket`; object_store cannot create
    /// buckets).
    pub fn create_bucket(&self, bucket: &str) {
        let response = self.http(&format!("PUT /{bucket} HTTP/1.1"));
        assert!(
            response.starts_with("HTTP/1.1 200") || response.starts_with("HTTP/1.0 200"),
            "creating bucket {bucket} failed: {response}"
        );
    }

    /// Sends one bodiless request and returns the whole response.
    fn http(&self, request_line: &str) -> String {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).expect("connect to moto");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("set timeout");
        let request = format!(
            "{request_line}\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        );
        stream.write_all(request.as_bytes()).expect("send to moto");
        let mut response = String::new();
        // A read error after the status line (reset on close) still leaves a usable answer.
        let _ = stream.read_to_string(&mut response);
        response
    }

    fn wait_ready(&mut self, limit: Duration) {
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("moto_server exited early with {status}");
            }
            if self.answers() {
                return;
            }
            assert!(
                start.elapsed() < limit,
                "moto_server did not answer on port {} within {limit:?}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn answers(&self) -> bool {
        TcpStream::connect(("127.0.0.1", self.port)).is_ok()
            && self.http("GET / HTTP/1.1").starts_with("HTTP/1")
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The credentials moto accepts, as the environment variables the S3 client reads: pass
/// them to child processes (`Command::envs`) or set them with [`set_credentials_env`].
#[allow(dead_code)] // Not every file that includes this module uses both functions.
pub fn credentials_env() -> [(&'static str, &'static str); 2] {
    [
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
    ]
}

/// Puts [`credentials_env`] into this process's environment, once per process. Tests run on
/// parallel threads and the environment is shared by all of them: setting the same values
/// once and never removing them means no test can see another's values or a variable
/// half-way through a change. (`set_var` is safe to call in edition 2021; edition 2024
/// makes it `unsafe` for exactly this reason.)
#[allow(dead_code)]
pub fn set_credentials_env() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for (key, value) in credentials_env() {
            std::env::set_var(key, value);
        }
    });
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// A port nobody listens on right now (bind to port 0, read it, close).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}
