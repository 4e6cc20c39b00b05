//! Distributed jobs whose master, parameter servers and workers are hosts of their own:
//! each process runs in its own network namespace with its own address
//! (`engine.local.netns`), so every byte between them crosses a real network stack, and
//! network faults are made with the kernel's packet filter between those hosts. Each test
//! ends with the exact sample ledger, the single-process AUC, and no process left behind.
//! Root only (`netns_harness`); CI requires it (`ELASTREC_REQUIRE_NETNS`).

mod common;
mod netns_harness;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use common::*;
use netns_harness::Net;

/// The hosts of a job with 2 PS and 2 workers: spare worker hosts take the workers that
/// replace lost ones (a worker's index is its launch number).
const HOSTS: &[&str] = &[
    "master", "ps0", "ps1", "worker0", "worker1", "worker2", "worker3", "worker4",
];

/// As in cluster.rs: two workers train asynchronously.
const AUC_TOLERANCE: f64 = 0.005;

/// The `[cluster]` and `[engine]` parts of a job whose nodes run on `net`'s hosts.
fn on_hosts(net: &Net) -> String {
    format!(
        r#"
[cluster]
ps = 2
workers = 2
bind = "0.0.0.0"
heartbeat_ms = 300
dead_after_ms = 3000
[engine.local]
netns = "{}{{role}}{{index}}"
"#,
        net.prefix
    )
}

/// `elastrec args` run on host `host`.
fn elastrec_on(net: &Net, host: &str, args: &[&str]) -> Output {
    net.command(host, exe(), args)
        .env("XDG_DATA_HOME", data_home())
        .output()
        .expect("run elastrec in a namespace")
}

/// The job's status, asked of its master from the master's host.
fn status_on(net: &Net, dir: &Path) -> Option<serde_json::Value> {
    let out = elastrec_on(net, "master", &["status", dir.to_str().unwrap(), "--json"]);
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())
        .flatten()
}

/// Starts `job` on the master's host, held at a third of its first epoch.
fn spawn_held(net: &Net, job: &Path, log: &Path) -> Group {
    spawn_held_with(net, job, log, &[])
}

/// [`spawn_held`] with environment variables `env` (fail points) for the master.
fn spawn_held_with(net: &Net, job: &Path, log: &Path, env: &[(&str, &str)]) -> Group {
    let at = (fixture().train_rows / 3).to_string();
    let mut cmd = net.command(
        "master",
        exe(),
        &["run", job.to_str().unwrap(), "--pause-at-samples", &at],
    );
    cmd.envs(env.iter().copied());
    Group::spawn_command(cmd, log)
}

/// Takes a checkpoint of the job now (through its master, from the master's host).
fn checkpoint_on(net: &Net, dir: &Path) {
    let out = elastrec_on(net, "master", &["checkpoint", dir.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "checkpoint: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The PS indices the job's recoveries brought back, in the order of the recoveries.
fn recovered_ps(result: &serde_json::Value) -> Vec<u64> {
    result["checkpoint"]["recoveries"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|rec| rec["ps"].as_array().cloned().unwrap_or_default())
        .map(|p| p.as_u64().unwrap())
        .collect()
}

/// Waits until the job stands at its pause point; returns its status then.
fn wait_held_on(net: &Net, dir: &Path) -> serde_json::Value {
    let mut last = None;
    wait_for(Duration::from_secs(180), || {
        last = status_on(net, dir);
        last.as_ref()
            .is_some_and(|s| s["pause"]["held"].as_bool() == Some(true))
    });
    last.unwrap()
}

fn unpause_on(net: &Net, dir: &Path) {
    let out = elastrec_on(net, "master", &["unpause", dir.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "unpause: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The IP address of `host:port`.
fn ip_of(addr: &str) -> &str {
    addr.rsplit_once(':').map_or(addr, |(ip, _)| ip)
}

/// The running node on host `host` in a status (found by the address it registered its
/// metrics at): its id and record.
fn node_on<'a>(s: &'a serde_json::Value, net: &Net, host: &str) -> (u64, &'a serde_json::Value) {
    let want = &net.host(host).addr;
    let n = s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["state"] == "running" && n["metrics_addr"].as_str().map(ip_of) == Some(want))
        .unwrap_or_else(|| panic!("no running node on {host} ({want}): {s}"));
    (n["id"].as_u64().unwrap(), n)
}

/// Waits for the job to succeed, then checks the ledger, the AUC and that nothing it
/// started still runs on any host.
fn finish(net: &Net, mut g: Group, dir: &Path, log: &Path) {
    g.wait_success(log);
    check_result(dir, log, AUC_TOLERANCE);
    drop(g);
    assert_eq!(net.processes(), Vec::<i32>::new(), "processes left behind");
}

#[test]
fn netns_a_job_whose_nodes_are_hosts_of_their_own_trains_every_sample_once() {
    let _g = serial();
    let Some(net) = Net::create(HOSTS) else {
        return;
    };
    let (job, dir) = write_job("netns-hosts", &on_hosts(&net));
    let log = dir.with_extension("log");
    let g = spawn_held(&net, &job, &log);
    let s = wait_held_on(&net, &dir);
    // Every node registered the address of its own host, for its service and its metrics:
    // PS 0 and 1 on their hosts, the two workers on the first two worker hosts.
    let running: Vec<_> = s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["state"] == "running")
        .collect();
    assert_eq!(running.len(), 4, "{s}");
    for (host, role) in [
        ("ps0", "ps"),
        ("ps1", "ps"),
        ("worker0", "worker"),
        ("worker1", "worker"),
    ] {
        let (_, n) = node_on(&s, &net, host);
        assert_eq!(n["role"], role, "{n}");
        if role == "ps" {
            assert_eq!(
                ip_of(n["addr"].as_str().unwrap()),
                net.host(host).addr,
                "{n}"
            );
        }
    }
    unpause_on(&net, &dir);
    finish(&net, g, &dir, &log);
}

/// A worker that the master cannot hear (its heartbeats and the master's probes are lost
/// between the two hosts) while it still reaches the PS is declared dead, stopped and
/// replaced on another host, and every sample trains once.
#[test]
fn netns_a_worker_cut_off_from_the_master_is_replaced_and_every_sample_trains_once() {
    a_worker_the_master_loses_is_replaced("netns-worker-cut", "worker0", |net| {
        net.partition("worker0", "master")
    });
}

/// Runs a job on hosts of their own, makes `fault` between the master and the worker on
/// `host` once the job is held, and checks that this worker alone was suspected, then
/// declared dead, and that the job, healed, ends with an exact ledger. The verdict is
/// awaited while the job is still held: a held job has dealt every task it gave out, so
/// once running it could end on the other worker alone before the verdict came.
fn a_worker_the_master_loses_is_replaced(name: &str, host: &str, fault: impl FnOnce(&Net)) {
    let _g = serial();
    let Some(net) = Net::create(HOSTS) else {
        return;
    };
    let (job, dir) = write_job(name, &on_hosts(&net));
    let log = dir.with_extension("log");
    let g = spawn_held(&net, &job, &log);
    let s = wait_held_on(&net, &dir);
    let (lost, _) = node_on(&s, &net, host);
    fault(&net);
    wait_for(Duration::from_secs(120), || {
        events(&dir, "node_dead")
            .iter()
            .any(|e| e["node"].as_u64() == Some(lost))
    });
    net.heal(host);
    net.heal("master");
    unpause_on(&net, &dir);
    finish(&net, g, &dir, &log);
    let suspected = events(&dir, "node_suspected");
    assert!(
        suspected.iter().any(|e| e["node"].as_u64() == Some(lost)),
        "the silence was a suspicion first: {suspected:?}"
    );
    let dead: Vec<_> = events(&dir, "node_dead")
        .into_iter()
        .map(|e| e["node"].as_u64().unwrap())
        .collect();
    assert_eq!(dead, vec![lost], "only the lost worker was declared dead");
}

/// One packet in a hundred lost on every link, at random, for the whole job: TCP carries
/// every call through, and the job ends as a clean one does.
#[test]
fn netns_a_job_losing_one_packet_in_a_hundred_on_every_link_trains_every_sample_once() {
    let _g = serial();
    let Some(net) = Net::create(HOSTS) else {
        return;
    };
    let (job, dir) = write_job("netns-loss", &on_hosts(&net));
    let log = dir.with_extension("log");
    net.lose(10);
    let g = spawn_held(&net, &job, &log);
    wait_held_on(&net, &dir);
    unpause_on(&net, &dir);
    finish(&net, g, &dir, &log);
}

/// An asymmetric partition: the master reaches a worker, the worker no longer reaches the
/// master (its heartbeats and reports are lost; the master's probe gets no answer back).
/// The worker is declared dead and replaced, and every sample trains once.
#[test]
fn netns_a_worker_that_the_master_reaches_but_that_cannot_reach_the_master_is_replaced() {
    a_worker_the_master_loses_is_replaced("netns-one-way", "worker1", |net| {
        net.cut("worker1", "master")
    });
}

/// The master cut off from every node, both ways, for as long as it takes it to declare
/// them all dead (it is held at a pause point with a checkpoint of that point, so nothing
/// trains meanwhile): once healed, the replacements register, the PS come back from the
/// checkpoint, and the job ends as a clean one does.
#[test]
fn netns_a_master_cut_off_from_every_node_replaces_them_once_healed() {
    let _g = serial();
    let Some(net) = Net::create(HOSTS) else {
        return;
    };
    let (job, dir) = write_job("netns-master-cut", &on_hosts(&net));
    let log = dir.with_extension("log");
    let g = spawn_held(&net, &job, &log);
    let s = wait_held_on(&net, &dir);
    checkpoint_on(&net, &dir);
    let others = ["ps0", "ps1", "worker0", "worker1"];
    let nodes: Vec<u64> = others.iter().map(|h| node_on(&s, &net, h).0).collect();
    for h in others {
        net.partition("master", h);
    }
    wait_for(Duration::from_secs(120), || {
        let dead = events(&dir, "node_dead");
        nodes
            .iter()
            .all(|id| dead.iter().any(|e| e["node"].as_u64() == Some(*id)))
    });
    net.heal("master");
    for h in others {
        net.heal(h);
    }
    unpause_on(&net, &dir);
    finish(&net, g, &dir, &log);
    let r = result(&dir);
    let mut recovered = recovered_ps(&r);
    recovered.sort_unstable();
    recovered.dedup();
    assert_eq!(
        recovered,
        vec![0, 1],
        "both PS came back from the checkpoint: {r}"
    );
    assert_eq!(r["workers_dead"], 2, "{r}");
}

/// A PS cut off from every host, both ways, for longer than `dead_after_ms`, whose stop
/// never reaches it (a fail point: as when the master cannot reach its host). Its lease
/// runs out before the master's verdict, so it serves and sends nothing once its
/// replacement may start; healed, it hears that the master no longer knows it and exits
/// by itself. Its replacement (node 3, on the same host) comes back from the checkpoint
/// and the successor's dense replica, and the job ends as a clean one does.
#[test]
fn netns_a_ps_cut_off_past_dead_after_ms_fences_itself_before_it_is_replaced() {
    let _g = serial();
    let Some(net) = Net::create(HOSTS) else {
        return;
    };
    let cluster = format!("{}[checkpoint]\nrecovery = \"partial\"\n", on_hosts(&net));
    let (job, dir) = write_job("netns-ps-cut", &cluster);
    let log = dir.with_extension("log");
    // Node ids: the 2 PS are 1 and 2 (index 0 and 1), then the workers.
    let g = spawn_held_with(&net, &job, &log, &[("ELASTREC_FAIL_LOST_STOP", "1:1")]);
    let s = wait_held_on(&net, &dir);
    let (cut, _) = node_on(&s, &net, "ps0");
    assert_eq!(cut, 1, "{s}");
    checkpoint_on(&net, &dir);
    let others = [
        "master", "ps1", "worker0", "worker1", "worker2", "worker3", "worker4",
    ];
    for h in others {
        net.partition("ps0", h);
    }
    unpause_on(&net, &dir);
    wait_for(Duration::from_secs(120), || {
        events(&dir, "node_dead")
            .iter()
            .any(|e| e["node"].as_u64() == Some(cut))
    });
    let node_log = |id: u64| {
        std::fs::read_to_string(dir.join("logs").join(format!("ps-{id}.log"))).unwrap_or_default()
    };
    // Written on the server's heartbeat thread as the lease ran out, which is before the
    // verdict could come: it is in the log by now.
    assert!(
        node_log(cut).contains("fenced: the master acknowledged no heartbeat"),
        "PS node {cut} did not fence itself: {}",
        node_log(cut)
    );
    net.heal("ps0");
    for h in others {
        net.heal(h);
    }
    finish(&net, g, &dir, &log);
    assert!(
        node_log(cut).contains("the master no longer knows this node"),
        "PS node {cut} did not exit on its own once healed: {}",
        node_log(cut)
    );
    let dead: Vec<_> = events(&dir, "node_dead")
        .into_iter()
        .map(|e| e["node"].as_u64().unwrap())
        .collect();
    assert_eq!(dead, vec![cut], "only the cut-off PS was declared dead");
    let r = result(&dir);
    assert_eq!(recovered_ps(&r), vec![0], "PS 0 alone was recovered: {r}");
}

/// Every packet held 5 ms on its way between two hosts: a 10 ms round trip, as between
/// the zones of a region. The job ends as a clean one does; its speed is in the test's
/// output. `ELASTREC_NETNS_RTT_MS` sets another round trip, `ELASTREC_NETNS_STALENESS`
/// the job's `cluster.staleness` (`docs/engines.md` has the speeds measured so).
#[test]
fn netns_a_job_over_a_10_ms_round_trip_trains_every_sample_once() {
    let _g = serial();
    let Some(mut net) = Net::create(HOSTS) else {
        return;
    };
    let rtt_ms: f64 = std::env::var("ELASTREC_NETNS_RTT_MS")
        .ok()
        .map_or(10.0, |v| {
            v.parse().expect("ELASTREC_NETNS_RTT_MS: milliseconds")
        });
    let one_way = Duration::from_secs_f64(rtt_ms / 2e3);
    if rtt_ms > 0.0 {
        net.delay(one_way);
    }
    let staleness: u32 = std::env::var("ELASTREC_NETNS_STALENESS")
        .ok()
        .map_or(0, |v| v.parse().expect("ELASTREC_NETNS_STALENESS: a count"));
    let cluster = on_hosts(&net).replace(
        "[cluster]\n",
        &format!("[cluster]\nstaleness = {staleness}\n"),
    );
    let (job, dir) = write_job("netns-rtt", &cluster);
    let log = dir.with_extension("log");
    let g = spawn_held(&net, &job, &log);
    let s = wait_held_on(&net, &dir);
    let (_, ps) = node_on(&s, &net, "ps0");
    let rtt = net.connect_time("worker0", ps["addr"].as_str().unwrap());
    assert!(rtt >= 2 * one_way, "a round trip took {rtt:?}");
    unpause_on(&net, &dir);
    finish(&net, g, &dir, &log);
    let r = result(&dir);
    eprintln!(
        "round trip {:.2} ms (a TCP connect), staleness {staleness}: {:.0} samples/s, {:.1} s, \
         eval AUC {:.4}",
        rtt.as_secs_f64() * 1e3,
        r["samples_per_s"].as_f64().unwrap(),
        r["wall_s"].as_f64().unwrap(),
        r["eval"]["auc"].as_f64().unwrap()
    );
}
