//! A `[[preprocess]]` graph compiled into a plan, and the plan's execution.
//!
//! **Compile** (once, when the job file is loaded): every entry's chain is type checked
//! (an error names the entry and the op), its values get scratch columns, and each op
//! becomes a [`Kernel`] with its arguments resolved.
//!
//! **Horizontal fusion** (RAP §6.2): the chains' ops are scheduled into steps; one step
//! runs one kind of kernel over every chain that is ready for it. RAP solves a MILP that
//! maximizes `Σ (ops per step)²` under the chains' dependencies. Our chains are linear and
//! independent, so a list scheduler does it: at each step, run the kind that the most
//! chains are ready for. For the Criteo graph this gives 3 steps for 39 chains instead of
//! 39 × 3 kernel calls in chain order.
//!
//! **Execution** is cache-blocked: rows go through in blocks of [`BLOCK_ROWS`], and a
//! block's columns (8 KiB each) stay in L1/L2 from the load through every step to the
//! scatter into the batch. Nothing is allocated per block: the scratch columns are
//! allocated once per thread ([`Scratch`]).

use std::collections::HashMap;
use std::ops::Range;

use elastrec_data::{criteo, Batch, RawColumns, MISSING_CATEGORY};

use crate::error::{PreprocessError, Result};
use crate::kernels as k;
use crate::ops::Op;
use crate::spec::FeatureSpec;
use crate::types::{Element, ValueType};

/// Rows per cache block.
pub const BLOCK_ROWS: usize = 1024;

/// What a feature becomes in the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FeatureKind {
    /// Inputs of the bottom MLP.
    Dense,
    /// Ids, each looked up in its own embedding table.
    Sparse,
}

/// One compiled feature, as reported (`elastrec preprocess --explain`, logs).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Feature {
    /// Its name.
    pub name: String,
    /// Dense or sparse.
    pub kind: FeatureKind,
    /// Model inputs it occupies: dense columns, or embedding tables.
    pub width: usize,
    /// Sparse: the entry's `rows`.
    pub rows: Option<u64>,
    /// Sparse: how many distinct ids the chain can produce (a `sigrid_hash` mod, a
    /// bucket count), when it bounds them.
    pub cardinality: Option<u64>,
    /// Sparse: the raw categorical column (0-based) whose ids the feature keeps
    /// unchanged, if it is one.
    #[serde(skip)]
    pub raw_column: Option<usize>,
    /// Its type at the end of the chain.
    pub output: String,
}

/// What sizes one sparse column's embedding table, most binding first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableSize {
    /// The entry's `rows`.
    pub rows: Option<u64>,
    /// The ids the chain can produce.
    pub cardinality: Option<u64>,
    /// The raw `C` column (0-based) whose ids it keeps.
    pub raw_column: Option<usize>,
}

/// An input column of the Criteo layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Column {
    Int(usize),
    Cat(usize),
}

fn column_of(name: &str) -> Option<Column> {
    let index = |rest: &str, n: usize| {
        rest.parse::<usize>()
            .ok()
            .filter(|i| (1..=n).contains(i) && !rest.starts_with('0'))
            .map(|i| i - 1)
    };
    if let Some(rest) = name.strip_prefix('I') {
        return index(rest, criteo::DENSE).map(Column::Int);
    }
    name.strip_prefix('C')
        .and_then(|rest| index(rest, criteo::CATEGORICAL))
        .map(Column::Cat)
}

/// An op with its arguments resolved for its input type.
#[derive(Debug, Clone)]
enum Kernel {
    FillInt(i64),
    FillFloat(f64),
    FillId(u64),
    ClampInt(i64, i64),
    ClampFloat(f64, f64),
    ClampId(u64, u64),
    Log1pInt,
    Log1pFloat,
    LogitInt(f64),
    LogitFloat(f64),
    BoxCoxInt(f64),
    BoxCoxFloat(f64),
    BucketizeInt(Vec<f64>),
    BucketizeFloat(Vec<f64>),
    Sigrid { salt: u64, modulus: u64 },
    MapId(Vec<(u64, u64)>, Option<u64>),
    Ngram(usize),
    OneHot,
    MultiHot,
    IntToFloat,
    IdToFloat,
    FloatToInt,
    IdToInt,
    IntToId,
    FloatToId,
}

impl Kernel {
    /// Which kernels may share a step.
    fn kind(&self) -> &'static str {
        match self {
            Kernel::FillInt(_) => "fill_null/int",
            Kernel::FillFloat(_) => "fill_null/float",
            Kernel::FillId(_) => "fill_null/id",
            Kernel::ClampInt(..) => "clamp/int",
            Kernel::ClampFloat(..) => "clamp/float",
            Kernel::ClampId(..) => "clamp/id",
            Kernel::Log1pInt => "log1p/int",
            Kernel::Log1pFloat => "log1p/float",
            Kernel::LogitInt(_) => "logit/int",
            Kernel::LogitFloat(_) => "logit/float",
            Kernel::BoxCoxInt(_) => "box_cox/int",
            Kernel::BoxCoxFloat(_) => "box_cox/float",
            Kernel::BucketizeInt(_) => "bucketize/int",
            Kernel::BucketizeFloat(_) => "bucketize/float",
            Kernel::Sigrid { .. } => "sigrid_hash",
            Kernel::MapId(..) => "map_id",
            Kernel::Ngram(_) => "ngram",
            Kernel::OneHot => "onehot",
            Kernel::MultiHot => "multihot",
            Kernel::IntToFloat => "cast/int->float",
            Kernel::IdToFloat => "cast/id->float",
            Kernel::FloatToInt => "cast/float->int",
            Kernel::IdToInt => "cast/id->int",
            Kernel::IntToId => "cast/int->id",
            Kernel::FloatToId => "cast/float->id",
        }
    }
}

/// One chain's op in a step: its kernel, the scratch columns it reads and writes.
#[derive(Debug, Clone)]
struct Member {
    kernel: Kernel,
    input: Vec<usize>,
    output: Vec<usize>,
}

/// Ops of one kind from several chains, run together.
#[derive(Debug, Clone)]
struct Step {
    kind: &'static str,
    members: Vec<Member>,
}

/// Copies an input column into a scratch column.
#[derive(Debug, Clone, Copy)]
struct Load {
    column: Column,
    /// Element of the scratch column (an `I` column in an id list is cast to id).
    element: Element,
    slot: usize,
}

/// A compiled `[[preprocess]]` graph.
#[derive(Debug, Clone)]
pub struct Plan {
    features: Vec<Feature>,
    loads: Vec<Load>,
    steps: Vec<Step>,
    dense_out: Vec<usize>,
    sparse_out: Vec<usize>,
    /// Scratch columns per element: ints, floats, ids.
    slots: [usize; 3],
}

/// A thread's scratch columns for one block.
#[derive(Debug, Clone)]
pub struct Scratch {
    ints: Vec<Vec<i64>>,
    floats: Vec<Vec<f64>>,
    ids: Vec<Vec<u64>>,
}

struct Builder {
    slots: [usize; 3],
}

impl Builder {
    fn slot(&mut self, e: Element) -> usize {
        let i = e as usize;
        self.slots[i] += 1;
        self.slots[i] - 1
    }
    fn slots(&mut self, e: Element, n: usize) -> Vec<usize> {
        (0..n).map(|_| self.slot(e)).collect()
    }
}

impl Plan {
    /// Compiles a graph; an error names the entry (1-based, and its name) and the op.
    pub fn compile(specs: &[FeatureSpec]) -> Result<Plan> {
        if specs.is_empty() {
            return Err(PreprocessError::Empty);
        }
        let mut b = Builder { slots: [0; 3] };
        let mut loads = Vec::new();
        let mut chains: Vec<Vec<Member>> = Vec::new();
        let mut features = Vec::new();
        let (mut dense_out, mut sparse_out) = (Vec::new(), Vec::new());
        let mut names = HashMap::new();
        let expanded =
            crate::spec::expand(specs).map_err(|(entry, reason)| PreprocessError::Entry {
                entry,
                name: specs[entry - 1].display_name(),
                op: None,
                reason,
            })?;
        for (entry, spec) in &expanded {
            let (entry, spec) = (*entry, spec);
            let name = spec.display_name();
            let entry_err = |op: Option<(usize, &str)>, reason: String| PreprocessError::Entry {
                entry,
                name: name.clone(),
                op: op.map(|(j, t)| format!("op {} `{t}`", j + 1)),
                reason,
            };
            if let Some(first) = names.insert(name.clone(), entry) {
                return Err(entry_err(
                    None,
                    format!("entry {first} has the same name; give one of them a `name`"),
                ));
            }
            let columns = spec.input.columns();
            if columns.is_empty() {
                return Err(entry_err(None, "`input` names no column".into()));
            }
            let mut cols = Vec::new();
            for c in &columns {
                cols.push(column_of(c).ok_or_else(|| {
                    entry_err(
                        None,
                        format!(
                            "no input column `{c}`; the columns are I1..I{} (integers) \
                             and C1..C{} (categorical)",
                            criteo::DENSE,
                            criteo::CATEGORICAL
                        ),
                    )
                })?);
            }
            let (mut ty, mut cur) = match (&spec.input, cols[0]) {
                (crate::spec::Input::One(_), Column::Int(_)) => (ValueType::Int, Element::Int),
                (crate::spec::Input::One(_), Column::Cat(_)) => (ValueType::Id, Element::Id),
                (crate::spec::Input::Many(_), _) => (ValueType::Ids(cols.len()), Element::Id),
            };
            let mut slots = Vec::new();
            for &column in &cols {
                let slot = b.slot(cur);
                loads.push(Load {
                    column,
                    element: cur,
                    slot,
                });
                slots.push(slot);
            }
            let mut rows: Option<u64> = None;
            // A raw categorical column whose ids no op changes: its table can be sized
            // from the data's cardinality of that column.
            let mut raw_column = match (&spec.input, cols[0]) {
                (crate::spec::Input::One(_), Column::Cat(c)) => Some(c),
                _ => None,
            };
            let mut chain = Vec::new();
            for (j, text) in spec.ops.iter().enumerate() {
                let op = Op::parse(text).map_err(|e| entry_err(Some((j, text)), e))?;
                let out = op.output(ty).map_err(|e| entry_err(Some((j, text)), e))?;
                rows = op.cardinality(rows);
                if !matches!(op, Op::FillNull(_) | Op::FirstX(_)) {
                    raw_column = None;
                }
                let (kernel, new_slots) = lower(&op, ty, out, &slots, &mut b);
                if let Some(kernel) = kernel {
                    chain.push(Member {
                        kernel,
                        input: slots.clone(),
                        output: new_slots.clone(),
                    });
                }
                slots = new_slots;
                ty = out;
                cur = ty.element();
            }
            let _ = cur;
            let kind = match ty {
                ValueType::Float | ValueType::Floats(_) => {
                    dense_out.extend(&slots);
                    FeatureKind::Dense
                }
                ValueType::Id | ValueType::Ids(_) => {
                    sparse_out.extend(&slots);
                    FeatureKind::Sparse
                }
                ValueType::Int => {
                    return Err(entry_err(
                        None,
                        "the chain ends with an int; the model takes floats (dense) or ids \
                         (sparse): end it with log1p, cast(float), bucketize or cast(id)"
                            .into(),
                    ))
                }
            };
            if spec.rows.is_some() && kind == FeatureKind::Dense {
                return Err(entry_err(
                    None,
                    "`rows` is for sparse features; this chain ends with floats".into(),
                ));
            }
            if spec.rows == Some(0) {
                return Err(entry_err(None, "`rows` must be at least 1".into()));
            }
            features.push(Feature {
                name,
                kind,
                width: ty.width(),
                rows: spec.rows,
                cardinality: match kind {
                    FeatureKind::Sparse => rows,
                    FeatureKind::Dense => None,
                },
                raw_column,
                output: ty.to_string(),
            });
            chains.push(chain);
        }
        if sparse_out.is_empty() {
            return Err(PreprocessError::NoSparse);
        }
        Ok(Plan {
            features,
            loads,
            steps: schedule(chains),
            dense_out,
            sparse_out,
            slots: b.slots,
        })
    }

    /// The features, in the order their columns appear in a batch.
    pub fn features(&self) -> &[Feature] {
        &self.features
    }

    /// Dense columns per row (the bottom MLP's input width).
    pub fn dense_width(&self) -> usize {
        self.dense_out.len()
    }

    /// Ids per row (embedding tables).
    pub fn sparse_width(&self) -> usize {
        self.sparse_out.len()
    }

    /// Per sparse column: what sizes its embedding table.
    pub fn table_sizes(&self) -> Vec<TableSize> {
        self.features
            .iter()
            .filter(|f| f.kind == FeatureKind::Sparse)
            .flat_map(|f| {
                let size = TableSize {
                    rows: f.rows,
                    cardinality: f.cardinality,
                    raw_column: f.raw_column,
                };
                std::iter::repeat_n(size, f.width)
            })
            .collect()
    }

    /// The fused steps: each step's kernel kind and how many chains it runs.
    pub fn steps(&self) -> Vec<(&'static str, usize)> {
        self.steps
            .iter()
            .map(|s| (s.kind, s.members.len()))
            .collect()
    }

    /// Scratch for one thread.
    pub fn scratch(&self) -> Scratch {
        Scratch {
            ints: (0..self.slots[0]).map(|_| vec![0; BLOCK_ROWS]).collect(),
            floats: (0..self.slots[1]).map(|_| vec![0.0; BLOCK_ROWS]).collect(),
            ids: (0..self.slots[2]).map(|_| vec![0; BLOCK_ROWS]).collect(),
        }
    }

    /// Preprocesses every row of `input` into `out` (cleared first) on this thread.
    pub fn run(&self, input: &RawColumns, out: &mut Batch, scratch: &mut Scratch) {
        self.prepare(input, out);
        let (dw, sw) = (self.dense_width(), self.sparse_width());
        let n = input.len();
        self.run_rows(
            input,
            0..n,
            &mut out.dense[..n * dw],
            &mut out.sparse[..n * sw],
            scratch,
        );
    }

    /// [`Plan::run`] on `threads` threads, each over a contiguous share of the rows.
    pub fn run_parallel(&self, input: &RawColumns, out: &mut Batch, threads: usize) {
        let n = input.len();
        let threads = threads.clamp(1, n.div_ceil(BLOCK_ROWS).max(1));
        if threads == 1 {
            return self.run(input, out, &mut self.scratch());
        }
        self.prepare(input, out);
        let (dw, sw) = (self.dense_width(), self.sparse_width());
        let share = n.div_ceil(threads).div_ceil(BLOCK_ROWS) * BLOCK_ROWS;
        std::thread::scope(|scope| {
            let mut dense = &mut out.dense[..];
            let mut sparse = &mut out.sparse[..];
            let mut start = 0;
            while start < n {
                let end = (start + share).min(n);
                let (d, dr) = std::mem::take(&mut dense).split_at_mut((end - start) * dw);
                let (s, sr) = std::mem::take(&mut sparse).split_at_mut((end - start) * sw);
                dense = dr;
                sparse = sr;
                scope.spawn(move || self.run_rows(input, start..end, d, s, &mut self.scratch()));
                start = end;
            }
        });
    }

    /// The cost model's measurements (RAP §5): seconds each part of the plan takes over
    /// all of `input` on this thread, in plan order: `load` (columns into scratch), each
    /// fused step, `scatter` (scratch into the batch's rows).
    pub fn profile(&self, input: &RawColumns) -> Vec<(String, f64)> {
        use std::time::Instant;
        let mut s = self.scratch();
        let mut out = Batch::default();
        self.prepare(input, &mut out);
        let mut load = 0.0;
        let mut steps = vec![0.0; self.steps.len()];
        let mut scatter = 0.0;
        let (dw, sw) = (self.dense_width(), self.sparse_width());
        let n_all = input.len();
        let mut at = 0;
        while at < n_all {
            let n = (n_all - at).min(BLOCK_ROWS);
            let t = Instant::now();
            self.load_block(input, at, n, &mut s);
            load += t.elapsed().as_secs_f64();
            for (step, cost) in self.steps.iter().zip(steps.iter_mut()) {
                let t = Instant::now();
                for m in &step.members {
                    apply(m, &mut s, n);
                }
                *cost += t.elapsed().as_secs_f64();
            }
            let t = Instant::now();
            let (d, sp) = (
                &mut out.dense[at * dw..(at + n) * dw],
                &mut out.sparse[at * sw..(at + n) * sw],
            );
            self.scatter_block(&s, n, d, sp);
            scatter += t.elapsed().as_secs_f64();
            at += n;
        }
        let mut costs = vec![("load".to_string(), load)];
        costs.extend(
            self.steps
                .iter()
                .zip(steps)
                .map(|(st, c)| (format!("{}×{}", st.kind, st.members.len()), c)),
        );
        costs.push(("scatter".to_string(), scatter));
        costs
    }

    fn prepare(&self, input: &RawColumns, out: &mut Batch) {
        let n = input.len();
        out.dense_width = self.dense_width();
        out.sparse_width = self.sparse_width();
        out.labels.clear();
        out.labels.extend_from_slice(&input.labels);
        out.tasks = input.tasks;
        out.task_labels.clear();
        out.task_labels.extend_from_slice(&input.task_labels);
        out.dense.resize(n * out.dense_width, 0.0);
        out.sparse.resize(n * out.sparse_width, 0);
    }

    /// Rows `rows` of `input` into `dense` / `sparse` (exactly those rows' outputs).
    fn run_rows(
        &self,
        input: &RawColumns,
        rows: Range<usize>,
        dense: &mut [f32],
        sparse: &mut [u64],
        s: &mut Scratch,
    ) {
        let mut at = rows.start;
        while at < rows.end {
            let n = (rows.end - at).min(BLOCK_ROWS);
            self.load_block(input, at, n, s);
            for step in &self.steps {
                for m in &step.members {
                    apply(m, s, n);
                }
            }
            let base = at - rows.start;
            let (dw, sw) = (self.dense_width(), self.sparse_width());
            self.scatter_block(
                s,
                n,
                &mut dense[base * dw..(base + n) * dw],
                &mut sparse[base * sw..(base + n) * sw],
            );
            at += n;
        }
    }

    /// Rows `at..at + n` of the input columns into their scratch columns.
    fn load_block(&self, input: &RawColumns, at: usize, n: usize, s: &mut Scratch) {
        let block = at..at + n;
        for load in &self.loads {
            match (load.column, load.element) {
                (Column::Int(c), Element::Int) => {
                    s.ints[load.slot][..n].copy_from_slice(&input.ints[c][block.clone()])
                }
                (Column::Int(c), _) => {
                    k::int_to_id(&input.ints[c][block.clone()], &mut s.ids[load.slot][..n])
                }
                (Column::Cat(c), _) => {
                    s.ids[load.slot][..n].copy_from_slice(&input.cats[c][block.clone()])
                }
            }
        }
    }

    /// The block's outputs into its rows of the batch (`dense` and `sparse` hold exactly
    /// those `n` rows).
    fn scatter_block(&self, s: &Scratch, n: usize, dense: &mut [f32], sparse: &mut [u64]) {
        let (dw, sw) = (self.dense_width(), self.sparse_width());
        for (c, &slot) in self.dense_out.iter().enumerate() {
            for (r, &v) in s.floats[slot][..n].iter().enumerate() {
                dense[r * dw + c] = if v.is_nan() { 0.0 } else { v as f32 };
            }
        }
        for (c, &slot) in self.sparse_out.iter().enumerate() {
            for (r, &v) in s.ids[slot][..n].iter().enumerate() {
                sparse[r * sw + c] = if v == crate::types::NULL_ID {
                    MISSING_CATEGORY
                } else {
                    v
                };
            }
        }
    }
}

/// The kernel for `op` on a value of type `ty` held in `slots`, and the slots of its
/// result. `None`: the op only renames columns (`first_x`, a cast to the same type).
fn lower(
    op: &Op,
    ty: ValueType,
    out: ValueType,
    slots: &[usize],
    b: &mut Builder,
) -> (Option<Kernel>, Vec<usize>) {
    use Element as E;
    let same = slots.to_vec();
    let fresh = |b: &mut Builder| b.slots(out.element(), out.width());
    let elem = ty.element();
    let kernel = match (op, elem) {
        (Op::FillNull(v), E::Int) => Kernel::FillInt(v.as_int().expect("typed")),
        (Op::FillNull(v), E::Float) => Kernel::FillFloat(v.float),
        (Op::FillNull(v), E::Id) => Kernel::FillId(v.as_id().expect("typed")),
        (Op::Clamp { min, max }, E::Int) => Kernel::ClampInt(
            min.and_then(|n| n.as_int()).unwrap_or(i64::MIN + 1),
            max.and_then(|n| n.as_int()).unwrap_or(i64::MAX),
        ),
        (Op::Clamp { min, max }, E::Float) => Kernel::ClampFloat(
            min.map_or(f64::NEG_INFINITY, |n| n.float),
            max.map_or(f64::INFINITY, |n| n.float),
        ),
        (Op::Clamp { min, max }, E::Id) => Kernel::ClampId(
            min.and_then(|n| n.as_id()).unwrap_or(0),
            max.and_then(|n| n.as_id()).unwrap_or(u64::MAX - 1),
        ),
        (Op::Log1p, E::Int) => return (Some(Kernel::Log1pInt), fresh(b)),
        (Op::Log1p, _) => Kernel::Log1pFloat,
        (Op::Logit { eps }, E::Int) => return (Some(Kernel::LogitInt(*eps)), fresh(b)),
        (Op::Logit { eps }, _) => Kernel::LogitFloat(*eps),
        (Op::BoxCox { lambda }, E::Int) => return (Some(Kernel::BoxCoxInt(*lambda)), fresh(b)),
        (Op::BoxCox { lambda }, _) => Kernel::BoxCoxFloat(*lambda),
        (Op::Bucketize(borders), E::Int) => {
            return (Some(Kernel::BucketizeInt(borders.clone())), fresh(b))
        }
        (Op::Bucketize(borders), _) => {
            return (Some(Kernel::BucketizeFloat(borders.clone())), fresh(b))
        }
        (Op::SigridHash { salt, modulus }, _) => Kernel::Sigrid {
            salt: k::sigrid_salt(*salt),
            modulus: *modulus,
        },
        (Op::MapId { map, default }, _) => Kernel::MapId(map.clone(), *default),
        (Op::FirstX(x), _) => return (None, slots[..(*x).min(slots.len())].to_vec()),
        (Op::Ngram(n), _) => return (Some(Kernel::Ngram(*n)), fresh(b)),
        (Op::OneHot(_), _) => return (Some(Kernel::OneHot), fresh(b)),
        (Op::MultiHot(_), _) => return (Some(Kernel::MultiHot), fresh(b)),
        (Op::Cast(to), from) if *to == from => return (None, same),
        (Op::Cast(to), from) => {
            let kernel = match (from, to) {
                (E::Int, E::Float) => Kernel::IntToFloat,
                (E::Id, E::Float) => Kernel::IdToFloat,
                (E::Float, E::Int) => Kernel::FloatToInt,
                (E::Id, E::Int) => Kernel::IdToInt,
                (E::Int, E::Id) => Kernel::IntToId,
                _ => Kernel::FloatToId,
            };
            return (Some(kernel), fresh(b));
        }
    };
    (Some(kernel), same)
}

/// Splits the chains' members into steps: each step takes the kernel kind the most chains
/// are ready for (ties: the kind first met), until every chain is done.
fn schedule(chains: Vec<Vec<Member>>) -> Vec<Step> {
    let mut next: Vec<std::vec::IntoIter<Member>> =
        chains.into_iter().map(Vec::into_iter).collect();
    let mut heads: Vec<Option<Member>> = next.iter_mut().map(Iterator::next).collect();
    let mut steps = Vec::new();
    loop {
        let mut counts: Vec<(&'static str, usize)> = Vec::new();
        for m in heads.iter().flatten() {
            let kind = m.kernel.kind();
            match counts.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, c)) => *c += 1,
                None => counts.push((kind, 1)),
            }
        }
        let Some(&(kind, _)) =
            counts
                .iter()
                .fold(None, |best: Option<&(&str, usize)>, c| match best {
                    Some(b) if b.1 >= c.1 => Some(b),
                    _ => Some(c),
                })
        else {
            return steps;
        };
        let mut members = Vec::new();
        for (head, rest) in heads.iter_mut().zip(next.iter_mut()) {
            if head.as_ref().is_some_and(|m| m.kernel.kind() == kind) {
                members.push(head.take().expect("checked"));
                *head = rest.next();
            }
        }
        steps.push(Step { kind, members });
    }
}

/// Runs `f` over the float columns `outputs` (their first `n` rows), taken out of the
/// scratch meanwhile so that `f` may read its other columns; then puts them back.
fn with_float_outputs(
    s: &mut Scratch,
    outputs: &[usize],
    n: usize,
    f: impl FnOnce(&Scratch, &mut [&mut [f64]]),
) {
    let mut cols: Vec<Vec<f64>> = outputs
        .iter()
        .map(|&c| std::mem::take(&mut s.floats[c]))
        .collect();
    let mut views: Vec<&mut [f64]> = cols.iter_mut().map(|c| &mut c[..n]).collect();
    f(s, &mut views);
    drop(views);
    for (&c, col) in outputs.iter().zip(cols) {
        s.floats[c] = col;
    }
}

/// Runs one chain's op over the first `n` rows of its scratch columns.
fn apply(m: &Member, s: &mut Scratch, n: usize) {
    let (i, o) = (&m.input, &m.output);
    match &m.kernel {
        Kernel::FillInt(v) => i
            .iter()
            .for_each(|&c| k::fill_null_int(&mut s.ints[c][..n], *v)),
        Kernel::FillFloat(v) => i
            .iter()
            .for_each(|&c| k::fill_null_float(&mut s.floats[c][..n], *v)),
        Kernel::FillId(v) => i
            .iter()
            .for_each(|&c| k::fill_null_id(&mut s.ids[c][..n], *v)),
        Kernel::ClampInt(lo, hi) => i
            .iter()
            .for_each(|&c| k::clamp_int(&mut s.ints[c][..n], *lo, *hi)),
        Kernel::ClampFloat(lo, hi) => i
            .iter()
            .for_each(|&c| k::clamp_float(&mut s.floats[c][..n], *lo, *hi)),
        Kernel::ClampId(lo, hi) => i
            .iter()
            .for_each(|&c| k::clamp_id(&mut s.ids[c][..n], *lo, *hi)),
        Kernel::Log1pInt => k::log1p_int(&s.ints[i[0]][..n], &mut s.floats[o[0]][..n]),
        Kernel::Log1pFloat => k::log1p_float(&mut s.floats[i[0]][..n]),
        Kernel::LogitInt(eps) => {
            k::int_to_float(&s.ints[i[0]][..n], &mut s.floats[o[0]][..n]);
            k::logit(&mut s.floats[o[0]][..n], *eps);
        }
        Kernel::LogitFloat(eps) => k::logit(&mut s.floats[i[0]][..n], *eps),
        Kernel::BoxCoxInt(lambda) => {
            k::int_to_float(&s.ints[i[0]][..n], &mut s.floats[o[0]][..n]);
            k::box_cox(&mut s.floats[o[0]][..n], *lambda);
        }
        Kernel::BoxCoxFloat(lambda) => k::box_cox(&mut s.floats[i[0]][..n], *lambda),
        Kernel::BucketizeInt(borders) => {
            k::bucketize_int(&s.ints[i[0]][..n], borders, &mut s.ids[o[0]][..n])
        }
        Kernel::BucketizeFloat(borders) => {
            k::bucketize(&s.floats[i[0]][..n], borders, &mut s.ids[o[0]][..n])
        }
        Kernel::Sigrid { salt, modulus } => i
            .iter()
            .for_each(|&c| k::sigrid_hash(&mut s.ids[c][..n], *salt, *modulus)),
        Kernel::MapId(map, default) => i
            .iter()
            .for_each(|&c| k::map_id(&mut s.ids[c][..n], map, *default)),
        Kernel::Ngram(len) => {
            for (g, &out) in o.iter().enumerate() {
                let mut col = std::mem::take(&mut s.ids[out]);
                let window: Vec<&[u64]> = i[g..g + len].iter().map(|&c| &s.ids[c][..n]).collect();
                k::ngram(&window, &mut col[..n]);
                s.ids[out] = col;
            }
        }
        Kernel::OneHot => with_float_outputs(s, o, n, |s, out| k::onehot(&s.ids[i[0]][..n], out)),
        Kernel::MultiHot => with_float_outputs(s, o, n, |s, out| {
            let srcs: Vec<&[u64]> = i.iter().map(|&c| &s.ids[c][..n]).collect();
            k::multihot(&srcs, out)
        }),
        Kernel::IntToFloat => k::int_to_float(&s.ints[i[0]][..n], &mut s.floats[o[0]][..n]),
        Kernel::IdToFloat => k::id_to_float(&s.ids[i[0]][..n], &mut s.floats[o[0]][..n]),
        Kernel::FloatToInt => k::float_to_int(&s.floats[i[0]][..n], &mut s.ints[o[0]][..n]),
        Kernel::IdToInt => k::id_to_int(&s.ids[i[0]][..n], &mut s.ints[o[0]][..n]),
        Kernel::IntToId => k::int_to_id(&s.ints[i[0]][..n], &mut s.ids[o[0]][..n]),
        Kernel::FloatToId => k::float_to_id(&s.floats[i[0]][..n], &mut s.ids[o[0]][..n]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{default_graph, Input};
    use elastrec_data::RawRow;

    fn spec(input: &str, ops: &[&str]) -> FeatureSpec {
        FeatureSpec {
            name: None,
            input: Input::One(input.into()),
            ops: ops.iter().map(|s| s.to_string()).collect(),
            rows: None,
        }
    }

    /// Rows with every kind of Criteo value: empty fields, negatives, the table's edge,
    /// large integers.
    fn criteo_rows(n: usize) -> RawColumns {
        let mut cols = RawColumns::with_capacity(n);
        let mut z = 7u64;
        for i in 0..n {
            let mut row = RawRow {
                label: (i % 3 == 0) as u8,
                ..RawRow::default()
            };
            for v in row.ints.iter_mut() {
                z = elastrec_common::splitmix::splitmix64(z);
                *v = match z % 7 {
                    0 => None,
                    1 => Some(-((z >> 40) as i64)),
                    2 => Some(4095 + (z >> 62) as i64),
                    3 => Some((z >> 20) as i64),
                    _ => Some((z >> 52) as i64),
                };
            }
            for c in row.cats.iter_mut() {
                z = elastrec_common::splitmix::splitmix64(z);
                *c = (!z.is_multiple_of(5)).then_some(z as u32);
            }
            cols.push(&row);
        }
        cols
    }

    #[test]
    fn the_default_graph_gives_the_bits_of_the_old_fixed_transform() {
        let plan = Plan::compile(&default_graph()).unwrap();
        assert_eq!(
            (plan.dense_width(), plan.sparse_width()),
            (criteo::DENSE, criteo::CATEGORICAL)
        );
        let input = criteo_rows(3 * BLOCK_ROWS + 17);
        let mut want = criteo::batch(input.len());
        for i in 0..input.len() {
            want.push_raw(&input.row(i));
        }
        for threads in [1, 2, 3] {
            let mut got = Batch::default();
            plan.run_parallel(&input, &mut got, threads);
            assert_eq!(got.labels, want.labels);
            assert_eq!(got.sparse, want.sparse);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got.dense), bits(&want.dense), "{threads} threads");
        }
    }

    #[test]
    fn identical_ops_of_different_features_are_fused_into_one_step() {
        let plan = Plan::compile(&default_graph()).unwrap();
        assert_eq!(
            plan.steps(),
            vec![("fill_null/int", 13), ("clamp/int", 13), ("log1p/int", 13)]
        );
        // A chain that starts later is aligned with the others rather than run alone.
        let plan = Plan::compile(&[
            spec("I1", &["fill_null(0)", "log1p"]),
            spec("I2", &["log1p"]),
            spec("I3", &["fill_null(1)", "log1p"]),
            spec("C1", &["sigrid_hash(1, 10)"]),
            spec("C2", &["sigrid_hash(2, 10)"]),
        ])
        .unwrap();
        // In chain order this would be 7 kernel calls in 5 kinds; fused, 3 steps: the
        // I2 chain's log1p waits one step to run with the other two.
        assert_eq!(
            plan.steps(),
            vec![("fill_null/int", 2), ("log1p/int", 3), ("sigrid_hash", 2)]
        );
    }

    #[test]
    fn the_profile_names_every_part_of_the_plan() {
        let plan = Plan::compile(&default_graph()).unwrap();
        let costs = plan.profile(&criteo_rows(2 * BLOCK_ROWS));
        let names: Vec<&str> = costs.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            vec![
                "load",
                "fill_null/int×13",
                "clamp/int×13",
                "log1p/int×13",
                "scatter"
            ]
        );
        assert!(costs.iter().all(|(_, s)| *s >= 0.0 && s.is_finite()));
    }

    #[test]
    fn widths_and_table_rows_follow_the_chains() {
        let plan = Plan::compile(&[
            spec("I1", &["fill_null(0)", "bucketize([1, 10])", "onehot(3)"]),
            spec("I2", &["bucketize([1, 10, 100])"]),
            FeatureSpec {
                name: Some("cross".into()),
                input: Input::Many(vec!["C1".into(), "C2".into(), "C3".into()]),
                ops: vec!["ngram(2)".into(), "sigrid_hash(0, 1000)".into()],
                rows: None,
            },
            FeatureSpec {
                rows: Some(77),
                ..spec("C4", &[])
            },
        ])
        .unwrap();
        assert_eq!(plan.dense_width(), 3);
        assert_eq!(plan.sparse_width(), 4);
        let sizes: Vec<_> = plan
            .table_sizes()
            .iter()
            .map(|t| (t.rows, t.cardinality, t.raw_column))
            .collect();
        assert_eq!(
            sizes,
            vec![
                (None, Some(4), None),
                (None, Some(1000), None),
                (None, Some(1000), None),
                (Some(77), None, Some(3))
            ]
        );
        assert_eq!(plan.features()[2].name, "cross");
        assert_eq!(plan.features()[2].output, "ids(2)");
    }

    #[test]
    fn a_column_range_makes_one_feature_per_column() {
        let plan = Plan::compile(&[
            spec("I2..I4", &["fill_null(0)", "log1p"]),
            spec("C1..C2", &[]),
        ])
        .unwrap();
        let names: Vec<&str> = plan.features().iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, vec!["I2", "I3", "I4", "C1", "C2"]);
        assert_eq!((plan.dense_width(), plan.sparse_width()), (3, 2));
        let e = Plan::compile(&[spec("C1", &[]), spec("I4..I2", &["log1p"])])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("[[preprocess]] entry 2 (I4..I2): `I4..I2` is not a column range"),
            "{e}"
        );
        // Entry numbers stay those of the job file after a range is expanded.
        let e = Plan::compile(&[spec("C1..C3", &[]), spec("I1", &["frob"])])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("[[preprocess]] entry 2 (I1), op 1 `frob`"),
            "{e}"
        );
    }

    #[test]
    fn a_bad_graph_is_refused_naming_the_entry_and_the_op() {
        let err = |specs: &[FeatureSpec]| Plan::compile(specs).unwrap_err().to_string();
        let e = err(&[
            spec("C1", &[]),
            spec("C2", &["sigrid_hash(1, 10)", "log1p"]),
        ]);
        assert_eq!(
            e,
            "[[preprocess]] entry 2 (C2), op 2 `log1p`: log1p takes int or float, not id; \
             cast(float) first"
        );
        let e = err(&[spec("C1", &[]), spec("I5", &["fill_null(0)", "frob(2)"])]);
        assert!(
            e.starts_with("[[preprocess]] entry 2 (I5), op 2 `frob(2)`: unknown operator"),
            "{e}"
        );
        let e = err(&[spec("C1", &[]), spec("I14", &["log1p"])]);
        assert!(
            e.contains("entry 2 (I14)") && e.contains("no input column `I14`"),
            "{e}"
        );
        let e = err(&[spec("C1", &[]), spec("I1", &["bucketize([3, 2])"])]);
        assert!(
            e.contains("op 1 `bucketize([3, 2])`") && e.contains("strictly increasing"),
            "{e}"
        );
        let e = err(&[spec("C1", &[]), spec("I1", &["fill_null(0)"])]);
        assert!(e.contains("ends with an int"), "{e}");
        assert!(err(&[spec("I1", &["log1p"])]).contains("no sparse feature"));
        assert!(err(&[spec("C1", &[]), spec("C1", &["sigrid_hash(1, 2)"])]).contains("same name"));
        assert!(err(&[]).contains("is empty"));
    }
}
