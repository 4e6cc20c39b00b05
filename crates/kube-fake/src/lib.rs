//! A test double of the Kubernetes API server for the elastrec Kubernetes backend: real
//! HTTP on loopback, the real `k8s-openapi` types, and a kubelet that runs each created
//! pod's container as a local process.
//!
//! It serves exactly what the backend uses, with the API's semantics where the backend
//! depends on them: create/get/list/delete of pods and Secrets (server-side dry-run
//! creates too), list + watch of pods by `labelSelector` from a `resourceVersion`
//! (newline-delimited JSON events), bearer-token authentication (401), a switch that
//! answers 403 Forbidden to everything, and the garbage collection of pods whose owner is
//! gone. Anything else answers 404 naming the request, so a backend change that needs a
//! new endpoint fails loudly here. Test hooks kill a pod's process with a chosen reason
//! (`OOMKilled`, `Evicted`, ...).

mod http;
mod kubelet;
mod store;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Secret};
use parking_lot::Mutex;

pub use kubelet::POD_IP;

/// The state the HTTP handlers and the kubelet share.
pub struct Cluster {
    store: Mutex<store::Store>,
    processes: Mutex<HashMap<store::Key, kubelet::Process>>,
    /// Pod changes, for live watches (sent while `store` is locked, so a watch that
    /// subscribes under the lock misses nothing and sees nothing twice).
    events: tokio::sync::broadcast::Sender<store::PodEvent>,
    token: String,
    forbidden: AtomicBool,
    programs: HashMap<String, PathBuf>,
    log_dir: PathBuf,
}

/// How the fake runs pods.
#[derive(Debug, Clone)]
pub struct Options {
    /// Program paths inside images, each mapped to a local executable.
    pub programs: Vec<(String, PathBuf)>,
    /// Where each pod's output goes (`<namespace>-<pod>.log`).
    pub log_dir: PathBuf,
}

/// A running fake API server. Dropping it kills every pod's process.
pub struct FakeCluster {
    cluster: Arc<Cluster>,
    url: String,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeCluster {
    /// Starts the server on a free loopback port, on a thread (and runtime) of its own.
    pub fn start(options: Options) -> anyhow::Result<Self> {
        std::fs::create_dir_all(&options.log_dir)?;
        let (events, _) = tokio::sync::broadcast::channel(4096);
        let cluster = Arc::new(Cluster {
            store: Mutex::new(store::Store::default()),
            processes: Mutex::new(HashMap::new()),
            events,
            token: format!("fake-{:016x}", rand_u64()),
            forbidden: AtomicBool::new(false),
            programs: options.programs.into_iter().collect(),
            log_dir: options.log_dir,
        });
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let url = format!("http://{}", listener.local_addr()?);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let c = cluster.clone();
        let thread = std::thread::Builder::new()
            .name("kube-fake".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("fake API runtime");
                rt.block_on(async move {
                    let listener =
                        tokio::net::TcpListener::from_std(listener).expect("fake API listener");
                    let server = tokio::spawn(async move {
                        let _ = axum::serve(listener, http::router(c)).await;
                    });
                    let _ = rx.await;
                    server.abort();
                });
                // Dropping the runtime drops the kubelet's tasks, whose children are
                // killed on drop.
            })?;
        Ok(Self {
            cluster,
            url,
            shutdown: Some(tx),
            thread: Some(thread),
        })
    }

    /// The server's URL (`http://127.0.0.1:PORT`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The bearer token the server accepts.
    pub fn token(&self) -> &str {
        &self.cluster.token
    }

    /// A kubeconfig reaching this server with its token, in `namespace`.
    pub fn kubeconfig(&self, namespace: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: {namespace}\n\
             current-context: fake\nusers:\n- name: fake\n  user:\n    token: {}\n",
            self.url, self.cluster.token
        )
    }

    /// Writes [`FakeCluster::kubeconfig`] to `path`.
    pub fn write_kubeconfig(&self, path: &Path, namespace: &str) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig(namespace))
    }

    /// From now on, answer 403 Forbidden to every request (an identity without RBAC).
    pub fn set_forbidden(&self, forbidden: bool) {
        self.cluster.forbidden.store(forbidden, Ordering::Release);
    }

    /// Every pod now stored.
    pub fn pods(&self) -> Vec<Pod> {
        self.cluster.store.lock().pods.values().cloned().collect()
    }

    /// Every Secret now stored.
    pub fn secrets(&self) -> Vec<Secret> {
        self.cluster
            .store
            .lock()
            .secrets
            .values()
            .cloned()
            .collect()
    }

    /// Every pod ever created (not dry runs), in order.
    pub fn created_pods(&self) -> Vec<Pod> {
        self.cluster.store.lock().created.clone()
    }

    /// Kills the process of pod `name` (any namespace) as the node would for `reason`:
    /// `OOMKilled` (the kernel's OOM killer: exit code 137), `Evicted` (the kubelet under
    /// memory pressure: the pod fails with reason Evicted), or any other container
    /// termination reason. False when no such pod runs.
    pub fn kill_pod(&self, name: &str, reason: &str) -> bool {
        let pid = {
            let mut processes = self.cluster.processes.lock();
            let Some(p) = processes
                .iter_mut()
                .find(|(k, _)| k.1 == name)
                .map(|(_, p)| p)
            else {
                return false;
            };
            p.killed_for = Some(reason.to_string());
            p.pid
        };
        kill(pid);
        true
    }
}

impl Drop for FakeCluster {
    fn drop(&mut self) {
        for p in self.cluster.processes.lock().values() {
            kill(p.pid);
        }
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// SIGKILL to `pid` (0: nothing).
fn kill(pid: u32) {
    if pid > 0 {
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGKILL);
        }
    }
}

/// A token nobody guesses across test runs (the fake needs no cryptographic strength).
fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}
