//! Shared by the end-to-end tests of distributed jobs: the `elastrec` binary, process
//! groups killed on drop, one data set with its single-process baseline, job files, and
//! status polling.
#![allow(dead_code)]

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

pub fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_elastrec")
}

/// Where the processes the tests start keep per-user state (the in-process brain's
/// database, `autoscale.brain_db`'s default): never the home of the user who runs the
/// tests, and one per test process, so that no run warm-starts from the jobs of an
/// earlier one (the brain's past jobs change its plans).
pub fn data_home() -> &'static Path {
    static HOME: OnceLock<PathBuf> = OnceLock::new();
    HOME.get_or_init(|| scratch_dir("elastrec-data-home"))
}

/// Directories this test process made, removed when it exits (tests are threads of one
/// process, and a static is never dropped).
static SCRATCH: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

extern "C" fn remove_scratch_at_exit() {
    if let Ok(dirs) = SCRATCH.lock() {
        for dir in dirs.iter() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A new temporary directory that lives until this test process exits.
fn scratch_dir(prefix: &str) -> PathBuf {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .unwrap()
        .keep();
    let mut dirs = SCRATCH.lock().unwrap_or_else(|e| e.into_inner());
    if dirs.is_empty() {
        // SAFETY: `remove_scratch_at_exit` is an `extern "C" fn()` that never unwinds.
        unsafe {
            libc::atexit(remove_scratch_at_exit);
        }
    }
    dirs.push(dir.clone());
    dir
}

pub fn elastrec(args: &[&str]) -> Output {
    Command::new(exe())
        .env("XDG_DATA_HOME", data_home())
        .args(args)
        .output()
        .expect("run elastrec")
}

/// [`elastrec`], asserting that the command succeeded (its stderr in the failure).
pub fn elastrec_ok(args: &[&str]) -> Output {
    let out = elastrec(args);
    assert!(
        out.status.success(),
        "elastrec {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A loopback port nobody listens on right now (for a server a test starts).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One distributed job at a time: the machine is small and timings matter.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A process group (the master and every node it starts) killed when dropped.
pub struct Group(pub Child);

impl Group {
    pub fn spawn(args: &[&str], log: &Path) -> Self {
        Self::spawn_with_env(args, log, &[])
    }

    /// Like [`Group::spawn`], with extra environment variables (inherited by every node).
    pub fn spawn_with_env(args: &[&str], log: &Path, env: &[(&str, &str)]) -> Self {
        let mut cmd = Command::new(exe());
        cmd.args(args).envs(env.iter().copied());
        Self::spawn_command(cmd, log)
    }

    /// Starts `cmd` (an `elastrec` command line, perhaps behind a wrapper that execs it)
    /// as the leader of a new process group, its output in `log`.
    pub fn spawn_command(mut cmd: Command, log: &Path) -> Self {
        let f = std::fs::File::create(log).unwrap();
        let child = cmd
            .env("XDG_DATA_HOME", data_home())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .stdin(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("spawn elastrec run");
        Group(child)
    }

    pub fn pid(&self) -> i32 {
        self.0.id() as i32
    }

    /// Waits (at most 300 s) for the job to end and fails the test, showing its log,
    /// unless it succeeded. Returns the log.
    pub fn wait_success(&mut self, log: &Path) -> String {
        let limit = Duration::from_secs(300);
        let Some(st) = self.wait_for(limit) else {
            // A job that hangs: what it and its nodes logged, for the failure report.
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let nodes = node_logs(&log.with_extension(""));
            panic!("job did not finish in {limit:?}\n{text}\n{nodes}");
        };
        let text = std::fs::read_to_string(log).unwrap();
        assert!(st.success(), "{text}");
        text
    }

    pub fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        self.wait_for(limit)
            .unwrap_or_else(|| panic!("job did not finish in {limit:?}"))
    }

    /// The job's exit status, or `None` when it is still running after `limit`.
    fn wait_for(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            if let Some(s) = self.0.try_wait().unwrap() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.0.try_wait().unwrap()
    }
}

/// The last lines of every node log under `dir/logs` (empty when there is none).
fn node_logs(dir: &Path) -> String {
    let Ok(entries) = std::fs::read_dir(dir.join("logs")) else {
        return String::new();
    };
    let mut out = String::new();
    for path in entries.flatten().map(|e| e.path()) {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        out += &format!("== {}\n{tail}\n", path.display());
    }
    out
}

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: kill(2) with a negative pid signals the process group.
        unsafe {
            libc::kill(-self.pid(), libc::SIGKILL);
        }
        let _ = self.0.wait();
    }
}

/// Shared data set and single-process baseline.
pub struct Fixture {
    pub dir: PathBuf,
    pub baseline_auc: f64,
    pub train_rows: u64,
}

pub const ROWS: u64 = 90_000;

pub fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        // Kept for every test of this binary, removed when it exits: each run leaves
        // tens of megabytes of data and job outputs otherwise.
        let dir = scratch_dir("elastrec-fixture");
        gen_data(&dir.join("data"), ROWS, &[]);
        let job = dir.join("single.toml");
        std::fs::write(&job, job_text("single", "")).unwrap();
        elastrec_ok(&["train", job.to_str().unwrap()]);
        let summary: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("single/summary.json")).unwrap(),
        )
        .unwrap();
        Fixture {
            baseline_auc: summary["eval"]["auc"].as_f64().unwrap(),
            train_rows: ROWS * 2 / 3,
            dir,
        }
    })
}

/// The same data, model and optimizer for both modes; `cluster` adds the `[cluster]` part.
pub fn job_text(out: &str, cluster: &str) -> String {
    format!(
        r#"
[data]
dir = "data"
train = ["day_0.tsv", "day_1.tsv"]
eval = ["day_2.tsv"]
[model]
bottom_mlp = [32, 16]
top_mlp = [32, 1]
max_table_rows = 4000
[train]
batch_size = 256
epochs = 2
progress = false
[output]
dir = "{out}"
{cluster}
"#
    )
}

pub fn write_job(name: &str, cluster: &str) -> (PathBuf, PathBuf) {
    write_job_file(name, &job_text(name, cluster))
}

/// Writes `text` as the job file `<name>.toml` beside the fixture's data; returns it and
/// the job's directory (`output.dir` of [`job_text`]: `<name>` beside it).
pub fn write_job_file(name: &str, text: &str) -> (PathBuf, PathBuf) {
    let f = fixture();
    let job = f.dir.join(format!("{name}.toml"));
    std::fs::write(&job, text).unwrap();
    (job, f.dir.join(name))
}

/// The job's events of `kind` (`<dir>/events.jsonl`, written by the master).
pub fn events(dir: &Path, kind: &str) -> Vec<serde_json::Value> {
    elastrec_master::events::read(&dir.join("events.jsonl"))
        .into_iter()
        .filter(|e| e["kind"] == kind)
        .collect()
}

pub fn result(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("result.json")).unwrap()).unwrap()
}

/// The ledger proves exactly-once per epoch, and the model is as good as single-process.
pub fn check_result(dir: &Path, log: &Path, auc_tolerance: f64) {
    check_result_against(dir, log, fixture().baseline_auc, auc_tolerance);
    let r = result(dir);
    if !r["checkpoint"].is_null() {
        check_saved_model(dir, &r, &eval_day());
    }
}

/// [`check_result`]'s ledger and AUC against the single-process AUC `baseline_auc` of
/// another data set with as many training rows as the fixture's.
pub fn check_result_against(dir: &Path, log: &Path, baseline_auc: f64, auc_tolerance: f64) {
    let f = fixture();
    let r = result(dir);
    let text = std::fs::read_to_string(log).unwrap();
    assert_eq!(r["status"], "finished", "{r}\n{text}");
    for e in r["epochs"].as_array().unwrap() {
        assert_eq!(e["duplicated"], 0, "{r}");
        assert_eq!(e["missing"], 0, "{r}");
        assert_eq!(e["consumed"], f.train_rows, "{r}");
    }
    assert_eq!(r["ledger"]["consumed"], 2 * f.train_rows);
    assert!(text.contains("duplicated 0, missing 0"), "{text}");
    let auc = r["eval"]["auc"].as_f64().unwrap();
    assert!(
        (auc - baseline_auc).abs() <= auc_tolerance,
        "distributed AUC {auc:.4} vs single-process {baseline_auc:.4}"
    );
}

/// AUC and logloss of a model file on the fixture's evaluation day (`elastrec eval`).
pub fn eval_model(model: &Path) -> serde_json::Value {
    eval_model_on(model, &eval_day())
}

/// The fixture's evaluation day.
pub fn eval_day() -> PathBuf {
    fixture().dir.join("data/day_2.tsv")
}

/// Generates `rows` rows over 3 days into `dir` (scale 0.001, seed 5; `extra` flags of
/// `gen-data` added); returns its `report.json`.
pub fn gen_data(dir: &Path, rows: u64, extra: &[&str]) -> serde_json::Value {
    let rows = rows.to_string();
    let mut args = vec![
        "gen-data",
        "--out",
        dir.to_str().unwrap(),
        "--rows",
        &rows,
        "--days",
        "3",
        "--scale",
        "0.001",
        "--seed",
        "5",
    ];
    args.extend_from_slice(extra);
    elastrec_ok(&args);
    serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap()
}

/// A click log with named columns and lists (`gen-data --named`), `rows` rows over 3
/// days into `dir`.
pub fn gen_named(dir: &Path, rows: u64) {
    elastrec_ok(&[
        "gen-data",
        "--named",
        "--out",
        dir.to_str().unwrap(),
        "--rows",
        &rows.to_string(),
        "--days",
        "3",
    ]);
}

/// [`gen_named`]'s log over `days` days, as CSV files with a header (`day_K.csv`).
pub fn gen_named_csv(dir: &Path, rows: u64, days: u32) {
    elastrec_ok(&[
        "gen-data",
        "--named",
        "--format",
        "csv",
        "--out",
        dir.to_str().unwrap(),
        "--rows",
        &rows.to_string(),
        "--days",
        &days.to_string(),
    ]);
}

/// The label and the columns of [`gen_named`]'s log as `[[data.feature]]` tables, to
/// end a job's `[data]` section; `hist` adds lines to the `hist_items` sequence, which
/// shares the item table.
pub fn named_features(hist: &str) -> String {
    format!(
        r#"label = "click"
[[data.feature]]
name = "user_id"
kind = "categorical"
[[data.feature]]
name = "item_id"
kind = "categorical"
[[data.feature]]
name = "device"
kind = "categorical"
[[data.feature]]
name = "genres"
kind = "bag"
[[data.feature]]
name = "price"
kind = "dense"
transform = "log1p"
[[data.feature]]
name = "hist_items"
kind = "sequence"
table = "item_id"
{hist}
"#
    )
}

/// The generated named log's features with chains of their own (`data.feature.ops`):
/// a hashed user, a price both as a clamped `log1p` number and as a categorical of its
/// bands, the first two genres, and the history's item-to-item transitions (2-grams)
/// besides its items.
pub fn chained_features() -> String {
    r#"label = "click"
[[data.feature]]
name = "user_id"
kind = "categorical"
ops = ["sigrid_hash(3, 4000)"]
[[data.feature]]
name = "item_id"
kind = "categorical"
[[data.feature]]
name = "device"
kind = "categorical"
[[data.feature]]
name = "genres"
kind = "bag"
ops = ["first_x(2)"]
[[data.feature]]
name = "price"
kind = "dense"
ops = ["fill_null(0)", "clamp(max = 200)", "log1p"]
[[data.feature]]
name = "price_band"
column = "price"
kind = "categorical"
ops = ["bucketize([5, 10, 20, 50, 100])"]
[[data.feature]]
name = "hist_items"
kind = "sequence"
table = "item_id"
max_len = 20
[[data.feature]]
name = "hist_pairs"
column = "hist_items"
kind = "sequence"
max_len = 10
ops = ["ngram(2)"]
"#
    .to_string()
}

/// Trains `text` as the job `name` in one process (`elastrec train`); returns its
/// evaluation AUC.
pub fn train_auc(name: &str, text: &str) -> f64 {
    let (job, dir) = write_job_file(name, text);
    elastrec_ok(&["train", job.to_str().unwrap()]);
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    summary["eval"]["auc"].as_f64().unwrap()
}

/// [`gen_data`] with a conversion label after each click (`--conversions`): the data of
/// a two-task model.
pub fn gen_conversions(dir: &Path, rows: u64) -> serde_json::Value {
    gen_data(dir, rows, &["--conversions"])
}

/// `text` (a job file) made a two-task MMoE reading `data` (a directory named relative to
/// the job file, as the fixture's `data`): the model for [`gen_conversions`]' data.
pub fn as_mmoe(text: &str, data: &str) -> String {
    text.replace(
        "[model]\n",
        "[model]\ntype = \"mmoe\"\nmmoe = { tasks = 2, experts = 3, expert_mlp = [32, 16] }\n",
    )
    .replace("dir = \"data\"", &format!("dir = \"{data}\""))
}

/// `elastrec eval --json` of a model file on `data`.
pub fn eval_model_on(model: &Path, data: &Path) -> serde_json::Value {
    let out = elastrec_ok(&[
        "eval",
        "--model",
        model.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--json",
    ]);
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A finished job left `model.bin`, exported from a final checkpoint of everything it
/// trained: evaluated on its own, it scores what the job's final evaluation scored.
pub fn check_saved_model(dir: &Path, r: &serde_json::Value, eval_file: &Path) {
    let saved = &r["export"]["model"];
    assert_eq!(saved["samples"], r["ledger"]["consumed"], "{r}");
    let model = dir.join("model.bin");
    assert_eq!(saved["path"], model.to_str().unwrap(), "{r}");
    let e = eval_model_on(&model, eval_file);
    let (mine, job) = (
        e["auc"].as_f64().unwrap(),
        r["eval"]["auc"].as_f64().unwrap(),
    );
    assert!(
        (mine - job).abs() <= 0.002,
        "model.bin scores AUC {mine:.4}, the job's final evaluation {job:.4}: {r}"
    );
}

pub fn status_json(dir: &Path) -> Option<serde_json::Value> {
    let out = elastrec(&["status", dir.to_str().unwrap(), "--json"]);
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

pub fn running_workers(s: &serde_json::Value) -> Vec<(u64, i32)> {
    s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["role"] == "worker" && n["state"] == "running" && n["pid"].as_u64() > Some(0))
        .map(|n| (n["id"].as_u64().unwrap(), n["pid"].as_u64().unwrap() as i32))
        .collect()
}

pub fn wait_for(limit: Duration, cond: impl FnMut() -> bool) {
    assert!(
        poll_until(limit, cond),
        "condition not reached in {limit:?}"
    );
}

/// Checks `cond` every 100 ms until it holds (true) or `limit` has passed (false).
fn poll_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while !cond() {
        if t0.elapsed() >= limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    true
}

pub fn samples_done(dir: &Path) -> u64 {
    status_json(dir).map_or(0, |s| s["samples_done"].as_u64().unwrap_or(0))
}

/// Runs an `elastrec` subcommand on a job directory and asserts that it succeeded.
fn control(args: &[&str]) -> String {
    String::from_utf8_lossy(&elastrec_ok(args).stdout).into_owned()
}

/// Moves the job's pause point to `samples` (the job goes on until it gets there).
pub fn pause_at(dir: &Path, samples: u64) {
    control(&[
        "pause",
        dir.to_str().unwrap(),
        "--at-samples",
        &samples.to_string(),
    ]);
}

/// Lifts the job's pause.
pub fn unpause(dir: &Path) {
    control(&["unpause", dir.to_str().unwrap()]);
}

/// Takes a checkpoint now (returns once it is committed).
pub fn take_checkpoint(dir: &Path) {
    control(&["checkpoint", dir.to_str().unwrap()]);
}

/// Waits until the job stands at its pause point. A paused job cannot pass it, so no fast
/// run skips this state.
pub fn wait_held(dir: &Path) -> serde_json::Value {
    wait_for_status(
        dir,
        Duration::from_secs(180),
        "held at its pause point",
        |s| s["pause"]["held"].as_bool() == Some(true),
    )
}

/// Polls the job's status until `cond` holds and returns that status. A job that does not
/// get there in `limit` fails the test with what it was waiting `for`, the last status,
/// the job's log and the tail of every node's log: a hang is diagnosed from its report.
pub fn wait_for_status(
    dir: &Path,
    limit: Duration,
    what: &str,
    mut cond: impl FnMut(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let mut last: Option<serde_json::Value> = None;
    let reached = poll_until(limit, || {
        last = status_json(dir).or(last.take());
        last.as_ref().is_some_and(&mut cond)
    });
    match last {
        Some(s) if reached => s,
        last => {
            let log = std::fs::read_to_string(dir.with_extension("log")).unwrap_or_default();
            panic!(
                "the job in {} was not {what} after {limit:?}\nlast status: {}\njob log:\n{log}\n{}",
                dir.display(),
                last.map_or("none".into(), |s| s.to_string()),
                node_logs(dir)
            );
        }
    }
}

/// The running nodes of `role` (`"ps"`, `"worker"`, `"executor"`) in a status, as
/// (id, pid, samples).
pub fn running_nodes(s: &serde_json::Value, role: &str) -> Vec<(u64, i32, u64)> {
    s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["role"] == role && n["state"] == "running" && n["pid"].as_u64() > Some(0))
        .map(|n| {
            (
                n["id"].as_u64().unwrap(),
                n["pid"].as_u64().unwrap() as i32,
                n["samples"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

/// SIGKILLs node `id` (process `pid`, started by this test's job) and waits until the
/// master no longer counts it running.
pub fn kill_node(dir: &Path, id: u64, pid: i32) {
    // SAFETY: plain kill(2) of a process this test's job started.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
    wait_not_running(dir, id);
}

/// Waits until node `id` is no longer running (declared dead or exited).
pub fn wait_not_running(dir: &Path, id: u64) {
    let what = format!("without node {id} running");
    wait_for_status(dir, Duration::from_secs(60), &what, |s| {
        s["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["id"].as_u64() == Some(id) && n["state"] != "running")
    });
}

/// A running `elastrec serve` (killed when dropped) and its bound addresses.
pub struct ModelServer {
    pub group: Group,
    pub http: String,
    pub grpc: String,
}

/// Starts `elastrec serve` with `args` on free loopback ports, with the token `token`
/// (when given); returns once it listens.
pub fn start_server(args: &[&str], token: Option<&str>, log: &Path) -> ModelServer {
    let mut all = vec![
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--grpc-listen",
        "127.0.0.1:0",
    ];
    all.extend_from_slice(args);
    let env: Vec<(&str, &str)> = token.map(|t| ("ELASTREC_TOKEN", t)).into_iter().collect();
    let group = Group::spawn_with_env(&all, log, &env);
    let mut line = String::new();
    // The server prints its addresses once it listens, and then keeps running.
    wait_for(Duration::from_secs(60), || {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        match text.lines().find(|l| l.starts_with("serving ")) {
            Some(l) => {
                line = l.to_string();
                true
            }
            None => false,
        }
    });
    let after = |marker: &str| {
        let rest = &line[line.find(marker).unwrap_or_else(|| panic!("{line}")) + marker.len()..];
        rest.split([',', ' ']).next().unwrap().to_string()
    };
    ModelServer {
        http: after("http://"),
        grpc: after("gRPC on "),
        group,
    }
}

/// One HTTP/1.0 request; returns the status code and the body.
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\n{auth}Content-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).unwrap();
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (code, body.to_string())
}

/// The first `n` rows of a Criteo TSV file: as raw rows, and as the JSON body of a
/// prediction request.
pub fn request_rows(file: &Path, n: usize) -> (Vec<elastrec_data::RawRow>, Vec<u8>) {
    let text = std::fs::read_to_string(file).unwrap();
    let raw: Vec<elastrec_data::RawRow> = text
        .lines()
        .take(n)
        .map(|line| {
            let mut r = elastrec_data::RawRow::default();
            elastrec_data::tsv::parse_line(line.as_bytes(), &mut r).unwrap();
            r
        })
        .collect();
    let json: Vec<serde_json::Value> = raw.iter().map(elastrec_serve::features::json_row).collect();
    (
        raw,
        serde_json::to_vec(&serde_json::json!({ "rows": json })).unwrap(),
    )
}

/// What the model file at `model` predicts for `rows`, computed in this process.
pub fn file_predictions(model: &Path, rows: &[elastrec_data::RawRow]) -> Vec<f32> {
    let (m, _) = elastrec_worker::model_file::load(model).unwrap();
    let mut b = elastrec_data::criteo::batch(rows.len());
    rows.iter().for_each(|r| b.push_raw(r));
    let mut p = Vec::new();
    elastrec_worker::Predictor::new(&m, rows.len())
        .predict(&m, &b, &mut p)
        .unwrap();
    p
}

/// The predictions and checkpoint of a `POST /v1/predict` reply.
pub fn predictions(reply: &str) -> (Vec<f32>, serde_json::Value) {
    let v: serde_json::Value =
        serde_json::from_str(reply).unwrap_or_else(|e| panic!("{e}: {reply}"));
    let p = v["predictions"]
        .as_array()
        .unwrap_or_else(|| panic!("{reply}"))
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    (p, v["checkpoint"].clone())
}

/// The scalars of the TensorBoard event files in `dir` as TensorBoard's own reader loads
/// them (`tests/python/tensorboard_scalars.py`): tag to `[(step, value)]`. `None` (the
/// test skipped, and counted) where Python has no `tensorboard` package.
pub fn tensorboard_scalars(dir: &Path) -> Option<serde_json::Map<String, serde_json::Value>> {
    if !elastrec_common::skip::python_imports("TENSORBOARD", "tensorboard") {
        return None;
    }
    let v = python_json("tensorboard_scalars.py", &[dir]);
    Some(v.as_object().unwrap().clone())
}

/// Runs the script `script` of `tests/python` on `args` and parses the JSON it prints;
/// a failing script fails the test with its error output.
pub fn python_json(script: &str, args: &[&Path]) -> serde_json::Value {
    let path = format!("{}/tests/python/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(path)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The last value of `tag` in TensorBoard `scalars`.
pub fn last_scalar(scalars: &serde_json::Map<String, serde_json::Value>, tag: &str) -> f64 {
    let points = scalars
        .get(tag)
        .and_then(|v| v.as_array())
        .unwrap_or_else(|| panic!("no {tag} among {:?}", scalars.keys()));
    points.last().unwrap()[1].as_f64().unwrap()
}

/// Runs `command` with `input` on its standard input; its output and status (stdout and
/// stderr captured). Err: it could not be started.
pub fn output_with_stdin(command: &mut Command, input: &[u8]) -> std::io::Result<Output> {
    use std::io::Write as _;
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    // A child that exits without reading all of it leaves a broken pipe: its status says
    // what went wrong, not the write.
    let _ = child.stdin.take().expect("piped").write_all(input);
    child.wait_with_output()
}

/// `promtool check metrics` over an exposition, as a user runs it on `curl`'s output:
/// `Some(problems)` (empty: clean), or `None` (the test skipped, and counted) without
/// `promtool`.
pub fn promtool_problems(exposition: &str) -> Option<String> {
    let mut promtool = Command::new("promtool");
    promtool.args(["check", "metrics"]);
    let Ok(out) = output_with_stdin(&mut promtool, exposition.as_bytes()) else {
        elastrec_common::skip::skip_test(
            "PROMETHEUS",
            "no promtool (scripts/test.sh installs the prometheus package)",
        );
        return None;
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some(if out.status.success() {
        String::new()
    } else {
        text
    })
}

/// A real Prometheus server on loopback scraping the targets of one file-based service
/// discovery file every second; killed when dropped.
pub struct Prometheus {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts one over `targets` (a `file_sd` JSON file); `None` (the test skipped, and
    /// counted) without the `prometheus` binary.
    pub fn start(targets: &Path) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  \
                 - job_name: elastrec\n    file_sd_configs:\n      - files: [\"{}\"]\n        \
                 refresh_interval: 1s\n",
                targets.display()
            ),
        )
        .unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let spawned = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn();
        let Ok(child) = spawned else {
            elastrec_common::skip::skip_test(
                "PROMETHEUS",
                "no prometheus binary (scripts/test.sh installs the prometheus package)",
            );
            return None;
        };
        Some(Self {
            child,
            addr,
            _dir: dir,
        })
    }

    /// Its active targets as `(role, node, health)`, from its HTTP API; empty while it
    /// is not answering yet.
    pub fn targets(&self) -> Vec<(String, String, String)> {
        let Ok((200, body)) =
            elastrec_metrics::http_get_accepting(&self.addr, "/api/v1/targets", None, None)
        else {
            return Vec::new();
        };
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["data"]["activeTargets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let l = &t["labels"];
                let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
                (s(&l["role"]), s(&l["node"]), s(&t["health"]))
            })
            .collect()
    }

    /// The log, for a failing assertion.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("prometheus.log")).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
