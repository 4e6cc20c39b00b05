//! The fake's kubelet: runs a created pod's container as a local process and reports its
//! life in the pod's status (Pending → Running → Succeeded/Failed), the way a node's
//! kubelet does: the image's program path maps to a local executable, `secretKeyRef`
//! reads the Secret, `fieldRef: status.podIP` is loopback.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, EnvVar, Pod, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::store::{key_of, now, Key};
use crate::Cluster;

/// The address every pod gets (they all run on this host).
pub const POD_IP: &str = "127.0.0.1";

/// A running pod's process.
pub struct Process {
    /// Its pid.
    pub pid: u32,
    /// Why a test hook killed it (`OOMKilled`, `Evicted`...): the status it ends with.
    pub killed_for: Option<String>,
}

/// Starts `pod` (already stored as Pending): resolves its environment, spawns its
/// command, and waits for it on the fake's runtime.
pub fn start(cluster: Arc<Cluster>, pod: Pod) {
    tokio::spawn(async move {
        let key = key_of(&pod.metadata);
        let env = match resolve_env(&cluster, &pod) {
            Ok(env) => env,
            Err(message) => {
                // As on a node: the container waits for what it references; the pod stays
                // Pending until someone fixes it or deletes the pod.
                set_state(
                    &cluster,
                    &key,
                    "Pending",
                    waiting("CreateContainerConfigError", &message),
                );
                return;
            }
        };
        let Some(program) = program_of(&cluster, &pod) else {
            let command = pod_command(&pod).unwrap_or_default();
            let message = format!("exec: \"{command}\": stat {command}: no such file or directory");
            set_state(
                &cluster,
                &key,
                "Failed",
                terminated("StartError", 128, Some(&message)),
            );
            return;
        };
        let container = &pod.spec.as_ref().expect("validated at create").containers[0];
        let log = cluster.log_dir.join(format!("{}-{}.log", key.0, key.1));
        let files = std::fs::File::create(&log).and_then(|f| Ok((f.try_clone()?, f)));
        let Ok((out, err)) = files else {
            set_state(
                &cluster,
                &key,
                "Failed",
                terminated("StartError", 128, Some("log file")),
            );
            return;
        };
        let mut command = tokio::process::Command::new(program);
        command
            .args(container.args.clone().unwrap_or_default())
            .env_clear()
            .envs(std::env::var_os("PATH").map(|p| ("PATH", p)))
            .envs(env)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true);
        let mut child = match command.spawn() {
            Ok(c) => c,
            Err(e) => {
                let message = e.to_string();
                set_state(
                    &cluster,
                    &key,
                    "Failed",
                    terminated("StartError", 128, Some(&message)),
                );
                return;
            }
        };
        let pid = child.id().unwrap_or(0);
        if !mark_running(&cluster, &key, pid) {
            // Deleted while it started.
            let _ = child.start_kill();
            let _ = child.wait().await;
            return;
        }
        let status = child.wait().await;
        let killed_for = cluster
            .processes
            .lock()
            .remove(&key)
            .and_then(|p| p.killed_for);
        let code = match status {
            Ok(st) => {
                use std::os::unix::process::ExitStatusExt;
                st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(9))
            }
            Err(_) => 255,
        };
        mark_ended(&cluster, &key, code, killed_for.as_deref());
    });
}

/// Shows how the pod's process ended: as a test hook's reason when it killed it, else
/// by its exit code.
fn mark_ended(cluster: &Cluster, key: &Key, code: i32, killed_for: Option<&str>) {
    let mut s = cluster.store.lock();
    let Some(pod) = s.pods.get_mut(key) else {
        return;
    };
    let (phase, state) = match killed_for {
        Some("Evicted") => {
            let st = pod.status.get_or_insert_with(Default::default);
            st.reason = Some("Evicted".into());
            st.message = Some("The node was low on resource: memory.".into());
            ("Failed", terminated("Error", code, None))
        }
        Some(reason) => ("Failed", terminated(reason, code, None)),
        None if code == 0 => ("Succeeded", terminated("Completed", 0, None)),
        None => ("Failed", terminated("Error", code, None)),
    };
    update_status(cluster, &mut s, key, phase, state);
}

/// Records the pod's process and shows it Running; false when the pod is gone.
fn mark_running(cluster: &Cluster, key: &Key, pid: u32) -> bool {
    let mut s = cluster.store.lock();
    if !s.pods.contains_key(key) {
        return false;
    }
    cluster.processes.lock().insert(
        key.clone(),
        Process {
            pid,
            killed_for: None,
        },
    );
    let running = ContainerState {
        running: Some(ContainerStateRunning {
            started_at: Some(Time(now())),
        }),
        ..Default::default()
    };
    update_status(cluster, &mut s, key, "Running", running);
    true
}

/// The local executable for the pod's command (its first word, a path in the image).
fn program_of(cluster: &Cluster, pod: &Pod) -> Option<PathBuf> {
    cluster.programs.get(&pod_command(pod)?).cloned()
}

fn pod_command(pod: &Pod) -> Option<String> {
    pod.spec
        .as_ref()?
        .containers
        .first()?
        .command
        .as_ref()?
        .first()
        .cloned()
}

/// The container's environment with every reference resolved, or why it cannot be.
fn resolve_env(cluster: &Cluster, pod: &Pod) -> Result<HashMap<String, String>, String> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let container = &pod.spec.as_ref().ok_or("no spec")?.containers[0];
    let mut env = HashMap::new();
    for EnvVar {
        name,
        value,
        value_from,
    } in container.env.clone().unwrap_or_default()
    {
        let v = match (value, value_from) {
            (_, Some(from)) => {
                if let Some(r) = from.secret_key_ref {
                    let store = cluster.store.lock();
                    let secret = store
                        .secrets
                        .get(&(ns.clone(), r.name.clone()))
                        .ok_or_else(|| format!("secret \"{}\" not found", r.name))?;
                    let bytes = secret
                        .data
                        .as_ref()
                        .and_then(|d| d.get(&r.key))
                        .ok_or_else(|| {
                            format!("couldn't find key {} in Secret {ns}/{}", r.key, r.name)
                        })?;
                    String::from_utf8(bytes.0.clone()).map_err(|e| e.to_string())?
                } else if let Some(f) = from.field_ref {
                    match f.field_path.as_str() {
                        "status.podIP" | "status.hostIP" => POD_IP.to_string(),
                        "metadata.name" => pod.metadata.name.clone().unwrap_or_default(),
                        "metadata.namespace" => ns.clone(),
                        "metadata.uid" => pod.metadata.uid.clone().unwrap_or_default(),
                        other => return Err(format!("the fake does not resolve fieldRef {other}")),
                    }
                } else {
                    return Err(format!(
                        "the fake resolves only secretKeyRef and fieldRef ({name})"
                    ));
                }
            }
            (Some(v), None) => v,
            (None, None) => String::new(),
        };
        env.insert(name, v);
    }
    Ok(env)
}

fn waiting(reason: &str, message: &str) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.into()),
            message: Some(message.into()),
        }),
        ..Default::default()
    }
}

fn terminated(reason: &str, exit_code: i32, message: Option<&str>) -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            reason: Some(reason.into()),
            exit_code,
            message: message.map(str::to_string),
            finished_at: Some(Time(now())),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn set_state(cluster: &Cluster, key: &Key, phase: &str, state: ContainerState) {
    let mut s = cluster.store.lock();
    if s.pods.contains_key(key) {
        update_status(cluster, &mut s, key, phase, state);
    }
}

/// Sets the pod's phase and its one container's state, and tells the watches.
fn update_status(
    cluster: &Cluster,
    s: &mut crate::store::Store,
    key: &Key,
    phase: &str,
    state: ContainerState,
) {
    let Some(mut pod) = s.pods.get(key).cloned() else {
        return;
    };
    let name = pod
        .spec
        .as_ref()
        .and_then(|p| p.containers.first())
        .map(|c| c.name.clone())
        .unwrap_or_default();
    let status = pod.status.get_or_insert_with(PodStatus::default);
    status.phase = Some(phase.into());
    status.pod_ip = Some(POD_IP.into());
    status.host_ip = Some(POD_IP.into());
    status.container_statuses = Some(vec![ContainerStatus {
        name,
        ready: state.running.is_some(),
        state: Some(state),
        ..Default::default()
    }]);
    let event = s.pod_changed("MODIFIED", pod);
    let _ = cluster.events.send(event);
}
