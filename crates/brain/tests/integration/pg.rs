//! Starts a throwaway PostgreSQL cluster on a free loopback port; stops it on drop (also
//! when a test panics). Fails loudly when the PostgreSQL binaries are missing.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Postgres {
    bin: PathBuf,
    dir: tempfile::TempDir,
    as_root: bool,
    pub url: String,
}

fn find_bin_dir() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.push("/usr/local/bin".into());
    if let Ok(rd) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .collect();
        versions.sort();
        dirs.extend(versions.into_iter().rev());
    }
    dirs.into_iter()
        .find(|d| d.join("initdb").is_file() && d.join("pg_ctl").is_file())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn sh_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', "'\\''"))
}

impl Postgres {
    fn run(&self, args: &str) -> std::process::Output {
        if self.as_root {
            Command::new("su")
                .args(["postgres", "-c", args])
                .output()
                .expect("run su postgres")
        } else {
            Command::new("sh")
                .args(["-c", args])
                .output()
                .expect("run sh")
        }
    }

    pub fn start() -> Self {
        let bin = find_bin_dir().unwrap_or_else(|| {
            panic!(
                "PostgreSQL binaries (initdb, pg_ctl) not found in PATH, /usr/local/bin or \
                 /usr/lib/postgresql/*/bin: install PostgreSQL (e.g. apt-get install -y postgresql) \
                 to run the brain's database tests"
            )
        });
        let dir = tempfile::Builder::new()
            .prefix("brain-pg-")
            .tempdir()
            .expect("temp dir");
        let as_root = is_root();
        if as_root {
            let st = Command::new("chown")
                .args(["-R", "postgres", &dir.path().display().to_string()])
                .status();
            assert!(
                st.is_ok_and(|s| s.success()),
                "chown of the data dir to postgres failed"
            );
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let data = dir.path().join("data");
        let pg = Self {
            bin,
            dir,
            as_root,
            url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
        };
        let initdb = format!(
            "{} -D {} -A trust -U postgres",
            sh_quote(&pg.bin.join("initdb")),
            sh_quote(&data)
        );
        let out = pg.run(&initdb);
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let start = format!(
            "{} -D {} -o \"-c listen_addresses=127.0.0.1 -p {port} -k {}\" -l {} -w start",
            sh_quote(&pg.bin.join("pg_ctl")),
            sh_quote(&data),
            sh_quote(pg.dir.path()),
            sh_quote(&pg.dir.path().join("log"))
        );
        let out = pg.run(&start);
        assert!(
            out.status.success(),
            "pg_ctl start failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(pg.dir.path().join("log")).unwrap_or_default()
        );
        pg
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let stop = format!(
            "{} -D {} -m fast stop",
            sh_quote(&self.bin.join("pg_ctl")),
            sh_quote(&self.dir.path().join("data"))
        );
        let _ = self.run(&stop);
    }
}
