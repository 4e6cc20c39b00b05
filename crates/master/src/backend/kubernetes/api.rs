//! The Kubernetes API from synchronous code: a dedicated thread owns a small tokio
//! runtime and the `kube` client; the backend's methods send it work and wait for the
//! answer.
//!
//! Why a thread of its own: the [`ClusterBackend`](crate::backend::ClusterBackend) methods
//! are synchronous and are called from tasks of the master's runtime. Blocking such a task
//! on a future that needs the same runtime to make progress (`Handle::block_on`, or a
//! spawned task awaited through a channel) deadlocks as soon as every worker thread of
//! that runtime waits (or at once on a current-thread runtime). Work sent here runs on a
//! runtime that never waits for the master's, so a caller's wait always ends: with the
//! answer or with [`REQUEST_TIMEOUT`]. While it waits, a caller on a multi-threaded
//! runtime hands its other tasks to the remaining threads (`block_in_place`).

use std::future::Future;
use std::sync::mpsc;
use std::time::Duration;

use anyhow::Context as _;
use futures::future::BoxFuture;
use kube::Client;

/// Longest wait for one API call (not a watch): past it, the call counts as failed.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Work for the API thread: a future built from the client.
type Work = Box<dyn FnOnce(Client) -> BoxFuture<'static, ()> + Send>;

/// Where the master's credentials come from.
#[derive(Debug, Clone)]
pub enum Credentials {
    /// `kube::Config::infer()`: `KUBECONFIG`, `~/.kube/config`, or the pod's service account.
    Infer,
    /// This kubeconfig file (`engine.kubernetes.kubeconfig`).
    File(std::path::PathBuf),
}

/// The API thread and how to reach it.
pub struct ApiThread {
    work: Option<tokio::sync::mpsc::UnboundedSender<Work>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The API server's address (for error messages).
    pub server: String,
    /// The namespace of the credentials' context (or the pod's own namespace).
    pub default_namespace: String,
}

impl ApiThread {
    /// Starts the thread and connects the client (no request is sent yet).
    pub fn start(credentials: Credentials) -> anyhow::Result<Self> {
        let (work_tx, mut work_rx) = tokio::sync::mpsc::unbounded_channel::<Work>();
        let (ready_tx, ready_rx) = mpsc::channel::<anyhow::Result<(String, String)>>();
        let thread = std::thread::Builder::new()
            .name("kubernetes-api".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ =
                            ready_tx.send(Err(e).context("starting the Kubernetes API runtime"));
                        return;
                    }
                };
                rt.block_on(async move {
                    let client = match connect(&credentials).await {
                        Ok((client, server, ns)) => {
                            let _ = ready_tx.send(Ok((server, ns)));
                            client
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    // Each piece of work runs as its own task, so a slow call does not
                    // hold up the others (nor the watch).
                    while let Some(work) = work_rx.recv().await {
                        tokio::spawn(work(client.clone()));
                    }
                });
            })
            .context("starting the Kubernetes API thread")?;
        let (server, default_namespace) = wait(ready_rx, Duration::from_secs(60)).context(
            "the Kubernetes API thread ended before connecting (its panic is printed above)",
        )??;
        Ok(Self {
            work: Some(work_tx),
            thread: Some(thread),
            server,
            default_namespace,
        })
    }

    /// Runs `f` on the API thread and waits for its result (at most [`REQUEST_TIMEOUT`]).
    pub fn call<T, F, Fut>(&self, f: F) -> anyhow::Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Client) -> Fut + Send + 'static,
        Fut: Future<Output = anyhow::Result<T>> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel();
        self.spawn(move |client| async move {
            let r = match tokio::time::timeout(REQUEST_TIMEOUT, f(client)).await {
                Ok(r) => r,
                Err(_) => Err(anyhow::anyhow!(
                    "no answer from the Kubernetes API server in {REQUEST_TIMEOUT:?}"
                )),
            };
            let _ = tx.send(r);
        })?;
        // The margin lets the thread's own timeout answer first, with its message.
        wait(rx, REQUEST_TIMEOUT + Duration::from_secs(5))
            .context("the Kubernetes API thread stopped answering")?
    }

    /// Runs `f` on the API thread without waiting (the watch).
    pub fn spawn<F, Fut>(&self, f: F) -> anyhow::Result<()>
    where
        F: FnOnce(Client) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let work: Work = Box::new(move |client| Box::pin(f(client)));
        self.work
            .as_ref()
            .and_then(|w| w.send(work).ok())
            .context("the Kubernetes API thread has stopped")
    }
}

impl Drop for ApiThread {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop; its runtime then drops every task
        // still running (the watch).
        self.work.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Waits for `rx` without stalling the caller's runtime: on a multi-threaded runtime the
/// other tasks of this thread move to the remaining threads while it waits.
fn wait<T>(rx: mpsc::Receiver<T>, limit: Duration) -> anyhow::Result<T> {
    let recv = move || rx.recv_timeout(limit);
    let multi = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    let r = if multi {
        tokio::task::block_in_place(recv)
    } else {
        recv()
    };
    r.map_err(|e| anyhow::anyhow!("{e}"))
}

/// Loads the configuration and builds the client.
async fn connect(credentials: &Credentials) -> anyhow::Result<(Client, String, String)> {
    let mut config = match credentials {
        Credentials::Infer => kube::Config::infer().await.map_err(|e| {
            anyhow::anyhow!(
                "no Kubernetes configuration found ({e}): set KUBECONFIG (or \
                 engine.kubernetes.kubeconfig) to a kubeconfig file, or run the master in a \
                 pod with a service account"
            )
        })?,
        Credentials::File(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading the kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .with_context(|| format!("using the kubeconfig {}", path.display()))?
        }
    };
    config.connect_timeout = Some(Duration::from_secs(10));
    let server = config.cluster_url.to_string();
    let namespace = config.default_namespace.clone();
    let client = Client::try_from(config)
        .with_context(|| format!("building a Kubernetes client for {server}"))?;
    Ok((client, server, namespace))
}

/// An API failure in words that say what to do. `what` is the attempted action
/// ("create Secret x in namespace y").
pub fn explain(e: kube::Error, what: &str, server: &str, namespace: &str) -> anyhow::Error {
    match &e {
        kube::Error::Api(s) if s.code == 403 => anyhow::anyhow!(
            "the Kubernetes API server refused to {what}: 403 Forbidden ({}). The master's \
             identity lacks RBAC permission: bind it a Role in namespace `{namespace}` \
             granting create, get, list, watch and delete on pods and secrets (see \
             docs/engines.md)",
            s.message
        ),
        kube::Error::Api(s) if s.code == 401 => anyhow::anyhow!(
            "the Kubernetes API server at {server} rejected the master's credentials when \
             asked to {what}: 401 Unauthorized ({}). Renew the token or certificate of the \
             kubeconfig context (KUBECONFIG) or of the pod's service account",
            s.message
        ),
        kube::Error::Api(s) if s.code == 404 && s.message.contains("namespace") => {
            anyhow::anyhow!(
                "could not {what}: {} (create the namespace or set engine.kubernetes.namespace)",
                s.message
            )
        }
        kube::Error::Api(s) => anyhow::anyhow!(
            "the Kubernetes API server refused to {what}: {} {} ({})",
            s.code,
            s.reason,
            s.message
        ),
        kube::Error::HyperError(_) | kube::Error::Service(_) => anyhow::anyhow!(
            "could not reach the Kubernetes API server at {server} to {what}: {e:#}. Check \
             the server address of the kubeconfig context (KUBECONFIG), that the cluster is \
             up, and that this host can reach it"
        ),
        _ => anyhow::Error::new(e).context(format!("could not {what} (API server {server})")),
    }
}

/// True for a "not found" answer (deleting what is already gone is no failure).
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// True for an "already exists" answer.
pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}
