//! Pure manifest generation: the job's Secret and one pod per node, from a [`LaunchSpec`]
//! and `[engine.kubernetes]`. No I/O here, so the dry run prints exactly what the backend
//! would create, and unit tests check every field that matters on a cluster.

use std::collections::BTreeMap;

use elastrec_job::resources::{KubernetesConfig, ADVERTISE_ENV, BIND_ENV};
use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, ObjectFieldSelector, Pod, PodSpec, ResourceRequirements,
    Secret, SecretKeySelector,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::ByteString;

use crate::job::Role;
use crate::launch::{role_name, LaunchSpec};

/// `app.kubernetes.io/name`: what the objects are.
pub const NAME_LABEL: &str = "app.kubernetes.io/name";
/// `app.kubernetes.io/managed-by`: who creates and deletes them.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The job's unique id: selects every object of one job (and no other job's).
pub const JOB_UID_LABEL: &str = "elastrec.io/job-uid";
/// `ps` or `worker`.
pub const ROLE_LABEL: &str = "elastrec.io/role";
/// The node id the master knows the pod by.
pub const NODE_LABEL: &str = "elastrec.io/node";

/// Image pull policies Kubernetes accepts.
pub const PULL_POLICIES: [&str; 3] = ["Always", "IfNotPresent", "Never"];

/// What a Secret value shows in a dry run: the real values exist only once a job starts.
pub const REDACTED: &str = "<generated at job start; never printed>";

/// The label selector of every pod and Secret of the job `job_uid`.
pub fn job_selector(job_uid: &str) -> String {
    format!("{JOB_UID_LABEL}={job_uid}")
}

/// The node id a pod of ours runs, from its label.
pub fn node_of(pod: &Pod) -> Option<u32> {
    pod.metadata.labels.as_ref()?.get(NODE_LABEL)?.parse().ok()
}

/// The owner the job's pods point at, so that the cluster's garbage collector deletes
/// them with it (even when the master dies and never cleans up).
pub fn owner_reference(kind: &str, name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
        ..Default::default()
    }
}

/// Checks the settings a pod cannot start without, naming the field at fault.
pub fn check_config(cfg: &KubernetesConfig) -> anyhow::Result<()> {
    anyhow::ensure!(
        !cfg.image.is_empty(),
        "engine.kubernetes.image is required with --backend kubernetes: the container image \
         holding the elastrec binary (at engine.kubernetes.program = `{}`)",
        cfg.program
    );
    anyhow::ensure!(
        !cfg.program.is_empty(),
        "engine.kubernetes.program must name the elastrec executable inside the image"
    );
    anyhow::ensure!(
        cfg.image_pull_policy.is_empty() || PULL_POLICIES.contains(&cfg.image_pull_policy.as_str()),
        "engine.kubernetes.image_pull_policy `{}` is none of {PULL_POLICIES:?}",
        cfg.image_pull_policy
    );
    Ok(())
}

/// Everything the manifests of one job share.
#[derive(Debug, Clone)]
pub struct JobObjects {
    /// `[engine.kubernetes]`.
    pub cfg: KubernetesConfig,
    /// Namespace of every object.
    pub namespace: String,
    /// The job's unique id.
    pub job_uid: String,
    /// Name of the job's Secret.
    pub secret_name: String,
}

impl JobObjects {
    /// Labels of every object of the job: the configured ones, then ours (which win).
    pub fn labels(&self) -> BTreeMap<String, String> {
        let mut labels = self.cfg.labels.clone();
        labels.insert(NAME_LABEL.into(), "elastrec".into());
        labels.insert(MANAGED_BY_LABEL.into(), "elastrec".into());
        labels.insert(JOB_UID_LABEL.into(), self.job_uid.clone());
        labels
    }

    /// The Secret holding every secret environment entry of the nodes (the job token, TLS
    /// material): pods read them through `secretKeyRef`, so no pod spec carries a secret.
    /// `owner` is the master's pod when the master runs in one. With `redact`, values are
    /// placeholders in `stringData` (what a dry run prints).
    pub fn secret(
        &self,
        entries: &[(String, String)],
        owner: Option<OwnerReference>,
        redact: bool,
    ) -> Secret {
        let mut secret = Secret {
            metadata: ObjectMeta {
                name: Some(self.secret_name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some(self.labels()),
                owner_references: owner.map(|o| vec![o]),
                ..Default::default()
            },
            type_: Some("Opaque".into()),
            ..Default::default()
        };
        if redact {
            secret.string_data = Some(
                entries
                    .iter()
                    .map(|(k, _)| (k.clone(), REDACTED.to_string()))
                    .collect(),
            );
        } else {
            secret.data = Some(
                entries
                    .iter()
                    .map(|(k, v)| (k.clone(), ByteString(v.clone().into_bytes())))
                    .collect(),
            );
        }
        secret
    }

    /// The pod of one node. `owner` is the job's Secret: deleting it (or the master's pod
    /// that owns it) deletes every pod of the job.
    pub fn pod(&self, spec: &LaunchSpec, owner: OwnerReference) -> Pod {
        let role = role_name(spec.role);
        let mut labels = self.labels();
        labels.insert(ROLE_LABEL.into(), role.into());
        labels.insert(NODE_LABEL.into(), spec.node.to_string());
        let quantities = BTreeMap::from([
            (
                "cpu".to_string(),
                Quantity(format!("{}m", millicores(spec.cpu))),
            ),
            (
                "memory".to_string(),
                Quantity(format!("{}Mi", spec.memory_mib)),
            ),
        ]);
        Pod {
            metadata: ObjectMeta {
                name: Some(spec.name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some(labels),
                owner_references: Some(vec![owner]),
                ..Default::default()
            },
            spec: Some(PodSpec {
                // A dead node is replaced by the master (a new node, a new pod), never
                // restarted in place: the master decides, with the job's whole state.
                restart_policy: Some("Never".into()),
                service_account_name: non_empty(&self.cfg.service_account),
                // Nodes talk to the master, never to the Kubernetes API.
                automount_service_account_token: Some(false),
                // Service links would add an environment variable per service in the
                // namespace to a process that reads none of them.
                enable_service_links: Some(false),
                containers: vec![Container {
                    name: role.into(),
                    image: Some(self.cfg.image.clone()),
                    image_pull_policy: non_empty(&self.cfg.image_pull_policy),
                    command: Some(vec![self.cfg.program.clone()]),
                    args: Some(spec.args.clone()),
                    env: Some(self.env(spec)),
                    resources: Some(ResourceRequirements {
                        requests: Some(quantities.clone()),
                        limits: Some(quantities),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The plain environment of the spec, each secret entry as a reference into the job's
    /// Secret, and the network settings of a pod: bind every interface of the pod and
    /// advertise the pod's IP (from the downward API).
    fn env(&self, spec: &LaunchSpec) -> Vec<EnvVar> {
        let ours = [ADVERTISE_ENV, BIND_ENV];
        let mut env: Vec<EnvVar> = spec
            .env
            .iter()
            .filter(|(k, _)| !ours.contains(&k.as_str()))
            .filter(|(k, _)| !spec.secret_env.iter().any(|(s, _)| s == k))
            .map(|(k, v)| EnvVar {
                name: k.clone(),
                value: Some(v.clone()),
                ..Default::default()
            })
            .collect();
        env.extend(spec.secret_env.iter().map(|(k, _)| EnvVar {
            name: k.clone(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: self.secret_name.clone(),
                    key: secret_key(spec.role, k),
                    optional: Some(false),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }));
        env.push(EnvVar {
            name: ADVERTISE_ENV.into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "status.podIP".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        env.push(EnvVar {
            name: BIND_ENV.into(),
            value: Some("0.0.0.0".into()),
            ..Default::default()
        });
        env
    }
}

/// Cores as Kubernetes millicores (at least 1m).
fn millicores(cpu: f64) -> u64 {
    ((cpu * 1000.0).round() as u64).max(1)
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

/// The name of the job's Secret: the node names' job part (`elastrec-<job>-<uid8>`).
/// The Secret's key of a node's secret variable `env`: per role, since each role has its
/// own token (`ps.ELASTREC_TOKEN`, `worker.ELASTREC_TOKEN`; a data executor holds a
/// worker's token under `executor.ELASTREC_TOKEN`).
pub fn secret_key(role: Role, env: &str) -> String {
    format!("{}.{env}", crate::launch::role_name(role))
}

/// The secret entries of every role, keyed by [`secret_key`]: what the job's Secret holds.
pub fn secret_entries(template: &crate::launch::LaunchTemplate) -> Vec<(String, String)> {
    [Role::Ps, Role::Worker, Role::Executor]
        .into_iter()
        .flat_map(|role| {
            template
                .spec(&probe_node(role))
                .secret_env
                .into_iter()
                .map(move |(k, v)| (secret_key(role, &k), v))
        })
        .collect()
}

/// A node of `role` that only serves to list what its role's pods get.
pub fn probe_node(role: Role) -> crate::job::Node {
    crate::job::Node::pending(0, role, 0)
}

pub fn secret_name(node_name_of_ps_0: &str) -> String {
    let stem = node_name_of_ps_0
        .strip_suffix("-ps-0")
        .unwrap_or(node_name_of_ps_0);
    format!("{stem}-secret")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn objects() -> JobObjects {
        JobObjects {
            cfg: KubernetesConfig {
                image: "registry.example/elastrec:1".into(),
                service_account: "trainer".into(),
                labels: BTreeMap::from([
                    ("team".to_string(), "ads".to_string()),
                    (JOB_UID_LABEL.to_string(), "spoofed".to_string()),
                ]),
                ..Default::default()
            },
            namespace: "ml".into(),
            job_uid: "0123456789abcdef".into(),
            secret_name: "elastrec-j-01234567-secret".into(),
        }
    }

    fn spec() -> LaunchSpec {
        LaunchSpec {
            node: 7,
            role: Role::Worker,
            name: "elastrec-j-01234567-worker-7".into(),
            program: "/home/me/elastrec".into(),
            args: vec!["worker".into(), "--node-id".into(), "7".into()],
            env: vec![
                ("ELASTREC_MASTER".into(), "10.0.0.1:5000".into()),
                (ADVERTISE_ENV.into(), "10.9.9.9".into()),
            ],
            secret_env: vec![("ELASTREC_TOKEN".into(), "s3cr3t-token".into())],
            cpu: 1.5,
            memory_mib: 3072,
            log: "/tmp/x.log".into(),
        }
    }

    #[test]
    fn a_pod_carries_labels_owner_resources_and_no_secret() {
        let o = objects();
        let owner = owner_reference("Secret", &o.secret_name, "uid-1");
        let pod = o.pod(&spec(), owner.clone());
        let labels = pod.metadata.labels.clone().unwrap();
        assert_eq!(labels[NAME_LABEL], "elastrec");
        assert_eq!(labels[MANAGED_BY_LABEL], "elastrec");
        assert_eq!(labels[JOB_UID_LABEL], "0123456789abcdef", "ours win");
        assert_eq!(labels[ROLE_LABEL], "worker");
        assert_eq!(labels[NODE_LABEL], "7");
        assert_eq!(labels["team"], "ads");
        assert_eq!(node_of(&pod), Some(7));
        assert_eq!(pod.metadata.owner_references, Some(vec![owner]));
        let ps = pod.spec.as_ref().unwrap();
        assert_eq!(ps.restart_policy.as_deref(), Some("Never"));
        assert_eq!(ps.service_account_name.as_deref(), Some("trainer"));
        let c = &ps.containers[0];
        assert_eq!(c.command, Some(vec!["/usr/local/bin/elastrec".to_string()]));
        assert_eq!(c.image.as_deref(), Some("registry.example/elastrec:1"));
        let r = c.resources.as_ref().unwrap();
        for q in [r.requests.as_ref().unwrap(), r.limits.as_ref().unwrap()] {
            assert_eq!(q["cpu"].0, "1500m");
            assert_eq!(q["memory"].0, "3072Mi");
        }
        let env = c.env.as_ref().unwrap();
        let get = |n: &str| env.iter().find(|e| e.name == n).unwrap();
        let token = get("ELASTREC_TOKEN").value_from.as_ref().unwrap();
        let key = token.secret_key_ref.as_ref().unwrap();
        assert_eq!(
            (key.name.as_str(), key.key.as_str()),
            ("elastrec-j-01234567-secret", "worker.ELASTREC_TOKEN")
        );
        let ip = get(ADVERTISE_ENV).value_from.as_ref().unwrap();
        assert_eq!(ip.field_ref.as_ref().unwrap().field_path, "status.podIP");
        assert_eq!(
            env.iter().filter(|e| e.name == ADVERTISE_ENV).count(),
            1,
            "the pod IP replaces a template's address"
        );
        assert_eq!(get(BIND_ENV).value.as_deref(), Some("0.0.0.0"));
        assert_eq!(
            get("ELASTREC_MASTER").value.as_deref(),
            Some("10.0.0.1:5000")
        );
        let text = serde_json::to_string(&pod).unwrap();
        assert!(!text.contains("s3cr3t-token"), "{text}");
    }

    #[test]
    fn the_secret_holds_the_values_or_placeholders() {
        let o = objects();
        let entries = [("ELASTREC_TOKEN".to_string(), "s3cr3t-token".to_string())];
        let s = o.secret(&entries, None, false);
        assert_eq!(s.data.unwrap()["ELASTREC_TOKEN"].0, b"s3cr3t-token");
        assert_eq!(
            s.metadata.labels.unwrap()[JOB_UID_LABEL],
            "0123456789abcdef"
        );
        assert!(s.metadata.owner_references.is_none());
        let master = owner_reference("Pod", "master-abc", "uid-m");
        let shown = o.secret(&entries, Some(master.clone()), true);
        assert!(shown.data.is_none());
        assert_eq!(shown.string_data.unwrap()["ELASTREC_TOKEN"], REDACTED);
        assert_eq!(shown.metadata.owner_references, Some(vec![master]));
    }

    #[test]
    fn config_errors_name_the_field() {
        let err = check_config(&KubernetesConfig::default()).unwrap_err();
        assert!(err.to_string().contains("engine.kubernetes.image"), "{err}");
        let cfg = KubernetesConfig {
            image: "x".into(),
            image_pull_policy: "Sometimes".into(),
            ..Default::default()
        };
        let err = check_config(&cfg).unwrap_err();
        assert!(err.to_string().contains("image_pull_policy"), "{err}");
        assert_eq!(
            secret_name("elastrec-j-01234567-ps-0"),
            "elastrec-j-01234567-secret"
        );
        assert_eq!(millicores(0.0001), 1);
    }
}
