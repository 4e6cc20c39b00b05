//! Whether a silent node is dead: suspicion before a verdict. A node that has sent nothing
//! for `dead_after_ms` is first *suspected*, and the master probes it directly over a
//! second channel (its metrics endpoint, which the node serves apart from its calls to
//! the master). A node that answers is alive and busy: its clock restarts and it stays. A
//! node whose probe fails (nothing listens: the process is gone), or that stays silent
//! and unanswering for another `dead_after_ms`, is declared dead. A node that keeps
//! answering probes but sends no heartbeat is declared dead after [`MAX_PROBE_SAVES`]
//! answers, so a process that serves but no longer works does not hold the job.
//!
//! A node that never told the master where to probe it (no metrics address) is declared
//! dead at the end of its silence, as before suspicion existed.

use super::*;

/// Probe answers that may stand in for heartbeats in a row; the next silence is a death.
pub const MAX_PROBE_SAVES: u32 = 3;

/// A node under suspicion (not persisted: a restarted master's nodes start trusted, and
/// their clocks restart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Suspect {
    /// When the probe was asked for.
    since_ms: u64,
    /// Probe answers since the node's last own word.
    saves: u32,
    /// Whether the probe is still out.
    probing: bool,
}

impl Job {
    /// Periodic check: silent nodes are suspected and probed; suspects whose probe went
    /// unanswered for `dead_after_ms` are declared dead and the failure policy applies.
    pub fn tick(&mut self, cx: &mut impl Context) {
        let now = cx.now_ms();
        let dead_after = self.policy.dead_after_ms;
        let silent: Vec<u32> = self
            .nodes
            .values()
            .filter(|n| n.state.is_live() && now.saturating_sub(n.last_seen_ms) > dead_after)
            .map(|n| n.id)
            .collect();
        for id in silent {
            let node = &self.nodes[&id];
            let silent_ms = now - node.last_seen_ms;
            match self.suspects.get(&id).copied() {
                _ if node.metrics_addr.is_empty() => {
                    self.declare_dead(id, format!("no heartbeat for {silent_ms} ms"), cx);
                }
                Some(s) if s.saves >= MAX_PROBE_SAVES => {
                    self.suspects.remove(&id);
                    let reason = format!(
                        "no heartbeat for {silent_ms} ms; its metrics endpoint answered \
                         {} probes in a row, but a node that only answers probes does no work",
                        s.saves
                    );
                    self.declare_dead(id, reason, cx);
                }
                Some(s) if s.probing => {
                    if now.saturating_sub(s.since_ms) > dead_after {
                        self.suspects.remove(&id);
                        let reason = format!(
                            "no heartbeat for {silent_ms} ms, and no answer to a direct probe \
                             of {} for {} ms",
                            node.metrics_addr,
                            now - s.since_ms
                        );
                        self.declare_dead(id, reason, cx);
                    }
                }
                previous => {
                    let saves = previous.map_or(0, |s| s.saves);
                    self.suspects.insert(
                        id,
                        Suspect {
                            since_ms: now,
                            saves,
                            probing: true,
                        },
                    );
                    let node = node.clone();
                    cx.event(Event::NodeSuspected {
                        id,
                        role: node.role,
                        silent_ms,
                    });
                    cx.probe(&node);
                }
            }
        }
    }

    /// The direct probe of node `id` was answered: the node is alive, its silence a
    /// stall (a busy machine, a slow path to the master). Its clock restarts.
    pub fn probe_answered(&mut self, id: u32, cx: &mut impl Context) {
        let now = cx.now_ms();
        let Some(s) = self.suspects.get_mut(&id) else {
            return;
        };
        let Some(n) = self.nodes.get_mut(&id).filter(|n| n.state.is_live()) else {
            return;
        };
        s.probing = false;
        s.saves += 1;
        let silent_ms = now.saturating_sub(n.last_seen_ms);
        n.last_seen_ms = now;
        cx.event(Event::ProbeAnswered {
            id,
            role: n.role,
            silent_ms,
        });
    }

    /// The direct probe of node `id` failed (`why`: nothing listens, the reply was not
    /// HTTP): the node is declared dead.
    pub fn probe_failed(&mut self, id: u32, why: &str, cx: &mut impl Context) {
        let now = cx.now_ms();
        if self.suspects.remove(&id).is_none() {
            return;
        }
        let Some(n) = self.nodes.get(&id).filter(|n| n.state.is_live()) else {
            return;
        };
        let reason = format!(
            "no heartbeat for {} ms, and the direct probe of {} failed: {why}",
            now.saturating_sub(n.last_seen_ms),
            n.metrics_addr
        );
        self.declare_dead(id, reason, cx);
    }

    /// Nodes under suspicion now.
    pub fn suspected(&self) -> Vec<u32> {
        self.suspects.keys().copied().collect()
    }
}
