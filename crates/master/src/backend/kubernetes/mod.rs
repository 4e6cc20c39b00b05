//! The Kubernetes backend: one pod per node through the Kubernetes API.
//!
//! Per job the backend creates one Secret (every secret environment entry of the nodes:
//! the token, later TLS material) and one pod per node that reads those entries through
//! `secretKeyRef`, so no pod spec carries a secret. Pods point at the Secret as their
//! owner: deleting it (or the master's pod that owns it, when the master runs in a pod)
//! makes the cluster delete every pod of the job, even after a crash of the master. A watch
//! on the job's pods turns their ends into [`NodeExit`]s with the kubelet's reason; the
//! master's usual policies (relaunch a worker, recover a PS) then apply.
//!
//! Modules: `manifests` (pure: what a pod and the Secret look like), `outcome` (pure: how a
//! pod status reads as a node's end), `watch` (pod events to exits), `api` (the client on
//! a thread of its own, callable from synchronous code), `dry_run` (`--dry-run`).

mod api;
pub mod dry_run;
pub mod manifests;
mod outcome;
mod watch;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use elastrec_job::resources::KubernetesConfig;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::Api;
use parking_lot::Mutex;

use self::api::{explain, is_conflict, is_not_found, ApiThread, Credentials};
use self::manifests::{job_selector, owner_reference, JobObjects, JOB_UID_LABEL};
use self::watch::PodTable;
use super::{ClusterBackend, NodeExit};
use crate::events::event;
use crate::job::{Node, Role};
use crate::launch::LaunchTemplate;

/// Downward-API variables of a master that runs in a pod: its pod becomes the owner of
/// the job's Secret (and so, through it, of every node pod).
pub const POD_NAME_ENV: &str = "POD_NAME";
/// The master pod's uid (downward API `metadata.uid`).
pub const POD_UID_ENV: &str = "POD_UID";
/// The master pod's namespace (downward API `metadata.namespace`): an owner must be in
/// the namespace of what it owns, or the garbage collector deletes the dependents.
pub const POD_NAMESPACE_ENV: &str = "POD_NAMESPACE";

/// Nodes as pods of one job.
pub struct KubernetesPods {
    template: Arc<LaunchTemplate>,
    objects: JobObjects,
    /// The Secret, as the pods' owner.
    owner: OwnerReference,
    api: ApiThread,
    table: Arc<Mutex<PodTable>>,
    finished: AtomicBool,
}

impl KubernetesPods {
    /// Connects to the cluster, checks that the master may manage pods there, creates the
    /// job's Secret (or takes over the one of a resumed job) and starts watching the
    /// job's pods. Any refusal here stops the job with nothing left on the cluster.
    pub fn open(template: Arc<LaunchTemplate>, cfg: &KubernetesConfig) -> anyhow::Result<Self> {
        manifests::check_config(cfg)?;
        let credentials = if cfg.kubeconfig.is_empty() {
            Credentials::Infer
        } else {
            Credentials::File(cfg.kubeconfig.clone().into())
        };
        let api = ApiThread::start(credentials)?;
        let namespace = if cfg.namespace.is_empty() {
            api.default_namespace.clone()
        } else {
            cfg.namespace.clone()
        };
        let objects = JobObjects {
            cfg: cfg.clone(),
            namespace: namespace.clone(),
            job_uid: template.job_uid.clone(),
            secret_name: manifests::secret_name(&template.node_name(Role::Ps, 0)),
            metrics_port_base: template.metrics_port_base,
        };
        let server = api.server.clone();
        // Reading first: an unreachable server, bad credentials or a missing permission
        // show up before anything is created.
        {
            let (ns, selector, server) = (
                namespace.clone(),
                job_selector(&objects.job_uid),
                server.clone(),
            );
            api.call(move |client| async move {
                Api::<Pod>::namespaced(client, &ns)
                    .list(&ListParams::default().labels(&selector).limit(1))
                    .await
                    .map_err(|e| explain(e, &format!("list pods in namespace {ns}"), &server, &ns))
            })?;
        }
        // Each role's secret entries (its own token), listed by a probe node's spec.
        let entries = manifests::secret_entries(&template);
        let secret = objects.secret(&entries, master_pod(&namespace), false);
        let uid = {
            let (ns, server) = (namespace.clone(), server.clone());
            api.call(
                move |client| async move { ensure_secret(client, secret, &ns, &server).await },
            )?
        };
        let owner = owner_reference("Secret", &objects.secret_name, &uid);
        let backend = Self {
            template,
            objects,
            owner,
            api,
            table: Arc::new(Mutex::new(PodTable::default())),
            finished: AtomicBool::new(false),
        };
        // The Secret exists from here: any failure below drops `backend`, which deletes it.
        backend.check_pod_permission()?;
        let (client_ns, selector, table) = (
            namespace.clone(),
            job_selector(&backend.objects.job_uid),
            backend.table.clone(),
        );
        backend
            .api
            .spawn(move |client| watch::run(client, client_ns, selector, table))?;
        event!("kubernetes_pods", namespace = %namespace, server = %server,
            "kubernetes: job pods in namespace {namespace} of {server} (select them with -l {})",
            job_selector(&backend.objects.job_uid)
        );
        Ok(backend)
    }

    /// Creates a pod server-side in dry-run mode (validated and authorized, never
    /// stored): a master allowed to create Secrets but not pods stops here, not with a
    /// job whose every launch fails.
    fn check_pod_permission(&self) -> anyhow::Result<()> {
        let pod = self.objects.pod(
            &self.template.spec(&manifests::probe_node(Role::Worker)),
            self.owner.clone(),
        );
        let (ns, server) = (self.objects.namespace.clone(), self.api.server.clone());
        self.api.call(move |client| async move {
            let params = PostParams {
                dry_run: true,
                ..Default::default()
            };
            Api::<Pod>::namespaced(client, &ns)
                .create(&params, &pod)
                .await
                .map(|_| ())
                .map_err(|e| explain(e, &format!("create pods in namespace {ns}"), &server, &ns))
        })
    }

    fn pod_name(&self, node: &Node) -> String {
        self.template.node_name(node.role, node.id)
    }

    /// Deletes every pod of the job and its Secret (idempotent). Errors are printed with
    /// the command that removes what is left.
    fn delete_everything(&self) {
        if self.finished.swap(true, Ordering::AcqRel) {
            return;
        }
        let (ns, selector, secret) = (
            self.objects.namespace.clone(),
            job_selector(&self.objects.job_uid),
            self.objects.secret_name.clone(),
        );
        let server = self.api.server.clone();
        let (ns2, selector2) = (ns.clone(), selector.clone());
        let r = self.api.call(move |client| async move {
            let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
            let now = DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            };
            let list = pods
                .list(&ListParams::default().labels(&selector))
                .await
                .map_err(|e| explain(e, "list the job's pods", &server, &ns))?;
            for p in list.items {
                let name = p.metadata.name.unwrap_or_default();
                match pods.delete(&name, &now).await {
                    Ok(_) => {}
                    Err(e) if is_not_found(&e) => {}
                    Err(e) => return Err(explain(e, &format!("delete pod {name}"), &server, &ns)),
                }
            }
            match Api::<Secret>::namespaced(client, &ns)
                .delete(&secret, &DeleteParams::default())
                .await
            {
                Ok(_) => Ok(()),
                Err(e) if is_not_found(&e) => Ok(()),
                Err(e) => Err(explain(e, &format!("delete Secret {secret}"), &server, &ns)),
            }
        });
        if let Err(e) = r {
            event!(warn, "cleanup_failed", error = %format!("{e:#}"),
                "kubernetes: cleaning up the job failed: {e:#}; remove what is left with \
                 `kubectl delete pods,secrets -n {ns2} -l {selector2}`"
            );
        }
    }
}

/// A worker no job has (id 0): what a pod of the job looks like before any node exists.
/// Creates the job's Secret, or takes over the one a previous master of the same job
/// created (after `run --resume`). Returns its uid.
async fn ensure_secret(
    client: kube::Client,
    secret: Secret,
    ns: &str,
    server: &str,
) -> anyhow::Result<String> {
    let api: Api<Secret> = Api::namespaced(client, ns);
    let name = secret.metadata.name.clone().unwrap_or_default();
    let what = format!("create Secret {name} in namespace {ns}");
    let created = match api.create(&PostParams::default(), &secret).await {
        Ok(s) => s,
        Err(e) if is_conflict(&e) => {
            let existing = api
                .get(&name)
                .await
                .map_err(|e| explain(e, &format!("read Secret {name}"), server, ns))?;
            let ours = secret
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(JOB_UID_LABEL));
            let theirs = existing
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(JOB_UID_LABEL));
            anyhow::ensure!(
                ours == theirs,
                "Secret {name} in namespace {ns} exists and belongs to another job \
                 ({JOB_UID_LABEL}={}); delete it or choose another output.dir",
                theirs.map_or("none", String::as_str)
            );
            existing
        }
        Err(e) => return Err(explain(e, &what, server, ns)),
    };
    created
        .metadata
        .uid
        .with_context(|| format!("the API server returned Secret {name} without a uid"))
}

/// The master's own pod as an owner, when it runs in one in `namespace`.
fn master_pod(namespace: &str) -> Option<OwnerReference> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let (name, uid, ns) = (
        var(POD_NAME_ENV)?,
        var(POD_UID_ENV)?,
        var(POD_NAMESPACE_ENV)?,
    );
    (ns == namespace).then(|| owner_reference("Pod", &name, &uid))
}

impl ClusterBackend for KubernetesPods {
    fn start(&self, node: &Node) -> anyhow::Result<u32> {
        let pod = self
            .objects
            .pod(&self.template.spec(node), self.owner.clone());
        let name = self.pod_name(node);
        let (ns, server) = (self.objects.namespace.clone(), self.api.server.clone());
        self.api.call(move |client| async move {
            Api::<Pod>::namespaced(client, &ns)
                .create(&PostParams::default(), &pod)
                .await
                .map_err(|e| {
                    explain(
                        e,
                        &format!("create pod {name} in namespace {ns}"),
                        &server,
                        &ns,
                    )
                })
        })?;
        // The process runs in the pod's own PID namespace: no pid the master could use.
        Ok(0)
    }

    fn stop(&self, node: &Node) {
        if self.table.lock().stop(node.id) {
            // Already ended: the pod stays (with its logs) until the job ends.
            return;
        }
        let name = self.pod_name(node);
        let (ns, server) = (self.objects.namespace.clone(), self.api.server.clone());
        let what = format!("delete pod {name}");
        let r = self.api.call(move |client| async move {
            let now = DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            };
            match Api::<Pod>::namespaced(client, &ns)
                .delete(&name, &now)
                .await
            {
                Ok(_) => Ok(()),
                Err(e) if is_not_found(&e) => Ok(()),
                Err(e) => Err(explain(e, &what, &server, &ns)),
            }
        });
        if let Err(e) = r {
            event!(
                warn,
                "stop_failed",
                node = node.id,
                error = %format!("{e:#}"),
                "kubernetes: stopping node {}: {e:#}",
                node.id,
            );
        }
    }

    fn queued(&self) -> Vec<u32> {
        let timeout = Duration::from_secs(self.objects.cfg.pending_timeout_s);
        self.table.lock().queued(Instant::now(), timeout)
    }

    fn exited(&self) -> Vec<NodeExit> {
        self.table.lock().take_exits()
    }

    fn is_alive(&self, node: &Node) -> bool {
        let name = self.pod_name(node);
        let ns = self.objects.namespace.clone();
        let r = self.api.call(move |client| async move {
            Ok(Api::<Pod>::namespaced(client, &ns).get_opt(&name).await?)
        });
        match r {
            Ok(Some(pod)) => {
                pod.metadata.deletion_timestamp.is_none() && outcome::ended(&pod).is_none()
            }
            Ok(None) => false,
            // Cannot tell: heartbeat timeouts decide.
            Err(_) => true,
        }
    }

    fn set_worker_threads(&self, threads: usize) {
        self.template.set_worker_threads(threads);
    }

    fn finish(&self) {
        self.delete_everything();
    }
}

impl Drop for KubernetesPods {
    fn drop(&mut self) {
        // A master that returns early (an error after the Secret was created) leaves
        // nothing behind either. A killed master leaves its pods running for
        // `run --resume`; the Secret's owner (the master's pod) or a `kubectl delete`
        // removes them otherwise.
        self.delete_everything();
    }
}
