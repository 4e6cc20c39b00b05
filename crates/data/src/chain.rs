//! A named feature's own operator chain (`ops = [...]` of a `[[data.feature]]`): the
//! `[[preprocess]]` operators ([`crate::ops`]) applied to one column as it is read, by
//! every reader (Parquet, CSV, JSON files and messages, `serve` requests), so a feature
//! means the same wherever it comes from.
//!
//! What a chain may do depends on the feature's kind:
//! - **dense**: number → number (`fill_null`, `clamp`, `log1p`, `logit`, `box_cox`); a
//!   value still null after the chain enters the model as 0;
//! - **categorical**: id → id (`fill_null`, `clamp`, `sigrid_hash`, `map_id`), or a
//!   number made an id (`bucketize`, `cast(id)`), so that `price` or `age` can be a
//!   categorical feature of its buckets; a null id is the table's shared "missing" row;
//! - **bag, sequence**: every kept id through id → id operators, `first_x(x)` (the
//!   first `x` of the kept ids) and `ngram(n)` (the hash of each `n` consecutive kept
//!   ids, in order: the transitions of a click history); ids null after the chain are
//!   dropped and counted in `list_nulls`.
//!
//! Numbers enter a chain as the model would see them, rounded to 32-bit floats, so a
//! `bucketize` border splits a value the same way in a Parquet double column, a CSV
//! field and a JSON request.

use crate::batch::Jagged;
use crate::columns::NULL_ID;
use crate::ops::kernels as k;
use crate::ops::types::{Element, ValueType};
use crate::ops::Op;
use crate::schema::{FeatureKind, FeatureSpec, Schema};

/// The chains of a schema's features, by kind in batch order (`None`: no `ops`).
#[derive(Debug, Clone, Default)]
pub struct Chains {
    /// Of the dense features.
    pub dense: Vec<Option<Chain>>,
    /// Of the categorical features.
    pub cats: Vec<Option<Chain>>,
    /// Of the bags and sequences.
    pub lists: Vec<Option<Chain>>,
}

impl Chains {
    /// The chains of `schema` (validated: a chain that does not compile is left out).
    pub fn of(schema: &Schema) -> Self {
        let of = |f: &FeatureSpec| Chain::compile(f).ok().flatten();
        Self {
            dense: schema.dense().map(of).collect(),
            cats: schema.categorical().map(of).collect(),
            lists: schema.lists().map(of).collect(),
        }
    }
}

/// True when `f`'s column is read as numbers: a dense feature, or a categorical one whose
/// chain starts by taking a number (`bucketize`).
pub fn reads_numbers(f: &FeatureSpec) -> bool {
    match f.kind {
        FeatureKind::Dense => true,
        FeatureKind::Categorical => Chain::compile(f)
            .ok()
            .flatten()
            .is_some_and(|c| c.reads_numbers()),
        FeatureKind::Bag | FeatureKind::Sequence => false,
    }
}

/// One feature's chain, typed for its kind.
#[derive(Debug, Clone, PartialEq)]
pub struct Chain {
    ops: Vec<Op>,
    /// What the reader hands the chain: numbers or ids (a list's items are ids).
    input: Element,
    kind: FeatureKind,
}

impl Chain {
    /// The chain of `f`, checked against its kind; `None` when it has no `ops`. The
    /// error says which operator does not fit, and why.
    pub fn compile(f: &FeatureSpec) -> Result<Option<Chain>, String> {
        if f.ops.is_empty() {
            return Ok(None);
        }
        let ops = f
            .ops
            .iter()
            .map(|text| Op::parse(text).map_err(|e| format!("`{text}`: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        let input = match f.kind {
            FeatureKind::Dense => {
                typed(&ops, ValueType::Float, Element::Float, "a dense feature")?;
                Element::Float
            }
            FeatureKind::Categorical => {
                // Read as ids unless the chain starts by taking a number (`bucketize`).
                match typed(&ops, ValueType::Id, Element::Id, "a categorical feature") {
                    Ok(()) => Element::Id,
                    Err(as_ids) => {
                        typed(&ops, ValueType::Float, Element::Id, "a categorical feature")
                            .map_err(|_| as_ids)?;
                        Element::Float
                    }
                }
            }
            FeatureKind::Bag | FeatureKind::Sequence => {
                let widest = ValueType::Ids(f.max_len());
                for op in &ops {
                    if matches!(op, Op::OneHot(_) | Op::MultiHot(_) | Op::Cast(_)) {
                        return Err(format!(
                            "{} does not apply to a list feature: its ids are pooled as \
                             embeddings",
                            op.name()
                        ));
                    }
                    if matches!(op, Op::Ngram(_)) && f.weights.is_some() {
                        return Err(
                            "ngram of a weighted list: a gram has no weight; drop `weights` \
                             or the ngram"
                                .into(),
                        );
                    }
                }
                typed_list(&ops, widest)?;
                Element::Id
            }
        };
        Ok(Some(Chain {
            ops,
            input,
            kind: f.kind,
        }))
    }

    /// True when the column is read as numbers (a dense feature, or a categorical one
    /// whose chain starts with `bucketize`).
    pub fn reads_numbers(&self) -> bool {
        self.input == Element::Float
    }

    /// How many distinct ids a categorical or list chain produces (its table's natural
    /// size), when bounded.
    pub fn cardinality(&self) -> Option<u64> {
        if self.kind == FeatureKind::Dense {
            return None;
        }
        self.ops.iter().fold(None, |c, op| op.cardinality(c))
    }

    /// A dense chain over `values` (NaN: null), then every null becomes 0.
    pub fn numbers(&self, values: &mut [f64]) {
        let mut no_ids = [0u64; 0];
        self.scalars(values, &mut no_ids, Element::Float);
        for v in values.iter_mut() {
            if !v.is_finite() {
                *v = 0.0;
            }
        }
    }

    /// A categorical chain over numbers (`values`, NaN: null) into ids (`ids`, as long).
    pub fn numbers_to_ids(&self, values: &mut [f64], ids: &mut [u64]) {
        self.scalars(values, ids, Element::Float);
    }

    /// A categorical chain over `ids` ([`NULL_ID`]: null).
    pub fn ids(&self, ids: &mut [u64]) {
        let mut no_numbers = [0f64; 0];
        self.scalars(&mut no_numbers, ids, Element::Id);
    }

    /// One dense value (`None`: null) through the chain.
    pub fn number(&self, v: Option<f32>) -> f32 {
        let mut x = [v.map_or(f64::NAN, f64::from)];
        self.numbers(&mut x);
        x[0] as f32
    }

    /// One categorical value through the chain: a number (`None`: null) for a chain that
    /// reads numbers, else an id ([`NULL_ID`]: null).
    pub fn id_of_number(&self, v: Option<f32>) -> u64 {
        let (mut x, mut id) = ([v.map_or(f64::NAN, f64::from)], [NULL_ID]);
        self.numbers_to_ids(&mut x, &mut id);
        id[0]
    }

    /// One categorical id through the chain.
    pub fn id(&self, v: u64) -> u64 {
        let mut id = [v];
        self.ids(&mut id);
        id[0]
    }

    /// Runs a scalar chain; the value is in `f` while it is a number, in `ids` once it is
    /// an id (both as long, or the one not used empty).
    fn scalars(&self, f: &mut [f64], ids: &mut [u64], mut at: Element) {
        for op in &self.ops {
            at = match (op, at) {
                (Op::FillNull(v), Element::Float) => {
                    k::fill_null_float(f, v.float);
                    at
                }
                (Op::Clamp { min, max }, Element::Float) => {
                    let lo = min.map_or(f64::NEG_INFINITY, |n| n.float);
                    k::clamp_float(f, lo, max.map_or(f64::INFINITY, |n| n.float));
                    at
                }
                (Op::Log1p, Element::Float) => {
                    k::log1p_float(f);
                    at
                }
                (Op::Logit { eps }, Element::Float) => {
                    k::logit(f, *eps);
                    at
                }
                (Op::BoxCox { lambda }, Element::Float) => {
                    k::box_cox(f, *lambda);
                    at
                }
                (Op::Bucketize(borders), Element::Float) => {
                    k::bucketize(f, borders, ids);
                    Element::Id
                }
                (Op::Cast(Element::Id), Element::Float) => {
                    k::float_to_id(f, ids);
                    Element::Id
                }
                (Op::Cast(Element::Float), Element::Id) => {
                    k::id_to_float(ids, f);
                    Element::Float
                }
                (op, Element::Id) => {
                    id_op(op, ids);
                    at
                }
                // `compile` typed the chain; nothing else is reached.
                _ => at,
            };
        }
    }

    /// A list chain over the rows `from_row..` of `list` (filled by a reader), in place;
    /// returns the ids dropped because the chain made them null.
    pub fn lists(&self, list: &mut Jagged, from_row: usize) -> u64 {
        let start = list.offsets[from_row] as usize;
        for op in &self.ops {
            match op {
                Op::FirstX(x) => first_x(list, from_row, *x),
                Op::Ngram(n) => ngrams(list, from_row, *n),
                op => id_op(op, &mut list.ids[start..]),
            }
        }
        drop_nulls(list, from_row)
    }
}

/// An id → id operator over `ids`.
fn id_op(op: &Op, ids: &mut [u64]) {
    match op {
        Op::FillNull(v) => k::fill_null_id(ids, v.as_id().unwrap_or(NULL_ID)),
        Op::Clamp { min, max } => k::clamp_id(
            ids,
            min.and_then(|n| n.as_id()).unwrap_or(0),
            max.and_then(|n| n.as_id()).unwrap_or(u64::MAX - 1),
        ),
        Op::SigridHash { salt, modulus } => k::sigrid_hash(ids, k::sigrid_salt(*salt), *modulus),
        Op::MapId { map, default } => k::map_id(ids, map, *default),
        Op::Cast(Element::Id) => {}
        // `compile` typed the chain; nothing else is reached.
        _ => {}
    }
}

/// Types a scalar chain from `from`; it must end as `to`.
fn typed(ops: &[Op], from: ValueType, to: Element, what: &str) -> Result<(), String> {
    let mut ty = from;
    for op in ops {
        if matches!(op, Op::Cast(Element::Int)) {
            return Err("cast(int): a named feature's numbers are floats; use cast(id)".into());
        }
        if matches!(op, Op::FirstX(_) | Op::Ngram(_)) {
            return Err(format!(
                "{} applies to a list feature (bag or sequence)",
                op.name()
            ));
        }
        ty = op.output(ty)?;
        if let ValueType::Floats(n) = ty {
            return Err(format!(
                "{} makes {n} dense inputs; {what} is one value (a list's ids are pooled \
                 as embeddings instead)",
                op.name()
            ));
        }
    }
    let want = match to {
        Element::Float => ValueType::Float,
        _ => ValueType::Id,
    };
    if ty == want {
        Ok(())
    } else {
        Err(format!(
            "{what} needs its chain to end as {want}, this one ends as {ty}"
        ))
    }
}

/// Types a list chain from `from` (the longest list kept).
fn typed_list(ops: &[Op], from: ValueType) -> Result<(), String> {
    let mut ty = from;
    for op in ops {
        ty = op.output(ty)?;
    }
    match ty {
        ValueType::Ids(_) => Ok(()),
        other => Err(format!(
            "a list feature's chain must end as ids, this one ends as {other}"
        )),
    }
}

/// Keeps the first `x` ids (and weights) of each row from `from_row`.
fn first_x(list: &mut Jagged, from_row: usize, x: usize) {
    compact(list, from_row, |ids, weights, write, row| {
        let kept = row.len().min(x);
        ids.copy_within(row.start..row.start + kept, write);
        if let Some(w) = weights {
            w.copy_within(row.start..row.start + kept, write);
        }
        kept
    });
}

/// Each row from `from_row` becomes the hashes of its `n` consecutive ids (a row shorter
/// than `n` becomes empty); a gram over a null id is null. (`compile` refuses an ngram of
/// a weighted list.)
fn ngrams(list: &mut Jagged, from_row: usize, n: usize) {
    compact(list, from_row, |ids, _, write, row| {
        // Gram `i` is written at `write + i <= row.start + i`, after its window
        // `row.start + i ..` was read, and later grams read only past it: in place.
        let grams = (row.len() + 1).saturating_sub(n);
        for i in 0..grams {
            let at = row.start + i;
            ids[write + i] = k::gram(ids[at..at + n].iter().copied());
        }
        grams
    });
}

/// Drops the null ids (and their weights) of rows from `from_row`, in place; returns
/// how many.
fn drop_nulls(list: &mut Jagged, from_row: usize) -> u64 {
    let start = list.offsets[from_row] as usize;
    if !list.ids[start..].contains(&NULL_ID) {
        return 0;
    }
    let before = list.ids.len();
    compact(list, from_row, |ids, mut weights, write, row| {
        let mut kept = 0;
        for i in row {
            if ids[i] != NULL_ID {
                ids[write + kept] = ids[i];
                if let Some(w) = weights.as_deref_mut() {
                    w[write + kept] = w[i];
                }
                kept += 1;
            }
        }
        kept
    });
    (before - list.ids.len()) as u64
}

/// Rebuilds the rows from `from_row` in place: `row(ids, weights, write, range)` writes
/// the row's new ids (and weights, when the list has them) at `write..`, never past what
/// it has read of `range`, and returns how many.
fn compact(
    list: &mut Jagged,
    from_row: usize,
    mut row: impl FnMut(&mut [u64], Option<&mut [f32]>, usize, std::ops::Range<usize>) -> usize,
) {
    let weighted = !list.weights.is_empty();
    let mut write = list.offsets[from_row] as usize;
    let mut start = write;
    for r in from_row..list.rows() {
        // The row's old end, read before its new end replaces it.
        let end = list.offsets[r + 1] as usize;
        let weights = weighted.then_some(list.weights.as_mut_slice());
        write += row(&mut list.ids, weights, write, start..end);
        list.offsets[r + 1] = write as u32;
        start = end;
    }
    list.ids.truncate(write);
    if weighted {
        list.weights.truncate(write);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bag(ops: &[&str]) -> Chain {
        let mut f = FeatureSpec::new("tags", FeatureKind::Bag);
        f.weights = Some("w".into());
        f.ops = ops.iter().map(|s| s.to_string()).collect();
        Chain::compile(&f).unwrap().unwrap()
    }

    fn jagged(rows: &[(&[u64], &[f32])]) -> Jagged {
        let mut j = Jagged::default();
        for (ids, ws) in rows {
            j.ids.extend_from_slice(ids);
            j.weights.extend_from_slice(ws);
            j.end_row();
        }
        j
    }

    #[test]
    fn ids_a_list_chain_makes_null_are_dropped_with_their_weights_from_the_given_row_on() {
        let chain = bag(&["map_id({1: 10, 3: 30})"]);
        let mut j = jagged(&[
            (&[2], &[0.9]),
            (&[1, 2, 3], &[0.1, 0.2, 0.3]),
            (&[2], &[0.5]),
            (&[3, 1], &[0.7, 0.8]),
        ]);
        // Row 0 was read (and chained) before: it is left as it is.
        assert_eq!(chain.lists(&mut j, 1), 2);
        let want = jagged(&[
            (&[2], &[0.9]),
            (&[10, 30], &[0.1, 0.3]),
            (&[], &[]),
            (&[30, 10], &[0.7, 0.8]),
        ]);
        assert_eq!(j, want);
    }

    #[test]
    fn ngrams_are_made_in_place_row_by_row() {
        let mut f = FeatureSpec::new("hist", FeatureKind::Sequence);
        f.ops = vec!["ngram(2)".into()];
        let chain = Chain::compile(&f).unwrap().unwrap();
        let mut j = Jagged::default();
        for row in [&[1u64, 2, 3][..], &[4], &[], &[5, 6]] {
            j.ids.extend_from_slice(row);
            j.end_row();
        }
        assert_eq!(chain.lists(&mut j, 0), 0);
        let g = |a: u64, b: u64| k::gram([a, b]);
        let rows: Vec<&[u64]> = (0..j.rows()).map(|r| j.row(r)).collect();
        assert_eq!(rows, [&[g(1, 2), g(2, 3)][..], &[], &[], &[g(5, 6)]]);
    }

    #[test]
    fn first_x_keeps_the_first_ids_and_their_weights() {
        let chain = bag(&["first_x(2)"]);
        let mut j = jagged(&[(&[5, 6, 7], &[1.0, 2.0, 3.0]), (&[8], &[4.0])]);
        assert_eq!(chain.lists(&mut j, 0), 0);
        assert_eq!(j, jagged(&[(&[5, 6], &[1.0, 2.0]), (&[8], &[4.0])]));
    }
}
