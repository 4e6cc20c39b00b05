//! Pure manifest generation: the job's Secret and one pod per node, from a [`LaunchSpec`]
//! and `[engine.kubernetes]`. No I/O here, so the dry run prints exactly what the backend
//! would create, and unit tests check every field that matters on a cluster.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use elastrec_job::resources::{KubernetesConfig, ADVERTISE_ENV, BIND_ENV};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HostPathVolumeSource, LocalObjectReference, ObjectFieldSelector,
    PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec, ResourceRequirements,
    SeccompProfile, Secret, SecretKeySelector, SecurityContext, Toleration, Volume, VolumeMount,
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
    for (i, t) in cfg.tolerations.iter().enumerate() {
        let at = format!("engine.kubernetes.tolerations[{i}]");
        anyhow::ensure!(
            ["", "Equal", "Exists"].contains(&t.operator.as_str()),
            "{at}.operator `{}` is neither `Equal` nor `Exists`",
            t.operator
        );
        anyhow::ensure!(
            TAINT_EFFECTS.contains(&t.effect.as_str()),
            "{at}.effect `{}` is none of {TAINT_EFFECTS:?}",
            t.effect
        );
        anyhow::ensure!(
            t.operator != "Exists" || t.value.is_empty(),
            "{at}: `Exists` takes no value"
        );
        anyhow::ensure!(
            t.toleration_seconds.is_none() || t.effect == "NoExecute",
            "{at}.toleration_seconds goes with effect = \"NoExecute\" only"
        );
    }
    let mut names = std::collections::HashSet::new();
    for (i, v) in cfg.volumes.iter().enumerate() {
        let at = format!("engine.kubernetes.volumes[{i}]");
        anyhow::ensure!(
            is_dns_label(&v.name),
            "{at}.name `{}` must be a DNS label (lowercase letters, digits and `-`, at most \
             63, starting and ending with a letter or digit)",
            v.name
        );
        anyhow::ensure!(
            names.insert(&v.name),
            "{at}: two volumes are named `{}`",
            v.name
        );
        anyhow::ensure!(
            v.mount_path.starts_with('/'),
            "{at}.mount_path `{}` must be an absolute path",
            v.mount_path
        );
        let sources = [!v.claim.is_empty(), !v.host_path.is_empty(), v.empty_dir];
        anyhow::ensure!(
            sources.iter().filter(|&&s| s).count() == 1,
            "{at} (`{}`) needs exactly one source: claim = \"PVC\", host_path = \"/dir\" or \
             empty_dir = true",
            v.name
        );
        anyhow::ensure!(
            v.empty_dir || (v.medium.is_empty() && v.size.is_empty()),
            "{at}: medium and size go with empty_dir = true"
        );
        anyhow::ensure!(
            ["", "Memory"].contains(&v.medium.as_str()),
            "{at}.medium `{}` is neither empty (the node's disk) nor `Memory`",
            v.medium
        );
        anyhow::ensure!(
            v.host_path.is_empty() || !cfg.restricted,
            "{at}: a hostPath volume is not allowed under the \"restricted\" Pod Security \
             profile; use a PersistentVolumeClaim (claim = \"...\"), or set \
             engine.kubernetes.restricted = false where the namespace allows it"
        );
    }
    Ok(())
}

/// The effects a toleration names (empty: every effect).
pub const TAINT_EFFECTS: [&str; 4] = ["", "NoSchedule", "PreferNoSchedule", "NoExecute"];

/// An RFC 1123 label, as Kubernetes names volumes.
fn is_dns_label(s: &str) -> bool {
    let ok = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && ok(b[0])
        && ok(b[b.len() - 1])
        && b.iter().all(|&c| ok(c) || c == b'-')
}

/// Refuses a job whose pods would need a directory only the master's own disk has: the
/// data files (`data.dir`) and a local checkpoint directory must each lie under a volume
/// mounted into the pods (`[[engine.kubernetes.volumes]]`) at the same path.
pub fn check_paths(job: &elastrec_job::config::JobConfig) -> anyhow::Result<()> {
    let mounted = |path: &Path| {
        job.engine
            .kubernetes
            .volumes
            .iter()
            .any(|v| path.starts_with(&v.mount_path))
    };
    let mut needed: Vec<(&str, PathBuf)> = Vec::new();
    if !job.data.train.is_empty() || !job.data.eval.is_empty() {
        needed.push(("data.dir", job.data.dir.clone()));
    }
    let location = &job.checkpoint.location;
    if job.checkpoint.enabled && !location.contains("://") {
        // Empty: `<output.dir>/checkpoints` (a loaded job file has it resolved).
        let dir = if location.is_empty() {
            job.output.dir.join("checkpoints")
        } else {
            PathBuf::from(location)
        };
        needed.push(("checkpoint.location", dir));
    }
    for (what, path) in needed {
        anyhow::ensure!(
            mounted(&path),
            "{what} {} is on the master's disk, which no pod sees: mount the volume that holds \
             it into the pods at the same path ([[engine.kubernetes.volumes]] with \
             mount_path = \"{}\" and claim = \"YOUR-PVC\"), or use s3:// (checkpoints, \
             datasets)",
            path.display(),
            path.display()
        );
    }
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
    /// `cluster.node_metrics_port_base` (0: ports chosen at start, so none to announce).
    pub metrics_port_base: u16,
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
        let metrics_port = self.metrics_port(spec.node);
        Pod {
            metadata: ObjectMeta {
                name: Some(spec.name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some(labels),
                annotations: metrics_port.map(scrape_annotations),
                owner_references: Some(vec![owner]),
                ..Default::default()
            },
            spec: Some(PodSpec {
                // A dead node is replaced by the master (a new node, a new pod), never
                // restarted in place: the master decides, with the job's whole state.
                restart_policy: Some("Never".into()),
                service_account_name: non_empty(&self.cfg.service_account),
                node_selector: (!self.cfg.node_selector.is_empty())
                    .then(|| self.cfg.node_selector.clone()),
                tolerations: (!self.cfg.tolerations.is_empty()).then(|| self.tolerations()),
                image_pull_secrets: (!self.cfg.image_pull_secrets.is_empty()).then(|| {
                    self.cfg
                        .image_pull_secrets
                        .iter()
                        .map(|name| LocalObjectReference { name: name.clone() })
                        .collect()
                }),
                priority_class_name: non_empty(&self.cfg.priority_class),
                security_context: self.cfg.restricted.then(|| PodSecurityContext {
                    run_as_non_root: Some(true),
                    run_as_user: Some(self.cfg.run_as_user),
                    seccomp_profile: Some(SeccompProfile {
                        type_: "RuntimeDefault".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                volumes: (!self.cfg.volumes.is_empty()).then(|| self.volumes()),
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
                    volume_mounts: (!self.cfg.volumes.is_empty()).then(|| {
                        self.cfg
                            .volumes
                            .iter()
                            .map(|v| VolumeMount {
                                name: v.name.clone(),
                                mount_path: v.mount_path.clone(),
                                read_only: v.read_only.then_some(true),
                                ..Default::default()
                            })
                            .collect()
                    }),
                    security_context: self.cfg.restricted.then(restricted_container),
                    ports: metrics_port.map(|port| {
                        vec![ContainerPort {
                            name: Some("metrics".into()),
                            container_port: i32::from(port),
                            ..Default::default()
                        }]
                    }),
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

    /// `[[engine.kubernetes.tolerations]]` as Kubernetes writes them.
    fn tolerations(&self) -> Vec<Toleration> {
        self.cfg
            .tolerations
            .iter()
            .map(|t| Toleration {
                key: non_empty(&t.key),
                operator: non_empty(&t.operator),
                value: non_empty(&t.value),
                effect: non_empty(&t.effect),
                toleration_seconds: t.toleration_seconds,
            })
            .collect()
    }

    /// `[[engine.kubernetes.volumes]]` as pod volumes.
    fn volumes(&self) -> Vec<Volume> {
        self.cfg
            .volumes
            .iter()
            .map(|v| Volume {
                name: v.name.clone(),
                persistent_volume_claim: (!v.claim.is_empty()).then(|| {
                    PersistentVolumeClaimVolumeSource {
                        claim_name: v.claim.clone(),
                        read_only: v.read_only.then_some(true),
                    }
                }),
                host_path: (!v.host_path.is_empty()).then(|| HostPathVolumeSource {
                    path: v.host_path.clone(),
                    type_: Some("Directory".into()),
                }),
                empty_dir: v.empty_dir.then(|| EmptyDirVolumeSource {
                    medium: non_empty(&v.medium),
                    size_limit: non_empty(&v.size).map(Quantity),
                }),
                ..Default::default()
            })
            .collect()
    }

    /// Node `node`'s fixed `/metrics` port, if the job fixes them
    /// (`cluster.node_metrics_port_base`).
    fn metrics_port(&self, node: u32) -> Option<u16> {
        (self.metrics_port_base > 0)
            .then(|| u16::try_from(u32::from(self.metrics_port_base) + node).ok())
            .flatten()
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

/// A container under the "restricted" Pod Security profile: no privilege escalation,
/// no capability, not root, the runtime's default seccomp profile.
fn restricted_container() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Default::default()
        }),
        run_as_non_root: Some(true),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The annotations by which Prometheus' Kubernetes pod discovery (the common
/// `prometheus.io/*` relabelling of its example configuration) scrapes a node's
/// `/metrics` on `port`.
fn scrape_annotations(port: u16) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("prometheus.io/scrape".to_string(), "true".to_string()),
        ("prometheus.io/port".to_string(), port.to_string()),
        ("prometheus.io/path".to_string(), "/metrics".to_string()),
    ])
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
            metrics_port_base: 0,
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

    /// With fixed node ports a pod tells Prometheus where its metrics are; with ports
    /// chosen at start it says nothing it cannot know.
    #[test]
    fn a_pod_with_a_fixed_metrics_port_announces_it_to_prometheus() {
        let owner = owner_reference("Secret", "s", "uid-1");
        let plain = objects().pod(&spec(), owner.clone());
        assert_eq!(plain.metadata.annotations, None);
        assert_eq!(plain.spec.unwrap().containers[0].ports, None);
        let fixed = JobObjects {
            metrics_port_base: 9400,
            ..objects()
        };
        let pod = fixed.pod(&spec(), owner);
        let a = pod.metadata.annotations.clone().unwrap();
        assert_eq!(a["prometheus.io/scrape"], "true");
        assert_eq!(a["prometheus.io/port"], "9407", "node 7");
        assert_eq!(a["prometheus.io/path"], "/metrics");
        let ports = pod.spec.unwrap().containers[0].ports.clone().unwrap();
        assert_eq!(
            (ports[0].name.as_deref(), ports[0].container_port),
            (Some("metrics"), 9407)
        );
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

    /// The pod runs under the "restricted" profile by default, on the nodes, with the
    /// tolerations, registry credentials, priority and volumes the job file names.
    #[test]
    fn a_pod_runs_restricted_with_the_scheduling_and_volumes_of_the_job_file() {
        let mut o = objects();
        o.cfg.node_selector = BTreeMap::from([("pool".to_string(), "training".to_string())]);
        o.cfg.tolerations = vec![elastrec_job::resources::Toleration {
            key: "gpu".into(),
            operator: "Exists".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        }];
        o.cfg.image_pull_secrets = vec!["registry".into()];
        o.cfg.priority_class = "batch-low".into();
        o.cfg.volumes = vec![
            elastrec_job::resources::Volume {
                name: "data".into(),
                mount_path: "/data".into(),
                read_only: true,
                claim: "criteo".into(),
                ..Default::default()
            },
            elastrec_job::resources::Volume {
                name: "shm".into(),
                mount_path: "/dev/shm".into(),
                empty_dir: true,
                medium: "Memory".into(),
                size: "2Gi".into(),
                ..Default::default()
            },
        ];
        check_config(&o.cfg).unwrap();
        let pod = o.pod(&spec(), owner_reference("Secret", "s", "uid-1"));
        let ps = pod.spec.unwrap();
        assert_eq!(ps.node_selector.unwrap()["pool"], "training");
        let t = &ps.tolerations.unwrap()[0];
        assert_eq!(
            (t.key.as_deref(), t.operator.as_deref(), t.value.as_deref()),
            (Some("gpu"), Some("Exists"), None)
        );
        assert_eq!(ps.image_pull_secrets.unwrap()[0].name, "registry");
        assert_eq!(ps.priority_class_name.as_deref(), Some("batch-low"));
        let sc = ps.security_context.unwrap();
        assert_eq!(
            (sc.run_as_non_root, sc.run_as_user),
            (Some(true), Some(65532))
        );
        assert_eq!(sc.seccomp_profile.unwrap().type_, "RuntimeDefault");
        let c = &ps.containers[0];
        let csc = c.security_context.clone().unwrap();
        assert_eq!(csc.allow_privilege_escalation, Some(false));
        assert_eq!(
            csc.capabilities.unwrap().drop,
            Some(vec!["ALL".to_string()])
        );
        let volumes = ps.volumes.unwrap();
        let claim = volumes[0].persistent_volume_claim.as_ref().unwrap();
        assert_eq!(
            (claim.claim_name.as_str(), claim.read_only),
            ("criteo", Some(true))
        );
        let shm = volumes[1].empty_dir.as_ref().unwrap();
        assert_eq!(shm.medium.as_deref(), Some("Memory"));
        assert_eq!(shm.size_limit.as_ref().unwrap().0, "2Gi");
        let mounts = c.volume_mounts.clone().unwrap();
        assert_eq!(
            mounts
                .iter()
                .map(|m| (m.name.as_str(), m.mount_path.as_str(), m.read_only))
                .collect::<Vec<_>>(),
            [("data", "/data", Some(true)), ("shm", "/dev/shm", None)]
        );
        // Not restricted: no security context of ours.
        o.cfg.restricted = false;
        let pod = o.pod(&spec(), owner_reference("Secret", "s", "uid-1"));
        let ps = pod.spec.unwrap();
        assert!(ps.security_context.is_none() && ps.containers[0].security_context.is_none());
    }

    #[test]
    fn bad_scheduling_and_volume_settings_are_refused_naming_the_field() {
        let base = KubernetesConfig {
            image: "x".into(),
            ..Default::default()
        };
        let refused = |cfg: KubernetesConfig, want: &str| {
            let err = check_config(&cfg).unwrap_err().to_string();
            assert!(err.contains(want), "{want:?} not in {err}");
        };
        let toleration = |operator: &str, effect: &str| elastrec_job::resources::Toleration {
            key: "k".into(),
            operator: operator.into(),
            effect: effect.into(),
            ..Default::default()
        };
        refused(
            KubernetesConfig {
                tolerations: vec![toleration("Maybe", "")],
                ..base.clone()
            },
            "tolerations[0].operator",
        );
        refused(
            KubernetesConfig {
                tolerations: vec![toleration("Exists", "NoWay")],
                ..base.clone()
            },
            "tolerations[0].effect",
        );
        let volume = |name: &str, path: &str| elastrec_job::resources::Volume {
            name: name.into(),
            mount_path: path.into(),
            claim: "pvc".into(),
            ..Default::default()
        };
        refused(
            KubernetesConfig {
                volumes: vec![volume("Data", "/data")],
                ..base.clone()
            },
            "volumes[0].name",
        );
        refused(
            KubernetesConfig {
                volumes: vec![volume("data", "data")],
                ..base.clone()
            },
            "must be an absolute path",
        );
        refused(
            KubernetesConfig {
                volumes: vec![volume("a", "/a"), volume("a", "/b")],
                ..base.clone()
            },
            "two volumes are named `a`",
        );
        let mut two_sources = volume("a", "/a");
        two_sources.empty_dir = true;
        refused(
            KubernetesConfig {
                volumes: vec![two_sources],
                ..base.clone()
            },
            "exactly one source",
        );
        let host = elastrec_job::resources::Volume {
            name: "h".into(),
            mount_path: "/h".into(),
            host_path: "/mnt/h".into(),
            ..Default::default()
        };
        refused(
            KubernetesConfig {
                volumes: vec![host.clone()],
                ..base.clone()
            },
            "restricted",
        );
        check_config(&KubernetesConfig {
            volumes: vec![host],
            restricted: false,
            ..base
        })
        .unwrap();
    }

    /// Data and a local checkpoint directory must reach the pods through a volume.
    #[test]
    fn a_job_whose_files_only_the_master_sees_is_refused() {
        let mut job = elastrec_job::config::JobConfig::default();
        job.data.dir = "/data/criteo".into();
        job.data.train = vec!["day_0.tsv".into()];
        job.checkpoint.enabled = true;
        job.checkpoint.location = "/runs/j/checkpoints".into();
        let err = check_paths(&job).unwrap_err().to_string();
        assert!(
            err.contains("data.dir /data/criteo") && err.contains("mount_path"),
            "{err}"
        );
        job.engine.kubernetes.volumes = vec![elastrec_job::resources::Volume {
            name: "data".into(),
            mount_path: "/data".into(),
            claim: "criteo".into(),
            ..Default::default()
        }];
        let err = check_paths(&job).unwrap_err().to_string();
        assert!(
            err.contains("checkpoint.location /runs/j/checkpoints"),
            "{err}"
        );
        job.checkpoint.location = "s3://bucket/j".into();
        check_paths(&job).unwrap();
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
