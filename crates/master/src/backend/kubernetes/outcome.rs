//! How a pod's status reads as the end of a node: the engine's reason in words, and
//! whether the kernel killed it for its memory. Pure, so every termination the kubelet
//! reports is unit-tested here rather than on a cluster.

use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod};

/// A pod whose node no longer runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Ended {
    /// The engine's words: `OOMKilled (exit code 137)`, `Evicted: ...`.
    pub reason: String,
    /// Killed for exceeding its memory limit.
    pub oom: bool,
    /// Ended by itself with exit code 0 (a worker leaving at the end of the job).
    pub clean: bool,
}

/// Waiting reasons after which a container never starts without someone changing the
/// image, the Secret or the pod: the master replaces the node instead of waiting forever.
const FATAL_WAITING: [&str; 5] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
];

/// The end of the node in `pod`, if its status says it ended (or cannot ever start).
pub fn ended(pod: &Pod) -> Option<Ended> {
    let status = pod.status.as_ref()?;
    let phase = status.phase.as_deref().unwrap_or("Pending");
    let container = status.container_statuses.as_ref().and_then(|c| c.first());
    let state = container.and_then(|c| c.state.as_ref());
    // A pod-level reason (Evicted, NodeLost, Preempting...) explains more than the exit code
    // of a container the kubelet killed for it.
    if phase == "Failed" {
        if let Some(reason) = status.reason.as_deref().filter(|r| !r.is_empty()) {
            return Some(Ended {
                reason: with_message(reason, status.message.as_deref()),
                oom: false,
                clean: false,
            });
        }
    }
    if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
        return Some(terminated(t));
    }
    if let Some(w) = state.and_then(|s| s.waiting.as_ref()) {
        let reason = w.reason.as_deref().unwrap_or("");
        if FATAL_WAITING.contains(&reason) {
            return Some(Ended {
                reason: with_message(reason, w.message.as_deref()),
                oom: false,
                clean: false,
            });
        }
    }
    match phase {
        "Succeeded" => Some(Ended {
            reason: "Succeeded".into(),
            oom: false,
            clean: true,
        }),
        "Failed" => Some(Ended {
            reason: with_message("Failed", status.message.as_deref()),
            oom: false,
            clean: false,
        }),
        _ => None,
    }
}

/// Why a pod that has not ended does not run yet, if it does not: the scheduler's
/// message while it is unscheduled (`0/3 nodes are available: 3 Insufficient cpu.`), or
/// its container's waiting reason (`ContainerCreating`, an image being pulled). Such a
/// pod is queued by the engine, not a silent node.
pub fn waiting(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    if status.phase.as_deref().unwrap_or("Pending") != "Pending" {
        return None;
    }
    let unscheduled = status.conditions.as_ref().and_then(|c| {
        c.iter()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False")
    });
    if let Some(c) = unscheduled {
        let reason = c.reason.as_deref().unwrap_or("Unschedulable");
        return Some(with_message(reason, c.message.as_deref()));
    }
    let waiting = status
        .container_statuses
        .as_ref()
        .and_then(|c| c.first())
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.waiting.as_ref());
    Some(match waiting {
        Some(w) => with_message(
            w.reason.as_deref().unwrap_or("Waiting"),
            w.message.as_deref(),
        ),
        None => "Pending".into(),
    })
}

/// The end of a node whose pod was deleted before it ended by itself: a drained or lost
/// host, a preemption, someone's `kubectl delete`. The disruption condition the cluster
/// sets (Kubernetes 1.26+) says which.
pub fn deleted(pod: &Pod) -> Ended {
    if let Some(e) = ended(pod) {
        return e;
    }
    let disruption = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "DisruptionTarget"))
        .and_then(|c| c.reason.clone());
    Ended {
        reason: match disruption {
            Some(r) => format!("pod deleted ({r})"),
            None => "pod deleted (node drained or lost, preempted, or deleted by hand)".into(),
        },
        oom: false,
        clean: false,
    }
}

fn terminated(t: &ContainerStateTerminated) -> Ended {
    let reason = t.reason.as_deref().unwrap_or("Terminated");
    let mut words = format!("{reason} (exit code {}", t.exit_code);
    if let Some(sig) = t.signal.filter(|&s| s != 0) {
        words.push_str(&format!(", signal {sig}"));
    }
    words.push(')');
    Ended {
        reason: with_message(&words, t.message.as_deref()),
        oom: reason == "OOMKilled",
        clean: t.exit_code == 0,
    }
}

fn with_message(reason: &str, message: Option<&str>) -> String {
    match message.map(str::trim).filter(|m| !m.is_empty()) {
        Some(m) => format!("{reason}: {m}"),
        None => reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateWaiting, ContainerStatus,
        PodCondition, PodStatus,
    };

    fn pod(phase: &str, state: ContainerState) -> Pod {
        Pod {
            status: Some(PodStatus {
                phase: Some(phase.into()),
                container_statuses: Some(vec![ContainerStatus {
                    name: "worker".into(),
                    state: Some(state),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn terminated_with(reason: &str, code: i32) -> ContainerState {
        ContainerState {
            terminated: Some(ContainerStateTerminated {
                reason: Some(reason.into()),
                exit_code: code,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn running_and_pending_pods_have_not_ended() {
        let running = ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        };
        assert_eq!(ended(&pod("Running", running)), None);
        let pulling = ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("ContainerCreating".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(ended(&pod("Pending", pulling)), None);
        assert_eq!(ended(&Pod::default()), None);
    }

    #[test]
    fn terminations_read_as_the_kubelet_reports_them() {
        let oom = ended(&pod("Failed", terminated_with("OOMKilled", 137))).unwrap();
        assert_eq!(oom.reason, "OOMKilled (exit code 137)");
        assert!(oom.oom && !oom.clean);
        let err = ended(&pod("Failed", terminated_with("Error", 3))).unwrap();
        assert_eq!(
            (err.reason.as_str(), err.oom),
            ("Error (exit code 3)", false)
        );
        let done = ended(&pod("Succeeded", terminated_with("Completed", 0))).unwrap();
        assert!(done.clean);
    }

    #[test]
    fn eviction_and_fatal_waits_end_a_node() {
        let mut p = pod("Failed", terminated_with("Error", 137));
        let s = p.status.as_mut().unwrap();
        s.reason = Some("Evicted".into());
        s.message = Some("The node was low on resource: memory.".into());
        let e = ended(&p).unwrap();
        assert_eq!(e.reason, "Evicted: The node was low on resource: memory.");
        let bad_image = ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("ImagePullBackOff".into()),
                message: Some("Back-off pulling image \"nope\"".into()),
            }),
            ..Default::default()
        };
        let e = ended(&pod("Pending", bad_image)).unwrap();
        assert!(e.reason.starts_with("ImagePullBackOff: "), "{e:?}");
    }

    #[test]
    fn deletion_names_the_disruption() {
        let running = ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        };
        let mut p = pod("Running", running);
        assert!(deleted(&p).reason.starts_with("pod deleted (node drained"));
        p.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: Some("EvictionByEvictionAPI".into()),
            ..Default::default()
        }]);
        assert_eq!(deleted(&p).reason, "pod deleted (EvictionByEvictionAPI)");
    }
}
