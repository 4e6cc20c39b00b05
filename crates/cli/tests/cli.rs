//! End-to-end tests of the `elastrec` binary in temporary directories.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::gen_named_csv;

fn elastrec(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_elastrec"))
        .args(args)
        .output()
        .expect("run elastrec")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "elastrec failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn gen(dir: &Path, rows: u64, days: u32) {
    ok(&elastrec(&[
        "gen-data",
        "--out",
        dir.to_str().unwrap(),
        "--rows",
        &rows.to_string(),
        "--days",
        &days.to_string(),
        "--scale",
        "0.001",
        "--seed",
        "3",
    ]));
}

/// A small but real job: the same DLRM structure with narrower MLPs.
fn write_job(dir: &Path, extra: &str) -> PathBuf {
    let job = dir.join("job.toml");
    std::fs::write(
        &job,
        format!(
            r#"
[data]
dir = "data"
train = ["day_0.tsv", "day_1.tsv"]
eval = ["day_2.tsv"]
{extra}
[model]
bottom_mlp = [64, 16]
top_mlp = [64, 1]
[train]
batch_size = 256
progress = false
[output]
dir = "run"
"#
        ),
    )
    .unwrap();
    job
}

fn summary(dir: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("run/summary.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn train_beats_trivial_predictor_and_eval_reproduces_it() {
    let tmp = tempfile::tempdir().unwrap();
    gen(&tmp.path().join("data"), 60_000, 3);
    let job = write_job(tmp.path(), "");
    let stdout = ok(&elastrec(&["train", job.to_str().unwrap()]));
    assert!(stdout.contains("eval AUC"), "{stdout}");

    let s = summary(tmp.path());
    let auc = s["eval"]["auc"].as_f64().unwrap();
    let logloss = s["eval"]["logloss"].as_f64().unwrap();
    assert_eq!(s["samples"].as_u64().unwrap(), 40_000);
    assert_eq!(s["eval"]["samples"].as_u64().unwrap(), 20_000);
    // A constant predictor has AUC 0.5 and at best the label entropy as log loss.
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(tmp.path().join("data/report.json")).unwrap(),
    )
    .unwrap();
    let p = report["click_rate"].as_f64().unwrap();
    let entropy = -(p * p.ln() + (1.0 - p) * (1.0 - p).ln());
    assert!(
        auc > 0.6,
        "AUC {auc} does not beat a trivial predictor clearly"
    );
    assert!(
        logloss < entropy,
        "logloss {logloss} not below the constant predictor's {entropy}"
    );
    assert!(auc < report["teacher_auc"].as_f64().unwrap() + 0.01);

    // The saved model evaluates to the same figures on the same file.
    let model = tmp.path().join("run/model.bin");
    let data = tmp.path().join("data/day_2.tsv");
    let out = ok(&elastrec(&[
        "eval",
        "--model",
        model.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--json",
    ]));
    let e: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!((e["auc"].as_f64().unwrap() - auc).abs() < 1e-9);
    assert!((e["logloss"].as_f64().unwrap() - logloss).abs() < 1e-9);

    // A corrupted model file is refused, not evaluated.
    let mut bytes = std::fs::read(&model).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&model, bytes).unwrap();
    let out = elastrec(&[
        "eval",
        "--model",
        model.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("checksum mismatch"));
}

/// `elastrec plot` of a `train` run draws its loss and AUC over the samples trained, with
/// labelled axes and tick labels as a person writes numbers.
#[test]
fn plot_of_a_train_run_draws_loss_and_auc_over_samples() {
    let tmp = tempfile::tempdir().unwrap();
    gen(&tmp.path().join("data"), 30_000, 3);
    let job = tmp.path().join("job.toml");
    std::fs::write(
        &job,
        "[data]\ndir = \"data\"\ntrain = [\"day_0.tsv\", \"day_1.tsv\"]\n\
         eval = [\"day_2.tsv\"]\n[model]\nbottom_mlp = [32, 16]\ntop_mlp = [16, 1]\n\
         [train]\nbatch_size = 256\nepochs = 2\neval_every = 5000\nprogress = false\n\
         [output]\ndir = \"run\"\n",
    )
    .unwrap();
    ok(&elastrec(&["train", job.to_str().unwrap()]));
    let charts = tmp.path().join("charts");
    let out = ok(&elastrec(&[
        "plot",
        tmp.path().join("run").to_str().unwrap(),
        "--out",
        charts.to_str().unwrap(),
    ]));
    for name in ["train-loss", "train-auc"] {
        assert!(out.contains(&format!("{name}.png")), "{out}");
        let png = std::fs::read(charts.join(format!("{name}.png"))).unwrap();
        assert!(png.starts_with(b"\x89PNG"), "{name}.png is a PNG");
        let svg = std::fs::read_to_string(charts.join(format!("{name}.svg"))).unwrap();
        assert!(
            svg.contains("samples trained"),
            "{name}: the x axis says what it counts"
        );
        // Ticks of tens of thousands of samples are grouped, never float noise.
        // The SVG's text contents: its lines that are not markup.
        let texts: Vec<&str> = svg
            .lines()
            .map(str::trim)
            .filter(|l| !l.starts_with('<'))
            .collect();
        assert!(texts.contains(&"10,000"), "{name}: grouped ticks");
        assert!(
            !texts
                .iter()
                .any(|t| t.ends_with(".0") || t.contains("000000")),
            "{name}: float noise in a tick"
        );
    }
    let auc = std::fs::read_to_string(charts.join("train-auc.svg")).unwrap();
    assert!(auc.lines().any(|l| l.trim() == "AUC"), "the y axis");
}

#[test]
fn bad_rows_fail_with_location_or_are_skipped_and_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    gen(&data, 3_000, 3);
    // Corrupt line 5 of day_1: a categorical value that is not 8 hex digits.
    let day1 = data.join("day_1.tsv");
    let text = std::fs::read_to_string(&day1).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let mut fields: Vec<&str> = lines[4].split('\t').collect();
    fields[20] = "zz12";
    lines[4] = fields.join("\t");
    std::fs::write(&day1, lines.join("\n") + "\n").unwrap();
    let _ = std::fs::remove_file(data.join("day_1.tsv.idx"));

    let job = write_job(tmp.path(), "");
    let out = elastrec(&["train", job.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("day_1.tsv:5: field 20"), "{err}");

    let job = write_job(tmp.path(), "on_bad_row = \"skip\"");
    ok(&elastrec(&["train", job.to_str().unwrap()]));
    let s = summary(tmp.path());
    assert_eq!(s["rows_skipped"].as_u64().unwrap(), 1);
    assert_eq!(s["samples"].as_u64().unwrap(), 1_999);
}

/// A Parquet file with a run of bytes inverted inside its column data (the decoders panic
/// on some such pages): `train` fails with an error that names the file, not a panic.
#[test]
fn a_corrupt_parquet_file_is_named_not_a_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    ok(&elastrec(&[
        "gen-data",
        "--out",
        data.to_str().unwrap(),
        "--rows",
        "3000",
        "--days",
        "3",
        "--scale",
        "0.001",
        "--seed",
        "3",
        "--format",
        "parquet",
    ]));
    let day1 = data.join("day_1.parquet");
    let mut bytes = std::fs::read(&day1).unwrap();
    let mid = bytes.len() / 2;
    for b in &mut bytes[mid..mid + 64] {
        *b = !*b;
    }
    std::fs::write(&day1, bytes).unwrap();
    let job = write_job(tmp.path(), "");
    let text = std::fs::read_to_string(&job)
        .unwrap()
        .replace(".tsv", ".parquet");
    std::fs::write(&job, text).unwrap();
    let out = elastrec(&["train", job.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("day_1.parquet"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bad_job_files_are_rejected_naming_the_field() {
    let tmp = tempfile::tempdir().unwrap();
    let job = tmp.path().join("job.toml");
    for (text, needle) in [
        ("[train]\nbatch_sise = 10\n", "batch_sise"),
        ("[train]\nbatch_size = 0\n", "train.batch_size"),
        ("[model]\nembedding_dim = 8\n", "model.bottom_mlp"),
        (
            "[optimizer.dense]\ntype = \"adagrad\"\nlr = -1.0\n",
            "optimizer.dense.lr",
        ),
    ] {
        std::fs::write(&job, text).unwrap();
        let out = elastrec(&["train", job.to_str().unwrap()]);
        assert!(!out.status.success(), "{text} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{text}: {err}");
    }
    // A missing data directory without [data.generate] says what to do.
    std::fs::write(&job, "[data]\ndir = \"nowhere\"\n").unwrap();
    let out = elastrec(&["train", job.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("data file not found"));
    // Training hygiene a job cannot have: `run` refuses it instead of ignoring it,
    // before it starts anything. An online job trains its stream in arrival order.
    gen(&tmp.path().join("data"), 3_000, 3);
    let job = write_job(tmp.path(), "");
    let text = std::fs::read_to_string(&job).unwrap().replace(
        "batch_size = 256",
        "batch_size = 256\nshuffle_buffer = 1000",
    );
    std::fs::write(&job, format!("{text}\n[stream]\ntopics = [\"clicks\"]\n")).unwrap();
    let out = elastrec(&["run", job.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("train.shuffle_buffer") && err.contains("arrival order"),
        "{err}"
    );
    assert!(!tmp.path().join("run/master.db").exists());
}

/// `replay --format json` sends a named log's features, so it needs the job file that
/// names them; what is missing is said before any broker is reached.
#[test]
fn replay_as_json_needs_the_job_file_naming_the_features() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log.csv");
    std::fs::write(&log, "click,user,item\n1,7,a\n0,8,b\n").unwrap();
    let replay = |extra: &[&str]| {
        let mut args = vec![
            "replay",
            "--to",
            "kafka://127.0.0.1:9/clicks",
            "--qps",
            "10",
            "--data",
            log.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let out = elastrec(&args);
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = replay(&["--format", "json"]);
    assert!(err.contains("--job JOB.toml"), "{err}");
    let job = dir.path().join("job.toml");
    // A Criteo-layout job: no label column, no named features.
    std::fs::write(&job, "[data]\ndir = \".\"\ntrain = [\"log.csv\"]\n").unwrap();
    let err = replay(&["--format", "json", "--job", job.to_str().unwrap()]);
    assert!(err.contains("job.toml: names no data.label"), "{err}");
    let err = replay(&["--job", job.to_str().unwrap()]);
    assert!(err.contains("--job goes with --format json"), "{err}");
}

#[test]
fn every_subcommand_has_help() {
    for sub in ["train", "gen-data", "eval", "bench", "export"] {
        let out = ok(&elastrec(&[sub, "--help"]));
        assert!(out.contains("Usage"), "{sub}: {out}");
    }
}

/// The README's first command, on its own data: the trained model must reach 95% of the
/// AUC lift of the generator's hidden teacher (the best any model can do on this data).
#[test]
fn quickstart_reaches_95_percent_of_teacher_lift() {
    let tmp = tempfile::tempdir().unwrap();
    let examples = tmp.path().join("examples");
    std::fs::create_dir_all(&examples).unwrap();
    let job = examples.join("quickstart.toml");
    std::fs::copy(manifest_dir().join("../../examples/quickstart.toml"), &job).unwrap();
    ok(&elastrec(&["train", job.to_str().unwrap()]));
    let text = std::fs::read_to_string(tmp.path().join("runs/quickstart/summary.json")).unwrap();
    let s: serde_json::Value = serde_json::from_str(&text).unwrap();
    let auc = s["eval"]["auc"].as_f64().unwrap();
    let teacher = s["teacher_auc"].as_f64().unwrap();
    let target = 0.95 * (teacher - 0.5) + 0.5;
    assert!(
        auc >= target,
        "quickstart AUC {auc:.4} below 95% of the teacher's lift ({target:.4}; teacher {teacher:.4})"
    );
}

/// `elastrec brain plan` prints a plan inside the job's bounds, with its reasons.
#[test]
fn brain_plan_stays_within_the_job_bounds() {
    let job = manifest_dir().join("../brain/tests/data/job.toml");
    let out = ok(&elastrec(&[
        "brain",
        "plan",
        "--job",
        job.to_str().unwrap(),
        "--json",
    ]));
    let plan: serde_json::Value = serde_json::from_str(&out).unwrap();
    let spec: toml::Value = toml::from_str(&std::fs::read_to_string(&job).unwrap()).unwrap();
    let bounds = &spec["job"]["bounds"];
    for (key, bound) in [("workers", "workers"), ("ps", "ps")] {
        let v = plan["allocation"][key].as_f64().unwrap();
        let lo = bounds[bound][0].as_integer().unwrap() as f64;
        let hi = bounds[bound][1].as_integer().unwrap() as f64;
        assert!(lo <= v && v <= hi, "{key} = {v} outside [{lo}, {hi}]");
    }
    assert!(plan["predicted_throughput"].as_f64().unwrap() > 0.0);
    assert!(!plan["reasons"].as_array().unwrap().is_empty());

    let table = ok(&elastrec(&[
        "brain",
        "plan",
        "--job",
        job.to_str().unwrap(),
    ]));
    assert!(
        table.contains("workers") && table.contains("reasons"),
        "{table}"
    );
}

/// `elastrec brain plan` reads the job file a user runs (its `[autoscale]` bounds and
/// requested size, its tables and samples from the data), as the job's master plans at
/// start; an online job, which follows its traffic, is refused by name.
#[test]
fn brain_plan_reads_the_job_file_users_run() {
    let tmp = tempfile::tempdir().unwrap();
    let job = tmp.path().join("job.toml");
    let text = "[data]\ndir = \"data\"\ntrain = [\"day_0.tsv\"]\neval = [\"day_1.tsv\"]\n\
        [data.generate]\nrows = 4000\ndays = 2\nseed = 3\n\
        [model]\nbottom_mlp = [16, 16]\ntop_mlp = [16, 1]\nmax_table_rows = 500\n\
        [cluster]\nps = 1\nworkers = 2\n\
        [autoscale]\nenabled = true\nworkers = [2, 3]\nps = [1, 1]\ncluster_cpu = 8\nworker_cpu = 3\n";
    std::fs::write(&job, text).unwrap();
    let out = ok(&elastrec(&[
        "brain",
        "plan",
        "--job",
        job.to_str().unwrap(),
        "--json",
    ]));
    let plan: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(plan["job_id"], "job");
    let workers = plan["allocation"]["workers"].as_f64().unwrap();
    assert!((2.0..=3.0).contains(&workers), "{workers} workers: {plan}");
    assert_eq!(plan["allocation"]["ps"].as_f64(), Some(1.0), "{plan}");
    assert_eq!(
        plan["allocation"]["worker_cpu"].as_f64(),
        Some(3.0),
        "{plan}"
    );
    // A PS's memory is sized from the job's own tables (26 of at most 500 rows), not the
    // 2 GiB floor a brain job description defaults to.
    let ps_mem = plan["allocation"]["ps_mem_gb"].as_f64().unwrap();
    assert!(ps_mem > 0.0 && ps_mem < 2.0, "{ps_mem} GiB per PS: {plan}");
    assert!(
        tmp.path().join("data/day_0.tsv").exists(),
        "the data is generated as run does"
    );

    let online = tmp.path().join("online.toml");
    let text = text.replace("train = [\"day_0.tsv\"]\n", "");
    // (An online job that sets [autoscale] is refused when it loads, for any command.)
    let text = &text[..text.find("[autoscale]").unwrap()];
    std::fs::write(
        &online,
        format!("{text}[stream]\nbrokers = \"127.0.0.1:9\"\ntopics = [\"clicks\"]\n"),
    )
    .unwrap();
    let out = elastrec(&["brain", "plan", "--job", online.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("online.toml") && err.contains("an online job"),
        "{err}"
    );
}

/// The brain service refuses to start without a shared token.
#[test]
fn brain_service_requires_a_token() {
    let out = Command::new(env!("CARGO_BIN_EXE_elastrec"))
        .args(["brain", "--db", "sqlite::memory:"])
        .env_remove("ELASTREC_BRAIN_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--token"));
}

/// The brain serves `/metrics` where `--metrics-addr` says and prints the address (the
/// port is chosen by the OS): the endpoint answers with an OpenMetrics exposition.
#[test]
fn brain_prints_and_serves_its_metrics_endpoint() {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_elastrec"))
        .args([
            "brain",
            "--db",
            "sqlite::memory:",
            "--listen",
            "127.0.0.1:0",
        ])
        .args(["--metrics-addr", "127.0.0.1:0"])
        .env("ELASTREC_BRAIN_TOKEN", "brainmetricstesttoken")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(rest) = line.strip_prefix("brain metrics on http://") {
                let _ = tx.send(rest.trim_end_matches("/metrics").to_string());
            }
        }
    });
    let addr = rx.recv_timeout(std::time::Duration::from_secs(60));
    let got = addr
        .as_deref()
        .map(|a| elastrec_metrics::http_get(a, "/metrics", None));
    let _ = child.kill();
    let _ = child.wait();
    let (status, body) = got.expect("the brain printed its metrics address").unwrap();
    assert_eq!(status, 200, "{body}");
    // Counters by method appear with the first request; before it, a valid empty exposition.
    elastrec_metrics::parse_exposition(&body).unwrap();
    assert!(body.trim_end().ends_with("# EOF"), "{body}");
}

/// `elastrec simulate cpr` on a small job: the side-by-side table on stdout, the JSON
/// report on disk, the same failures for every strategy.
#[test]
fn simulate_cpr_prints_the_table_and_writes_the_report() {
    let tmp = tempfile::tempdir().unwrap();
    gen(&tmp.path().join("data"), 3_000, 3);
    let job = write_job(tmp.path(), "");
    let report = tmp.path().join("out").join("cpr.json");
    let help = ok(&elastrec(&["simulate", "cpr", "--help"]));
    assert!(
        help.contains("--target-pls") && help.contains("--n-emb"),
        "{help}"
    );
    let out = ok(&elastrec(&[
        "simulate",
        "cpr",
        "--job",
        job.to_str().unwrap(),
        "--failures",
        "2",
        "--strategies",
        "full,cpr-vanilla",
        "--out",
        report.to_str().unwrap(),
        "--no-progress",
    ]));
    assert!(out.contains("| full recovery | full |"), "{out}");
    assert!(out.contains("| CPR-vanilla |"), "{out}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    assert_eq!(results[0]["strategy"], "no-failures");
    for r in &results[1..] {
        assert_eq!(r["failures"], 2, "{r}");
    }
    let bad = elastrec(&["simulate", "cpr", "--strategies", "scar"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("cpr-ssu"));
}

/// A job directory whose token file was damaged: `status` and `scale` say which file is
/// corrupt instead of panicking.
#[test]
fn a_corrupt_token_file_is_named_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("master.addr"), "127.0.0.1:1").unwrap();
    std::fs::write(dir.path().join("token"), "not a\ntoken\u{0}").unwrap();
    let d = dir.path().to_str().unwrap();
    for args in [vec!["status", d], vec!["scale", d, "--workers", "2"]] {
        let out = elastrec(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(
            err.contains("token") && err.contains("corrupt"),
            "{args:?}: {err}"
        );
    }
}

/// Every job file in `examples/` is valid (typos in a key or a range fail here, not in a
/// user's first run).
#[test]
fn every_example_job_file_is_valid() {
    let dir = manifest_dir().join("../../examples");
    let mut seen = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            let out = elastrec(&["train", "--print-config", p.to_str().unwrap()]);
            assert!(
                out.status.success(),
                "{}: {}",
                p.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            seen += 1;
        }
    }
    assert!(
        seen >= 3,
        "found {seen} example job files in {}",
        dir.display()
    );
}

/// This crate's directory, read when the test runs (cargo sets it): a path compiled in
/// with `env!` would name wherever the binary was first built, which a shared target
/// directory may have reused from another checkout.
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .expect("run the tests with cargo test")
        .into()
}

/// A stand-in for the PyTorch reference's interpreter. With `SPIN_PIDFILE` set it starts a
/// CPU spinner it never waits for (load that is not the bench's own) and lets it burn
/// inside the round; it always reports 1,000 samples/s.
const FAKE_PYTHON: &str = r#"#!/bin/sh
if [ -n "$SPIN_PIDFILE" ]; then
  nohup sh -c 'while :; do :; done' >/dev/null 2>&1 &
  echo $! >> "$SPIN_PIDFILE"
  i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done
fi
cpus=$(awk '/^Cpus_allowed_list/ {print $2}' /proc/self/status)
echo "{\"samples_per_s\": 1000.0, \"cpus\": \"$cpus\"}"
"#;

/// Kills the spinners a fake reference started, even when an assertion fails.
struct Spinners(PathBuf);

impl Drop for Spinners {
    fn drop(&mut self) {
        for pid in std::fs::read_to_string(&self.0).unwrap_or_default().lines() {
            if let Ok(pid) = pid.trim().parse::<i32>() {
                // SAFETY: kill(2) of a spinner this test started.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
    }
}

/// `elastrec bench sequence` times DIN and the transformer on the same histories, and
/// with `--pytorch` puts each beside the reference's samples/s (a stand-in Python here:
/// torch is not installed by the test command): the ratio is ours over theirs.
#[test]
fn the_sequence_bench_reports_each_layer_beside_the_reference() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let python = tmp.path().join("python");
    std::fs::write(
        &python,
        "#!/bin/sh\necho '{\"samples_per_s\": 1000.0, \"candidate_only_samples_per_s\": 500.0, \"torch\": \"stand-in\"}'\n",
    )
    .unwrap();
    std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = ok(&Command::new(env!("CARGO_BIN_EXE_elastrec"))
        .args(["bench", "sequence", "--batch-size", "64", "--len", "10"])
        .args(["--steps", "2", "--rounds", "1", "--max-foreign-load", "1.0"])
        .args(["--json", "--pytorch"])
        .arg(&python)
        .output()
        .unwrap());
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["torch_version"], "stand-in", "{r}");
    let summary = r["summary"].as_array().unwrap();
    let layers: Vec<&str> = summary
        .iter()
        .map(|s| s["layer"].as_str().unwrap())
        .collect();
    assert_eq!(layers, ["din", "transformer"]);
    for s in summary {
        let ours = s["elastrec"].as_f64().unwrap();
        assert!(ours > 0.0, "{r}");
        let ratio = s["ratio"].as_f64().unwrap();
        assert!((ratio - ours / 1000.0).abs() < 1e-9 * ratio, "{r}");
    }
    let cand = summary[1]["ratio_candidate_only"].as_f64().unwrap();
    assert!((cand - summary[1]["elastrec"].as_f64().unwrap() / 500.0).abs() < 1e-9 * cand);
}

/// `elastrec bench bags` times every pooling and mean length asked for, and with
/// `--pytorch` puts each beside the reference's samples/s (a stand-in Python here): the
/// ratio is ours over theirs.
#[test]
fn the_bag_bench_reports_each_pooling_and_length_beside_the_reference() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let python = tmp.path().join("python");
    std::fs::write(
        &python,
        "#!/bin/sh\necho '{\"samples_per_s\": 1000.0, \"torch\": \"stand-in\"}'\n",
    )
    .unwrap();
    std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = ok(&Command::new(env!("CARGO_BIN_EXE_elastrec"))
        .args(["bench", "bags", "--batch-size", "64", "--rows", "1000"])
        .args(["--lengths", "1,5", "--steps", "2", "--rounds", "1"])
        .args(["--max-foreign-load", "1.0", "--json", "--pytorch"])
        .arg(&python)
        .output()
        .unwrap());
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    let summary = r["summary"].as_array().unwrap();
    let cases: Vec<&str> = summary
        .iter()
        .map(|s| s["case"].as_str().unwrap())
        .collect();
    assert_eq!(cases, ["sum/1", "sum/5", "mean/1", "mean/5"]);
    for s in summary {
        let ours = s["elastrec"].as_f64().unwrap();
        assert!(ours > 0.0, "{r}");
        let ratio = s["ratio"].as_f64().unwrap();
        assert!((ratio - ours / 1000.0).abs() < 1e-9 * ratio, "{r}");
    }
    let err = Command::new(env!("CARGO_BIN_EXE_elastrec"))
        .args(["bench", "bags", "--poolings", "max"])
        .output()
        .unwrap();
    assert!(!err.status.success());
    assert!(
        String::from_utf8_lossy(&err.stderr).contains("\"max\" is not sum or mean"),
        "{}",
        String::from_utf8_lossy(&err.stderr)
    );
}

/// `elastrec bench --pytorch` judges every round by the CPU other processes used: a ratio
/// comes only from quiet rounds, and a run whose rounds were all disturbed reports none
/// and fails, saying why.
#[test]
fn bench_reports_a_ratio_only_from_rounds_nothing_else_disturbed() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let python = tmp.path().join("python");
    std::fs::write(&python, FAKE_PYTHON).unwrap();
    std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = tmp.path().join("data");
    let bench = |max_load: &str, env: &[(&str, &Path)]| {
        Command::new(env!("CARGO_BIN_EXE_elastrec"))
            .args([
                "bench",
                "--steps",
                "3",
                "--batch-size",
                "64",
                "--threads",
                "1",
            ])
            .args([
                "--max-table-rows",
                "1000",
                "--rounds",
                "2",
                "--max-repeats",
                "1",
            ])
            .args(["--max-foreign-load", max_load, "--json", "--data-dir"])
            .arg(&data)
            .arg("--pytorch")
            .arg(&python)
            .envs(env.iter().copied())
            .output()
            .unwrap()
    };
    // Every round counts as quiet: the ratio is ours over the stand-in's 1,000/s.
    let r: serde_json::Value = serde_json::from_str(&ok(&bench("1.0", &[]))).unwrap();
    let rounds = r["full_step_rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 2, "{r}");
    assert!(rounds.iter().all(|x| x["quiet"] == true), "{r}");
    let ratio = r["ratio_full_vs_pytorch"].as_f64().unwrap();
    assert!(rounds.iter().any(|x| x["ratio"] == ratio), "{r}");
    // One thread: both sides confined to the same one CPU (the reference inherits it),
    // and the report names the CPU and the GEMM kernels picked for it.
    let machine = &r["machine"];
    let cpus = machine["cpus"].as_str().unwrap();
    assert!(cpus.parse::<usize>().is_ok(), "one CPU: {machine}");
    assert_eq!(r["pytorch_full"]["cpus"], cpus, "{r}");
    assert!(machine["cpu"]["model"].as_str().is_some(), "{machine}");
    assert!(
        machine["cpu"]["gemm_kernels"].as_str().is_some(),
        "{machine}"
    );

    // A spinner outside the bench's process tree burns a core in every round.
    let pids = tmp.path().join("spinners");
    let _spinners = Spinners(pids.clone());
    let out = bench("0.05", &[("SPIN_PIDFILE", &pids)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a disturbed run reported success: {err}"
    );
    assert!(err.contains("not reported"), "{err}");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rounds = r["full_step_rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 2, "one round and one repeat: {r}");
    for x in rounds {
        assert_eq!(x["quiet"], false, "{r}");
        assert!(x["foreign_load"].as_f64().unwrap() > 0.05, "{r}");
    }
    assert!(r["ratio_full_vs_pytorch"].is_null(), "{r}");
}

/// The container image's runtime stage is `debian:bookworm-slim` with the binary copied
/// in (`Dockerfile`): the binary must start there, so it may link only the C runtime that
/// every Debian has (no libssl, libcurl, libsasl, libzstd or libstdc++ of a build
/// machine), and it must run with an empty environment.
#[test]
fn the_binary_runs_in_the_container_images_slim_runtime() {
    let exe = env!("CARGO_BIN_EXE_elastrec");
    let ldd = std::process::Command::new("ldd").arg(exe).output().unwrap();
    let linked = String::from_utf8_lossy(&ldd.stdout);
    let base = [
        "linux-vdso",
        "libc.so",
        "libm.so",
        "libgcc_s.so",
        "libpthread.so",
        "libdl.so",
        "librt.so",
        "ld-linux",
    ];
    for line in linked.lines().map(str::trim).filter(|l| !l.is_empty()) {
        assert!(
            base.iter().any(|b| line.contains(b)),
            "the binary links a library the slim image lacks: {line}\n{linked}"
        );
    }
    let out = std::process::Command::new(exe)
        .arg("--version")
        .env_clear()
        .current_dir("/")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("elastrec "));

    let dockerfile =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../Dockerfile")).unwrap();
    let runtime = dockerfile
        .split("FROM debian:bookworm-slim AS runtime")
        .nth(1)
        .expect("a runtime stage on debian:bookworm-slim");
    assert!(runtime.contains("COPY --from=build /elastrec /usr/local/bin/elastrec"));
    assert!(runtime.contains("USER 10001"), "runs as a non-root user");
}

/// Sample weights (`data.weight`) on a CSV log. A weight column of ones trains exactly
/// the model the log trains without it. On a log whose rows of one user in five were
/// corrupted (their label set to 1), giving those rows weight 0 trains as well as
/// leaving them out of the log, measured on clean data, where the same corrupted log
/// without weights loses AUC. Batch sizes are pinned (left to the job, they follow the
/// training rows, which leaving rows out changes) so that both make the same steps.
#[test]
fn a_weight_column_of_zeros_leaves_corrupted_rows_out_and_ones_change_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let clean = tmp.path().join("clean");
    gen_named_csv(&clean, 90000, 3);
    // A job on the copy in `data` (with `extra` sections), writing to `run-<name>`.
    let job = |name: &str, data: &str, weights: bool, batch: usize, extra: &str| {
        let weight = if weights { "weight = \"w\"\n" } else { "" };
        let text = format!(
            "[data]\ndir = \"{data}\"\ntrain = [\"day_0.csv\", \"day_1.csv\"]\n\
             eval = [\"day_2.csv\"]\nlabel = \"click\"\n{weight}[train]\nprogress = false\n\
             batch_size = {batch}\n[output]\ndir = \"run-{name}\"\n{extra}"
        );
        let path = tmp.path().join(format!("{name}.toml"));
        std::fs::write(&path, text).unwrap();
        path
    };
    // One copy of the log per variant: `weights` adds the column `w`, `corrupt` sets
    // the label of one user in five to 1 (weight 0). Eval data is never corrupted.
    let variant = |name: &str, weights: bool, corrupt: bool, drop: bool, batch: usize| {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for day in 0..3 {
            let text = std::fs::read_to_string(clean.join(format!("day_{day}.csv"))).unwrap();
            let mut out = String::new();
            for (i, line) in text.lines().enumerate() {
                let (mut label, rest) = line.split_once(',').unwrap();
                let user = rest.split(',').next().unwrap();
                let bad = i > 0 && day < 2 && user.ends_with(['0', '5']);
                if bad && drop {
                    continue;
                }
                let bad = bad && corrupt;
                if bad {
                    label = "1";
                }
                let w = match (i, bad) {
                    (0, _) => ",w",
                    (_, true) => ",0",
                    (_, false) => ",1",
                };
                out += &format!("{label},{rest}{}\n", if weights { w } else { "" });
            }
            std::fs::write(dir.join(format!("day_{day}.csv")), out).unwrap();
        }
        let path = job(name, name, weights, batch, "");
        ok(&elastrec(&["train", path.to_str().unwrap()]));
        let summary: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(tmp.path().join(format!("run-{name}/summary.json"))).unwrap(),
        )
        .unwrap();
        summary["eval"]["auc"].as_f64().unwrap()
    };
    let plain = variant("plain", false, false, false, 512);
    let ones = variant("ones", true, false, false, 512);
    assert_eq!(ones, plain, "a weight of 1 everywhere changed the model");
    // A fifth of the rows weigh 0: a batch of 640 rows holds about the 512 rows a step
    // of the log without them takes, in the same order.
    let corrupted = variant("corrupted", false, true, false, 640);
    let weighted = variant("weighted", true, true, false, 640);
    let dropped = variant("dropped", false, false, true, 512);
    eprintln!(
        "eval AUC: clean {plain:.4}, corrupted {corrupted:.4}, corrupted rows weighted 0 \
         {weighted:.4}, those rows left out {dropped:.4}"
    );
    assert!(
        weighted > corrupted + 0.015,
        "weights did not leave the corrupted rows out: {weighted:.4} against {corrupted:.4}"
    );
    assert!(
        (weighted - dropped).abs() < 0.004,
        "weighted {weighted:.4} against {dropped:.4} without those rows"
    );
    // The same weighted job on two parameter servers: its shards come in another order,
    // which moves this small model's AUC by up to 0.02 (0.570-0.585 over batch sizes of
    // 512 to 800, where the log without the corrupted rows gives 0.586-0.587), so it is
    // held to what weights are for: far above the corrupted log's model.
    let path = job(
        "weighted-run",
        "weighted",
        true,
        640,
        "[cluster]\nps = 2\nworkers = 1\n[checkpoint]\nenabled = false\n",
    );
    ok(&elastrec(&["run", path.to_str().unwrap()]));
    let result: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(tmp.path().join("run-weighted-run/result.json")).unwrap(),
    )
    .unwrap();
    let run = result["eval"]["auc"].as_f64().unwrap();
    assert_eq!(result["ledger"]["duplicated"], 0, "{result}");
    assert_eq!(result["ledger"]["missing"], 0, "{result}");
    assert!(
        run > corrupted + 0.01,
        "`run` on 2 PS {run:.4} against the corrupted log's {corrupted:.4}"
    );
}

/// The figures CTR teams report, weighted by `data.weight`: `eval` (and `train`'s
/// summary) give the AUC, log loss, normalized entropy, calibration and GAUC (over the
/// `user_id` column, found by inference) that scikit-learn computes from the
/// predictions `eval --predictions` writes, with the same sample weights.
#[test]
fn eval_figures_with_sample_weights_match_scikit_learn() {
    if !elastrec_common::skip::python_imports("SKLEARN", "sklearn") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let gen = tmp.path().join("gen");
    gen_named_csv(&gen, 20000, 2);
    // Weights 0, 0.5, ..., 2.5 by row, and a heavier weight on clicks of odd rows, so the
    // weighted figures differ from the plain ones.
    let data = tmp.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    for day in 0..2 {
        let text = std::fs::read_to_string(gen.join(format!("day_{day}.csv"))).unwrap();
        let mut out = String::new();
        for (i, line) in text.lines().enumerate() {
            let w = if i == 0 {
                "w".to_string()
            } else if line.starts_with('1') && i % 2 == 1 {
                "4".to_string()
            } else {
                format!("{}", (i % 6) as f32 / 2.0)
            };
            out += &format!("{line},{w}\n");
        }
        std::fs::write(data.join(format!("day_{day}.csv")), out).unwrap();
    }
    let job = tmp.path().join("job.toml");
    std::fs::write(
        &job,
        format!(
            "[data]\ndir = \"{}\"\ntrain = [\"day_0.csv\"]\neval = [\"day_1.csv\"]\n\
             label = \"click\"\nweight = \"w\"\n[train]\nprogress = false\n\
             [output]\ndir = \"{}\"\n",
            data.display(),
            tmp.path().join("run").display()
        ),
    )
    .unwrap();
    ok(&elastrec(&["train", job.to_str().unwrap()]));
    let predictions = tmp.path().join("predictions.csv");
    let got: serde_json::Value = serde_json::from_str(&ok(&elastrec(&[
        "eval",
        "--model",
        tmp.path().join("run/model.bin").to_str().unwrap(),
        "--data",
        data.join("day_1.csv").to_str().unwrap(),
        "--json",
        "--predictions",
        predictions.to_str().unwrap(),
    ])))
    .unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/eval_metrics.py");
    let want: serde_json::Value = serde_json::from_str(&ok(&Command::new("python3")
        .args([script, predictions.to_str().unwrap()])
        .output()
        .unwrap()))
    .unwrap();
    eprintln!("elastrec eval: {got}\nscikit-learn: {want}");
    assert_eq!(got["samples"], want["rows"]);
    for figure in ["auc", "logloss", "ne", "calibration", "gauc"] {
        let (g, w) = (
            got[figure].as_f64().unwrap(),
            want[figure].as_f64().unwrap(),
        );
        assert!(
            (g - w).abs() < 1e-6,
            "{figure}: elastrec {g} against scikit-learn {w}"
        );
    }
    // The weights matter: the plain figures of the same predictions differ.
    let plain: Vec<(f64, f64)> = std::fs::read_to_string(&predictions)
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| {
            let v: Vec<f64> = l.split(',').map(|x| x.parse().unwrap()).collect();
            (v[0], v[2])
        })
        .collect();
    let plain_calibration =
        plain.iter().map(|r| r.1).sum::<f64>() / plain.iter().map(|r| r.0).sum::<f64>();
    assert!(
        (plain_calibration - got["calibration"].as_f64().unwrap()).abs() > 0.01,
        "unweighted calibration {plain_calibration} equals the weighted one"
    );
    // `train` reported the same figures for the same model and day.
    let summary: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(tmp.path().join("run/summary.json")).unwrap(),
    )
    .unwrap();
    for figure in ["auc", "logloss", "ne", "calibration", "gauc"] {
        let (s, g) = (
            summary["eval"][figure].as_f64().unwrap(),
            got[figure].as_f64().unwrap(),
        );
        assert!((s - g).abs() < 1e-9, "{figure}: train {s}, eval {g}");
    }
}

/// The same log as CSV files with a header (one gzip-compressed) trains as its Parquet
/// twin does: the same inferred features, the same keys, an AUC within 0.002, and
/// `eval` of the model on the CSV day gives the job's own AUC.
#[test]
fn a_csv_log_with_a_header_trains_like_its_parquet_twin() {
    let tmp = tempfile::tempdir().unwrap();
    let gen = |format: &str| {
        let dir = tmp.path().join(format);
        ok(&elastrec(&[
            "gen-data",
            "--named",
            "--format",
            format,
            "--out",
            dir.to_str().unwrap(),
            "--rows",
            "20000",
            "--days",
            "3",
        ]));
        dir
    };
    gen("parquet");
    let csv = gen("csv");
    let day1 = std::fs::read(csv.join("day_1.csv")).unwrap();
    let mut gz = flate2::write::GzEncoder::new(
        std::fs::File::create(csv.join("day_1.csv.gz")).unwrap(),
        flate2::Compression::fast(),
    );
    std::io::Write::write_all(&mut gz, &day1).unwrap();
    gz.finish().unwrap();
    let train = |dir: &str, ext: &str, day1: &str| {
        let job = tmp.path().join(format!("{dir}.toml"));
        std::fs::write(
            &job,
            format!(
                "[data]\ndir = \"{dir}\"\ntrain = [\"day_0.{ext}\", \"{day1}\"]\n\
                 eval = [\"day_2.{ext}\"]\nlabel = \"click\"\n[train]\nprogress = false\n\
                 [output]\ndir = \"run-{dir}\"\n"
            ),
        )
        .unwrap();
        let printed = ok(&elastrec(&[
            "train",
            "--print-config",
            job.to_str().unwrap(),
        ]));
        ok(&elastrec(&["train", job.to_str().unwrap()]));
        let s: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(tmp.path().join(format!("run-{dir}/summary.json"))).unwrap(),
        )
        .unwrap();
        let features: Vec<&str> = printed
            .lines()
            .filter(|l| l.starts_with("name = ") || l.starts_with("kind = "))
            .collect();
        (s["eval"]["auc"].as_f64().unwrap(), features.join(" "))
    };
    let (want, want_features) = train("parquet", "parquet", "day_1.parquet");
    let (got, got_features) = train("csv", "csv", "day_1.csv.gz");
    assert_eq!(got_features, want_features, "one log, one inferred schema");
    assert!(
        (got - want).abs() <= 0.002,
        "CSV AUC {got:.4} against Parquet {want:.4}"
    );
    let model = tmp.path().join("run-csv/model.bin");
    let e = eval_auc(&model, &csv.join("day_2.csv"));
    assert!((e - got).abs() < 1e-9, "eval {e} against the job's {got}");
}

/// A user's own log: named columns of strings, 64-bit ids, a genre list and a click
/// history. A job naming only the files and the label trains on features inferred from
/// the data, the printed configuration is a job file of them, and the model file carries
/// them to `eval`.
#[test]
fn a_job_naming_only_files_and_label_trains_on_inferred_features() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let out = ok(&elastrec(&[
        "gen-data",
        "--named",
        "--out",
        data.to_str().unwrap(),
        "--rows",
        "30000",
        "--days",
        "3",
    ]));
    assert!(out.contains("teacher AUC"), "{out}");
    let job = tmp.path().join("job.toml");
    std::fs::write(
        &job,
        r#"
[data]
dir = "data"
train = ["day_0.parquet", "day_1.parquet"]
eval = ["day_2.parquet"]
label = "click"
[train]
progress = false
[output]
dir = "run"
"#,
    )
    .unwrap();
    let printed = ok(&elastrec(&[
        "train",
        "--print-config",
        job.to_str().unwrap(),
    ]));
    for want in [
        "name = \"hist_items\"\nkind = \"bag\"\ntable = \"item_id\"",
        "name = \"price\"\nkind = \"dense\"\ntransform = \"log1p\"",
        "name = \"item_id\"\nkind = \"categorical\"",
    ] {
        assert!(printed.contains(want), "{want:?} not in\n{printed}");
    }
    // The printed configuration is a job file that trains the same features.
    let fixed = tmp.path().join("fixed.toml");
    let body: String = printed
        .lines()
        .filter(|l| !l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&fixed, body).unwrap();
    let out = elastrec(&["train", fixed.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = elastrec(&["train", job.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("features inferred"), "{err}");
    let s = summary(tmp.path());
    let auc = s["eval"]["auc"].as_f64().unwrap();
    let logloss = s["eval"]["logloss"].as_f64().unwrap();
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("named-report.json")).unwrap())
            .unwrap();
    let p = report["click_rate"].as_f64().unwrap();
    let entropy = -(p * p.ln() + (1.0 - p) * (1.0 - p).ln());
    assert!(auc > 0.55, "AUC {auc} does not beat a constant clearly");
    assert!(
        logloss < entropy,
        "logloss {logloss} not below a constant's {entropy}"
    );
    let model = tmp.path().join("run/model.bin");
    let e = eval_auc(&model, &data.join("day_2.parquet"));
    assert!((e - auc).abs() < 1e-9, "eval {e} against the job's {auc}");
}

/// `elastrec eval --json` of `model` on `data`: its AUC.
fn eval_auc(model: &Path, data: &Path) -> f64 {
    let out = ok(&elastrec(&[
        "eval",
        "--model",
        model.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--json",
    ]));
    let e: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    e["auc"].as_f64().unwrap()
}
