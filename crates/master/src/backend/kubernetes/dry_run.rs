//! `elastrec run JOB --backend kubernetes --dry-run`: the manifests the backend would
//! create for the job's first nodes, as YAML, without contacting the cluster. The Secret
//! shows its keys with placeholders: the token exists only once a job starts.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use elastrec_job::config::JobConfig;
use rand::Rng as _;

use super::manifests::{self, owner_reference, JobObjects};
use crate::backend::BackendKind;
use crate::job::{Node, Role};
use crate::launch::LaunchTemplate;

/// Prints the manifests of the job in `job` (only the Kubernetes backend has any).
pub async fn run(job: Option<&Path>, backend: Option<BackendKind>) -> anyhow::Result<()> {
    let job = job.context("--dry-run needs a job file")?;
    anyhow::ensure!(
        backend == Some(BackendKind::Kubernetes),
        "--dry-run prints the Kubernetes manifests of a job: add --backend kubernetes"
    );
    // The job file and its data, checked as a start would; not the checkpoint store,
    // whose opening creates its directory.
    let cfg = JobConfig::load(job)?;
    cfg.check_data(job)?;
    let namespace = namespace(&cfg.engine.kubernetes).await;
    print!("{}", render(&cfg, &namespace)?);
    Ok(())
}

/// The namespace a real run would use, read from the configuration only (no request).
async fn namespace(cfg: &elastrec_job::resources::KubernetesConfig) -> String {
    if !cfg.namespace.is_empty() {
        return cfg.namespace.clone();
    }
    let inferred = if cfg.kubeconfig.is_empty() {
        kube::Config::infer().await.ok()
    } else {
        match kube::config::Kubeconfig::read_from(&cfg.kubeconfig) {
            Ok(k) => kube::Config::from_custom_kubeconfig(k, &Default::default())
                .await
                .ok(),
            Err(_) => None,
        }
    };
    inferred.map_or_else(|| "default".into(), |c| c.default_namespace)
}

/// The YAML documents: a comment, the Secret, one pod per initial PS and worker.
fn render(cfg: &JobConfig, namespace: &str) -> anyhow::Result<String> {
    manifests::check_config(&cfg.engine.kubernetes)?;
    let job_id = cfg
        .output
        .dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "job".into());
    // What a start draws: a fresh uid, and a token that is never shown.
    let job_uid = random_hex(16);
    let token = random_hex(32);
    let ip = elastrec_job::resources::bind_address(cfg)?;
    let port = cfg.cluster.master_port;
    let master = elastrec_job::resources::advertise_for(&cfg.engine, SocketAddr::new(ip, port))?;
    let master = match master.strip_suffix(":0") {
        Some(host) => format!("{host}:<port bound at start>"),
        None => master,
    };
    let mut template = LaunchTemplate::new(
        cfg.engine.kubernetes.program.clone().into(),
        &job_id,
        &job_uid,
        &master,
        &token,
        "logs".into(),
        cfg.resources.clone(),
    );
    template.metrics_port_base = cfg.cluster.node_metrics_port_base;
    manifests::check_paths(cfg)?;
    crate::autoscale_loop::size_nodes(&template, cfg);
    let template = Arc::new(template);
    let objects = JobObjects {
        cfg: cfg.engine.kubernetes.clone(),
        namespace: namespace.to_string(),
        job_uid: job_uid.clone(),
        secret_name: manifests::secret_name(&template.node_name(Role::Ps, 0)),
        metrics_port_base: template.metrics_port_base,
    };
    let nodes = initial_nodes(cfg.cluster.ps, cfg.cluster.workers, cfg.cluster.executors);
    let entries = manifests::secret_entries(&template);
    let secret = objects.secret(&entries, super::master_pod(namespace), true);
    let owner = owner_reference(
        "Secret",
        &objects.secret_name,
        "<uid the API server gives the Secret>",
    );
    let mut out = format!(
        "# elastrec run --dry-run: the Kubernetes objects of job `{job_id}` ({} PS, {} workers, \
         {} data executors at start); nothing was created.\n# A real start draws a new job uid \
         (here {job_uid}) and a token that no manifest contains.\n",
        cfg.cluster.ps, cfg.cluster.workers, cfg.cluster.executors
    );
    out.push_str("---\n");
    out.push_str(&serde_saphyr::to_string(&secret).context("writing the Secret as YAML")?);
    for node in &nodes {
        let pod = objects.pod(&template.spec(node), owner.clone());
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&pod).context("writing a pod as YAML")?);
    }
    // Nothing above may carry the token; the Secret has placeholders only.
    anyhow::ensure!(!out.contains(&token), "a manifest carries the job token");
    Ok(out)
}

/// The nodes a job starts with, numbered as the master numbers them: the PS first, then
/// the workers, then the data executors, from 1.
fn initial_nodes(ps: u32, workers: u32, executors: u32) -> Vec<Node> {
    let roles = (0..ps)
        .map(|i| (Role::Ps, i))
        .chain((0..workers).map(|i| (Role::Worker, i)))
        .chain((0..executors).map(|i| (Role::Executor, i)));
    roles
        .enumerate()
        .map(|(k, (role, index))| Node::pending(k as u32 + 1, role, index))
        .collect()
}

fn random_hex(n: usize) -> String {
    let mut rng = rand::rng();
    (0..n)
        .map(|_| format!("{:x}", rng.random_range(0..16u8)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_numbered_as_the_master_numbers_them() {
        let n = initial_nodes(2, 3, 1);
        let ids: Vec<(u32, Role, u32)> = n.iter().map(|n| (n.id, n.role, n.index)).collect();
        assert_eq!(
            ids,
            [
                (1, Role::Ps, 0),
                (2, Role::Ps, 1),
                (3, Role::Worker, 0),
                (4, Role::Worker, 1),
                (5, Role::Worker, 2),
                (6, Role::Executor, 0)
            ]
        );
    }

    #[test]
    fn the_yaml_shows_every_object_and_no_secret() {
        let mut cfg = JobConfig::default();
        cfg.cluster.ps = 1;
        cfg.cluster.workers = 2;
        cfg.cluster.executors = 1;
        cfg.cluster.master_port = 0;
        cfg.engine.kubernetes.image = "elastrec:test".into();
        cfg.data.dir = "/data/quickstart".into();
        cfg.output.dir = "/runs/quickstart".into();
        let volume = |name: &str, path: &str| elastrec_job::resources::Volume {
            name: name.into(),
            mount_path: path.into(),
            claim: name.into(),
            ..Default::default()
        };
        cfg.engine.kubernetes.volumes = vec![volume("data", "/data"), volume("runs", "/runs")];
        let yaml = render(&cfg, "ml").unwrap();
        assert_eq!(yaml.matches("\nkind: Pod\n").count(), 4, "{yaml}");
        // A data executor's pod reads its own role's token from the Secret.
        assert!(yaml.contains("key: executor.ELASTREC_TOKEN"), "{yaml}");
        assert_eq!(yaml.matches("\nkind: Secret\n").count(), 1, "{yaml}");
        assert!(yaml.contains("secretKeyRef"), "{yaml}");
        assert!(yaml.contains(manifests::REDACTED), "{yaml}");
        assert!(yaml.contains("<port bound at start>"), "{yaml}");
        assert!(yaml.contains("namespace: ml"), "{yaml}");
    }
}
