//! Job-level plan candidates: NSGA-II over allocations (DLRover-RM §4.2-4.3).
//!
//! Genes: workers, PS, CPU per worker, CPU per PS, memory per worker, memory per PS, all
//! kept inside [`Bounds`] (counts rounded to integers, CPU and memory to halves). The two
//! objectives, both minimized, are Resource Cost (Eq. 7) and 1 / Throughput Gain (Eq. 8-9),
//! where the gain subtracts the scaling overhead. Allocations whose PS memory cannot hold
//! the model, or that gain nothing, are infeasible (Deb's constraint domination), so the
//! returned front holds only feasible, mutually non-dominated allocations.

use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::alloc::{Allocation, Bounds};
use crate::error::{check_non_negative, Result};
use crate::throughput::ThroughputModel;

/// Prices of resources (Money(a_r) in Eq. 7), per unit and hour.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Prices {
    /// Per CPU core.
    pub cpu: f64,
    /// Per GiB of memory.
    pub mem_gb: f64,
}

impl Default for Prices {
    fn default() -> Self {
        // Roughly the cloud ratio of one core to 4 GiB.
        Self {
            cpu: 1.0,
            mem_gb: 0.25,
        }
    }
}

impl Prices {
    /// Eq. 7: `RC(A) = sum_r a_r Money(a_r)` over the job's whole allocation. (Costing the
    /// whole allocation rather than the increment shifts every candidate of a job by the
    /// same constant, so the front is the same, and keeps RC > 0 for Eq. 11.)
    pub fn cost(&self, a: &Allocation) -> f64 {
        a.total_cpu() * self.cpu + a.total_mem_gb() * self.mem_gb
    }
}

/// Scaling overhead (Eq. 8): throughput lost while the job moves to a new allocation,
/// averaged over the planning horizon. Defaults come from the seamless-migration design:
/// new workers join without stopping others; PS changes pause the job.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OverheadModel {
    /// Seconds for a new worker to start and join.
    pub worker_start_s: f64,
    /// Seconds the job pauses when PS count or PS resources change.
    pub ps_migration_s: f64,
    /// Horizon the gain is measured over, seconds.
    pub horizon_s: f64,
}

impl Default for OverheadModel {
    fn default() -> Self {
        Self {
            worker_start_s: 60.0,
            ps_migration_s: 120.0,
            horizon_s: 3600.0,
        }
    }
}

impl OverheadModel {
    /// `Overhead(A)` in samples/s, moving from `current` (throughput `cur_tp`) to `next`
    /// (throughput `next_tp`).
    pub fn overhead(
        &self,
        current: Option<&Allocation>,
        cur_tp: f64,
        next: &Allocation,
        next_tp: f64,
    ) -> f64 {
        let Some(c) = current else { return 0.0 };
        let mut lost = 0.0;
        if c.ps != next.ps || c.ps_cpu != next.ps_cpu || c.ps_mem_gb != next.ps_mem_gb {
            lost += cur_tp * self.ps_migration_s;
        }
        if c.worker_cpu != next.worker_cpu || c.worker_mem_gb != next.worker_mem_gb {
            // Every worker restarts with new resources.
            lost += cur_tp * self.worker_start_s;
        } else if next.workers > c.workers {
            // Added workers contribute only after they start.
            lost += (next_tp - cur_tp).max(0.0) * self.worker_start_s;
        }
        lost / self.horizon_s.max(1.0)
    }
}

/// One job's planning problem.
pub struct JobProblem<'a> {
    /// Fitted throughput model `F`.
    pub model: &'a dyn ThroughputModel,
    /// Allowed allocations.
    pub bounds: Bounds,
    /// The allocation the job runs with now (`None` at submission).
    pub current: Option<Allocation>,
    /// Resource prices.
    pub prices: Prices,
    /// Scaling overhead.
    pub overhead: OverheadModel,
    /// Memory the PS must hold together (embeddings, optimizer state, dense), GiB.
    pub ps_mem_needed_gb: f64,
}

/// An evaluated allocation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// The allocation.
    pub alloc: Allocation,
    /// Predicted throughput, samples/s.
    pub throughput: f64,
    /// Resource Cost (Eq. 7).
    pub cost: f64,
    /// Throughput Gain net of overhead (Eq. 8), samples/s.
    pub gain: f64,
    /// Constraint violation (0 = feasible).
    pub violation: f64,
}

impl Candidate {
    /// The two minimized objectives of Eq. 9.
    pub fn objectives(&self) -> [f64; 2] {
        [
            self.cost,
            if self.gain > 0.0 {
                1.0 / self.gain
            } else {
                f64::MAX
            },
        ]
    }

    /// Whether `self` Pareto-dominates `other` (both feasible).
    pub fn dominates(&self, other: &Candidate) -> bool {
        let (a, b) = (self.objectives(), other.objectives());
        a[0] <= b[0] && a[1] <= b[1] && (a[0] < b[0] || a[1] < b[1])
    }
}

impl JobProblem<'_> {
    /// Evaluates an allocation.
    pub fn evaluate(&self, a: Allocation) -> Candidate {
        self.evaluate_from(a, self.current_throughput())
    }

    /// Predicted throughput of the current allocation (0 without one).
    fn current_throughput(&self) -> f64 {
        self.current.map_or(0.0, |c| self.model.predict(&c))
    }

    /// [`JobProblem::evaluate`] with the current allocation's throughput already known
    /// (the search evaluates thousands of allocations against the same current one).
    fn evaluate_from(&self, a: Allocation, cur_tp: f64) -> Candidate {
        let tp = self.model.predict(&a);
        let gain = tp
            - cur_tp
            - self
                .overhead
                .overhead(self.current.as_ref(), cur_tp, &a, tp);
        let mem_short = (self.ps_mem_needed_gb - f64::from(a.ps) * a.ps_mem_gb).max(0.0);
        let mut violation = mem_short / self.ps_mem_needed_gb.max(1.0);
        if gain.is_nan() || gain <= 0.0 {
            violation += 1.0 + (-gain).max(0.0) / cur_tp.max(1.0);
        }
        Candidate {
            alloc: a,
            throughput: tp,
            cost: self.prices.cost(&a),
            gain,
            violation,
        }
    }

    fn decode(&self, g: &[f64; 6]) -> Allocation {
        let b = &self.bounds;
        let half = |v: f64| (v * 2.0).round() / 2.0;
        b.clamp(&Allocation {
            workers: g[0].round().max(0.0) as u32,
            ps: g[1].round().max(0.0) as u32,
            worker_cpu: half(g[2]),
            ps_cpu: half(g[3]),
            worker_mem_gb: half(g[4]),
            ps_mem_gb: half(g[5]),
        })
    }

    fn gene_ranges(&self) -> [(f64, f64); 6] {
        let b = &self.bounds;
        [
            (f64::from(b.workers.min), f64::from(b.workers.max)),
            (f64::from(b.ps.min), f64::from(b.ps.max)),
            (b.worker_cpu.min, b.worker_cpu.max),
            (b.ps_cpu.min, b.ps_cpu.max),
            (b.worker_mem_gb.min, b.worker_mem_gb.max),
            (b.ps_mem_gb.min, b.ps_mem_gb.max),
        ]
    }
}

/// NSGA-II settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Nsga2Params {
    /// Population size (even).
    pub population: usize,
    /// Generations.
    pub generations: usize,
    /// SBX crossover probability.
    pub crossover_prob: f64,
    /// SBX distribution index.
    pub eta_c: f64,
    /// Polynomial mutation distribution index.
    pub eta_m: f64,
    /// RNG seed: plans are reproducible.
    pub seed: u64,
}

impl Default for Nsga2Params {
    fn default() -> Self {
        Self {
            population: 48,
            generations: 60,
            crossover_prob: 0.9,
            eta_c: 15.0,
            eta_m: 20.0,
            seed: 0x5eed,
        }
    }
}

struct Ind {
    genes: [f64; 6],
    cand: Candidate,
    rank: usize,
    crowd: f64,
}

/// What constraint domination compares of one individual, computed once per sort.
#[derive(Clone, Copy)]
struct Key {
    violation: f64,
    objectives: [f64; 2],
}

impl Key {
    fn of(c: &Candidate) -> Self {
        Self {
            violation: c.violation,
            objectives: c.objectives(),
        }
    }

    /// `(self dominates other, other dominates self)` under constraint domination (Deb
    /// 2000): a feasible individual dominates an infeasible one, the smaller violation wins
    /// between infeasible ones, and Pareto dominance ([`Candidate::dominates`]) decides
    /// between feasible ones. The definition [`dominance_rows`] is tested against.
    #[cfg(test)]
    fn versus(&self, other: &Key) -> (bool, bool) {
        match (self.violation > 0.0, other.violation > 0.0) {
            (false, true) => (true, false),
            (true, false) => (false, true),
            (true, true) => (
                self.violation < other.violation,
                other.violation < self.violation,
            ),
            (false, false) => {
                let (a, b) = (self.objectives, other.objectives);
                // Objectives are never NaN (cost is finite, 1/gain finite or f64::MAX).
                let differ = a[0] != b[0] || a[1] != b[1];
                (
                    differ && a[0] <= b[0] && a[1] <= b[1],
                    differ && b[0] <= a[0] && b[1] <= a[1],
                )
            }
        }
    }

    /// The value crowding sorts by for objective `k` (the violation when infeasible).
    fn crowding_value(&self, k: usize) -> f64 {
        if self.violation > 0.0 {
            self.violation
        } else {
            self.objectives[k]
        }
    }
}

/// Fills `sc.dominates` (zeroed, `n` rows of `words` words) with the constraint-domination
/// relation of `sc.keys` ([`Key::versus`]), without asking it of each of the n² / 2 pairs:
/// a feasible individual's row holds every infeasible one; an infeasible one's, those of
/// larger violation (a sweep down the violations); a feasible one's, the feasible
/// individuals no better in both objectives and not equal in both (one sweep down each
/// objective gives the masks of "no better" in it). Ties compare with `==`, as the pair
/// test does.
fn dominance_rows(sc: &mut SortScratch, n: usize, words: usize) {
    let SortScratch {
        keys,
        dominates,
        masks,
        order,
        ..
    } = sc;
    let infeasible = |i: usize| keys[i].violation > 0.0;
    // [no better in objective 0 | no better in objective 1 | equal in both], by row.
    masks.clear();
    masks.resize(3 * n * words, 0);
    let mut infeasible_mask = vec![0u64; words];
    for i in (0..n).filter(|&i| infeasible(i)) {
        set_bit(&mut infeasible_mask, i);
    }
    let mut cum = vec![0u64; 2 * words];
    // Infeasible: larger violations, strictly.
    order.clear();
    order.extend((0..n).filter(|&i| infeasible(i)));
    order.sort_by(|&a, &b| keys[b].violation.total_cmp(&keys[a].violation));
    sweep(
        order,
        |i| keys[i].violation,
        Sweep::Before,
        &mut cum,
        |i, m| dominates[i * words..(i + 1) * words].copy_from_slice(m),
    );
    // Feasible: no better in objective 0, no better in objective 1, equal in both.
    order.clear();
    order.extend((0..n).filter(|&i| !infeasible(i)));
    for k in 0..2 {
        order.sort_by(|&a, &b| keys[b].objectives[k].total_cmp(&keys[a].objectives[k]));
        sweep(
            order,
            |i| keys[i].objectives[k],
            Sweep::Through,
            &mut cum,
            |i, m| masks[(k * n + i) * words..(k * n + i + 1) * words].copy_from_slice(m),
        );
    }
    // `+ 0.0` turns -0.0 into 0.0: equal under `==`, they must sort together.
    order.sort_by(|&a, &b| {
        let (x, y) = (keys[a].objectives, keys[b].objectives);
        (x[0] + 0.0)
            .total_cmp(&(y[0] + 0.0))
            .then((x[1] + 0.0).total_cmp(&(y[1] + 0.0)))
    });
    sweep(
        order,
        |i| keys[i].objectives,
        Sweep::Group,
        &mut cum,
        |i, m| masks[(2 * n + i) * words..(2 * n + i + 1) * words].copy_from_slice(m),
    );
    for &i in order.iter() {
        for w in 0..words {
            let no_better = masks[i * words + w] & masks[(n + i) * words + w];
            let equal = masks[(2 * n + i) * words + w];
            dominates[i * words + w] = (no_better & !equal) | infeasible_mask[w];
        }
    }
}

fn set_bit(mask: &mut [u64], i: usize) {
    mask[i / 64] |= 1 << (i % 64);
}

/// Which mask [`sweep`] gives each member of a group of equal values.
#[derive(Clone, Copy, PartialEq)]
enum Sweep {
    /// The members of the groups before it.
    Before,
    /// Those and its own group.
    Through,
    /// Its own group only.
    Group,
}

/// Walks `order` (sorted so that equal values are adjacent) group by group, groups of
/// values equal under `==`, and hands `give` each member with its mask. `buf` holds two
/// masks.
fn sweep<V: PartialEq>(
    order: &[usize],
    value: impl Fn(usize) -> V,
    kind: Sweep,
    buf: &mut [u64],
    mut give: impl FnMut(usize, &[u64]),
) {
    let words = buf.len() / 2;
    let (before, through) = buf.split_at_mut(words);
    before.fill(0);
    through.fill(0);
    let mut g = 0;
    while g < order.len() {
        let mut end = g + 1;
        while end < order.len() && value(order[end]) == value(order[g]) {
            end += 1;
        }
        if kind == Sweep::Group {
            through.fill(0);
        } else {
            before.copy_from_slice(through);
        }
        for &i in &order[g..end] {
            set_bit(through, i);
        }
        let mask: &[u64] = if kind == Sweep::Before {
            before
        } else {
            through
        };
        for &i in &order[g..end] {
            give(i, mask);
        }
        g = end;
    }
}

/// Fronts of a non-dominated sort, flat: front `f` is `order[ends[f - 1]..ends[f]]`.
#[derive(Default)]
struct Fronts {
    order: Vec<usize>,
    ends: Vec<usize>,
}

impl Fronts {
    fn iter(&self) -> impl Iterator<Item = &[usize]> {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let f = &self.order[start..end];
            start = end;
            f
        })
    }
}

/// Buffers of the sort, reused across generations (a plan sorts 121 populations).
#[derive(Default)]
struct SortScratch {
    keys: Vec<Key>,
    /// Row `i`: bit `j` set when `i` dominates `j` (ascending bits give the order in which
    /// Deb's algorithm lists them).
    dominates: Vec<u64>,
    dominated_by: Vec<usize>,
    /// Indices of one front sorted by one objective (crowding).
    idx: Vec<usize>,
    /// Bit planes of [`dominance_rows`].
    masks: Vec<u64>,
    /// Individuals sorted by one value ([`dominance_rows`]).
    order: Vec<usize>,
}

/// Fast non-dominated sort (Deb et al. 2002, with constraint domination) into `fronts`.
/// The fronts and the order within each are those of the textbook algorithm with
/// per-individual lists; the lists are bit rows here, so a sort allocates nothing.
fn sort_fronts(pop: &[Ind], sc: &mut SortScratch, fronts: &mut Fronts) {
    let n = pop.len();
    let words = n.div_ceil(64);
    sc.keys.clear();
    sc.keys.extend(pop.iter().map(|p| Key::of(&p.cand)));
    sc.dominates.clear();
    sc.dominates.resize(n * words, 0);
    sc.dominated_by.clear();
    sc.dominated_by.resize(n, 0);
    dominance_rows(sc, n, words);
    for i in 0..n {
        for w in 0..words {
            let mut bits = sc.dominates[i * words + w];
            while bits != 0 {
                sc.dominated_by[w * 64 + bits.trailing_zeros() as usize] += 1;
                bits &= bits - 1;
            }
        }
    }
    fronts.order.clear();
    fronts.ends.clear();
    fronts
        .order
        .extend((0..n).filter(|&i| sc.dominated_by[i] == 0));
    let mut start = 0;
    while start < fronts.order.len() {
        let end = fronts.order.len();
        fronts.ends.push(end);
        for at in start..end {
            let i = fronts.order[at];
            for (w, &bits) in sc.dominates[i * words..(i + 1) * words].iter().enumerate() {
                let mut bits = bits;
                while bits != 0 {
                    let j = w * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    sc.dominated_by[j] -= 1;
                    if sc.dominated_by[j] == 0 {
                        fronts.order.push(j);
                    }
                }
            }
        }
        start = end;
    }
}

fn assign_crowding(pop: &mut [Ind], front: &[usize], sc: &mut SortScratch) {
    for &i in front {
        pop[i].crowd = 0.0;
    }
    if front.len() <= 2 {
        for &i in front {
            pop[i].crowd = f64::INFINITY;
        }
        return;
    }
    let SortScratch { keys, idx, .. } = sc;
    for k in 0..2 {
        let obj = |i: usize| keys[i].crowding_value(k);
        idx.clear();
        idx.extend_from_slice(front);
        idx.sort_by(|&a, &b| obj(a).total_cmp(&obj(b)));
        let (lo, hi) = (obj(idx[0]), obj(idx[idx.len() - 1]));
        pop[idx[0]].crowd = f64::INFINITY;
        pop[idx[idx.len() - 1]].crowd = f64::INFINITY;
        let span = hi - lo;
        if !(span > 0.0 && span.is_finite()) {
            continue;
        }
        for w in 1..idx.len() - 1 {
            let d = (obj(idx[w + 1]) - obj(idx[w - 1])) / span;
            pop[idx[w]].crowd += d;
        }
    }
}

fn better(a: &Ind, b: &Ind) -> bool {
    a.rank < b.rank || (a.rank == b.rank && a.crowd > b.crowd)
}

/// Runs NSGA-II and returns the feasible non-dominated candidates, cheapest first, with
/// duplicates removed. Empty when no allocation inside the bounds is feasible.
pub fn nsga2(problem: &JobProblem<'_>, params: Nsga2Params) -> Result<Vec<Candidate>> {
    problem.bounds.validate()?;
    check_non_negative("ps_mem_needed_gb", problem.ps_mem_needed_gb)?;
    let n = params.population.max(4) & !1;
    let ranges = problem.gene_ranges();
    let mut rng = rand::rngs::StdRng::seed_from_u64(params.seed);
    let cur_tp = problem.current_throughput();
    let mk = |genes: [f64; 6], problem: &JobProblem<'_>| Ind {
        genes,
        cand: problem.evaluate_from(problem.decode(&genes), cur_tp),
        rank: 0,
        crowd: 0.0,
    };
    let mut pop: Vec<Ind> = Vec::with_capacity(2 * n);
    // Seeds: the current allocation and the corners of the bounds.
    if let Some(c) = problem.current {
        let c = problem.bounds.clamp(&c);
        pop.push(mk(
            [
                f64::from(c.workers),
                f64::from(c.ps),
                c.worker_cpu,
                c.ps_cpu,
                c.worker_mem_gb,
                c.ps_mem_gb,
            ],
            problem,
        ));
    }
    pop.push(mk(ranges.map(|r| r.0), problem));
    pop.push(mk(ranges.map(|r| r.1), problem));
    while pop.len() < n {
        let g = ranges.map(|(lo, hi)| {
            if hi > lo {
                rng.random_range(lo..=hi)
            } else {
                lo
            }
        });
        pop.push(mk(g, problem));
    }
    let mut sc = SortScratch::default();
    let mut fronts = Fronts::default();
    let rank_pop = |pop: &mut Vec<Ind>, sc: &mut SortScratch, fronts: &mut Fronts| {
        sort_fronts(pop, sc, fronts);
        for (r, f) in fronts.iter().enumerate() {
            for &i in f {
                pop[i].rank = r;
            }
            assign_crowding(pop, f, sc);
        }
    };
    rank_pop(&mut pop, &mut sc, &mut fronts);
    for _ in 0..params.generations {
        let mut children = Vec::with_capacity(n);
        while children.len() < n {
            let pick = |rng: &mut rand::rngs::StdRng, pop: &[Ind]| {
                let (a, b) = (
                    rng.random_range(0..pop.len()),
                    rng.random_range(0..pop.len()),
                );
                if better(&pop[a], &pop[b]) {
                    a
                } else {
                    b
                }
            };
            let (pa, pb) = (pick(&mut rng, &pop), pick(&mut rng, &pop));
            let (mut c1, mut c2) = (pop[pa].genes, pop[pb].genes);
            if rng.random::<f64>() < params.crossover_prob {
                sbx(&mut c1, &mut c2, &ranges, params.eta_c, &mut rng);
            }
            mutate(&mut c1, &ranges, params.eta_m, &mut rng);
            mutate(&mut c2, &ranges, params.eta_m, &mut rng);
            children.push(mk(c1, problem));
            children.push(mk(c2, problem));
        }
        pop.extend(children);
        rank_pop(&mut pop, &mut sc, &mut fronts);
        let mut keep: Vec<usize> = Vec::with_capacity(n);
        for f in fronts.iter() {
            if keep.len() + f.len() <= n {
                keep.extend_from_slice(f);
            } else {
                let mut f = f.to_vec();
                f.sort_by(|&a, &b| pop[b].crowd.total_cmp(&pop[a].crowd));
                keep.extend(f.into_iter().take(n - keep.len()));
                break;
            }
        }
        keep.sort_unstable();
        let mut next = Vec::with_capacity(2 * n);
        for (i, ind) in pop.into_iter().enumerate() {
            if keep.binary_search(&i).is_ok() {
                next.push(ind);
            }
        }
        pop = next;
        rank_pop(&mut pop, &mut sc, &mut fronts);
    }
    let mut front: Vec<Candidate> = pop
        .iter()
        .filter(|p| p.rank == 0 && p.cand.violation == 0.0)
        .map(|p| p.cand)
        .collect();
    front.sort_by(|a, b| a.cost.total_cmp(&b.cost).then(b.gain.total_cmp(&a.gain)));
    front.dedup_by(|a, b| a.alloc == b.alloc);
    // Rank 0 under constraint domination is non-dominated among feasible members already;
    // filter once more so duplicates in objective space cannot leave a dominated one.
    let filtered: Vec<Candidate> = front
        .iter()
        .filter(|c| !front.iter().any(|o| o.dominates(c)))
        .copied()
        .collect();
    Ok(filtered)
}

fn sbx(
    a: &mut [f64; 6],
    b: &mut [f64; 6],
    ranges: &[(f64, f64); 6],
    eta: f64,
    rng: &mut rand::rngs::StdRng,
) {
    for k in 0..6 {
        if rng.random::<f64>() > 0.5 || (a[k] - b[k]).abs() < 1e-12 {
            continue;
        }
        let u: f64 = rng.random();
        let beta = if u <= 0.5 {
            (2.0 * u).powf(1.0 / (eta + 1.0))
        } else {
            (1.0 / (2.0 * (1.0 - u))).powf(1.0 / (eta + 1.0))
        };
        let (x1, x2) = (a[k], b[k]);
        let (lo, hi) = ranges[k];
        a[k] = (0.5 * ((1.0 + beta) * x1 + (1.0 - beta) * x2)).clamp(lo, hi);
        b[k] = (0.5 * ((1.0 - beta) * x1 + (1.0 + beta) * x2)).clamp(lo, hi);
    }
}

fn mutate(g: &mut [f64; 6], ranges: &[(f64, f64); 6], eta: f64, rng: &mut rand::rngs::StdRng) {
    for k in 0..6 {
        if rng.random::<f64>() >= 1.0 / 6.0 {
            continue;
        }
        let (lo, hi) = ranges[k];
        if hi <= lo {
            continue;
        }
        let u: f64 = rng.random();
        let delta = if u < 0.5 {
            (2.0 * u).powf(1.0 / (eta + 1.0)) - 1.0
        } else {
            1.0 - (2.0 * (1.0 - u)).powf(1.0 / (eta + 1.0))
        };
        // Integer genes need at least a one-step move to change.
        let step = (delta * (hi - lo)).abs().max(if k < 2 { 1.0 } else { 0.5 }) * delta.signum();
        g[k] = (g[k] + step).clamp(lo, hi);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::alloc::Range;
    use crate::throughput::dlrover::{tests as dl, DlroverModel};

    /// The sweeps give exactly the pairwise relation, ties, infeasible individuals and
    /// signed zeros included.
    #[test]
    fn dominance_rows_equal_the_pairwise_definition() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let pick =
            |rng: &mut rand::rngs::StdRng, vals: &[f64]| vals[rng.random_range(0..vals.len())];
        for n in [1usize, 2, 7, 64, 65, 96, 130] {
            for _ in 0..20 {
                // Few distinct values, so ties are common.
                let keys: Vec<Key> = (0..n)
                    .map(|_| Key {
                        violation: pick(&mut rng, &[0.0, 0.0, 0.0, 0.5, 1.0, 2.5]),
                        objectives: [
                            pick(&mut rng, &[-0.0, 0.0, 1.0, 2.0, 3.0]),
                            pick(&mut rng, &[0.5, 1.0, 4.0, f64::MAX]),
                        ],
                    })
                    .collect();
                let words = n.div_ceil(64);
                let mut sc = SortScratch {
                    keys: keys.clone(),
                    ..SortScratch::default()
                };
                sc.dominates.resize(n * words, 0);
                dominance_rows(&mut sc, n, words);
                for i in 0..n {
                    for j in 0..n {
                        let bit = sc.dominates[i * words + j / 64] >> (j % 64) & 1 == 1;
                        let want = i != j && keys[i].versus(&keys[j]).0;
                        let (a, b) = (&keys[i], &keys[j]);
                        assert_eq!(
                            bit,
                            want,
                            "n {n}: {i} over {j}: {:?} {:?}",
                            (a.violation, a.objectives),
                            (b.violation, b.objectives)
                        );
                    }
                }
            }
        }
    }

    pub(crate) fn problem_bounds() -> Bounds {
        Bounds {
            workers: Range::new(1, 8),
            ps: Range::new(1, 4),
            worker_cpu: Range::new(1.0, 4.0),
            ps_cpu: Range::new(1.0, 4.0),
            worker_mem_gb: Range::new(4.0, 4.0),
            ps_mem_gb: Range::new(8.0, 8.0),
        }
    }

    fn grid(problem: &JobProblem<'_>) -> Vec<Candidate> {
        let mut out = Vec::new();
        let b = problem.bounds;
        for w in b.workers.min..=b.workers.max {
            for p in b.ps.min..=b.ps.max {
                for cw in 2..=8 {
                    for cp in 2..=8 {
                        let a = Allocation {
                            workers: w,
                            ps: p,
                            worker_cpu: f64::from(cw) / 2.0,
                            ps_cpu: f64::from(cp) / 2.0,
                            worker_mem_gb: 4.0,
                            ps_mem_gb: 8.0,
                        };
                        out.push(problem.evaluate(a));
                    }
                }
            }
        }
        out
    }

    /// Area dominated by a front (minimizing cost and 1/gain) up to a reference point.
    fn hypervolume(front: &[Candidate], reference: [f64; 2]) -> f64 {
        let mut pts: Vec<[f64; 2]> = front
            .iter()
            .filter(|c| c.violation == 0.0)
            .map(|c| c.objectives())
            .filter(|o| o[0] < reference[0] && o[1] < reference[1])
            .collect();
        pts.sort_by(|a, b| a[0].total_cmp(&b[0]));
        let mut hv = 0.0;
        let mut best_y = reference[1];
        for (i, p) in pts.iter().enumerate() {
            if p[1] < best_y {
                best_y = p[1];
            }
            let next_x = pts.get(i + 1).map_or(reference[0], |q| q[0]);
            hv += (next_x - p[0]) * (reference[1] - best_y);
        }
        hv
    }

    #[test]
    fn front_is_non_dominated_feasible_and_near_the_true_front() {
        let model = DlroverModel::new(dl::constants(), dl::truth());
        let problem = JobProblem {
            model: &model,
            bounds: problem_bounds(),
            current: None,
            prices: Prices::default(),
            overhead: OverheadModel::default(),
            ps_mem_needed_gb: 12.0,
        };
        let front = nsga2(&problem, Nsga2Params::default()).unwrap();
        assert!(front.len() >= 5, "{}", front.len());
        for a in &front {
            assert_eq!(a.violation, 0.0);
            assert!(problem.bounds.contains(&a.alloc));
            assert!(a.alloc.ps >= 2, "12 GiB needs two 8 GiB PS: {a:?}");
            for b in &front {
                assert!(!b.dominates(a), "{b:?} dominates {a:?}");
            }
        }
        let all = grid(&problem);
        let true_front: Vec<Candidate> = all
            .iter()
            .filter(|c| {
                c.violation == 0.0 && !all.iter().any(|o| o.violation == 0.0 && o.dominates(c))
            })
            .copied()
            .collect();
        let reference = [
            all.iter().map(|c| c.cost).fold(0.0, f64::max) * 1.01,
            true_front
                .iter()
                .map(|c| c.objectives()[1])
                .fold(0.0, f64::max)
                * 1.01,
        ];
        let (hv, hv_true) = (
            hypervolume(&front, reference),
            hypervolume(&true_front, reference),
        );
        assert!(
            hv >= 0.95 * hv_true,
            "hypervolume {hv} vs exhaustive {hv_true}"
        );
    }

    #[test]
    fn overhead_reduces_gain_and_no_gain_means_empty_front() {
        let model = DlroverModel::new(dl::constants(), dl::truth());
        let mut b = problem_bounds();
        b.workers = Range::new(4, 4);
        b.ps = Range::new(2, 2);
        b.worker_cpu = Range::new(2.0, 2.0);
        b.ps_cpu = Range::new(2.0, 2.0);
        let current = b.clamp(&Allocation {
            workers: 4,
            ps: 2,
            worker_cpu: 2.0,
            ps_cpu: 2.0,
            worker_mem_gb: 4.0,
            ps_mem_gb: 8.0,
        });
        let problem = JobProblem {
            model: &model,
            bounds: b,
            current: Some(current),
            prices: Prices::default(),
            overhead: OverheadModel::default(),
            ps_mem_needed_gb: 1.0,
        };
        // The only allocation in bounds is the current one: it gains nothing.
        assert!(nsga2(&problem, Nsga2Params::default()).unwrap().is_empty());
        let o = OverheadModel::default();
        let mut more = current;
        more.ps = 3;
        assert!(o.overhead(Some(&current), 1000.0, &more, 1500.0) > 0.0);
        assert_eq!(o.overhead(None, 0.0, &more, 1500.0), 0.0);
    }
}
