//! The simulated cluster's nodes and where pods go: best fit on free cores (the node with
//! the fewest free cores that still fits the pod's cores and memory), found through an
//! ordered index so that placement stays logarithmic at 100,000 nodes.

use std::collections::BTreeSet;

/// One placed pod: the node and what it took.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pod {
    /// Node index.
    pub node: u32,
    /// Cores (thousandths).
    pub milli_cpu: u64,
    /// Memory, MiB.
    pub mem_mb: u64,
}

/// Nodes of equal size and what is free on each.
#[derive(Debug, Clone)]
pub struct Nodes {
    free: Vec<(u64, u64)>,
    /// (free thousandths of cores, node) for best fit.
    by_cpu: BTreeSet<(u64, u32)>,
    node_milli: u64,
    node_mem_mb: u64,
    used_milli: u64,
    used_mem_mb: u64,
}

fn milli(cores: f64) -> u64 {
    (cores * 1000.0).round() as u64
}

fn mib(gb: f64) -> u64 {
    (gb * 1024.0).round() as u64
}

impl Nodes {
    /// `count` nodes of `cpu` cores and `mem_gb` GiB each.
    pub fn new(count: u32, cpu: f64, mem_gb: f64) -> Self {
        let (c, m) = (milli(cpu), mib(mem_gb));
        Self {
            free: vec![(c, m); count as usize],
            by_cpu: (0..count).map(|n| (c, n)).collect(),
            node_milli: c,
            node_mem_mb: m,
            used_milli: 0,
            used_mem_mb: 0,
        }
    }

    /// Cores and GiB of the whole cluster.
    pub fn capacity(&self) -> (f64, f64) {
        let n = self.free.len() as f64;
        (
            n * self.node_milli as f64 / 1000.0,
            n * self.node_mem_mb as f64 / 1024.0,
        )
    }

    /// Cores and GiB placed.
    pub fn used(&self) -> (f64, f64) {
        (
            self.used_milli as f64 / 1000.0,
            self.used_mem_mb as f64 / 1024.0,
        )
    }

    /// Places one pod, or `None` when no node has room.
    pub fn place(&mut self, cpu: f64, mem_gb: f64) -> Option<Pod> {
        let (c, m) = (milli(cpu), mib(mem_gb));
        if c > self.node_milli || m > self.node_mem_mb {
            return None;
        }
        let node = self
            .by_cpu
            .range((c, 0)..)
            .find(|&&(_, n)| self.free[n as usize].1 >= m)
            .map(|&(_, n)| n)?;
        self.take(node, c, m);
        Some(Pod {
            node,
            milli_cpu: c,
            mem_mb: m,
        })
    }

    /// Places every pod of `pods` (cores, GiB, count) or none of them.
    pub fn place_all(&mut self, pods: &[(f64, f64, u32)]) -> Option<Vec<Pod>> {
        let mut out = Vec::new();
        for &(cpu, mem, n) in pods {
            for _ in 0..n {
                match self.place(cpu, mem) {
                    Some(p) => out.push(p),
                    None => {
                        self.release(&out);
                        return None;
                    }
                }
            }
        }
        Some(out)
    }

    fn take(&mut self, node: u32, c: u64, m: u64) {
        let f = &mut self.free[node as usize];
        self.by_cpu.remove(&(f.0, node));
        f.0 -= c;
        f.1 -= m;
        self.by_cpu.insert((f.0, node));
        self.used_milli += c;
        self.used_mem_mb += m;
    }

    /// Takes back exactly the places of `pods`, released just before (a change that did
    /// not fit is undone where it was; placing again could pack differently and fail).
    pub fn restore(&mut self, pods: &[Pod]) {
        for p in pods {
            self.take(p.node, p.milli_cpu, p.mem_mb);
        }
    }

    /// Sets the memory of every pod of `pods` to `mem_gb` where each stands (vertical
    /// scaling in place), or changes none and returns false when a node has no room.
    pub fn resize_mem(&mut self, pods: &mut [Pod], mem_gb: f64) -> bool {
        let m = mib(mem_gb);
        let mut extra: std::collections::BTreeMap<u32, u64> = Default::default();
        for p in pods.iter() {
            *extra.entry(p.node).or_default() += m.saturating_sub(p.mem_mb);
        }
        if extra
            .iter()
            .any(|(&node, &need)| self.free[node as usize].1 < need)
        {
            return false;
        }
        for p in pods.iter_mut() {
            let f = &mut self.free[p.node as usize];
            f.1 = f.1 + p.mem_mb - m;
            self.used_mem_mb = self.used_mem_mb - p.mem_mb + m;
            p.mem_mb = m;
        }
        true
    }

    /// Gives the pods' resources back.
    pub fn release(&mut self, pods: &[Pod]) {
        for p in pods {
            let f = &mut self.free[p.node as usize];
            self.by_cpu.remove(&(f.0, p.node));
            f.0 += p.milli_cpu;
            f.1 += p.mem_mb;
            self.by_cpu.insert((f.0, p.node));
            self.used_milli -= p.milli_cpu;
            self.used_mem_mb -= p.mem_mb;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_packs_and_all_or_nothing_leaves_no_trace() {
        let mut n = Nodes::new(2, 8.0, 32.0);
        let a = n.place(6.0, 8.0).unwrap();
        // Best fit: the 2-core pod goes beside the 6-core one, not onto the empty node.
        let b = n.place(2.0, 8.0).unwrap();
        assert_eq!(a.node, b.node);
        assert_eq!(n.used(), (8.0, 16.0));
        // 3 pods of 4 cores do not fit in the 8 free cores: none is placed.
        assert!(n.place_all(&[(4.0, 1.0, 3)]).is_none());
        assert_eq!(n.used(), (8.0, 16.0));
        // Memory counts too: 8 cores but 40 GiB fit nowhere.
        assert!(n.place(8.0, 40.0).is_none());
        n.release(&[a, b]);
        assert_eq!(n.used(), (0.0, 0.0));
        assert_eq!(n.capacity(), (16.0, 64.0));
    }

    #[test]
    fn memory_resizes_in_place_or_not_at_all() {
        let mut n = Nodes::new(2, 8.0, 32.0);
        let mut pods = n.place_all(&[(4.0, 8.0, 2)]).unwrap();
        let other = n.place(4.0, 8.0).unwrap();
        assert_eq!(n.used(), (12.0, 24.0));
        assert!(n.resize_mem(&mut pods, 2.0));
        assert_eq!(n.used(), (12.0, 12.0));
        assert!(pods.iter().all(|p| p.mem_mb == 2048));
        // Both pods share a node of 32 GiB: 2 x 17 GiB do not fit there, 2 x 16 do.
        assert_eq!(pods[0].node, pods[1].node);
        assert!(!n.resize_mem(&mut pods, 17.0));
        assert_eq!(n.used(), (12.0, 12.0));
        assert!(n.resize_mem(&mut pods, 16.0));
        assert_eq!(n.used(), (12.0, 40.0));
        n.release(&pods);
        n.release(&[other]);
        assert_eq!(n.used(), (0.0, 0.0));
    }
}
