//! The watch on a job's pods: turns pod events into node exits with the engine's reason.
//! It lists the pods (the state after a gap), then watches from the list's resource
//! version; on any interruption it lists again, so no end is missed and none is told twice.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::TryStreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::{Api, Client};
use parking_lot::Mutex;

use super::manifests::node_of;
use super::outcome::{self, Ended};
use crate::backend::NodeExit;
use crate::events::event;

/// What the watch knows of the job's pods, shared with the backend's methods.
#[derive(Default)]
pub struct PodTable {
    /// Pods seen running or pending, by node: their names.
    live: HashMap<u32, String>,
    /// Nodes whose pod ended (kept for its logs until the job ends).
    ended: HashSet<u32>,
    /// Nodes the master stopped: their pods' ends are no news to it.
    stopped: HashSet<u32>,
    /// Nodes whose end was reported (each is told once).
    reported: HashSet<u32>,
    /// Ends not yet taken by [`PodTable::take_exits`].
    exits: Vec<NodeExit>,
    /// Nodes whose pod waits to run (unscheduled, its image pulled, its container
    /// created): since when, and why.
    waiting: HashMap<u32, Waiting>,
}

/// A pod the engine holds before it runs.
struct Waiting {
    since: Instant,
    why: String,
    name: String,
}

impl PodTable {
    /// Ends since the last call.
    pub fn take_exits(&mut self) -> Vec<NodeExit> {
        std::mem::take(&mut self.exits)
    }

    /// Marks `node` as stopped by the master; true when its pod already ended (nothing
    /// left to stop).
    pub fn stop(&mut self, node: u32) -> bool {
        self.stopped.insert(node);
        self.ended.contains(&node)
    }

    /// Takes in the current state of one pod.
    pub fn observe(&mut self, pod: &Pod) {
        let Some(id) = node_of(pod) else { return };
        let name = pod.metadata.name.clone().unwrap_or_default();
        match outcome::ended(pod) {
            Some(end) => {
                self.live.remove(&id);
                self.waiting.remove(&id);
                self.ended.insert(id);
                self.report(id, &name, end);
            }
            None => {
                match outcome::waiting(pod) {
                    Some(why) => self.wait(id, &name, why),
                    None => drop(self.waiting.remove(&id)),
                }
                self.live.insert(id, name);
            }
        }
    }

    /// Notes that node `id`'s pod `name` waits to run, for `why`. A pod the scheduler
    /// cannot place is told in the master's log once per reason.
    fn wait(&mut self, id: u32, name: &str, why: String) {
        let w = self.waiting.entry(id).or_insert_with(|| Waiting {
            since: Instant::now(),
            why: String::new(),
            name: name.to_string(),
        });
        if w.why != why && why.starts_with("Unschedulable") {
            event!(
                "pod_waiting",
                node = id,
                pod = %name,
                reason = %why,
                "kubernetes: pod {name} (node {id}) is not scheduled yet: {why}"
            );
        }
        w.why = why;
    }

    /// The nodes whose pods still wait to run; a pod that has waited longer than
    /// `timeout` ends instead, with what it waited for (the master then replaces its
    /// node or stops the job, as for any end).
    pub fn queued(&mut self, now: Instant, timeout: Duration) -> Vec<u32> {
        let expired: Vec<u32> = self
            .waiting
            .iter()
            .filter(|(_, w)| now.saturating_duration_since(w.since) > timeout)
            .map(|(&id, _)| id)
            .collect();
        for id in expired {
            let w = self.waiting.remove(&id).expect("listed");
            let end = Ended {
                reason: format!(
                    "did not start within engine.kubernetes.pending_timeout_s ({} s): {}",
                    timeout.as_secs(),
                    w.why
                ),
                oom: false,
                clean: false,
            };
            self.report(id, &w.name, end);
        }
        let mut ids: Vec<u32> = self.waiting.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Takes in the deletion of a pod.
    pub fn observe_deleted(&mut self, pod: &Pod) {
        let Some(id) = node_of(pod) else { return };
        self.live.remove(&id);
        self.waiting.remove(&id);
        if self.ended.insert(id) {
            let name = pod.metadata.name.clone().unwrap_or_default();
            self.report(id, &name, outcome::deleted(pod));
        }
    }

    /// After a fresh list: pods seen live before that the list lacks were deleted while
    /// no watch ran.
    fn observe_list(&mut self, pods: &[Pod]) {
        let listed: HashSet<u32> = pods.iter().filter_map(node_of).collect();
        let vanished: Vec<(u32, String)> = self
            .live
            .iter()
            .filter(|(id, _)| !listed.contains(id))
            .map(|(&id, name)| (id, name.clone()))
            .collect();
        for (id, name) in vanished {
            self.live.remove(&id);
            self.waiting.remove(&id);
            self.ended.insert(id);
            let end = Ended {
                reason: "pod deleted (while the watch was reconnecting)".into(),
                oom: false,
                clean: false,
            };
            self.report(id, &name, end);
        }
        for pod in pods {
            self.observe(pod);
        }
    }

    fn report(&mut self, id: u32, pod: &str, end: Ended) {
        if self.stopped.contains(&id) || !self.reported.insert(id) {
            return;
        }
        if end.clean {
            tracing::info!(node = id, pod, reason = %end.reason, "pod completed");
        } else {
            // The master's log keeps the engine's reason (the node table only says that
            // the process exited).
            event!(
                "node_ended",
                node = id,
                pod = %pod,
                reason = %end.reason,
                oom = end.oom,
                "kubernetes: pod {pod} (node {id}) ended: {}",
                end.reason,
            );
        }
        self.exits.push(NodeExit {
            id,
            reason: end.reason,
            oom: end.oom,
        });
    }
}

/// How long one watch request stays open (the server ends it then; the loop renews it).
const WATCH_SECONDS: u32 = 290;

/// Watches the pods matching `selector` in `namespace` until the API thread stops.
pub async fn run(client: Client, namespace: String, selector: String, table: Arc<Mutex<PodTable>>) {
    let api: Api<Pod> = Api::namespaced(client, &namespace);
    let mut failures = 0u32;
    loop {
        if failures > 0 {
            // Back-off between attempts against a failing server (not a synchronization).
            let wait = Duration::from_millis(200 * u64::from(failures.min(25)));
            tokio::time::sleep(wait).await;
        }
        let list = match api.list(&ListParams::default().labels(&selector)).await {
            Ok(l) => l,
            Err(e) => {
                failures += 1;
                if failures == 1 || failures.is_multiple_of(50) {
                    event!(
                        warn,
                        "pods_unlisted",
                        error = %e,
                        "kubernetes: listing the job's pods failed (retrying): {e}",
                    );
                }
                continue;
            }
        };
        table.lock().observe_list(&list.items);
        let version = list.metadata.resource_version.unwrap_or_default();
        let params = WatchParams::default()
            .labels(&selector)
            .timeout(WATCH_SECONDS);
        let stream = match api.watch(&params, &version).await {
            Ok(s) => s,
            Err(e) => {
                failures += 1;
                tracing::warn!(error = %e, "watching the job's pods failed; listing again");
                continue;
            }
        };
        failures = 0;
        futures::pin_mut!(stream);
        // A connection that dies silently ends in this timeout rather than a hang.
        let idle = Duration::from_secs(u64::from(WATCH_SECONDS) + 30);
        while let Ok(Ok(Some(event))) = tokio::time::timeout(idle, stream.try_next()).await {
            match event {
                WatchEvent::Added(pod) | WatchEvent::Modified(pod) => {
                    table.lock().observe(&pod);
                }
                WatchEvent::Deleted(pod) => {
                    table.lock().observe_deleted(&pod);
                }
                WatchEvent::Bookmark(_) => {}
                // Usually 410 Gone: the version is too old; a fresh list catches up.
                WatchEvent::Error(status) => {
                    tracing::info!(code = status.code, message = %status.message, "watch ended");
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStatus, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(node: u32, phase: &str, terminated: Option<(&str, i32)>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(format!("p-{node}")),
                labels: Some(
                    [(
                        super::super::manifests::NODE_LABEL.to_string(),
                        node.to_string(),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
            status: Some(PodStatus {
                phase: Some(phase.into()),
                container_statuses: Some(vec![ContainerStatus {
                    state: Some(ContainerState {
                        terminated: terminated.map(|(r, c)| ContainerStateTerminated {
                            reason: Some(r.into()),
                            exit_code: c,
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn each_end_is_told_once_and_stopped_nodes_are_not_news() {
        let mut t = PodTable::default();
        t.observe(&pod(1, "Running", None));
        t.observe(&pod(2, "Running", None));
        assert!(t.take_exits().is_empty());
        let oom = pod(1, "Failed", Some(("OOMKilled", 137)));
        t.observe(&oom);
        t.observe(&oom);
        t.observe_deleted(&oom);
        let exits = t.take_exits();
        assert_eq!(exits.len(), 1, "{exits:?}");
        assert!(exits[0].oom && exits[0].reason.starts_with("OOMKilled"));
        assert!(!t.stop(2), "a running pod must be deleted");
        t.observe_deleted(&pod(2, "Running", None));
        assert!(t.take_exits().is_empty(), "the master stopped it");
        assert!(t.stop(1), "an ended pod is kept for its logs");
    }

    /// A pod the scheduler cannot place, or whose container is being created, is queued
    /// (not silent) until `pending_timeout_s`, then ends saying what it waited for.
    #[test]
    fn waiting_pods_are_queued_until_their_timeout_then_end_saying_why() {
        use k8s_openapi::api::core::v1::PodCondition;
        let mut unscheduled = pod(5, "Pending", None);
        unscheduled.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
            type_: "PodScheduled".into(),
            status: "False".into(),
            reason: Some("Unschedulable".into()),
            message: Some("0/3 nodes are available: 3 Insufficient cpu.".into()),
            ..Default::default()
        }]);
        let mut t = PodTable::default();
        t.observe(&unscheduled);
        t.observe(&pod(6, "Pending", None));
        t.observe(&pod(7, "Running", None));
        let now = Instant::now();
        let timeout = Duration::from_secs(600);
        assert_eq!(t.queued(now, timeout), vec![5, 6]);
        assert!(t.take_exits().is_empty());
        // Node 6's pod starts: no longer queued.
        t.observe(&pod(6, "Running", None));
        assert_eq!(t.queued(now, timeout), vec![5]);
        let later = now + Duration::from_secs(601);
        assert!(t.queued(later, timeout).is_empty());
        let exits = t.take_exits();
        assert_eq!(exits.len(), 1, "{exits:?}");
        assert_eq!(exits[0].id, 5);
        assert!(
            exits[0].reason.contains("pending_timeout_s (600 s)")
                && exits[0].reason.contains("Insufficient cpu"),
            "{}",
            exits[0].reason
        );
        // Told once.
        t.observe(&unscheduled);
        assert!(t.take_exits().is_empty());
    }

    #[test]
    fn pods_gone_between_watches_are_deleted() {
        let mut t = PodTable::default();
        t.observe(&pod(3, "Running", None));
        t.observe(&pod(4, "Running", None));
        t.observe_list(&[pod(4, "Running", None)]);
        let exits = t.take_exits();
        assert_eq!(exits.len(), 1);
        assert_eq!(exits[0].id, 3);
        assert!(exits[0].reason.starts_with("pod deleted"));
    }
}
