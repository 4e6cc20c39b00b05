//! Per-node memory limits that follow use (Primus Eq. 2-3, vertical scaling): each round,
//! a node's limit becomes `R_used + R_x + R_s` over its recent resident-memory readings,
//! kept between its role's configured limit and maximum. On the local backend a limit is
//! its control group's (or, without them, what the memory watchdog enforces), so a change
//! needs no restart. Pure: the autoscale
//! loop feeds readings and asks for limits.

use std::collections::{BTreeMap, VecDeque};

use elastrec_brain::primus::VerticalRule;
use elastrec_brain::Range;
use serde::{Deserialize, Serialize};

/// Readings per node the rule looks at (`N_R + 1` of Eq. 2).
const WINDOW: usize = 8;

/// One change of a node's limit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LimitChange {
    /// Seconds since the job started.
    pub at_s: f64,
    /// Node id, role (`ps` / `worker`) and index.
    pub node: u32,
    /// See `node`.
    pub role: String,
    /// See `node`.
    pub index: u32,
    /// Limit before and after, GiB.
    pub from_gb: f64,
    /// See `from_gb`.
    pub to_gb: f64,
    /// Primus Eq. 3 with its terms.
    pub reason: String,
}

#[derive(Debug, Clone)]
struct NodeMemory {
    limit_gb: f64,
    readings: VecDeque<f64>,
}

/// The limits of every node.
#[derive(Debug, Clone)]
pub struct MemoryLimits {
    worker: Range<f64>,
    ps: Range<f64>,
    nodes: BTreeMap<u32, NodeMemory>,
    changes: Vec<LimitChange>,
}

impl MemoryLimits {
    /// Limits between each role's configured limit and maximum (equal: fixed).
    pub fn new(worker: Range<f64>, ps: Range<f64>) -> Self {
        Self {
            worker,
            ps,
            nodes: BTreeMap::new(),
            changes: Vec::new(),
        }
    }

    fn range(&self, is_ps: bool) -> Range<f64> {
        if is_ps {
            self.ps
        } else {
            self.worker
        }
    }

    /// The limit of a node now, GiB.
    pub fn limit_gb(&self, node: u32, is_ps: bool) -> f64 {
        self.nodes
            .get(&node)
            .map_or(self.range(is_ps).min, |n| n.limit_gb)
    }

    /// One reading of a node's resident memory; returns the change of its limit, if any.
    /// `start_gb` is the limit the node was started with (its role's, grown after an
    /// out-of-memory kill), used at its first reading.
    pub fn observe(
        &mut self,
        at_s: f64,
        node: (u32, bool, u32),
        rss_gb: f64,
        start_gb: f64,
    ) -> Option<LimitChange> {
        let (id, is_ps, index) = node;
        let range = self.range(is_ps);
        let n = self.nodes.entry(id).or_insert_with(|| NodeMemory {
            limit_gb: start_gb.max(range.min),
            readings: VecDeque::new(),
        });
        n.readings.push_back(rss_gb);
        if n.readings.len() > WINDOW {
            n.readings.pop_front();
        }
        if range.max <= range.min || n.readings.len() < 2 {
            return None;
        }
        let metrics: Vec<f64> = n.readings.iter().copied().collect();
        let used = metrics.iter().copied().fold(0.0, f64::max);
        // Headroom: a fifth of what the node uses, at least 50 MB; changes under 5% of the
        // limit are not worth a line.
        let rule = VerticalRule {
            safety_margin: (0.2 * used).max(0.05),
            min_change: 0.05 * n.limit_gb,
        };
        let d = rule.decide(&metrics, n.limit_gb, range).ok()?;
        if !d.changed {
            return None;
        }
        let change = LimitChange {
            at_s,
            node: id,
            role: if is_ps { "ps" } else { "worker" }.into(),
            index,
            from_gb: n.limit_gb,
            to_gb: d.alloc,
            reason: d.reason,
        };
        n.limit_gb = d.alloc;
        self.changes.push(change.clone());
        Some(change)
    }

    /// Takes back `change`, which could not be applied (the engine refused it).
    pub fn undo(&mut self, change: &LimitChange) {
        if let Some(n) = self.nodes.get_mut(&change.node) {
            n.limit_gb = change.from_gb;
        }
        if self.changes.last() == Some(change) {
            self.changes.pop();
        }
    }

    /// Every change so far.
    pub fn changes(&self) -> &[LimitChange] {
        &self.changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_growing_node_gets_a_higher_limit_within_its_maximum() {
        let mut m = MemoryLimits::new(Range::new(2.0, 2.0), Range::new(0.12, 0.4));
        let mut change = None;
        for (i, gb) in [0.05, 0.07, 0.09, 0.11].iter().enumerate() {
            change = m.observe(i as f64, (1, true, 0), *gb, 0.12).or(change);
        }
        let c = change.expect("the limit follows the growth");
        assert!(c.to_gb > 0.12 && c.to_gb <= 0.4, "{c:?}");
        assert!(c.reason.contains("Primus Eq. 3"), "{c:?}");
        assert_eq!(m.limit_gb(1, true), c.to_gb);
        // Far beyond the maximum: clamped to it.
        for gb in [1.0, 2.0] {
            m.observe(9.0, (1, true, 0), gb, 0.12);
        }
        assert_eq!(m.limit_gb(1, true), 0.4);
        // A fixed role never changes.
        for gb in [1.0, 3.0, 5.0] {
            assert_eq!(m.observe(1.0, (2, false, 0), gb, 2.0), None);
        }
        assert_eq!(m.limit_gb(2, false), 2.0);
        // A node started with a grown limit begins there; a refused change is undone.
        let c = [0.3, 0.35]
            .iter()
            .find_map(|gb| m.observe(1.0, (3, true, 1), *gb, 0.2))
            .expect("growth past the start");
        assert_eq!(c.from_gb, 0.2);
        let n = m.changes().len();
        m.undo(&c);
        assert_eq!((m.limit_gb(3, true), m.changes().len()), (0.2, n - 1));
    }
}
