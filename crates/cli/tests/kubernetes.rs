//! End-to-end tests of `elastrec run --backend kubernetes` against the in-process fake API
//! server (`elastrec-kube-fake`): real HTTP on loopback, the real API types, and pods run
//! as local processes of the real `elastrec` binary. The master reaches the fake through
//! a kubeconfig (`KUBECONFIG`), as it would reach a cluster.
//!
//! What the fake cannot show: scheduling, images, cgroup limits, networking between
//! hosts and the real garbage collector (see docs/engines.md).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use elastrec_kube_fake::{FakeCluster, Options};
use k8s_openapi::api::core::v1::Pod;

/// Where the job's image keeps the binary (the default of `engine.kubernetes.program`);
/// the fake maps it to the binary under test.
const PROGRAM: &str = "/usr/local/bin/elastrec";

/// The kubeconfig context's namespace: the job file names none, so the pods land here.
const NAMESPACE: &str = "ml-team";

const CLUSTER: &str = r#"
[cluster]
ps = 2
workers = 3
staleness = 0
batches_per_shard = 4
heartbeat_ms = 200
dead_after_ms = 2000
max_worker_restarts = 10
[engine.kubernetes]
image = "registry.example/elastrec:test"
labels = { team = "ranking" }
"#;

/// [`CLUSTER`] with the directory of the data and the jobs mounted into the pods (as a
/// PVC would be on a real cluster; the fake's pods share this machine's disk), which a
/// job whose pods read files must declare.
fn cluster() -> String {
    format!(
        "{CLUSTER}[[engine.kubernetes.volumes]]\nname = \"runs\"\nmount_path = \"{}\"\n\
         claim = \"elastrec-runs\"\n",
        fixture().dir.display()
    )
}

/// The fake API server of one test and a kubeconfig that reaches it.
struct Kube {
    fake: FakeCluster,
    kubeconfig: PathBuf,
}

impl Kube {
    fn start(name: &str) -> Self {
        let dir = fixture().dir.join(format!("{name}-kube"));
        let fake = FakeCluster::start(Options {
            programs: vec![(PROGRAM.into(), exe().into())],
            log_dir: dir.join("pods"),
        })
        .unwrap();
        let kubeconfig = dir.join("kubeconfig");
        fake.write_kubeconfig(&kubeconfig, NAMESPACE).unwrap();
        Self { fake, kubeconfig }
    }

    /// `elastrec run JOB --backend kubernetes ARGS...` with this kubeconfig.
    fn run(&self, job: &Path, log: &Path, args: &[&str]) -> Group {
        let mut all = vec!["run", job.to_str().unwrap(), "--backend", "kubernetes"];
        all.extend_from_slice(args);
        Group::spawn_with_env(
            &all,
            log,
            &[("KUBECONFIG", self.kubeconfig.to_str().unwrap())],
        )
    }

    /// No pod and no Secret of any job is left.
    fn assert_empty(&self, log: &str) {
        let pods: Vec<String> = self.fake.pods().iter().map(name).collect();
        assert!(pods.is_empty(), "pods left behind: {pods:?}\n{log}");
        let secrets = self.fake.secrets();
        assert!(
            secrets.is_empty(),
            "Secrets left behind: {secrets:?}\n{log}"
        );
    }

    /// The pod running node `id`.
    fn pod_of(&self, id: u64) -> String {
        let pods = self.fake.pods();
        let pod = pods
            .iter()
            .find(|p| label(p, "elastrec.io/node") == Some(id.to_string()));
        name(pod.unwrap_or_else(|| panic!("no pod for node {id}: {pods:?}")))
    }
}

fn name(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

fn label(p: &Pod, key: &str) -> Option<String> {
    p.metadata.labels.as_ref()?.get(key).cloned()
}

fn workers_created(fake: &FakeCluster) -> usize {
    fake.created_pods()
        .iter()
        .filter(|p| label(p, "elastrec.io/role").as_deref() == Some("worker"))
        .count()
}

/// Running workers by node id (pods have no pid the master could know).
fn running_worker_ids(s: &serde_json::Value) -> Vec<u64> {
    s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["role"] == "worker" && n["state"] == "running")
        .map(|n| n["id"].as_u64().unwrap())
        .collect()
}

/// (a) A whole job on pods: 2 PS and 3 workers train exactly once to the single-process
/// AUC; every pod carried the labels, the owner and the token only as a reference; and
/// nothing is left on the cluster afterwards.
#[test]
fn kubernetes_job_trains_exactly_once_and_leaves_nothing() {
    let _g = serial();
    let kube = Kube::start("k8s-a");
    let (job, dir) = write_job("k8s-a", &cluster());
    let log = dir.with_extension("log");
    let mut g = kube.run(&job, &log, &[]);
    let text = g.wait_success(&log);
    check_result(&dir, &log, 0.005);
    kube.assert_empty(&text);
    let token = std::fs::read_to_string(dir.join("token")).unwrap();
    let created = kube.fake.created_pods();
    let role = |r: &str| {
        created
            .iter()
            .filter(|p| label(p, "elastrec.io/role").as_deref() == Some(r))
            .count()
    };
    assert_eq!(role("ps"), 2, "{text}");
    assert!(role("worker") >= 3, "{text}");
    for pod in &created {
        assert_eq!(pod.metadata.namespace.as_deref(), Some(NAMESPACE));
        for key in ["app.kubernetes.io/name", "app.kubernetes.io/managed-by"] {
            assert_eq!(label(pod, key).as_deref(), Some("elastrec"), "{pod:?}");
        }
        assert_eq!(label(pod, "team").as_deref(), Some("ranking"));
        let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(owner.kind, "Secret");
        let json = serde_json::to_string(pod).unwrap();
        assert!(
            !json.contains(token.trim()),
            "a pod spec carries the token: {json}"
        );
        assert!(json.contains("secretKeyRef"), "{json}");
    }
}

/// (b) A worker's pod killed by the kernel for its memory mid-job (the job held at a fifth
/// of its samples, so the kill lands at the same point however fast the machine): the
/// master logs the kubelet's reason, replaces the worker with a new pod, and the ledger
/// stays exact.
#[test]
fn kubernetes_oom_killed_worker_is_replaced() {
    let _g = serial();
    let kube = Kube::start("k8s-b");
    let (job, dir) = write_job("k8s-b", &cluster());
    let log = dir.with_extension("log");
    let first = (2 * fixture().train_rows / 5).to_string();
    let mut g = kube.run(&job, &log, &["--pause-at-samples", &first]);
    let s = wait_held(&dir);
    let victim = *running_worker_ids(&s)
        .first()
        .unwrap_or_else(|| panic!("no running worker: {s}"));
    let pod = kube.pod_of(victim);
    assert!(
        kube.fake.kill_pod(&pod, "OOMKilled"),
        "{pod} is not running"
    );
    wait_not_running(&dir, victim);
    unpause(&dir);
    let text = g.wait_success(&log);
    check_result(&dir, &log, 0.005);
    assert!(
        text.contains(&format!(
            "pod {pod} (node {victim}) ended: OOMKilled (exit code 137)"
        )),
        "{text}"
    );
    assert!(text.contains("declared dead"), "{text}");
    assert!(result(&dir)["workers_dead"].as_u64() >= Some(1), "{text}");
    assert!(
        workers_created(&kube.fake) >= 4,
        "no replacement pod:\n{text}"
    );
    // The kill feeds the memory policy: the replacement asks for 1.5 times more.
    assert!(
        text.contains("workers start with 3.00 GiB instead of 2.00 GiB"),
        "{text}"
    );
    let memory_of_last_worker = kube
        .fake
        .created_pods()
        .iter()
        .rfind(|p| label(p, "elastrec.io/role").as_deref() == Some("worker"))
        .and_then(|p| {
            let c = &p.spec.as_ref()?.containers[0];
            Some(c.resources.as_ref()?.limits.as_ref()?["memory"].0.clone())
        });
    assert_eq!(memory_of_last_worker.as_deref(), Some("3072Mi"), "{text}");
    kube.assert_empty(&text);
}

/// A parameter server's pod evicted after a checkpoint (the job held first at a sixth of
/// its samples for the checkpoint, then at a third for the eviction): the master logs the
/// eviction, recovers the PS from the checkpoint in a new pod, and the ledger stays exact.
#[test]
fn kubernetes_evicted_ps_is_recovered_from_a_checkpoint() {
    let _g = serial();
    let kube = Kube::start("k8s-f");
    let cluster = cluster().replace("workers = 3", "workers = 1")
        + "[checkpoint]\ninterval_s = 1000.0\nkeep = 3\n";
    let (job, dir) = write_job("k8s-f", &cluster);
    let log = dir.with_extension("log");
    let total = 2 * fixture().train_rows;
    let mut g = kube.run(
        &job,
        &log,
        &["--pause-at-samples", &(total / 6).to_string()],
    );
    wait_held(&dir);
    take_checkpoint(&dir);
    pause_at(&dir, total / 3);
    let s = wait_held(&dir);
    let ps: Vec<u64> = s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["role"] == "ps" && n["state"] == "running")
        .map(|n| n["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ps.len(), 2, "{s}");
    let pod = kube.pod_of(ps[1]);
    assert!(kube.fake.kill_pod(&pod, "Evicted"), "{pod} is not running");
    unpause(&dir);
    let text = g.wait_success(&log);
    check_result(&dir, &log, 0.005);
    assert!(
        text.contains(&format!(
            "pod {pod} (node {}) ended: Evicted: The node was low on resource: memory.",
            ps[1]
        )),
        "{text}"
    );
    let r = result(&dir);
    let recoveries = r["checkpoint"]["recoveries"].as_array().unwrap();
    assert_eq!(recoveries.len(), 1, "{r}");
    let ps_pods = kube
        .fake
        .created_pods()
        .iter()
        .filter(|p| label(p, "elastrec.io/role").as_deref() == Some("ps"))
        .count();
    assert_eq!(ps_pods, 3, "the evicted PS came back in a new pod:\n{text}");
    kube.assert_empty(&text);
}

/// (c) An identity without RBAC permission: the job stops at once, names the cause and
/// the fix, creates nothing on the cluster, and leaves no state database (the same job
/// file runs once the permission is granted).
#[test]
fn kubernetes_forbidden_at_start_stops_the_job_and_leaves_nothing() {
    let _g = serial();
    let kube = Kube::start("k8s-c");
    kube.fake.set_forbidden(true);
    let (job, dir) = write_job("k8s-c", &cluster());
    let log = dir.with_extension("log");
    let mut g = kube.run(&job, &log, &[]);
    let st = g.wait(Duration::from_secs(120));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!st.success(), "{text}");
    assert!(text.contains("403 Forbidden"), "{text}");
    assert!(text.contains("RBAC"), "{text}");
    assert!(text.contains(NAMESPACE), "{text}");
    kube.assert_empty(&text);
    assert!(kube.fake.created_pods().is_empty(), "{text}");
    assert!(!dir.join("master.db").exists(), "{text}");
}

/// Bad credentials and an unreachable server are told apart, each with what to check.
#[test]
fn kubernetes_bad_credentials_and_unreachable_server_are_named() {
    let _g = serial();
    let kube = Kube::start("k8s-e");
    let (job, dir) = write_job("k8s-e", &cluster());
    let wrong = dir.with_extension("wrong-token.kubeconfig");
    let text = kube.fake.kubeconfig(NAMESPACE);
    std::fs::write(&wrong, text.replace(kube.fake.token(), "not-the-token")).unwrap();
    let out = run_with_kubeconfig(&job, &wrong);
    assert!(out.contains("401 Unauthorized"), "{out}");
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let gone = dir.with_extension("gone.kubeconfig");
    std::fs::write(
        &gone,
        text.replace(kube.fake.url(), &format!("http://127.0.0.1:{port}")),
    )
    .unwrap();
    let out = run_with_kubeconfig(&job, &gone);
    assert!(
        out.contains("could not reach the Kubernetes API server"),
        "{out}"
    );
    assert!(out.contains(&format!("127.0.0.1:{port}")), "{out}");
    kube.assert_empty(&out);
}

/// Runs a job that must fail at start; returns its output.
fn run_with_kubeconfig(job: &Path, kubeconfig: &Path) -> String {
    let out = Command::new(exe())
        .args(["run", job.to_str().unwrap(), "--backend", "kubernetes"])
        .env("KUBECONFIG", kubeconfig)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{text}");
    text
}

/// (d) `--dry-run` prints the Secret and the first pods with their labels, owner,
/// requests and limits and secret references, never a token, and starts nothing.
#[test]
fn kubernetes_dry_run_prints_manifests_and_starts_nothing() {
    let kube = Kube::start("k8s-d");
    let dry_run = |job: &Path| {
        Command::new(exe())
            .args([
                "run",
                job.to_str().unwrap(),
                "--backend",
                "kubernetes",
                "--dry-run",
            ])
            .env("KUBECONFIG", &kube.kubeconfig)
            .output()
            .unwrap()
    };
    // Without a volume the pods would not see the data: refused, naming the fix.
    let (bare, _) = write_job("k8s-d-bare", CLUSTER);
    let out = dry_run(&bare);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("data.dir") && err.contains("[[engine.kubernetes.volumes]]"),
        "{err}"
    );
    let (job, dir) = write_job("k8s-d", &cluster());
    let out = dry_run(&job);
    let yaml = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{yaml}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(yaml.matches("\nkind: Secret\n").count(), 1, "{yaml}");
    assert_eq!(yaml.matches("\nkind: Pod\n").count(), 5, "{yaml}");
    assert_eq!(yaml.matches("elastrec.io/role: ps").count(), 2, "{yaml}");
    assert_eq!(
        yaml.matches("elastrec.io/role: worker").count(),
        3,
        "{yaml}"
    );
    for needle in [
        "app.kubernetes.io/name: elastrec",
        "app.kubernetes.io/managed-by: elastrec",
        "elastrec.io/job-uid: ",
        "elastrec.io/node: ",
        "team: ranking",
        "ownerReferences:",
        "restartPolicy: Never",
        "requests:",
        "limits:",
        "cpu: 1000m",
        "memory: 2048Mi",
        "secretKeyRef:",
        "key: worker.ELASTREC_TOKEN",
        "key: ps.ELASTREC_TOKEN",
        "fieldPath: status.podIP",
        "image: registry.example/elastrec:test",
        "- /usr/local/bin/elastrec",
        // The "restricted" Pod Security profile, and the volume.
        "runAsNonRoot: true",
        "allowPrivilegeEscalation: false",
        "type: RuntimeDefault",
        "claimName: elastrec-runs",
        "mountPath: ",
    ] {
        assert!(yaml.contains(needle), "no `{needle}` in:\n{yaml}");
    }
    assert!(
        yaml.contains(&format!("namespace: {NAMESPACE}")),
        "the kubeconfig's namespace:\n{yaml}"
    );
    // A job token is 32 hex digits; the job uid (16) may show, a token may not.
    assert!(longest_hex_run(&yaml) < 32, "a token-like string:\n{yaml}");
    assert!(
        !dir.exists(),
        "a dry run created the job directory: {:?}",
        std::fs::read_dir(&dir).map(|d| d.map(|e| e.unwrap().path()).collect::<Vec<_>>())
    );
    assert!(kube.fake.created_pods().is_empty() && kube.fake.secrets().is_empty());
}

fn longest_hex_run(text: &str) -> usize {
    text.split(|c: char| !c.is_ascii_hexdigit())
        .map(str::len)
        .max()
        .unwrap_or(0)
}
