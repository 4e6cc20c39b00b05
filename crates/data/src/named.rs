//! Parquet with any schema, read through a named [`Schema`] into [`Batch`]es: dense
//! columns, single ids and jagged lists (bags, sequences), decoded column by column from
//! each Arrow batch and copied row by row into buffers that keep their capacity.
//!
//! Types accepted per feature kind (checked when a file opens, so a column missing from
//! one file, or holding another type there, is an error naming the file and column):
//! - labels: any integer, float or boolean column holding 0/1;
//! - dense: any integer, float or boolean column (null is 0; NaN or ±inf is a bad value);
//! - categorical: integers (an `i64` id `v` is the key `v as u64`), booleans, strings
//!   (hashed by [`crate::schema::string_key`]) and dictionary-encoded strings or
//!   integers (null is [`NULL_KEY`], one learned row per table);
//! - bag, sequence: `list` or `large_list` of the categorical types (a null list is
//!   empty, null items are dropped and counted, lists longer than `max_len` are cut and
//!   counted); per-id weights: a `list` of floats or integers as long as the ids.

use crate::batch::{Batch, Jagged};
use crate::chain::Chains;
use crate::error::{DataError, FieldError, Result};
use crate::id_keys::{keys, DecodedKeys};
use crate::parquet_io::{decode_label, guarded, open_projected};
use crate::reader::{BadRowPolicy, BatchReader, ReadStats};
use crate::schema::{
    schema_error, ColumnSample, DenseTransform, FeatureKind, FeatureSpec, Inferred, Schema,
    TableSpec, INFER_SAMPLE_ROWS, NULL_KEY,
};
use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::DataType;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where each of a schema's columns lives in a file (or in its decoded Arrow batches).
#[derive(Debug, Clone, Default)]
pub(crate) struct Columns {
    pub(crate) labels: Vec<usize>,
    /// The sample weights' column.
    pub(crate) weight: Option<usize>,
    pub(crate) dense: Vec<usize>,
    pub(crate) cats: Vec<usize>,
    /// Ids and, for a weighted bag, weights.
    pub(crate) lists: Vec<(usize, Option<usize>)>,
}

/// The error of a column a schema names and a file lacks.
pub(crate) fn missing_column(path: &Path, name: &str, role: &str, have: &[&str]) -> DataError {
    schema_error(
        path,
        format!(
            "column {name:?} ({role}) is missing; the file has {}",
            have.join(", ")
        ),
    )
}

/// One decoded Arrow batch, column by column.
#[derive(Debug, Default)]
struct Staged {
    rows: usize,
    labels: Vec<Vec<f32>>,
    sample_weights: Vec<f32>,
    dense: Vec<Vec<f32>>,
    cats: Vec<Vec<u64>>,
    lists: Vec<Jagged>,
    /// The first bad value of each row.
    errs: Vec<Option<(String, FieldError)>>,
    /// Each id column's keys (a list column's: its items'), decoded once per Arrow
    /// batch however many features read the column.
    keys: DecodedKeys,
    weights: Vec<f32>,
    /// The features' own chains, and a column's numbers on their way through one.
    chains: Chains,
    numbers: Vec<f64>,
    floats: Vec<f32>,
}

/// Reads a Parquet file's rows through a [`Schema`].
pub struct NamedParquetReader {
    path: PathBuf,
    schema: Arc<Schema>,
    inner: Option<crate::row_groups::Decoder>,
    columns: Columns,
    staged: Staged,
    cursor: usize,
    next_row: u64,
    policy: BadRowPolicy,
    stats: ReadStats,
}

impl std::fmt::Debug for NamedParquetReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamedParquetReader")
            .field("path", &self.path)
            .field("next_row", &self.next_row)
            .finish()
    }
}

fn is_number(dt: &DataType) -> bool {
    dt.is_numeric() || *dt == DataType::Boolean
}

fn is_id(dt: &DataType) -> bool {
    match dt {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Boolean => true,
        DataType::Dictionary(_, values) => is_id(values),
        other => other.is_integer(),
    }
}

fn list_item(dt: &DataType) -> Option<&DataType> {
    match dt {
        DataType::List(f) | DataType::LargeList(f) => Some(f.data_type()),
        _ => None,
    }
}

fn what_it_needs(kind: FeatureKind) -> &'static str {
    match kind {
        FeatureKind::Dense => "a dense feature needs an integer, float or boolean column",
        FeatureKind::Categorical => {
            "a categorical feature needs an integer, boolean or string column (or a \
             dictionary of them)"
        }
        FeatureKind::Bag | FeatureKind::Sequence => {
            "a bag or sequence needs a list of integers or strings"
        }
    }
}

impl Columns {
    /// Finds every column of `schema` with `find(column, role)` (a role such as
    /// `label` or `feature "genres"` words the error of a missing column).
    pub(crate) fn locate(
        schema: &Schema,
        mut find: impl FnMut(&str, &str) -> Result<usize>,
    ) -> Result<Self> {
        let mut out = Columns::default();
        for l in &schema.labels {
            out.labels.push(find(l, "label")?);
        }
        if let Some(w) = &schema.weight {
            out.weight = Some(find(w, "sample weight")?);
        }
        for f in &schema.features {
            let i = find(f.column(), &format!("feature {:?}", f.name))?;
            match f.kind {
                FeatureKind::Dense => out.dense.push(i),
                FeatureKind::Categorical => out.cats.push(i),
                FeatureKind::Bag | FeatureKind::Sequence => {
                    let w = match &f.weights {
                        None => None,
                        Some(w) => Some(find(w, &format!("weights of {:?}", f.name))?),
                    };
                    out.lists.push((i, w));
                }
            }
        }
        Ok(out)
    }

    /// Finds and type-checks every column of `schema` in the file's Arrow schema.
    pub(crate) fn resolve(
        path: &Path,
        file: &arrow_schema::Schema,
        schema: &Schema,
        chains: &Chains,
    ) -> Result<Self> {
        let out = Self::locate(schema, |name, role| {
            file.index_of(name).map_err(|_| {
                let have: Vec<&str> = file.fields().iter().map(|f| f.name().as_str()).collect();
                missing_column(path, name, role, &have)
            })
        })?;
        let check = |i: usize, ok: fn(&DataType) -> bool, needs: &str| {
            let field = file.field(i);
            let dt = field.data_type();
            if ok(dt) {
                Ok(())
            } else {
                Err(schema_error(
                    path,
                    format!("column {:?} is {dt}; {needs}", field.name()),
                ))
            }
        };
        if let Some(i) = out.weight {
            check(i, is_number, "a sample weight needs a number")?;
        }
        for &i in &out.labels {
            check(
                i,
                is_number,
                "a label needs an integer, float or boolean 0/1",
            )?;
        }
        for &i in &out.dense {
            check(i, is_number, what_it_needs(FeatureKind::Dense))?;
        }
        for (&i, chain) in out.cats.iter().zip(&chains.cats) {
            match chain {
                Some(c) if c.reads_numbers() => {
                    check(i, is_number, "its chain starts with a number (bucketize)")?
                }
                _ => check(i, is_id, what_it_needs(FeatureKind::Categorical))?,
            }
        }
        for &(i, w) in &out.lists {
            check(
                i,
                |dt| list_item(dt).is_some_and(is_id),
                what_it_needs(FeatureKind::Bag),
            )?;
            if let Some(w) = w {
                check(
                    w,
                    |dt| list_item(dt).is_some_and(is_number),
                    "per-id weights need a list of numbers",
                )?;
            }
        }
        Ok(out)
    }

    /// The file columns to decode, sorted, and `self` re-addressed into the decoded
    /// batches (which hold only those columns, in file order).
    pub(crate) fn project(&self) -> (Vec<usize>, Columns) {
        let mut wanted: Vec<usize> = self
            .labels
            .iter()
            .chain(&self.weight)
            .chain(&self.dense)
            .chain(&self.cats)
            .copied()
            .chain(
                self.lists
                    .iter()
                    .flat_map(|&(i, w)| std::iter::once(i).chain(w)),
            )
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        let pos = |c: &usize| wanted.binary_search(c).expect("column is decoded");
        let decoded = Columns {
            labels: self.labels.iter().map(pos).collect(),
            weight: self.weight.as_ref().map(pos),
            dense: self.dense.iter().map(pos).collect(),
            cats: self.cats.iter().map(pos).collect(),
            lists: self
                .lists
                .iter()
                .map(|(i, w)| (pos(i), w.as_ref().map(pos)))
                .collect(),
        };
        (wanted, decoded)
    }
}

impl NamedParquetReader {
    /// Opens rows `range` (0-based, end exclusive; `None`: all) of `path`.
    pub fn open(
        path: &Path,
        range: Option<(u64, u64)>,
        policy: BadRowPolicy,
        schema: Arc<Schema>,
    ) -> Result<Self> {
        let mut columns = None;
        let chains = Chains::of(&schema);
        let opened = open_projected(path, range, |file| {
            let resolved = Columns::resolve(path, file, &schema, &chains)?;
            let (wanted, decoded) = resolved.project();
            columns = Some(decoded);
            Ok(wanted)
        })?;
        let columns = columns.expect("set when the file opened");
        Ok(Self {
            path: path.to_path_buf(),
            schema,
            inner: opened.inner,
            staged: Staged {
                chains,
                keys: DecodedKeys::new(&columns),
                ..Staged::default()
            },
            columns,
            cursor: 0,
            next_row: opened.next_row,
            policy,
            stats: ReadStats::default(),
        })
    }

    /// Decodes the next Arrow batch; `false` at the end.
    fn stage_next(&mut self) -> Result<bool> {
        let Some(inner) = self.inner.as_mut() else {
            return Ok(false);
        };
        let what = format!("decoding the rows from {}", self.next_row);
        let (schema, columns, staged, stats) = (
            &self.schema,
            &self.columns,
            &mut self.staged,
            &mut self.stats,
        );
        let decoded = match inner.next_batch(&self.path, &what) {
            None => Ok(false),
            Some(Err(e)) => Err(e),
            Some(Ok(b)) => guarded(&self.path, &what, || {
                staged.fill(&b, schema, columns, stats);
                Ok(true)
            }),
        };
        match decoded {
            Ok(true) => {
                self.cursor = 0;
                Ok(true)
            }
            Ok(false) => {
                self.inner = None;
                Ok(false)
            }
            Err(e) => {
                // A decoder that failed (or panicked) half way is not read again.
                self.inner = None;
                self.staged.rows = 0;
                Err(e)
            }
        }
    }

    fn push_row(&self, batch: &mut Batch, i: usize) {
        let s = &self.staged;
        batch.labels.push(s.labels[0][i]);
        batch
            .task_labels
            .extend(s.labels[1..].iter().map(|col| col[i]));
        if let Some(&w) = s.sample_weights.get(i) {
            batch.weights.push(w);
        }
        batch.dense.extend(s.dense.iter().map(|col| col[i]));
        if s.dense.is_empty() {
            // No dense feature: the constant input of Schema::dense_width.
            batch.dense.push(0.0);
        }
        batch.sparse.extend(s.cats.iter().map(|col| col[i]));
        for (dst, src) in batch.bags.iter_mut().zip(&s.lists) {
            dst.push_row_of(src, i);
        }
    }
}

impl BatchReader for NamedParquetReader {
    fn next_batch(&mut self, batch: &mut Batch, max_rows: usize) -> Result<usize> {
        batch.clear();
        batch.dense_width = self.schema.dense_width();
        batch.sparse_width = self.columns.cats.len();
        batch
            .bags
            .resize_with(self.columns.lists.len(), Jagged::default);
        batch.tasks = self.columns.labels.len();
        while batch.len() < max_rows {
            if self.cursor >= self.staged.rows && !self.stage_next()? {
                break;
            }
            let i = self.cursor;
            self.cursor += 1;
            let file_row = self.next_row;
            self.next_row += 1;
            match self.staged.errs[i].take() {
                None => {
                    self.push_row(batch, i);
                    self.stats.rows_read += 1;
                }
                Some((column, reason)) => {
                    let err = DataError::BadValue {
                        path: self.path.clone(),
                        row: file_row,
                        column,
                        reason,
                    };
                    self.stats.refuse_or_skip(self.policy, err)?;
                }
            }
        }
        Ok(batch.len())
    }

    fn stats(&self) -> &ReadStats {
        &self.stats
    }
}

impl Staged {
    fn fill(&mut self, b: &RecordBatch, schema: &Schema, c: &Columns, stats: &mut ReadStats) {
        let n = b.num_rows();
        self.rows = n;
        self.keys.clear();
        self.errs.clear();
        self.errs.resize(n, None);
        let errs = &mut self.errs;
        let mut flag = |r: usize, column: &str, e: FieldError| {
            if errs[r].is_none() {
                errs[r] = Some((column.to_string(), e));
            }
        };
        self.labels.resize_with(c.labels.len(), Vec::new);
        for ((dst, &col), name) in self.labels.iter_mut().zip(&c.labels).zip(&schema.labels) {
            let col = b.column(col);
            dst.clear();
            dst.extend((0..n).map(|r| match decode_label(col, r) {
                Ok(v) => f32::from(v),
                Err(e) => {
                    flag(r, name, e);
                    0.0
                }
            }));
        }
        self.sample_weights.clear();
        if let (Some(col), Some(name)) = (c.weight, &schema.weight) {
            let col = b.column(col);
            numbers(col, &mut self.sample_weights);
            for (r, w) in self.sample_weights.iter_mut().enumerate() {
                if col.is_null(r) || !w.is_finite() || *w < 0.0 {
                    let got = if col.is_null(r) {
                        "null".to_string()
                    } else {
                        w.to_string()
                    };
                    flag(r, name, FieldError::BadWeight(got));
                    *w = 0.0;
                }
            }
        }
        self.dense.resize_with(c.dense.len(), Vec::new);
        let nums = &mut self.numbers;
        let dense = self.dense.iter_mut().zip(&c.dense).zip(schema.dense());
        for (((dst, &col), f), chain) in dense.zip(&self.chains.dense) {
            let col = b.column(col);
            numbers(col, dst);
            for (r, v) in dst.iter_mut().enumerate() {
                if !v.is_finite() {
                    flag(r, f.column(), FieldError::NotFinite(v.to_string()));
                    *v = 0.0;
                } else {
                    *v = f.transform.apply(*v);
                }
            }
            if let Some(chain) = chain {
                nullable(col, dst, nums);
                chain.numbers(nums);
                dst.iter_mut()
                    .zip(nums.iter())
                    .for_each(|(d, &x)| *d = x as f32);
            }
        }
        self.cats.resize_with(c.cats.len(), Vec::new);
        for ((dst, &c_col), chain) in self.cats.iter_mut().zip(&c.cats).zip(&self.chains.cats) {
            let col = b.column(c_col);
            match chain {
                Some(chain) if chain.reads_numbers() => {
                    numbers(col, &mut self.floats);
                    nullable(col, &self.floats, nums);
                    dst.clear();
                    dst.resize(n, NULL_KEY);
                    chain.numbers_to_ids(nums, dst);
                }
                Some(chain) => {
                    self.keys.copy(c_col, col, dst);
                    chain.ids(dst);
                }
                None => self.keys.copy(c_col, col, dst),
            }
        }
        self.lists.resize_with(c.lists.len(), Jagged::default);
        let lists = self.lists.iter_mut().zip(&c.lists).zip(schema.lists());
        for (((dst, &(col, weights)), f), chain) in lists.zip(&self.chains.lists) {
            let weights = weights.map(|w| b.column(w));
            let column = b.column(col);
            let items = self.keys.of(col, &list_values(column));
            list(
                column,
                weights,
                f,
                dst,
                items,
                &mut self.weights,
                stats,
                &mut flag,
            );
            if let Some(chain) = chain {
                stats.list_nulls += chain.lists(dst, 0);
            }
        }
    }
}

/// A column's numbers as read (`floats`, null read as 0) with its nulls as NaN: what a
/// chain takes.
fn nullable(col: &ArrayRef, floats: &[f32], out: &mut Vec<f64>) {
    out.clear();
    out.extend(floats.iter().enumerate().map(|(r, &v)| {
        if col.is_null(r) {
            f64::NAN
        } else {
            f64::from(v)
        }
    }));
}

/// Every value of a numeric or boolean column as `f32` (null: 0).
fn numbers(col: &ArrayRef, out: &mut Vec<f32>) {
    out.clear();
    macro_rules! prim {
        ($t:ty) => {
            out.extend(
                col.as_primitive::<$t>()
                    .iter()
                    .map(|v| v.map_or(0.0, |v| v as f32)),
            )
        };
    }
    match col.data_type() {
        DataType::Int8 => prim!(Int8Type),
        DataType::Int16 => prim!(Int16Type),
        DataType::Int32 => prim!(Int32Type),
        DataType::Int64 => prim!(Int64Type),
        DataType::UInt8 => prim!(UInt8Type),
        DataType::UInt16 => prim!(UInt16Type),
        DataType::UInt32 => prim!(UInt32Type),
        DataType::UInt64 => prim!(UInt64Type),
        DataType::Float16 => out.extend(
            col.as_primitive::<Float16Type>()
                .iter()
                .map(|v| v.map_or(0.0, f32::from)),
        ),
        DataType::Float32 => prim!(Float32Type),
        DataType::Float64 => prim!(Float64Type),
        DataType::Boolean => out.extend(
            col.as_boolean()
                .iter()
                .map(|v| v.map_or(0.0, |v| f32::from(u8::from(v)))),
        ),
        // Decimal and other numeric types were let through by `is_numeric`: read as null.
        _ => out.resize(col.len(), 0.0),
    }
}

/// A list column into `dst`, one row per Arrow row.
#[allow(clippy::too_many_arguments)]
fn list(
    col: &ArrayRef,
    weights: Option<&ArrayRef>,
    spec: &FeatureSpec,
    dst: &mut Jagged,
    items: &[u64],
    wbuf: &mut Vec<f32>,
    stats: &mut ReadStats,
    flag: &mut impl FnMut(usize, &str, FieldError),
) {
    dst.clear();
    let (offsets, values) = list_parts(col);
    let wparts = weights.map(|w| {
        let (o, v) = list_parts(w);
        numbers(&v, wbuf);
        o
    });
    for r in 0..col.len() {
        if col.is_null(r) {
            dst.end_row();
            continue;
        }
        let (from, to) = (offsets[r], offsets[r + 1]);
        if let Some(wo) = &wparts {
            let (wf, wt) = (wo[r], wo[r + 1]);
            if wt - wf != to - from {
                flag(
                    r,
                    spec.weights.as_deref().unwrap_or_default(),
                    FieldError::WeightCount {
                        weights: wt - wf,
                        ids: to - from,
                    },
                );
                dst.end_row();
                continue;
            }
        }
        let live = (from..to).filter(|&k| !values.is_null(k));
        let count = live.clone().count();
        stats.list_nulls += ((to - from) - count) as u64;
        let kept = spec.kept(count);
        if kept.len() < count {
            stats.lists_truncated += 1;
        }
        for k in live.skip(kept.start).take(kept.len()) {
            dst.ids.push(items[k]);
            if let Some(wo) = &wparts {
                let w = wbuf[wo[r] + (k - from)];
                dst.weights.push(w);
            }
        }
        dst.end_row();
    }
}

/// A `list` or `large_list` column's item values.
fn list_values(col: &ArrayRef) -> ArrayRef {
    match col.data_type() {
        DataType::LargeList(_) => col.as_list::<i64>().values().clone(),
        _ => col.as_list::<i32>().values().clone(),
    }
}

/// A `list` or `large_list` column's offsets (as `usize`) and item values.
fn list_parts(col: &ArrayRef) -> (Vec<usize>, ArrayRef) {
    match col.data_type() {
        DataType::LargeList(_) => {
            let l = col.as_list::<i64>();
            let o = l.value_offsets().iter().map(|&o| o as usize).collect();
            (o, l.values().clone())
        }
        _ => {
            let l = col.as_list::<i32>();
            let o = l.value_offsets().iter().map(|&o| o as usize).collect();
            (o, l.values().clone())
        }
    }
}

/// A schema for the Parquet file `path` (see [`crate::schema::infer`]).
pub(crate) fn infer_parquet(path: &Path, labels: &[String], max_rows: u64) -> Result<Inferred> {
    let mut schema = Schema {
        labels: labels.to_vec(),
        ..Schema::default()
    };
    let mut skipped = Vec::new();
    let mut picked = Vec::new();
    let opened = open_projected(path, Some((0, 0)), |file| {
        for l in labels {
            if file.index_of(l).is_err() {
                let have: Vec<&str> = file.fields().iter().map(|f| f.name().as_str()).collect();
                return Err(schema_error(
                    path,
                    format!(
                        "the label column {l:?} is missing; the file has {}",
                        have.join(", ")
                    ),
                ));
            }
        }
        for field in file.fields() {
            let name = field.name();
            if labels.contains(name) {
                continue;
            }
            let dt = field.data_type();
            let kind = if matches!(
                dt,
                DataType::Float16 | DataType::Float32 | DataType::Float64
            ) {
                Some(FeatureKind::Dense)
            } else if is_id(dt) {
                Some(FeatureKind::Categorical)
            } else if list_item(dt).is_some_and(is_id) {
                Some(FeatureKind::Bag)
            } else {
                None
            };
            match kind {
                Some(kind) => picked.push(FeatureSpec::new(name, kind)),
                None => skipped.push((name.clone(), format!("{dt}: not a feature type"))),
            }
        }
        Ok(Vec::new())
    })?;
    drop(opened);
    schema.features = picked;
    // Sample the first rows of every feature column.
    let mut samples: Vec<ColumnSample> = schema
        .features
        .iter()
        .map(|_| ColumnSample::new())
        .collect();
    let mut sampled = 0u64;
    let mut positions = Vec::new();
    let opened = open_projected(path, None, |file| {
        positions = schema
            .features
            .iter()
            .map(|f| file.index_of(f.column()).expect("found above"))
            .collect();
        Ok(positions.clone())
    })?;
    let mut order: Vec<usize> = positions.clone();
    order.sort_unstable();
    if let Some(mut inner) = opened.inner {
        let (mut nums, mut ids) = (Vec::new(), Vec::new());
        while (sampled as usize) < INFER_SAMPLE_ROWS {
            let next = inner
                .next_batch(path, "sampling rows to infer the schema")
                .transpose()?;
            let Some(b) = next else { break };
            for ((f, s), p) in schema.features.iter().zip(&mut samples).zip(&positions) {
                let col = b.column(order.binary_search(p).expect("decoded"));
                sample_column(f.kind, col, s, &mut nums, &mut ids);
            }
            sampled += b.num_rows() as u64;
        }
    }
    conclude(path, schema, &samples, skipped, sampled, max_rows)
}

/// The inferred schema from a sample of each feature column: shared tables, `log1p`
/// for long-tailed dense columns, list lengths and table sizes.
pub(crate) fn conclude(
    path: &Path,
    mut schema: Schema,
    samples: &[ColumnSample],
    skipped: Vec<(String, String)>,
    sampled: u64,
    max_rows: u64,
) -> Result<Inferred> {
    let shared = shared_tables(&schema.features, samples);
    for (i, (f, s)) in schema.features.iter_mut().zip(samples).enumerate() {
        if let Some(owner) = &shared[i] {
            f.table = Some(owner.clone());
            f.max_len = Some(s.longest.clamp(1, 256));
            continue;
        }
        match f.kind {
            FeatureKind::Dense => {
                if s.long_tailed() {
                    f.transform = DenseTransform::Log1p;
                }
            }
            _ => {
                if f.kind == FeatureKind::Bag {
                    f.max_len = Some(s.longest.clamp(1, 256));
                }
                // A table shared with lists holds their ids too.
                let mut ids = s.distinct.clone();
                for (j, other) in samples.iter().enumerate() {
                    if shared[j].as_deref() == Some(f.name.as_str()) {
                        ids.extend(&other.distinct);
                    }
                }
                let union = ColumnSample {
                    distinct: ids,
                    ..ColumnSample::new()
                };
                schema.tables.push(TableSpec {
                    name: f.name.clone(),
                    rows: union.table_rows(max_rows),
                });
            }
        }
    }
    schema
        .validate()
        .map_err(|e| schema_error(path, format!("the inferred schema {e}")))?;
    Ok(Inferred {
        schema,
        skipped,
        sampled_rows: sampled,
    })
}

/// Share of the sampled ids (of the smaller of the two sets) a list and a categorical
/// column must have in common for the list to share the column's table (`hist_items`
/// holding `item_id`s).
pub const SHARED_TABLE_OVERLAP: f64 = 0.5;

/// Fewest ids in common for a shared table: two small vocabularies of small integers
/// (ages, ratings) overlap by chance.
pub const SHARED_TABLE_MIN_COMMON: usize = 32;

/// For each feature, the categorical feature whose table it shares (`None`: its own):
/// a list whose sampled ids largely coincide with one categorical column's (of those that
/// qualify, the one with the most ids in common) names the same things, and learns them
/// in one table.
fn shared_tables(features: &[FeatureSpec], samples: &[ColumnSample]) -> Vec<Option<String>> {
    features
        .iter()
        .zip(samples)
        .map(|(f, s)| {
            if !f.is_list() || s.distinct.is_empty() {
                return None;
            }
            features
                .iter()
                .zip(samples)
                .filter(|(c, _)| c.kind == FeatureKind::Categorical)
                .map(|(c, cs)| {
                    let common = s
                        .distinct
                        .iter()
                        .filter(|k| cs.distinct.contains(k))
                        .count();
                    // Of the smaller set: a sample sees only part of a large vocabulary.
                    let smaller = s.distinct.len().min(cs.distinct.len()).max(1);
                    (c, common, common as f64 / smaller as f64)
                })
                .filter(|&(_, common, share)| {
                    common >= SHARED_TABLE_MIN_COMMON && share >= SHARED_TABLE_OVERLAP
                })
                // The most ids in common: a small vocabulary of small integers (ages)
                // lies wholly inside a list of item ids, and is not what it holds.
                .max_by_key(|&(_, common, _)| common)
                .map(|(c, _, _)| c.name.clone())
        })
        .collect()
}

/// Most distinct ids a sample tracks per column (the tables it sizes are capped far
/// below).
pub(crate) const MAX_TRACKED_IDS: usize = 4 << 20;

fn sample_column(
    kind: FeatureKind,
    col: &ArrayRef,
    s: &mut ColumnSample,
    nums: &mut Vec<f32>,
    ids: &mut Vec<u64>,
) {
    let track = |ids: &[u64], s: &mut ColumnSample| {
        for &k in ids {
            if s.distinct.len() >= MAX_TRACKED_IDS {
                break;
            }
            if k != NULL_KEY {
                s.distinct.insert(k);
            }
        }
    };
    match kind {
        FeatureKind::Dense => {
            numbers(col, nums);
            for (r, &v) in nums.iter().enumerate() {
                if !col.is_null(r) && v.is_finite() {
                    s.number(f64::from(v));
                }
            }
        }
        FeatureKind::Categorical => {
            keys(col, ids);
            track(ids, s);
        }
        FeatureKind::Bag | FeatureKind::Sequence => {
            let (offsets, values) = list_parts(col);
            keys(&values, ids);
            track(ids, s);
            let longest = offsets.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
            s.longest = s.longest.max(longest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ids: impl Iterator<Item = u64>) -> ColumnSample {
        let mut s = ColumnSample::new();
        s.distinct.extend(ids);
        s
    }

    #[test]
    fn a_list_shares_the_table_of_the_column_with_the_most_ids_in_common() {
        // As in MovieLens, the age column comes after the film's.
        let features = [
            FeatureSpec::new("movie_id", FeatureKind::Categorical),
            FeatureSpec::new("age", FeatureKind::Categorical),
            FeatureSpec::new("liked", FeatureKind::Bag),
            FeatureSpec::new("genres", FeatureKind::Bag),
        ];
        // Ages 7..74 lie wholly inside the films' ids 1..1682, as the liked films do.
        let samples = [
            sample(1..1682),
            sample(7..74),
            sample(1..1400),
            sample(2000..2018),
        ];
        let shared = shared_tables(&features, &samples);
        assert_eq!(shared[2].as_deref(), Some("movie_id"));
        assert_eq!(shared[3], None, "18 ids in common with nothing");
        assert_eq!(
            shared[..2],
            [None, None],
            "categorical columns keep their own"
        );
    }
}
