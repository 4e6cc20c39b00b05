//! Jobs over time-partitioned datasets (`[[data.dataset]]`): hourly partitions written by
//! `gen-data --hourly-from`, windows chosen by date or sliding from `data.now`, trained by
//! `elastrec train` and by a distributed `elastrec run` with an exact ledger; and a job
//! over a list of files too long to count before it starts.

#[path = "../../checkpoint/tests/integration/moto.rs"]
#[allow(dead_code)] // the helper serves several test files
mod moto;

use std::path::Path;
use std::process::{Command, Output};

mod common;

use common::elastrec;

/// The log (stderr) of a run that must have succeeded.
fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "elastrec failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

const ROWS_PER_DAY: u64 = 10_000;

/// `summary.json` of the single-process job `name`.
fn summary(dir: &Path, name: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join(name).join("summary.json")).unwrap())
        .unwrap()
}

/// Four days of hourly partitions, 2026-11-01 to 2026-11-04, under `dir/data`.
fn hourly_data(dir: &Path) {
    let out = elastrec(&[
        "gen-data",
        "--out",
        dir.join("data").to_str().unwrap(),
        "--rows",
        &(4 * ROWS_PER_DAY).to_string(),
        "--days",
        "4",
        "--scale",
        "0.001",
        "--seed",
        "9",
        "--hourly-from",
        "2026-11-01",
    ]);
    ok(&out);
    assert!(dir.join("data/dt=20261104/hour=23/_SUCCESS").exists());
    assert!(!dir.join("data/day_0.tsv").exists());
}

fn job(dir: &Path, name: &str, data: &str, extra: &str) -> std::path::PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            r#"
[data]
{data}
[model]
bottom_mlp = [32, 16]
top_mlp = [32, 1]
table_rows = 4000
[train]
batch_size = 256
progress = false
[output]
dir = "{name}"
{extra}
"#
        ),
    )
    .unwrap();
    path
}

const WINDOW: &str = r#"
[[data.dataset]]
name = "clicks"
path = "data/dt={date}/hour={hour}"
files = "part-*.tsv"
from = "2026-11-01"
to = "2026-11-04"

[[data.dataset]]
name = "holdout"
path = "data/dt={date}/hour={hour}"
from = "2026-11-04"
to = "2026-11-05"
role = "eval"
"#;

#[test]
fn train_reads_exactly_the_window_of_hourly_partitions() {
    let tmp = tempfile::tempdir().unwrap();
    hourly_data(tmp.path());
    let path = job(tmp.path(), "fixed", WINDOW, "");
    let log = ok(&elastrec(&["train", path.to_str().unwrap()]));
    assert!(
        log.contains("dataset `clicks` (train): 72 partitions, 72 files"),
        "{log}"
    );
    assert!(
        log.contains("dataset `holdout` (eval): 24 partitions"),
        "{log}"
    );
    let s = summary(tmp.path(), "fixed");
    assert_eq!(s["samples"].as_u64().unwrap(), 3 * ROWS_PER_DAY, "{s}");
    assert_eq!(s["eval"]["samples"].as_u64().unwrap(), ROWS_PER_DAY, "{s}");
    let auc = s["eval"]["auc"].as_f64().unwrap();
    assert!(auc > 0.6, "AUC {auc}");

    // A sliding window: the two days before the job's `now`.
    let sliding = r#"
now = "2026-11-03T00"
eval = ["dt=20261104/hour=00/part-00000.tsv"]
dir = "data"
[[data.dataset]]
name = "recent"
path = "data/dt={date}/hour={hour}"
last = "2d"
"#;
    job(tmp.path(), "sliding", sliding, "");
    // Named relative to the working directory, as a user types it.
    let log = ok(&Command::new(common::exe())
        .current_dir(tmp.path())
        .args(["train", "sliding.toml"])
        .output()
        .unwrap());
    assert!(
        log.contains("dataset `recent` (train): 48 partitions"),
        "{log}"
    );
    let s = summary(tmp.path(), "sliding");
    assert_eq!(s["samples"].as_u64().unwrap(), 2 * ROWS_PER_DAY, "{s}");
}

#[test]
fn a_distributed_run_over_datasets_keeps_the_ledger_exact() {
    let tmp = tempfile::tempdir().unwrap();
    hourly_data(tmp.path());
    let path = job(
        tmp.path(),
        "dist",
        WINDOW,
        "[cluster]\nps = 1\nworkers = 2\n[checkpoint]\nenabled = false\n",
    );
    let log = ok(&elastrec(&["run", path.to_str().unwrap()]));
    let datasets = common::events(&tmp.path().join("dist"), "dataset");
    assert!(
        datasets.iter().any(|e| e["name"] == "clicks"
            && e["role"] == "Train"
            && e["partitions"] == 72
            && e["files"] == 72),
        "{datasets:?}\n{log}"
    );
    let r: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(tmp.path().join("dist/result.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(r["status"], "finished", "{r}");
    let e = &r["epochs"][0];
    assert_eq!(e["consumed"].as_u64().unwrap(), 3 * ROWS_PER_DAY, "{r}");
    assert_eq!(
        (e["duplicated"].as_u64(), e["missing"].as_u64()),
        (Some(0), Some(0)),
        "{r}"
    );
}

#[test]
fn bad_dataset_definitions_fail_naming_the_dataset_and_field() {
    let tmp = tempfile::tempdir().unwrap();
    hourly_data(tmp.path());
    let cases = [
        (
            "reversed",
            "[[data.dataset]]\nname = \"clicks\"\npath = \"data/dt={date}/hour={hour}\"\nfrom = \"2026-11-04\"\nto = \"2026-11-01\"\n",
            "dataset `clicks`, field `to`",
        ),
        (
            "nothing",
            "[[data.dataset]]\nname = \"clicks\"\npath = \"data/date={date}/hour={hour}\"\nfrom = \"2026-11-01\"\nto = \"2026-11-02\"\n",
            "matches nothing",
        ),
        (
            "both",
            "train = [\"x.tsv\"]\n[[data.dataset]]\nname = \"clicks\"\npath = \"data/dt={date}\"\nlast = \"1d\"\n",
            "field `data.train`",
        ),
        (
            "late",
            "now = \"2026-11-07\"\n[[data.dataset]]\nname = \"clicks\"\npath = \"data/dt={date}/hour={hour}\"\nfrom = \"2026-11-04\"\nto = \"2026-11-06\"\nready_timeout = \"0s\"\n",
            "partition",
        ),
    ];
    // Hour 01 of a second data set drops a column: its TSV rows have 39 fields.
    let good = tmp.path().join("data/dt=20261101/hour=00");
    let narrow = tmp.path().join("narrow/dt=20261101");
    std::fs::create_dir_all(narrow.join("hour=00")).unwrap();
    std::fs::create_dir_all(narrow.join("hour=01")).unwrap();
    for name in ["part-00000.tsv", "_SUCCESS"] {
        std::fs::copy(good.join(name), narrow.join("hour=00").join(name)).unwrap();
    }
    let rows = std::fs::read_to_string(good.join("part-00000.tsv")).unwrap();
    let dropped: String = rows
        .lines()
        .map(|l| l.rsplit_once('\t').unwrap().0.to_string() + "\n")
        .collect();
    std::fs::write(narrow.join("hour=01/part-00000.tsv"), dropped).unwrap();
    std::fs::write(narrow.join("hour=01/_SUCCESS"), b"").unwrap();
    let cases = [
        cases[0],
        cases[1],
        cases[2],
        cases[3],
        (
            "schema",
            "[[data.dataset]]\nname = \"clicks\"\npath = \"narrow/dt={date}/hour={hour}\"\nfrom = \"2026-11-01T00\"\nto = \"2026-11-01T02\"\n",
            "dataset `clicks`, partition `dt=20261101/hour=01`: its schema differs",
        ),
    ];
    let follow = "follow = true\n[[data.dataset]]\nname = \"clicks\"\npath = \"data/dt={date}/hour={hour}\"\nlast = \"1d\"\n";
    let cases = cases.map(|(name, data, says)| (name, data, "", says));
    let follow_cases = [
        // Following trains each partition once, as it lands.
        ("follow_epochs", follow, "epochs = 2\n", "train.epochs"),
        // ... under a master.
        ("follow_train", follow, "", "start it with `elastrec run"),
    ];
    for (name, data, train, says) in cases.into_iter().chain(follow_cases) {
        let path = job(tmp.path(), name, data, "");
        if !train.is_empty() {
            let text = std::fs::read_to_string(&path).unwrap();
            std::fs::write(
                &path,
                text.replace("[train]\n", &format!("[train]\n{train}")),
            )
            .unwrap();
        }
        let out = elastrec(&["train", path.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}: {err}");
        assert!(err.contains(says), "{name}: {err}");
    }
}

/// Uploads files of the local hourly data under `dir/data` to bucket `logs` (created
/// here) on `s3`, at `clicks/<partition>/<name>`: `upload(partition, names)`.
fn s3_uploader(s3: &moto::Moto, dir: &Path) -> impl Fn(&str, &[&str]) {
    use object_store::{aws::AmazonS3Builder, path::Path as Key, ObjectStoreExt, PutPayload};
    s3.create_bucket("logs");
    let mut builder = AmazonS3Builder::new()
        .with_bucket_name("logs")
        .with_endpoint(s3.endpoint())
        .with_allow_http(true)
        .with_region("us-east-1");
    for (key, value) in moto::credentials_env() {
        builder = match key {
            "AWS_ACCESS_KEY_ID" => builder.with_access_key_id(value),
            _ => builder.with_secret_access_key(value),
        };
    }
    let store = builder.build().unwrap();
    let data = dir.join("data");
    move |partition: &str, names: &[&str]| {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            for name in names {
                let bytes = std::fs::read(data.join(partition).join(name)).unwrap();
                let key = Key::from(format!("clicks/{partition}/{name}"));
                store.put(&key, PutPayload::from(bytes)).await.unwrap();
            }
        });
    }
}

/// A following `run` over S3 partitions, with a data executor: the hours that are ready
/// are copied and trained, the job waits for the hour whose marker is missing, and picks
/// it up once the marker is uploaded; the window then closes and the job ends with every
/// row of the seven hours trained exactly once.
#[test]
fn a_following_run_over_s3_picks_up_an_hour_that_lands_during_the_run() {
    let _serial = common::serial();
    let tmp = tempfile::tempdir().unwrap();
    hourly_data(tmp.path());
    let s3 = moto::Moto::start();
    let upload = s3_uploader(&s3, tmp.path());
    for h in 0..7 {
        let names: &[&str] = if h < 6 {
            &["part-00000.tsv", "_SUCCESS"]
        } else {
            &["part-00000.tsv"]
        };
        upload(&format!("dt=20261101/hour={h:02}"), names);
    }
    let data = format!(
        r#"
dir = "data"
eval = ["dt=20261104/hour=00/part-00000.tsv"]
now = "2026-11-03"
follow = true
follow_every = "100ms"
[[data.dataset]]
name = "clicks"
path = "s3://logs/clicks/dt={{date}}/hour={{hour}}?endpoint={}&region=us-east-1"
from = "2026-11-01T00"
to = "2026-11-01T07"
"#,
        s3.endpoint()
    );
    let path = job(
        tmp.path(),
        "s3-follow",
        &data,
        "[cluster]\nps = 1\nworkers = 2\nexecutors = 1\nbatches_per_shard = 1\n[checkpoint]\nenabled = false\n",
    );
    let dir = tmp.path().join("s3-follow");
    let log = tmp.path().join("s3-follow.log");
    let mut run = common::Group::spawn_with_env(
        &["run", path.to_str().unwrap()],
        &log,
        &moto::credentials_env(),
    );
    let s = wait_followed(&dir, &log, &mut run, rows_of_hours(tmp.path(), 0..6), 1);
    assert_eq!(
        s["datasets"]["pending"][0]["dir"], "dt=20261101/hour=06",
        "{s}"
    );
    upload("dt=20261101/hour=06", &["_SUCCESS"]);
    let text = run.wait_success(&log);
    let r = common::result(&dir);
    assert_eq!(r["status"], "finished", "{r}\n{text}");
    let e = &r["epochs"][0];
    assert_eq!(
        e["consumed"].as_u64(),
        Some(rows_of_hours(tmp.path(), 0..7)),
        "{r}"
    );
    assert_eq!(
        (e["duplicated"].as_u64(), e["missing"].as_u64()),
        (Some(0), Some(0)),
        "{r}"
    );
    // The late hour was copied from the object store beside the others.
    assert!(dir
        .join("data-cache/clicks/dt=20261101/hour=06/part-00000.tsv")
        .exists());
    // The location names no key: the secret never reaches the log.
    assert!(!text.contains("testing"), "{text}");
}

/// One day of hourly partitions on an S3-compatible server: listed through the object-store
/// API, copied under the run directory, trained on; credentials come from the environment.
#[test]
fn train_reads_partitions_from_s3() {
    let tmp = tempfile::tempdir().unwrap();
    hourly_data(tmp.path());
    let s3 = moto::Moto::start();
    let upload = s3_uploader(&s3, tmp.path());
    for h in 0..24 {
        upload(
            &format!("dt=20261102/hour={h:02}"),
            &["part-00000.tsv", "_SUCCESS"],
        );
    }
    let data = format!(
        r#"
dir = "data"
eval = ["dt=20261104/hour=00/part-00000.tsv"]
[[data.dataset]]
name = "clicks"
path = "s3://logs/clicks/dt={{date}}/hour={{hour}}?endpoint={}&region=us-east-1"
from = "2026-11-02"
to = "2026-11-03"
"#,
        s3.endpoint()
    );
    let path = job(tmp.path(), "s3", &data, "");
    let out = Command::new(env!("CARGO_BIN_EXE_elastrec"))
        .args(["train", path.to_str().unwrap()])
        .envs(moto::credentials_env())
        .output()
        .unwrap();
    let log = ok(&out);
    assert!(
        log.contains("dataset `clicks` (train): 24 partitions, 24 files"),
        "{log}"
    );
    let s = summary(tmp.path(), "s3");
    assert_eq!(s["samples"].as_u64().unwrap(), ROWS_PER_DAY, "{s}");
    assert!(tmp
        .path()
        .join("s3/data-cache/clicks/dt=20261102/hour=23/part-00000.tsv")
        .exists());
    // The location names no key: the secret never reaches the log.
    assert!(!log.contains("testing"), "{log}");
}

/// Parquet partitions (gen-data --format parquet --hourly-from) train like TSV ones.
#[test]
fn train_reads_parquet_partitions() {
    let tmp = tempfile::tempdir().unwrap();
    ok(&elastrec(&[
        "gen-data",
        "--out",
        tmp.path().join("pq").to_str().unwrap(),
        "--rows",
        &(2 * ROWS_PER_DAY).to_string(),
        "--days",
        "2",
        "--scale",
        "0.001",
        "--format",
        "parquet",
        "--hourly-from",
        "2026-11-01",
    ]));
    assert!(tmp
        .path()
        .join("pq/dt=20261102/hour=23/part-00000.parquet")
        .exists());
    let data = r#"
[[data.dataset]]
name = "clicks"
path = "pq/dt={date}/hour={hour}"
files = "*.parquet"
from = "2026-11-01"
to = "2026-11-02"
[[data.dataset]]
name = "holdout"
path = "pq/dt={date}/hour={hour}"
from = "2026-11-02"
to = "2026-11-03"
role = "eval"
"#;
    let path = job(tmp.path(), "parquet", data, "");
    let log = ok(&elastrec(&["train", path.to_str().unwrap()]));
    assert!(
        log.contains("dataset `clicks` (train): 24 partitions, 24 files"),
        "{log}"
    );
    let s = summary(tmp.path(), "parquet");
    assert_eq!(s["samples"].as_u64().unwrap(), ROWS_PER_DAY, "{s}");
    assert_eq!(s["eval"]["samples"].as_u64().unwrap(), ROWS_PER_DAY, "{s}");
}

/// Rows of the hourly partitions `hours` of 2026-11-01 (one TSV line per row).
fn rows_of_hours(dir: &Path, hours: std::ops::Range<u32>) -> u64 {
    hours
        .map(|h| {
            let p = dir.join(format!("data/dt=20261101/hour={h:02}"));
            std::fs::read_dir(&p)
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|f| f.extension().is_some_and(|x| x == "tsv"))
                .map(|f| std::fs::read_to_string(f).unwrap().lines().count() as u64)
                .sum::<u64>()
        })
        .sum()
}

/// A following job (`data.follow`) starts on the hours that are ready, waits for the two
/// that are not (status names them), trains each once its marker lands, and ends with its
/// window: the ledger covers all twelve hours exactly once, through a worker killed
/// mid-task, a data executor killed (its replacement reads the hours that land later) and
/// a master killed and resumed between the two late hours.
#[test]
fn a_following_run_trains_the_hours_that_land_during_the_run() {
    let _serial = common::serial();
    let tmp = tempfile::tempdir().unwrap();
    hourly_data(tmp.path());
    for h in [10, 11] {
        std::fs::remove_file(
            tmp.path()
                .join(format!("data/dt=20261101/hour={h}/_SUCCESS")),
        )
        .unwrap();
    }
    let data = r#"
now = "2026-11-03"
follow = true
follow_every = "100ms"
[[data.dataset]]
name = "clicks"
path = "data/dt={date}/hour={hour}"
from = "2026-11-01T00"
to = "2026-11-01T12"

[[data.dataset]]
name = "holdout"
path = "data/dt={date}/hour={hour}"
from = "2026-11-01T12"
to = "2026-11-01T15"
role = "eval"
"#;
    let path = job(
        tmp.path(),
        "follow",
        data,
        "[cluster]\nps = 1\nworkers = 2\nexecutors = 2\nbatches_per_shard = 1\n[checkpoint]\nenabled = false\n",
    );
    let dir = tmp.path().join("follow");
    let log = tmp.path().join("follow.log");
    // Node ids: the PS is 1, the workers 2 and 3, the executors 4 and 5. A worker leaves
    // after its second push,
    // before reporting it (at least one of the two gets that far on the ready hours).
    let mut run = common::Group::spawn_with_env(
        &["run", path.to_str().unwrap()],
        &log,
        &[("ELASTREC_FAIL_EXIT_AFTER_PUSH", "2:2,3:2")],
    );
    let ready = rows_of_hours(tmp.path(), 0..10);
    let all = rows_of_hours(tmp.path(), 0..12);

    // Everything that is ready gets trained; the job cannot end before hour 10 lands.
    let s = wait_followed(&dir, &log, &mut run, ready, 2);
    assert_eq!(s["phase"], "training", "{s}");
    assert_eq!(s["datasets"]["growing"], true, "{s}");
    assert_eq!(
        s["datasets"]["pending"][0]["dir"], "dt=20261101/hour=10",
        "{s}"
    );
    assert_eq!(s["datasets"]["pending"][0]["exists"], true, "{s}");
    let status = common::elastrec(&["status", dir.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains("waiting for clicks/dt=20261101/hour=10 (no marker yet"),
        "{text}"
    );

    let executors = common::running_nodes(&s, "executor");
    assert_eq!(executors.len(), 2, "{s}");
    // The executors served the ready hours (their counts arrive with their heartbeats;
    // the job holds here until hour 10 lands).
    common::wait_for(std::time::Duration::from_secs(60), || {
        common::status_json(&dir).is_some_and(|s| {
            common::running_nodes(&s, "executor")
                .iter()
                .map(|e| e.2)
                .sum::<u64>()
                > 0
        })
    });
    // A data executor dies while the job waits: the master replaces it.
    common::kill_node(&dir, executors[0].0, executors[0].1);
    common::wait_for(std::time::Duration::from_secs(60), || {
        common::status_json(&dir).is_some_and(|s| common::running_nodes(&s, "executor").len() == 2)
    });

    let land = |h: u32| {
        std::fs::write(
            tmp.path()
                .join(format!("data/dt=20261101/hour={h}/_SUCCESS")),
            b"",
        )
        .unwrap();
    };
    // Hour 10 lands; the job trains it and waits for hour 11.
    land(10);
    wait_followed(&dir, &log, &mut run, rows_of_hours(tmp.path(), 0..11), 1);
    // The master dies and comes back: it knows hour 10 from its database (not queued
    // again), and goes on following.
    // SAFETY: plain kill(2) of the master only; its nodes keep running.
    unsafe {
        libc::kill(run.pid(), libc::SIGKILL);
    }
    let _ = run.wait(std::time::Duration::from_secs(30));
    let log2 = tmp.path().join("follow.resume.log");
    let mut resumed = common::Group::spawn(&["run", "--resume", dir.to_str().unwrap()], &log2);
    wait_followed(
        &dir,
        &log2,
        &mut resumed,
        rows_of_hours(tmp.path(), 0..11),
        1,
    );
    land(11);
    let text = resumed.wait_success(&log2);
    let first = std::fs::read_to_string(&log).unwrap();
    // Each late hour landed once, in order: hour 10 before the master was killed, hour
    // 11 after the resume.
    let landed: Vec<String> = common::events(&dir, "partitions_landed")
        .iter()
        .map(|e| e["names"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        landed,
        ["clicks/dt=20261101/hour=10", "clicks/dt=20261101/hour=11"],
        "{first}\n{text}"
    );
    let killed = (2..=3).any(|w| {
        std::fs::read_to_string(dir.join(format!("logs/worker-{w}.log")))
            .unwrap_or_default()
            .contains("fail point: exiting after a push")
    });
    assert!(killed, "no worker stopped at the fail point: {first}");
    let executor_logs = std::fs::read_dir(dir.join("logs"))
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy().starts_with("executor-")
        })
        .count();
    assert!(
        executor_logs >= 3,
        "two executors and a replacement: {first}"
    );
    let r = common::result(&dir);
    assert_eq!(r["status"], "finished", "{r}");
    let e = &r["epochs"][0];
    assert_eq!(e["consumed"].as_u64(), Some(all), "{r}");
    assert_eq!(
        (e["duplicated"].as_u64(), e["missing"].as_u64()),
        (Some(0), Some(0)),
        "{r}"
    );
    drop(run);
}

/// Waits until a following job has trained `samples` and waits for `pending` partitions:
/// a state it holds until more data lands, so no fast run skips it.
fn wait_followed(
    dir: &Path,
    log: &Path,
    run: &mut common::Group,
    samples: u64,
    pending: usize,
) -> serde_json::Value {
    let t0 = std::time::Instant::now();
    loop {
        let s = common::status_json(dir).unwrap_or_default();
        if s["samples_done"].as_u64() == Some(samples)
            && s["datasets"]["pending"]
                .as_array()
                .is_some_and(|p| p.len() == pending)
        {
            return s;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(180)
                && run.0.try_wait().unwrap().is_none(),
            "the job did not reach {samples} samples with {pending} partitions pending: {s}\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// `[[data.source]]` over two datasets of the hourly data: `recent` (the third day,
/// weight 3) and `old` (the first two, weight 1), served by weight.
const SOURCES: &str = r#"
[[data.dataset]]
name = "old"
path = "data/dt={date}/hour={hour}"
from = "2026-11-01"
to = "2026-11-03"

[[data.dataset]]
name = "recent"
path = "data/dt={date}/hour={hour}"
from = "2026-11-03"
to = "2026-11-04"

[[data.dataset]]
name = "holdout"
path = "data/dt={date}/hour={hour}"
from = "2026-11-04"
to = "2026-11-05"
role = "eval"

[[data.source]]
name = "recent"
datasets = ["recent"]
weight = 3

[[data.source]]
name = "old"
datasets = ["old"]
"#;

/// Weighted sources in both modes. `train` reads every row of each source once and
/// reports what each gave. A distributed `run`, held part-way, has served the sources
/// 3 : 1 (in time order it would have served only `old` so far); its master is SIGKILLed
/// there and resumed with the same buffers, and the job ends with an exact ledger and
/// every row of each source served.
#[test]
fn weighted_sources_are_mixed_by_train_and_by_run_and_survive_a_master_restart() {
    let _g = common::serial();
    let tmp = tempfile::tempdir().unwrap();
    hourly_data(tmp.path());
    let path = job(tmp.path(), "sources-train", SOURCES, "");
    ok(&elastrec(&["train", path.to_str().unwrap()]));
    let s = summary(tmp.path(), "sources-train");
    assert_eq!(s["samples"].as_u64().unwrap(), 3 * ROWS_PER_DAY, "{s}");
    let mix = &s["mix"];
    assert!(
        mix["serving"]
            .as_str()
            .unwrap()
            .starts_with("weighted 3 : 1"),
        "{s}"
    );
    assert_eq!(
        mix["served_per_epoch"]["recent"]["rows"], ROWS_PER_DAY,
        "{s}"
    );
    assert_eq!(
        mix["served_per_epoch"]["old"]["rows"],
        2 * ROWS_PER_DAY,
        "{s}"
    );
    assert!(s["eval"]["auc"].as_f64().unwrap() > 0.6, "{s}");

    let path = job(
        tmp.path(),
        "sources-run",
        SOURCES,
        "[cluster]\nps = 1\nworkers = 2\n[checkpoint]\nenabled = false\n",
    );
    let dir = tmp.path().join("sources-run");
    let log = tmp.path().join("sources-run.log");
    let at = 12_000u64;
    let mut run = common::Group::spawn(
        &[
            "run",
            path.to_str().unwrap(),
            "--pause-at-samples",
            &at.to_string(),
        ],
        &log,
    );
    let s = common::wait_held(&dir);
    let mix = &s["mix"];
    assert_eq!(mix["sources"], serde_json::json!(["recent", "old"]), "{s}");
    let rows = |k: &str| mix["served"][k]["rows"].as_u64().unwrap();
    let (recent, old) = (rows("recent"), rows("old"));
    assert!(recent + old >= at, "{s}");
    // Stride scheduling keeps each source within about one task (an hour, ~417 rows) of
    // its share.
    assert!(
        recent.abs_diff(3 * old) <= 2_000,
        "served recent {recent} and old {old} rows, not 3 : 1: {s}"
    );
    let queued = mix["queued"].clone();
    // SAFETY: plain kill(2) of the master only; its nodes keep running.
    unsafe {
        libc::kill(run.pid(), libc::SIGKILL);
    }
    let _ = run.wait(std::time::Duration::from_secs(30));
    let log2 = tmp.path().join("sources-run.resume.log");
    let mut run = common::Group::spawn(&["run", "--resume", dir.to_str().unwrap()], &log2);
    let s = common::wait_held(&dir);
    assert_eq!(
        s["mix"]["queued"], queued,
        "the resumed master's buffers: {s}"
    );
    common::unpause(&dir);
    run.wait_success(&log2);
    let r = common::result(&dir);
    assert_eq!(r["status"], "finished", "{r}");
    let e = &r["epochs"][0];
    assert_eq!(e["consumed"].as_u64().unwrap(), 3 * ROWS_PER_DAY, "{r}");
    assert_eq!(
        (e["duplicated"].as_u64(), e["missing"].as_u64()),
        (Some(0), Some(0)),
        "{r}"
    );
    // Served since the resumed master started: what was still queued at the kill.
    let queued_rows = r["mix"]["served"]["recent"]["rows"].as_u64().unwrap()
        + r["mix"]["served"]["old"]["rows"].as_u64().unwrap();
    assert!(
        queued_rows > 0 && queued_rows <= 3 * ROWS_PER_DAY - at,
        "{r}"
    );
}

/// Impressions for `[data.source.join]`: hours 0-2 of 2026-11-01, 300 rows each, row `n`
/// keyed `n + 1` (8 hex digits) in C3 and labelled 0. Events, hours 0-3: row `n % 3 == 0`
/// clicked 50 minutes into its hour (joined), `n % 3 == 1` clicked 1 h 45 min after
/// its hour began (past a 30-minute window), the rest never.
fn impressions_and_clicks(dir: &Path) {
    let ints = vec!["3"; 13].join("\t");
    let hour0 = 1_793_491_200i64; // 2026-11-01T00:00:00Z
    let mut events: Vec<Vec<String>> = vec![Vec::new(); 4];
    for hour in 0..3u32 {
        let part = dir.join(format!("imp/dt=20261101/hour={hour:02}"));
        std::fs::create_dir_all(&part).unwrap();
        let mut rows = String::new();
        for i in 0..300u32 {
            let n = hour * 300 + i;
            let mut cats = vec![format!("{:08x}", i % 7 + 1); 26];
            cats[2] = format!("{:08x}", n + 1);
            rows.push_str(&format!("0\t{ints}\t{}\n", cats.join("\t")));
            let at = match n % 3 {
                0 => 50 * 60,
                1 => 105 * 60,
                _ => continue,
            };
            let t = hour0 + i64::from(hour) * 3600 + at;
            let h = ((t - hour0) / 3600) as usize;
            events[h].push(format!("{:08x}\t{t}", n + 1));
        }
        std::fs::write(part.join("part-0.tsv"), rows).unwrap();
        std::fs::write(part.join("_SUCCESS"), "").unwrap();
    }
    for (hour, lines) in events.iter().enumerate() {
        let part = dir.join(format!("clicks/dt=20261101/hour={hour:02}"));
        std::fs::create_dir_all(&part).unwrap();
        std::fs::write(part.join("events.tsv"), lines.join("\n") + "\n").unwrap();
        std::fs::write(part.join("_SUCCESS"), "").unwrap();
    }
}

const JOINED: &str = r#"
eval = []
[[data.dataset]]
name = "impressions"
path = "imp/dt={date}/hour={hour}"
from = "2026-11-01T00"
to = "2026-11-01T03"

[[data.source]]
name = "labelled"
datasets = ["impressions"]

[data.source.join]
events = "clicks/dt={date}/hour={hour}"
key = "C3"
within = "30m"
"#;

/// A source joined with click events by key and time: exactly the impressions clicked
/// within the window are positive, in `train` and in a distributed `run` (whose ledger
/// stays exact over the joined files); an event partition the window needs that is not
/// ready stops the start naming it.
#[test]
fn a_joined_source_labels_impressions_by_their_clicks_within_the_window() {
    let tmp = tempfile::tempdir().unwrap();
    impressions_and_clicks(tmp.path());
    let path = job(tmp.path(), "joined", JOINED, "");
    let log = ok(&elastrec(&["train", path.to_str().unwrap()]));
    assert!(
        log.contains("joined with events: 900 rows, 300 positive (33.3%)"),
        "{log}"
    );
    let s = summary(tmp.path(), "joined");
    assert_eq!(s["samples"], 900, "{s}");
    // The joined rows: positive exactly when n % 3 == 0, the rest of each row unchanged.
    let mut seen = 0;
    for hour in 0..3 {
        let f = tmp.path().join(format!(
            "joined/data-cache/join-labelled/dt=20261101/hour={hour:02}/part-0.tsv"
        ));
        for (i, line) in std::fs::read_to_string(&f).unwrap().lines().enumerate() {
            let n = hour * 300 + i;
            let want = if n % 3 == 0 { "1" } else { "0" };
            assert_eq!(&line[..1], want, "{}:{}", f.display(), i + 1);
            assert_eq!(
                line.split('\t').nth(16),
                Some(format!("{:08x}", n + 1).as_str())
            );
            seen += 1;
        }
    }
    assert_eq!(seen, 900);

    let path = job(
        tmp.path(),
        "joined-run",
        JOINED,
        "[cluster]\nps = 1\nworkers = 2\n[checkpoint]\nenabled = false\n",
    );
    ok(&elastrec(&["run", path.to_str().unwrap()]));
    let dir = tmp.path().join("joined-run");
    let ds = common::events(&dir, "dataset");
    assert!(
        ds.iter()
            .any(|e| e["joined_rows"] == 900 && e["joined_positives"] == 300),
        "{ds:?}"
    );
    let r = common::result(&dir);
    assert_eq!(r["status"], "finished", "{r}");
    let e = &r["epochs"][0];
    assert_eq!(e["consumed"], 900, "{r}");
    assert_eq!(
        (e["duplicated"].as_u64(), e["missing"].as_u64()),
        (Some(0), Some(0)),
        "{r}"
    );

    // The clicks of hour 3 are not ready: hour 2's impressions cannot be labelled yet.
    std::fs::remove_file(tmp.path().join("clicks/dt=20261101/hour=03/_SUCCESS")).unwrap();
    let late = JOINED.replace(
        "within = \"30m\"",
        "within = \"30m\"\nready_timeout = \"0s\"",
    );
    let path = job(tmp.path(), "joined-late", &late, "");
    let out = elastrec(&["train", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("labelled (join events)")
            && err.contains("hour=03")
            && err.contains("not ready"),
        "{err}"
    );
}

/// A job over a long list (300 files of 40 rows, 2 epochs): `run` starts after counting
/// the first 256 files and counts the rest while they train. Held before that count, the
/// job trains exactly the counted files and waits (no second epoch is cut, epoch 0 does
/// not close) while its status already expects every file's rows; its master killed
/// there and resumed counts the rest from what it recorded, and both epochs cover all
/// 12,000 rows exactly once.
#[test]
fn a_long_list_is_counted_while_training_and_across_a_master_restart() {
    const FILES: usize = 300;
    const PER_FILE: usize = 40;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    common::gen_data(&data, (FILES * PER_FILE * 3 + 300) as u64, &[]);
    let day = std::fs::read_to_string(data.join("day_0.tsv")).unwrap();
    let lines: Vec<&str> = day.lines().collect();
    assert!(lines.len() >= FILES * PER_FILE, "{}", lines.len());
    let mut train = Vec::new();
    for (i, rows) in lines.chunks(PER_FILE).take(FILES).enumerate() {
        let name = format!("part-{i:05}.tsv");
        std::fs::write(data.join(&name), rows.join("\n") + "\n").unwrap();
        train.push(format!("\"{name}\""));
    }
    let path = tmp.path().join("long.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[data]
dir = "data"
train = [{}]
eval = ["day_1.tsv"]
[model]
bottom_mlp = [32, 16]
top_mlp = [32, 1]
table_rows = 4000
[train]
batch_size = 256
epochs = 2
progress = false
[output]
dir = "long"
[cluster]
ps = 1
workers = 2
[checkpoint]
enabled = false
"#,
            train.join(", ")
        ),
    )
    .unwrap();
    let dir = tmp.path().join("long");
    let log = tmp.path().join("long.log");
    let mut run = common::Group::spawn_with_env(
        &["run", path.to_str().unwrap()],
        &log,
        &[("ELASTREC_FAIL_HOLD_COUNTING", "1")],
    );
    let counted = (256 * PER_FILE) as u64;
    let all = (FILES * PER_FILE) as u64;
    let s = common::wait_for_status(
        &dir,
        std::time::Duration::from_secs(180),
        "done with the counted files",
        |s| s["samples_done"].as_u64() == Some(counted) && s["shards"]["doing"] == 0,
    );
    assert_eq!(s["epoch"], 0, "{s}");
    assert_eq!(
        s["samples_total"].as_u64(),
        Some(2 * all),
        "the expected rows: {s}"
    );
    let started = common::events(&dir, "job_started");
    assert!(
        started[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("256 of 300 files counted")),
        "{started:?}"
    );
    // SAFETY: plain kill(2) of the master only; its nodes keep running.
    unsafe {
        libc::kill(run.pid(), libc::SIGKILL);
    }
    let _ = run.wait(std::time::Duration::from_secs(30));
    let log2 = tmp.path().join("long.resume.log");
    let mut run = common::Group::spawn(&["run", "--resume", dir.to_str().unwrap()], &log2);
    run.wait_success(&log2);
    let counts = common::events(&dir, "files_counted");
    assert!(
        counts.iter().any(|e| e["files"] == 300 && e["of"] == 300),
        "{counts:?}"
    );
    let r = common::result(&dir);
    assert_eq!(r["status"], "finished", "{r}");
    for e in r["epochs"].as_array().unwrap() {
        assert_eq!(e["consumed"].as_u64(), Some(all), "{r}");
        assert_eq!(
            (e["duplicated"].as_u64(), e["missing"].as_u64()),
            (Some(0), Some(0)),
            "{r}"
        );
    }
    assert_eq!(r["epochs"].as_array().unwrap().len(), 2, "{r}");
}
