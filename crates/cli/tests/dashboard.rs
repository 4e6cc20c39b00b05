//! `elastrec dashboard` in a real headless Chromium, driven over the DevTools protocol:
//! the page loads without console errors, shows a running job's nodes and its charts
//! (its loss and AUC curves among them),
//! and updates in place (server-sent events) when the job scales. `.ci/run` installs
//! Debian's `chromium` and sets `ELASTREC_REQUIRE_CHROMIUM=1`; elsewhere the test skips
//! when no Chromium is found (`ELASTREC_CHROMIUM` names one).
//!
//! `ELASTREC_DASHBOARD_SCREENSHOT=FILE` also writes a screenshot of the page (what
//! `docs/dashboard.md` shows).

mod common;

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

const CLUSTER: &str = r#"
[cluster]
ps = 2
workers = 1
staleness = 0
batches_per_shard = 4
heartbeat_ms = 200
dead_after_ms = 2000
"#;

fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ELASTREC_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|d| ["chromium", "chromium-browser"].map(|n| d.join(n)))
        .find(|p| p.is_file())
}

/// A Chromium process, killed on drop.
struct Browser {
    child: Child,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A DevTools session with one page: calls, and the page's errors as they are reported.
struct Page {
    ws: WebSocket<MaybeTlsStream<TcpStream>>,
    next_id: u64,
    errors: Vec<String>,
}

impl Page {
    fn connect(url: &str) -> Self {
        let (ws, _) = tungstenite::connect(url).expect("DevTools WebSocket");
        if let MaybeTlsStream::Plain(s) = ws.get_ref() {
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        }
        Self {
            ws,
            next_id: 0,
            errors: Vec::new(),
        }
    }

    /// Sends one command and returns its result; events read meanwhile are examined for
    /// errors.
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let msg = json!({"id": id, "method": method, "params": params}).to_string();
        self.ws.send(Message::text(msg)).expect("DevTools send");
        loop {
            let m = self.ws.read().expect("DevTools reply");
            let Ok(text) = m.to_text() else { continue };
            let v: Value = serde_json::from_str(text).expect("DevTools JSON");
            if v["id"].as_u64() == Some(id) {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
            self.note_event(&v);
        }
    }

    fn note_event(&mut self, v: &Value) {
        let p = &v["params"];
        match v["method"].as_str() {
            Some("Runtime.exceptionThrown") => self.errors.push(p["exceptionDetails"].to_string()),
            Some("Runtime.consoleAPICalled") if p["type"] == "error" => {
                self.errors.push(p["args"].to_string())
            }
            Some("Log.entryAdded") if p["entry"]["level"] == "error" => {
                self.errors.push(p["entry"].to_string())
            }
            _ => {}
        }
    }

    /// Evaluates `expr` in the page and returns its value.
    fn eval(&mut self, expr: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expr, "returnByValue": true}),
        );
        r["result"]["value"].clone()
    }
}

/// What the page shows now.
fn page_state(page: &mut Page) -> Value {
    page.eval(
        "JSON.stringify({
            updates: window.__elastrec ? window.__elastrec.updates : 0,
            errors: window.__elastrec ? window.__elastrec.errors : ['no page state'],
            jobs: document.querySelectorAll('article.job[data-state=live]').length,
            workers: document.querySelectorAll('tr.node[data-role=worker][data-state=running]').length,
            ps: document.querySelectorAll('tr.node[data-role=ps][data-state=running]').length,
            charts: Array.from(document.querySelectorAll('svg.chart-svg')).map(s => Number(s.dataset.points)),
            titles: Array.from(document.querySelectorAll('.chart h3')).map(h => h.textContent),
            legends: Object.fromEntries(Array.from(document.querySelectorAll('.chart')).map(c => [c.querySelector('h3').textContent, c.querySelector('.legend').textContent])),
            axes: Array.from(document.querySelectorAll('.chart')).map(c => ({
                title: c.querySelector('h3').textContent,
                x: Array.from(c.querySelectorAll('text.tick-x')).map(t => t.textContent),
                y: Array.from(c.querySelectorAll('text.tick-y')).map(t => t.textContent),
                names: Array.from(c.querySelectorAll('text.axis-title')).map(t => t.textContent),
            })),
            connection: document.getElementById('connection').textContent,
        })",
    )
    .as_str()
    .map(|s| serde_json::from_str(s).unwrap())
    .unwrap_or(Value::Null)
}

/// The points of history the job's master has written so far.
fn history_points(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("history.jsonl"))
        .map(|t| t.lines().filter(|l| l.ends_with('}')).count())
        .unwrap_or(0)
}

/// Starts Chromium on `url` with DevTools on a free port; returns it and the page's
/// DevTools WebSocket address.
fn open(chromium: &Path, url: &str) -> (Browser, String) {
    let port = free_port();
    let profile = tempfile::tempdir().unwrap();
    let child = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--window-size=1280,1400",
            &format!("--remote-debugging-port={port}"),
            &format!("--user-data-dir={}", profile.path().display()),
            url,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting chromium");
    let browser = Browser {
        child,
        _profile: profile,
    };
    let devtools = format!("127.0.0.1:{port}");
    let mut ws_url = None;
    wait_for(Duration::from_secs(60), || {
        let Some(targets) = devtools_targets(&devtools) else {
            return false;
        };
        ws_url = targets.as_array().and_then(|t| {
            t.iter()
                .find(|t| t["type"] == "page")
                .and_then(|t| t["webSocketDebuggerUrl"].as_str().map(String::from))
        });
        ws_url.is_some()
    });
    (browser, ws_url.unwrap())
}

/// DevTools' list of targets (`None` while it does not answer yet).
fn devtools_targets(addr: &str) -> Option<Value> {
    use std::io::{Read, Write};
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET /json/list HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    // DevTools keeps the connection open: read the header, then Content-Length bytes.
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let body_at = loop {
        let n = s.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..body_at]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))?
        .trim()
        .parse()
        .ok()?;
    while buf.len() < body_at + len {
        let n = s.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    serde_json::from_slice(&buf[body_at..body_at + len]).ok()
}

#[test]
fn the_dashboard_shows_a_running_job_and_follows_it_when_it_scales() {
    let Some(chromium) = chromium() else {
        elastrec_common::skip_test(
            "CHROMIUM",
            "no chromium found: apt-get install chromium, or set ELASTREC_CHROMIUM",
        );
        return;
    };
    let _g = serial();
    // A two-task model, so that the page draws a progressive line per task.
    let f = fixture();
    gen_conversions(&f.dir.join("dashboard-data"), ROWS);
    let (job, dir) = write_job_file(
        "dashboard",
        &as_mmoe(&job_text("dashboard", CLUSTER), "dashboard-data"),
    );
    let log = dir.with_extension("log");
    let total = 2 * f.train_rows;
    let mut run = Group::spawn(
        &[
            "run",
            job.to_str().unwrap(),
            "--pause-at-samples",
            &(total / 10).to_string(),
        ],
        &log,
    );
    // Held at its pause point, the job cannot end before the page has been checked.
    wait_held(&dir);
    // The master keeps the job's history (a point with each progress line, also while it
    // is held): the dashboard, started now, draws the job from before it started.
    wait_for(Duration::from_secs(60), || history_points(&dir) >= 2);
    let dashboard_started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();

    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let dash_log = dir.with_extension("dashboard.log");
    let _dash = Group::spawn(
        &[
            "dashboard",
            dir.to_str().unwrap(),
            "--listen",
            &addr,
            "--every-ms",
            "200",
        ],
        &dash_log,
    );
    let mut snapshot = Value::Null;
    wait_for(Duration::from_secs(60), || {
        TcpStream::connect(&addr).is_ok() && {
            let (code, body) = http(&addr, "GET", "/api/snapshot", None, b"");
            snapshot = serde_json::from_str(&body).unwrap_or(Value::Null);
            code == 200 && body.contains("\"state\":\"live\"")
        }
    });
    let history = snapshot["jobs"][0]["history"].as_array().unwrap();
    let earlier = history
        .iter()
        .filter(|p| p["t_s"].as_f64().unwrap() < dashboard_started)
        .count();
    assert!(
        earlier >= 2,
        "no history from before the dashboard: {snapshot}"
    );

    let (_browser, ws) = open(&chromium, &format!("http://{addr}/"));
    let mut page = Page::connect(&ws);
    // Errors from the first byte on: enable the reports, then load the page again.
    page.call("Runtime.enable", json!({}));
    page.call("Log.enable", json!({}));
    page.call("Page.enable", json!({}));
    page.call("Page.reload", json!({}));

    let mut state = Value::Null;
    wait_for(Duration::from_secs(60), || {
        state = page_state(&mut page);
        state["jobs"] == 1
            && state["workers"] == 1
            && state["ps"] == 2
            && state["charts"]
                .as_array()
                .is_some_and(|c| c.len() >= 2 && c.iter().all(|n| n.as_u64() > Some(1)))
            // The batch job's progressive validation: its loss and AUC curves.
            && ["progressive logloss", "progressive AUC"]
                .iter()
                .all(|t| state["titles"].as_array().is_some_and(|a| a.contains(&json!(t))))
    });
    // Every chart reads as a chart: clock times across, values up, both axes named, and
    // tick labels without float noise (`5,000`, `0.75`, never `0.30000000000000004`).
    let axes = state["axes"].as_array().unwrap();
    assert!(axes.len() >= 4, "{state}");
    for a in axes {
        let ticks = |k: &str| -> Vec<String> {
            a[k].as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_str().unwrap().to_string())
                .collect()
        };
        let (x, y) = (ticks("x"), ticks("y"));
        assert!(x.len() >= 2 && y.len() >= 2, "{a}");
        assert!(
            x.iter()
                .all(|t| t.len() >= 5 && t.chars().all(|c| c.is_ascii_digit() || c == ':')),
            "clock times: {a}"
        );
        let decimals = |t: &String| t.split_once('.').map_or(0, |(_, d)| d.len());
        assert!(
            y.iter().all(|t| decimals(t) <= 4 && !t.contains('e')),
            "tick labels: {a}"
        );
        assert!(
            y.iter().all(|t| t.replace(',', "").parse::<f64>().is_ok()),
            "tick labels: {a}"
        );
        assert_eq!(a["names"].as_array().unwrap().len(), 2, "axis titles: {a}");
    }
    // A line per task of the two-task model.
    for chart in ["progressive logloss", "progressive AUC"] {
        let legend = state["legends"][chart].as_str().unwrap_or("");
        assert!(
            legend.contains("task 0") && legend.contains("task 1"),
            "{chart}: {state}"
        );
    }
    let before = state["updates"].as_u64().unwrap();

    if let Some(shot) = std::env::var_os("ELASTREC_DASHBOARD_SCREENSHOT") {
        screenshot(&chromium, &addr, Path::new(&shot));
    }

    elastrec_ok(&["scale", dir.to_str().unwrap(), "--workers", "2"]);
    // The same page load: only the event feed can bring the second worker in.
    let t0 = Instant::now();
    wait_for(Duration::from_secs(60), || {
        state = page_state(&mut page);
        state["workers"] == 2
    });
    assert!(
        state["updates"].as_u64().unwrap() > before,
        "the page changed without a new snapshot? {state}"
    );
    assert_eq!(state["connection"], "connected", "{state}");
    assert_eq!(state["errors"], json!([]), "{state}");
    assert!(page.errors.is_empty(), "console errors: {:?}", page.errors);
    eprintln!(
        "page followed the scale-up in {:.1} s: {state}",
        t0.elapsed().as_secs_f64()
    );

    unpause(&dir);
    run.wait_success(&log);
}

/// Chromium's own screenshot of the page after a few seconds of live updates.
fn screenshot(chromium: &Path, addr: &str, file: &Path) {
    let profile = tempfile::tempdir().unwrap();
    let status = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            "--window-size=1280,1100",
            "--timeout=4000",
            &format!("--user-data-dir={}", profile.path().display()),
            &format!("--screenshot={}", file.display()),
            &format!("http://{addr}/"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("chromium screenshot");
    assert!(status.success() && file.exists(), "screenshot {status}");
}
