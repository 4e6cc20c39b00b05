//! Online jobs end to end: `elastrec replay` feeds a Kafka topic (a Tansu broker, a real
//! Kafka-protocol server on loopback, one per test), `elastrec run` trains from it until
//! `elastrec stop`, and the ledger of offsets proves every message trained exactly once.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use elastrec_stream::tansu::Tansu;

#[path = "../../stream/tests/support/secure_broker.rs"]
mod secure_broker;

/// Replays `files` into `topic` as fast as the broker takes them; `producer` adds
/// Kafka client properties (`KEY=VALUE`).
fn replay(brokers: &str, topic: &str, files: &[PathBuf], producer: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "replay".to_string(),
        "--to".into(),
        format!("kafka://{brokers}/{topic}"),
        "--qps".into(),
        "1000000".into(),
        "--seconds".into(),
        "30".into(),
        "--json".into(),
        "--data".into(),
    ];
    args.extend(files.iter().map(|f| f.to_string_lossy().into_owned()));
    for p in producer {
        args.extend(["--property".to_string(), p.to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = elastrec(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Replays day `d` of the fixture into `clicks`; returns the samples sent.
fn replay_day(brokers: &str, d: u32) -> u64 {
    let day = fixture().dir.join(format!("data/day_{d}.tsv"));
    replay(brokers, "clicks", &[day], &[])["samples"]
        .as_u64()
        .unwrap()
}

fn online_job(name: &str, brokers: &str) -> (PathBuf, PathBuf) {
    online_job_with(name, brokers, "", "", "")
}

/// A broker of the test's own (its log under `name`), or `None` where Tansu is not
/// installed (the test skips, counted by the test command).
fn broker(name: &str) -> Option<Tansu> {
    broker_on(name, &Default::default())
}

/// [`broker`] with `options` (a storage engine).
fn broker_on(name: &str, options: &elastrec_stream::tansu::TansuOptions) -> Option<Tansu> {
    let bin = elastrec_stream::tansu::binary_or_skip()?;
    let log = fixture().dir.join(format!("{name}-broker.log"));
    Some(Tansu::start(&bin, &log, options).unwrap())
}

/// A broker holding topic `clicks` of `partitions` partitions, and its address.
fn broker_with_clicks(name: &str, partitions: i32) -> Option<(Tansu, String)> {
    broker_with_clicks_on(name, partitions, &Default::default())
}

/// [`broker_with_clicks`] with `options`.
fn broker_with_clicks_on(
    name: &str,
    partitions: i32,
    options: &elastrec_stream::tansu::TansuOptions,
) -> Option<(Tansu, String)> {
    let b = broker_on(name, options)?;
    let brokers = b.address();
    elastrec_stream::create_topic(
        &elastrec_stream::Connection::new(brokers.as_str()),
        "clicks",
        partitions,
    )
    .unwrap();
    Some((b, brokers))
}

/// Sends `sig` (`-STOP`, `-CONT`) to the broker's process.
fn signal(broker: &Tansu, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &broker.pid().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {}", broker.pid());
}

/// The tests' usual broker: topic `clicks` of 3 partitions.
fn clicks(name: &str) -> Option<(Tansu, String)> {
    broker_with_clicks(name, 3)
}

/// An online job; `cluster` and `stream` are extra lines of those sections (a `ps = N`
/// line in `cluster` replaces the default of 1 PS).
fn online_job_with(
    name: &str,
    brokers: &str,
    output: &str,
    cluster: &str,
    stream: &str,
) -> (PathBuf, PathBuf) {
    let ps = if cluster.lines().any(|l| l.starts_with("ps =")) {
        ""
    } else {
        "ps = 1"
    };
    let text = format!(
        r#"
[data]
dir = "data"
train = []
eval = ["day_2.tsv"]
[model]
bottom_mlp = [32, 16]
top_mlp = [32, 1]
max_table_rows = 4000
[train]
batch_size = 256
progress = false
[output]
dir = "{name}"
{output}
[cluster]
{ps}
workers = 2
batches_per_shard = 4
heartbeat_ms = 200
dead_after_ms = 2000
{cluster}
[stream]
brokers = "{brokers}"
topics = ["clicks"]
start = "earliest"
poll_ms = 50
linger_ms = 100
{stream}
"#
    );
    write_job_file(name, &text)
}

fn stop(dir: &Path) -> String {
    let out = elastrec_ok(&["stop", dir.to_str().unwrap()]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Replays day 0, starts an online job, kills a worker mid-stream, replays day 1, waits
/// until every message trained, stops the job and checks the ledger of offsets.
fn exactly_once_across_a_worker_kill(name: &str, brokers: &str, producer: &[&str], stream: &str) {
    let f = fixture();
    let day = |d: u32| f.dir.join(format!("data/day_{d}.tsv"));
    let first = replay(brokers, "clicks", &[day(0)], producer);
    let first_n = first["samples"].as_u64().unwrap();
    assert_eq!(first_n, ROWS / 3);

    let (job, dir) = online_job_with(name, brokers, "", "", stream);
    let log = f.dir.join(format!("{name}.log"));
    let mut g = Group::spawn(&["run", job.to_str().unwrap()], &log);
    // Part of the first day trained: the job cannot finish on its own, so this holds.
    wait_for(Duration::from_secs(180), || {
        samples_done(&dir) >= first_n / 3
    });
    let s = status_json(&dir).unwrap();
    // `elastrec status` shows the stream: every partition with its watermark and lag.
    let parts = s["stream"]["partitions"].as_array().expect("a stream view");
    assert_eq!(parts.len(), 3, "{s}");
    assert!(parts.iter().all(|p| p["high"].as_u64().is_some()), "{s}");
    let table = elastrec(&["status", dir.to_str().unwrap()]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("kafka:clicks/2"), "{table}");
    let (victim, pid) = running_workers(&s)[0];
    kill_node(&dir, victim, pid);
    // More traffic arrives while the job runs.
    let second = replay(brokers, "clicks", &[day(1)], producer);
    let total = first_n + second["samples"].as_u64().unwrap();
    let (r, text, said) = stop_when_trained(&dir, &mut g, &log, total);
    assert!(
        said.contains(&format!("stopped at {total} samples")),
        "{said}"
    );
    let auc = r["eval"]["auc"].as_f64().unwrap();
    assert!(auc > 0.6, "the online model learned: AUC {auc}\n{text}");
    assert_progressive(&r, total);
}

/// Waits until `total` samples trained (nothing more arrives, so the job holds there),
/// stops the job and checks that it finished with an exact ledger of `total` rows and
/// offsets. Returns the result, the job's log and what `elastrec stop` said.
fn stop_when_trained(
    dir: &Path,
    g: &mut Group,
    log: &Path,
    total: u64,
) -> (serde_json::Value, String, String) {
    wait_for(Duration::from_secs(240), || samples_done(dir) >= total);
    let said = stop(dir);
    let text = g.wait_success(log);
    let r = result(dir);
    assert_eq!(r["status"], "finished", "{r}\n{text}");
    assert_eq!(r["ledger"]["consumed"], total, "{r}");
    assert_eq!(r["ledger"]["duplicated"], 0, "{r}");
    assert_eq!(r["ledger"]["missing"], 0, "{r}");
    (r, text, said)
}

/// Progressive validation saw every trained sample once (its predictions travel with the
/// progress reports the ledger counts), and the window's figures show a learning model.
fn assert_progressive(r: &serde_json::Value, total: u64) {
    let p = &r["online"]["progressive"];
    assert_eq!(p["predictions"], total, "{p}");
    let window = p["window"].as_u64().unwrap();
    let latest = &p["latest"];
    assert_eq!(latest["samples"], total.min(window), "{latest}");
    let auc = latest["auc"].as_f64().unwrap();
    assert!(auc > 0.6 && auc < 1.0, "window AUC {auc}: {latest}");
    let logloss = latest["logloss"].as_f64().unwrap();
    assert!(
        logloss > 0.0 && logloss < 0.69,
        "better than a coin: {latest}"
    );
}

#[test]
fn kafka_an_online_job_trains_every_message_exactly_once_across_a_worker_kill() {
    let _g = serial();
    let Some((_broker, brokers)) = clicks("an_online_job_trains_every_message_exact") else {
        return;
    };
    exactly_once_across_a_worker_kill("online-kill", &brokers, &[], "");
}

/// What a managed Kafka asks of a job: TLS with the broker verified against a CA and a
/// client certificate, SASL SCRAM-SHA-512, zstd-compressed batches (Tansu behind stunnel,
/// `secure_broker`). The job's master and workers connect with the job's `[stream]
/// properties`, and every message trains exactly once across a worker kill.
#[test]
fn kafka_an_online_job_over_tls_and_scram_trains_every_message_exactly_once() {
    let _g = serial();
    let dir = fixture().dir.join("secure-broker");
    std::fs::create_dir_all(&dir).unwrap();
    let Some(broker) = secure_broker::SecureBroker::start(&dir) else {
        return;
    };
    let (user, password, _) = secure_broker::USERS[0];
    let conn = broker.connection(user, password, "SCRAM-SHA-512");
    elastrec_stream::create_topic(&conn, "clicks", 3).unwrap();
    let props = broker.properties(user, password, "SCRAM-SHA-512");
    let producer: Vec<String> = props.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let producer: Vec<&str> = producer.iter().map(String::as_str).collect();
    let table: Vec<String> = props
        .iter()
        .map(|(k, v)| format!("{k:?} = {v:?}"))
        .collect();
    exactly_once_across_a_worker_kill(
        "online-secure",
        &broker.address(),
        &producer,
        &format!("properties = {{ {} }}", table.join(", ")),
    );
}

#[test]
fn kafka_a_job_naming_a_missing_topic_says_so_before_starting() {
    let _g = serial();
    let Some(broker) = broker("no-topic") else {
        return;
    };
    let brokers = broker.address();
    let (job, dir) = online_job("online-no-topic", &brokers);
    let out = elastrec(&["run", job.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("topic \"clicks\" does not exist"), "{err}");
    assert!(!dir.join("master.db").exists(), "nothing was started");
}

#[test]
fn kafka_kale_adds_workers_for_a_traffic_peak_and_removes_them_after() {
    let _g = serial();
    let f = fixture();
    // Tansu's memory engine, one message per produce request (its high watermark moves
    // by one per request), as the SLO below was calibrated on: on its SQLite engine the
    // peak's lag reached 6-7 s against the 5 s SLO (11% of the time over it, on two busy
    // cores), and the paced replay gains nothing from batches.
    let memory = elastrec_stream::tansu::TansuOptions {
        storage: Some("memory://tansu/".into()),
        ..Default::default()
    };
    let Some((_broker, brokers)) = broker_with_clicks_on("kale", 4, &memory) else {
        return;
    };
    // Workers made slow (100 ms more per batch of 128: at most ~1,280 samples/s each, about
    // 700/s measured on two cores shared with the broker and the replayer), so that
    // workers set the capacity, and the 2,000/s peak needs two or three of them. (A
    // 3,000/s peak was never reached: the replayer's one-message requests topped out near
    // 2,100/s here, with the broker and every node starved of CPU.)
    let (job, dir) = online_job_with(
        "online-kale",
        &brokers,
        "",
        "",
        "autoscale = \"kale\"\nworkers = [1, 4]\ninterval_s = 2.0\nslo_lag_s = 5.0\ntau_s = 6.0\nhorizon_s = 10.0",
    );
    let text = std::fs::read_to_string(&job)
        .unwrap()
        .replace("batch_size = 256", "batch_size = 128")
        .replace("workers = 2", "workers = 1");
    std::fs::write(&job, text).unwrap();
    let trace = f.dir.join("peak.csv");
    std::fs::write(
        &trace,
        "t_s,qps\n0,500\n10,500\n20,2000\n35,2000\n40,200\n80,200\n",
    )
    .unwrap();
    let log = f.dir.join("online-kale.log");
    let mut g = Group::spawn_with_env(
        &["run", job.to_str().unwrap()],
        &log,
        &[("ELASTREC_FAIL_SLOW_WORKER", "*:100")],
    );
    wait_for(Duration::from_secs(120), || status_json(&dir).is_some());
    let out = elastrec_ok(&[
        "replay",
        "--to",
        &format!("kafka://{brokers}/clicks"),
        "--data",
        f.dir.join("data/day_0.tsv").to_str().unwrap(),
        "--repeat",
        "--qps-trace",
        trace.to_str().unwrap(),
        "--json",
        "--property",
        "batch.num.messages=1",
    ]);
    let sent: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let total = sent["samples"].as_u64().unwrap();
    let (r, text, _) = stop_when_trained(&dir, &mut g, &log, total);
    assert_progressive(&r, total);
    let online = &r["online"];
    let decisions = online["decisions"].as_array().unwrap();
    // The scaler's reasoning, for whoever reads a failure of the assertions below.
    for d in decisions {
        eprintln!(
            "{:>6.1} s  {} -> {} (raw {}, planned {})  load {:>5.0}/s  {}",
            d["at_s"].as_f64().unwrap_or(f64::NAN),
            d["workers"],
            d["target"],
            d["raw"],
            d["planned"],
            d["load"].as_f64().unwrap_or(f64::NAN),
            d["reason"].as_str().unwrap_or("")
        );
    }
    let most = decisions
        .iter()
        .map(|d| d["target"].as_u64().unwrap())
        .max()
        .unwrap();
    assert!(most > 1, "the peak got more workers: {online}\n{text}");
    let peak_at = decisions
        .iter()
        .position(|d| d["target"].as_u64() == Some(most))
        .unwrap();
    assert!(
        decisions[peak_at..]
            .iter()
            .any(|d| d["target"].as_u64().unwrap() < most),
        "workers were removed after the peak: {online}"
    );
    assert!(
        online["planned_changes"].as_u64() <= online["raw_plan_changes"].as_u64(),
        "the stabilized plan changes no more often than the raw one: {online}"
    );
    let st = &online["stream"];
    eprintln!("stream: {st}");
    assert!(st["observed_s"].as_f64().unwrap() > 60.0, "{st}");
    // The brokers' own outages (Tansu has stalled for 5-8 s on two busy cores, every
    // query and produce waiting) are no scaler's: judged is the time they answered.
    let stall = st["source_stall_s"].as_f64().unwrap();
    let violation = st["violation_s"].as_f64().unwrap();
    let observed = st["observed_s"].as_f64().unwrap();
    assert!(
        (violation - stall).max(0.0) <= 0.05 * (observed - stall),
        "the lag stayed under the SLO at least 95% of the time the brokers answered: \
         {st}\n{text}"
    );
    assert_eq!(st["partitions"].as_array().unwrap().len(), 4);
}

/// The online job of `name`, held at a third of day 0 (replayed first), with `cluster`
/// lines; returns its job dir, its process group, its log and day 0's sample count.
fn held_online_job(
    name: &str,
    brokers: &str,
    output: &str,
    cluster: &str,
) -> (PathBuf, Group, PathBuf, u64) {
    let f = fixture();
    let first = replay(brokers, "clicks", &[f.dir.join("data/day_0.tsv")], &[]);
    let first_n = first["samples"].as_u64().unwrap();
    let (job, dir) = online_job_with(name, brokers, output, cluster, "");
    let log = f.dir.join(format!("{name}.log"));
    let at = (first_n / 3).to_string();
    let g = Group::spawn(
        &["run", job.to_str().unwrap(), "--pause-at-samples", &at],
        &log,
    );
    wait_held(&dir);
    (dir, g, log, first_n)
}

/// Replays day 1, waits until everything sent trained, stops the job and checks an exact
/// ledger of offsets and a learning model. Returns the result.
fn day_one_then_stop(
    brokers: &str,
    dir: &Path,
    mut g: Group,
    log: &Path,
    first_n: u64,
) -> serde_json::Value {
    let f = fixture();
    let second = replay(brokers, "clicks", &[f.dir.join("data/day_1.tsv")], &[]);
    let total = first_n + second["samples"].as_u64().unwrap();
    let (r, _, _) = stop_when_trained(dir, &mut g, log, total);
    assert_progressive(&r, total);
    // `elastrec stop` ends the job with a final checkpoint, exported for serving.
    assert_eq!(r["export"]["model"]["samples"], total, "{r}");
    r
}

/// A parameter server SIGKILLed while the stream trains: CPR's partial recovery reloads
/// only its shard from the checkpoint taken before; the workers go on and every offset
/// still trains exactly once.
#[test]
fn kafka_a_ps_killed_mid_stream_is_recovered_and_every_message_trains_once() {
    let _g = serial();
    let Some((_broker, brokers)) = clicks("a_ps_killed_mid_stream_is_recovered_and_") else {
        return;
    };
    let cluster_lines = "ps = 2\n[checkpoint]\ninterval_s = 3600.0\nrecovery = \"partial\"";
    let (dir, g, log, first_n) = held_online_job("online-ps-kill", &brokers, "", cluster_lines);
    take_checkpoint(&dir);
    pause_at(&dir, 2 * first_n / 3);
    let s = wait_held(&dir);
    let ps: Vec<i32> = s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["role"] == "ps" && n["state"] == "running")
        .map(|n| n["pid"].as_i64().unwrap() as i32)
        .collect();
    assert_eq!(ps.len(), 2, "{s}");
    // SAFETY: kill(2) on a PS process this test's job started.
    unsafe {
        libc::kill(ps[1], libc::SIGKILL);
    }
    unpause(&dir);
    let r = day_one_then_stop(&brokers, &dir, g, &log, first_n);
    let rec = r["checkpoint"]["recoveries"].as_array().unwrap();
    assert_eq!(rec.len(), 1, "{r}");
    assert_eq!(rec[0]["mode"], "partial", "{r}");
    assert_eq!(rec[0]["ps"], serde_json::json!([1]), "{r}");
    assert_eq!(r["workers_launched"], 2, "no worker was replaced: {r}");
}

/// The broker goes away while the job trains and comes back: the master says so, the
/// workers wait in their ranges, and after the broker returns every offset trains once.
#[test]
fn kafka_a_broker_outage_is_waited_out_and_nothing_is_lost() {
    let _g = serial();
    let Some((broker, brokers)) = clicks("a_broker_outage_is_waited_out_and_nothin") else {
        return;
    };
    let (dir, g, log, first_n) = held_online_job("online-outage", &brokers, "", "");
    // An outage as a hung host shows it: the broker stops answering (SIGSTOP), its
    // connections stay open, and every call waits for its deadline.
    signal(&broker, "-STOP");
    // The broker stays down until the master has noticed.
    wait_for(Duration::from_secs(120), || {
        !events(&dir, "brokers_unreachable").is_empty()
    });
    unpause(&dir);
    signal(&broker, "-CONT");
    wait_for(Duration::from_secs(120), || {
        !events(&dir, "brokers_back").is_empty()
    });
    day_one_then_stop(&brokers, &dir, g, &log, first_n);
}

/// An online job never ends, so it exports for serving as it trains: every
/// `output.export_every_s` the newest checkpoint becomes `export/model-<id>.bin`, named by
/// `export/latest.json`, the older ones beyond `export_keep` removed.
#[test]
fn kafka_an_online_job_exports_its_newest_checkpoint_for_serving() {
    let _g = serial();
    let Some((_broker, brokers)) = clicks("an_online_job_exports_its_newest_checkpo") else {
        return;
    };
    let output = "export_every_s = 0.001\nexport_keep = 2";
    let cluster_lines = "ps = 2\n[checkpoint]\ninterval_s = 3600.0";
    let (dir, g, log, first_n) = held_online_job("online-export", &brokers, output, cluster_lines);
    // Held at its pause point, the job trains nothing more: this checkpoint is the newest
    // for as long as the test waits, so the exporter must get to it.
    let held = status_json(&dir).unwrap()["samples_done"].as_u64().unwrap();
    take_checkpoint(&dir);
    let latest = dir.join("export/latest.json");
    let mut record = serde_json::Value::Null;
    wait_for(Duration::from_secs(120), || {
        record = std::fs::read(&latest)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        record["samples"] == held
    });
    let model = PathBuf::from(record["path"].as_str().unwrap());
    assert_eq!(model.parent().unwrap(), dir.join("export"), "{record}");
    let e = eval_model(&model);
    let auc = e["auc"].as_f64().unwrap();
    assert!(
        auc > 0.6,
        "the exported model learned from {held} samples: {e}"
    );
    unpause(&dir);
    let r = day_one_then_stop(&brokers, &dir, g, &log, first_n);
    let x = &r["export"];
    assert_eq!(x["failures"], 0, "{r}");
    assert!(x["exports"].as_u64().unwrap() >= 1, "{r}");
    let kept = std::fs::read_dir(dir.join("export"))
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy().starts_with("model-")
        })
        .count();
    assert!(
        (1..=2).contains(&kept),
        "{kept} exports kept, at most 2 wanted"
    );
    let last = eval_model(&dir.join("model.bin"));
    assert!(last["auc"].as_f64().unwrap() > 0.6, "{last}");
}

/// A multi-task (MMoE) online job: the stream's TSV messages carry a click and a
/// conversion (`10`), both train, the ledger is exact, and progressive validation judges
/// each task on its own labels before training on them.
#[test]
fn kafka_a_multi_task_online_job_trains_and_judges_every_task() {
    let _g = serial();
    let f = fixture();
    let data = f.dir.join("mmoe-stream-data");
    let report = gen_conversions(&data, 30_000);
    let Some((_broker, brokers)) = clicks("a_multi_task_online_job_trains_and_judge") else {
        return;
    };
    let days: Vec<PathBuf> = (0..2).map(|d| data.join(format!("day_{d}.tsv"))).collect();
    let total = replay(&brokers, "clicks", &days, &[])["samples"]
        .as_u64()
        .unwrap();
    assert_eq!(total, 20_000);
    let (job, dir) = online_job_with("online-mmoe", &brokers, "", "", "");
    let text = std::fs::read_to_string(&job).unwrap();
    std::fs::write(&job, as_mmoe(&text, "mmoe-stream-data")).unwrap();
    let log = f.dir.join("online-mmoe.log");
    let mut g = Group::spawn(&["run", job.to_str().unwrap()], &log);
    let (r, text, _) = stop_when_trained(&dir, &mut g, &log, total);
    let evals = r["task_evals"].as_array().expect("every task evaluated");
    assert_eq!(evals.len(), 2, "{r}");
    for (t, e) in evals.iter().enumerate() {
        let auc = e["auc"].as_f64().unwrap();
        assert!(auc > 0.6, "task {t} learned from the stream: {e}\n{text}");
    }
    let p = &r["online"]["progressive"];
    assert_eq!(p["predictions"], total, "{p}");
    let latest = &p["latest"];
    let windows = latest["tasks"].as_array().expect("a window per task");
    assert_eq!(windows.len(), 2, "{latest}");
    assert_eq!(windows[0]["auc"], latest["auc"], "{latest}");
    for (t, w) in windows.iter().enumerate() {
        let auc = w["auc"].as_f64().unwrap();
        assert!(auc > 0.55 && auc < 1.0, "task {t}: {latest}");
    }
    let rate = windows[1]["positive_rate"].as_f64().unwrap();
    assert!(
        (rate - report["conversion"]["rate"].as_f64().unwrap()).abs() < 0.02,
        "task 1's labels are the conversions: {latest}"
    );
}

/// A batch + stream mixture job: `online_job_with`'s job (with `cluster` lines) plus day 0
/// as its history, a `[data.mix]` section of `mix` lines and `model` lines in `[model]`.
fn mixture_job(
    name: &str,
    brokers: &str,
    mix: &str,
    model: &str,
    cluster: &str,
) -> (PathBuf, PathBuf) {
    let (job, dir) = online_job_with(name, brokers, "", cluster, "");
    let text = std::fs::read_to_string(&job)
        .unwrap()
        .replace("train = []\n", "train = [\"day_0.tsv\"]\n")
        .replace("[model]", &format!("[data.mix]\n{mix}\n[model]\n{model}"));
    std::fs::write(&job, text).unwrap();
    (job, dir)
}

/// Stops a mixture job once `total` samples (history and stream) trained, and checks an
/// exact ledger over both sources. Returns the result.
fn stop_mixture(dir: &Path, g: &mut Group, log: &Path, total: u64) -> serde_json::Value {
    let (r, text, _) = stop_when_trained(dir, g, log, total);
    assert!(r["mix"].is_object(), "{r}");
    let auc = r["eval"]["auc"].as_f64().unwrap();
    assert!(auc > 0.6, "the mixed model learned: AUC {auc}\n{text}");
    r
}

/// Primus's prioritized serving (Eq. 4) and its MTRM model in one job: day 0 as history
/// (the memory tower's), the stream's messages as they arrive (the adapt tower's). A
/// worker killed mid-run loses nothing; every history row and every offset trains exactly
/// once; progressive validation judges the stream only, with the adapt tower's
/// predictions, and so do the final evaluation and the exported model.
#[test]
fn kafka_a_mixture_job_trains_its_history_and_its_stream_exactly_once() {
    let _g = serial();
    let Some((_broker, brokers)) = clicks("a_mixture_job_trains_its_history_and_its") else {
        return;
    };
    let f = fixture();
    let history = ROWS / 3;
    let first = replay_day(&brokers, 1);
    let name = "mix-priority";
    let mix = "mode = \"priority\"\nhistory_weight = 1.0\nstream_weight = 4.0";
    let (job, dir) = mixture_job(name, &brokers, mix, "adapt_mlp = [16, 1]", "");
    let log = f.dir.join(format!("{name}.log"));
    let at = ((history + first) / 3).to_string();
    let mut g = Group::spawn(
        &["run", job.to_str().unwrap(), "--pause-at-samples", &at],
        &log,
    );
    let s = wait_held(&dir);
    let m = &s["mix"];
    assert!(
        m["serving"].as_str().unwrap().starts_with("priority"),
        "{s}"
    );
    let table = elastrec(&["status", dir.to_str().unwrap()]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("sources (priority"), "{table}");
    let (victim, pid) = running_workers(&s)[0];
    kill_node(&dir, victim, pid);
    unpause(&dir);
    // More traffic arrives while the history is still being trained.
    let second = replay_day(&brokers, 1);
    let stream = first + second;
    let r = stop_mixture(&dir, &mut g, &log, history + stream);
    let served = &r["mix"]["served"];
    assert!(
        served["history"]["rows"].as_u64().unwrap() >= history,
        "{r}"
    );
    assert!(served["stream"]["rows"].as_u64().unwrap() >= stream, "{r}");
    // The history is trained, but not predicted: the window holds stream samples only.
    assert_progressive(&r, stream);
    assert_eq!(r["export"]["model"]["samples"], history + stream, "{r}");
    // The saved MTRM predicts with its adapt tower, as the job's own evaluation did.
    let saved = eval_model(&dir.join("model.bin"));
    let (job_auc, saved_auc) = (r["eval"]["auc"].as_f64(), saved["auc"].as_f64());
    assert!(
        (job_auc.unwrap() - saved_auc.unwrap()).abs() < 0.002,
        "{r}\n{saved}"
    );
}

/// `mode = "sequential"`: the whole history before any stream data. Held half-way through
/// the history, nothing of the stream has been served; the master is killed there and
/// resumed from its database with both sources where they were.
#[test]
fn kafka_a_sequential_mixture_trains_the_history_first_and_resumes_after_a_master_kill() {
    let _g = serial();
    let Some((_broker, brokers)) = clicks("a_sequential_mixture_trains_the_history_") else {
        return;
    };
    let f = fixture();
    let history = ROWS / 3;
    let stream = replay_day(&brokers, 1);
    let name = "mix-sequential";
    let (job, dir) = mixture_job(name, &brokers, "mode = \"sequential\"", "", "");
    let log = f.dir.join(format!("{name}.log"));
    let at = (history / 2).to_string();
    let mut g = Group::spawn(
        &["run", job.to_str().unwrap(), "--pause-at-samples", &at],
        &log,
    );
    wait_held(&dir);
    // Held, nothing more is handed out; the stream's watcher deals the replayed messages
    // into its buffer on its next poll, which a fast run may not have made yet.
    let mut s = serde_json::Value::Null;
    wait_for(Duration::from_secs(60), || {
        s = status_json(&dir).unwrap_or_default();
        s["mix"]["queued"]["stream"].as_u64() > Some(0)
    });
    let m = &s["mix"];
    assert_eq!(m["served"]["stream"]["rows"], 0, "{s}");
    assert!(m["queued"]["history"].as_u64().unwrap() > 0, "{s}");
    // SAFETY: plain kill(2) of the master only; its nodes keep running.
    unsafe {
        libc::kill(g.pid(), libc::SIGKILL);
    }
    let _ = g.wait(Duration::from_secs(30));
    let log2 = f.dir.join(format!("{name}.resume.log"));
    let mut g = Group::spawn(&["run", "--resume", dir.to_str().unwrap()], &log2);
    let s = wait_held(&dir);
    let m = &s["mix"];
    assert!(m["queued"]["history"].as_u64().unwrap() > 0, "{s}");
    unpause(&dir);
    stop_mixture(&dir, &mut g, &log2, history + stream);
}

/// A parameter server of a mixture job killed after a checkpoint, with full recovery:
/// every node is replaced and the job returns to the checkpoint's position in both
/// sources (history tasks and stream offsets), then trains on; the ledger ends exact.
#[test]
fn kafka_a_mixture_job_restores_both_sources_from_its_checkpoint_after_a_ps_dies() {
    let _g = serial();
    let Some((_broker, brokers)) = clicks("a_mixture_job_restores_both_sources_from") else {
        return;
    };
    let f = fixture();
    let history = ROWS / 3;
    let stream = replay_day(&brokers, 1);
    let total = history + stream;
    let name = "mix-full-recovery";
    let cluster = "ps = 2\n[checkpoint]\ninterval_s = 3600.0\nrecovery = \"full\"";
    let (job, dir) = mixture_job(name, &brokers, "mode = \"weighted\"", "", cluster);
    let log = f.dir.join(format!("{name}.log"));
    let at = (total / 3).to_string();
    let mut g = Group::spawn(
        &["run", job.to_str().unwrap(), "--pause-at-samples", &at],
        &log,
    );
    wait_held(&dir);
    take_checkpoint(&dir);
    pause_at(&dir, 2 * total / 3);
    let s = wait_held(&dir);
    let (ps, pid, _) = running_nodes(&s, "ps")[1];
    kill_node(&dir, ps, pid);
    unpause(&dir);
    let r = stop_mixture(&dir, &mut g, &log, total);
    let rec = r["checkpoint"]["recoveries"].as_array().unwrap();
    assert_eq!(rec.len(), 1, "{r}");
    assert_eq!(rec[0]["mode"], "full", "{r}");
}

/// An online job pushes its exports to a running `elastrec serve` (`output.push`): the
/// first as the whole model, the next as a delta of the rows changed since, which the
/// server applies in place. A client predicting all the while gets every answer, first
/// from the old checkpoint and then from the new one, each time what that export file
/// predicts.
#[test]
fn kafka_an_online_job_pushes_its_exports_to_a_running_server_as_deltas() {
    let _g = serial();
    let Some((_broker, brokers)) = clicks("an_online_job_pushes_its_exports_to_a_ru") else {
        return;
    };
    let f = fixture();
    let token = "pushtoken7";
    let server = start_server(&[], Some(token), &f.dir.join("serve-push.log"));
    // No model yet: the server says so until the job pushes one.
    let (rows, body) = request_rows(&f.dir.join("data/day_2.tsv"), 32);
    let (code, reply) = http(&server.http, "POST", "/v1/predict", None, &body);
    assert_eq!(code, 503, "{reply}");

    let first = replay(&brokers, "clicks", &[f.dir.join("data/day_0.tsv")], &[]);
    let first_n = first["samples"].as_u64().unwrap();
    let output = format!(
        "export_every_s = 0.001\nexport_keep = 10\npush = [\"http://{}\"]",
        server.http
    );
    let cluster_lines = "ps = 2\n[checkpoint]\ninterval_s = 3600.0";
    let name = "online-push";
    let (job, dir) = online_job_with(name, &brokers, &output, cluster_lines, "");
    let log = f.dir.join(format!("{name}.log"));
    let g = Group::spawn_with_env(
        &[
            "run",
            job.to_str().unwrap(),
            "--pause-at-samples",
            &(first_n / 3).to_string(),
        ],
        &log,
        &[("ELASTREC_SERVE_TOKEN", token)],
    );
    wait_held(&dir);
    let info = |key: &str| {
        let (_, text) = http(&server.http, "GET", "/v1/model", None, b"");
        serde_json::from_str::<serde_json::Value>(&text).unwrap()[key].clone()
    };
    // Held, the job takes one checkpoint, which is exported and pushed whole.
    take_checkpoint(&dir);
    wait_for(Duration::from_secs(120), || info("models") == 1);
    let a = info("checkpoint").as_u64().unwrap();
    let (code, reply) = http(&server.http, "POST", "/v1/predict", None, &body);
    assert_eq!(code, 200, "{reply}");
    let (before, at) = predictions(&reply);
    assert_eq!(at, a);
    let model_a = dir.join(format!("export/model-{a}.bin"));
    assert_eq!(before, file_predictions(&model_a, &rows));

    // It trains on to a second hold; a client predicts while the next export is pushed.
    pause_at(&dir, 2 * first_n / 3);
    wait_held(&dir);
    let client = {
        let (addr, body) = (server.http.clone(), body.clone());
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            loop {
                let (code, reply) = http(&addr, "POST", "/v1/predict", None, &body);
                assert_eq!(
                    code, 200,
                    "a request failed while the delta was applied: {reply}"
                );
                let (p, at) = predictions(&reply);
                let at = at.as_u64().unwrap();
                if seen.last().is_none_or(|(c, _)| *c != at) {
                    seen.push((at, p));
                }
                if at != a {
                    return seen;
                }
            }
        })
    };
    take_checkpoint(&dir);
    let seen = client.join().unwrap();
    assert_eq!(
        seen.len(),
        2,
        "the client saw checkpoint {a}, then the next one"
    );
    let b = seen[1].0;
    assert!(b > a);
    assert_eq!(info("deltas"), 1);
    assert_eq!(
        info("models"),
        1,
        "the second export came as a delta, not a model"
    );
    let model_b = dir.join(format!("export/model-{b}.bin"));
    assert_eq!(seen[1].1, file_predictions(&model_b, &rows));
    assert_ne!(seen[1].1, before, "the delta changed the predictions");
    let delta = dir.join(format!("export/delta-{a}-{b}.bin"));
    let full = std::fs::metadata(&model_b).unwrap().len();
    assert!(
        std::fs::metadata(&delta).unwrap().len() < full,
        "a delta carries the changed rows only"
    );

    unpause(&dir);
    let r = day_one_then_stop(&brokers, &dir, g, &log, first_n);
    let push = &r["export"]["push"];
    assert_eq!(push["failures"], 0, "{r}");
    assert!(push["deltas"].as_u64().unwrap() >= 1, "{r}");
    let pushed: Vec<String> = events(&dir, "pushed")
        .iter()
        .map(|e| format!("{} {}", e["what"].as_str().unwrap(), e["checkpoint"]))
        .collect();
    assert_eq!(
        pushed[..2],
        [format!("model {a}"), format!("delta {b}")],
        "{pushed:?}"
    );
    drop(server);
}

/// A service's own log as a stream: JSON messages of named features (an array of
/// samples each, string and integer ids, a genre list, a click history sharing the item
/// table) train an online job exactly once, and the model it evaluates on a held-out CSV
/// day learned.
#[test]
fn kafka_an_online_job_trains_json_messages_of_named_features_exactly_once() {
    let _g = serial();
    let Some((_broker, brokers)) = clicks("online_json") else {
        return;
    };
    let f = fixture();
    let data = f.dir.join("named-json");
    gen_named_csv(&data, 60000, 3);
    let features = format!("\n{}", named_features("max_len = 30"));
    let (job, dir) = online_job_with("online-json", &brokers, "", "", "format = \"json\"");
    let text = std::fs::read_to_string(&job)
        .unwrap()
        .replace("dir = \"data\"", "dir = \"named-json\"")
        .replace(
            "eval = [\"day_2.tsv\"]",
            &format!("eval = [\"day_2.csv\"]{features}"),
        )
        .replace("max_table_rows = 4000\n", "");
    std::fs::write(&job, text).unwrap();
    // The log as its service would send it: `replay` reads the CSV days through the job's
    // features and sends 100 rows a message as a JSON array.
    let days = [data.join("day_0.csv"), data.join("day_1.csv")];
    let sent = elastrec_ok(&[
        "replay",
        "--to",
        &format!("kafka://{brokers}/clicks"),
        "--format",
        "json",
        "--job",
        job.to_str().unwrap(),
        "--samples-per-message",
        "100",
        "--qps",
        "1000000",
        "--seconds",
        "30",
        "--json",
        "--data",
        days[0].to_str().unwrap(),
        days[1].to_str().unwrap(),
    ]);
    let sent: serde_json::Value = serde_json::from_slice(&sent.stdout).unwrap();
    let (messages, samples) = (
        sent["messages"].as_u64().unwrap(),
        sent["samples"].as_u64().unwrap(),
    );
    // Round robin over 3 partitions: 13,334 + 13,333 + 13,333 rows, 134 messages each.
    assert_eq!((messages, samples), (402, 40_000), "{sent}");
    let log = f.dir.join("online-json.log");
    let mut g = Group::spawn(&["run", job.to_str().unwrap()], &log);
    // A stream's ledger counts offsets: every message exactly once, whatever it holds.
    let (r, text, _) = stop_when_trained(&dir, &mut g, &log, messages);
    assert_eq!(r["online"]["progressive"]["predictions"], samples, "{r}");
    let auc = r["eval"]["auc"].as_f64().unwrap();
    assert!(auc > 0.55, "the online model learned: AUC {auc}\n{text}");
}
