//! Named features: what a job's own data holds and how each column enters the model.
//!
//! A [`Schema`] names the label column(s) and every feature, with its kind:
//! - **dense**: a numeric column (int or float, nullable: null is 0), optionally `log1p`;
//! - **categorical**: one id per row (int32/int64/uint/bool/string; strings hash to 64-bit
//!   keys with [`string_key`]), looked up in an embedding table;
//! - **bag**: a `list<int|string>` column of ids pooled into one vector (sum, mean or
//!   sqrt-n), optionally with per-id weights from a `list<float>` column;
//! - **sequence**: an ordered list (recently clicked items) kept in order, at most
//!   `max_len` of the most recent (the list's tail), pooled like a bag.
//!
//! Each feature may carry its own operator chain (`ops`, the `[[preprocess]]` operators;
//! see [`crate::chain`]).
//!
//! Tables are declared once and may be shared by several features (an item table read by
//! `item_id` and `hist_items`), as TorchRec's `feature_names`. Every table has the job's
//! `model.embedding_dim`: the interactions (dot, cross, FM) combine vectors of equal width.
//!
//! [`infer`] builds a schema from a Parquet file's own schema and a sample of its rows.
//!
//! Batch layout of a schema: dense features in order fill `Batch::dense`, categorical
//! features in order fill `Batch::sparse`, bags and sequences in order fill
//! `Batch::bags`; embedding slot `s` (categorical first, then bags) reads table
//! [`Schema::slot_tables`]`[s]`.

use crate::error::{DataError, Result};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::path::Path;

/// The key of a null categorical value or list item: never a string's key
/// ([`string_key`] clears the top bit) and far above any real 63-bit integer id a log
/// holds.
pub const NULL_KEY: u64 = u64::MAX;

/// The 64-bit key of an id written as text (a string column, a CSV field, a JSON
/// string): an integer written plainly (`-?[1-9][0-9]*` or `0`, fitting `i64`) is the key
/// of that integer, as in an integer column, so an id means the same whether a file
/// stores it as a number or as text; any other text is `xxh3_64` of its UTF-8 bytes with
/// the top bit cleared, so it never equals [`NULL_KEY`]. Stable across processes,
/// platforms and versions.
#[inline]
pub fn string_key(s: &[u8]) -> u64 {
    match plain_integer(s) {
        Some(v) => v as u64,
        None => xxhash_rust::xxh3::xxh3_64(s) >> 1,
    }
}

/// `s` as an `i64` when it is written the one plain way (no sign but `-`, no leading
/// zero, no spaces): `"007"` stays text, so two spellings never share a key.
pub(crate) fn plain_integer(s: &[u8]) -> Option<i64> {
    let digits = s.strip_prefix(b"-").unwrap_or(s);
    let plain = match digits {
        [] => false,
        [b'0'] => digits.len() == s.len(),
        [b'0', ..] => false,
        _ => digits.iter().all(u8::is_ascii_digit),
    };
    if !plain || digits.len() > 19 {
        return None;
    }
    std::str::from_utf8(s).ok()?.parse().ok()
}

/// How a CSV or TSV file with a header separates its fields and its lists
/// (`[data.csv]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CsvFormat {
    /// The field delimiter; default: a tab when the header line holds one, else a comma.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delimiter: Option<char>,
    /// What separates the items of a list field (`action|comedy`); default `|`.
    pub list_separator: char,
}

impl Default for CsvFormat {
    fn default() -> Self {
        Self {
            delimiter: None,
            list_separator: '|',
        }
    }
}

impl CsvFormat {
    /// Checks the separators; the error says which.
    pub fn validate(&self) -> std::result::Result<(), String> {
        let ok = |c: char| c.is_ascii() && !matches!(c, '"' | '\n' | '\r');
        if let Some(d) = self.delimiter {
            if !ok(d) {
                return Err(format!(
                    "data.csv.delimiter {d:?} must be one ASCII character other than a quote \
                     or a line break"
                ));
            }
            if d == self.list_separator {
                return Err(format!(
                    "data.csv.delimiter and data.csv.list_separator are both {d:?}"
                ));
            }
        }
        if !ok(self.list_separator) {
            return Err(format!(
                "data.csv.list_separator {:?} must be one ASCII character other than a quote \
                 or a line break",
                self.list_separator
            ));
        }
        Ok(())
    }
}

/// How a feature enters the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FeatureKind {
    /// A number into the bottom MLP.
    Dense,
    /// One id per row, looked up in a table.
    Categorical,
    /// A list of ids pooled into one vector.
    Bag,
    /// An ordered list of ids (most recent last), the last `max_len` kept, pooled.
    Sequence,
}

/// How the vectors of a bag's ids become one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pooling {
    /// Sum of the (weighted) vectors.
    Sum,
    /// Sum divided by the number of ids (the sum of weights, when weighted).
    #[default]
    Mean,
    /// Sum divided by the square root of the number of ids (TensorFlow's `sqrtn`).
    Sqrtn,
    /// Target attention (DIN): each id's vector weighted by a learned score against the
    /// `query` feature's (the candidate item's) vector.
    Attention,
    /// A transformer (BST) over the ids' vectors in order, then the `query` feature's
    /// (the candidate item's); the candidate's output is the pooled vector.
    Transformer,
}

impl Pooling {
    /// Pooled by a unit of the model against a `query` feature (attention or a
    /// transformer), not by a fixed weighting.
    pub fn is_learned(self) -> bool {
        matches!(self, Self::Attention | Self::Transformer)
    }

    /// Its name in a job file.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sum => "sum",
            Self::Mean => "mean",
            Self::Sqrtn => "sqrtn",
            Self::Attention => "attention",
            Self::Transformer => "transformer",
        }
    }
}

/// The transform of a dense feature before standardization.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DenseTransform {
    /// The value as it is.
    #[default]
    None,
    /// `ln(1 + max(x, 0))`, for counts and prices with a long tail.
    Log1p,
}

impl DenseTransform {
    /// The transformed value of `x`.
    #[inline]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Self::None => x,
            Self::Log1p => x.max(0.0).ln_1p(),
        }
    }
}

/// Default longest list kept of a bag or sequence.
pub const DEFAULT_MAX_LEN: usize = 64;

/// One feature (`[[data.feature]]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeatureSpec {
    /// The feature's name; also its column unless `column` is set.
    pub name: String,
    /// The column holding it, when not named like the feature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub column: Option<String>,
    /// How it enters the model.
    pub kind: FeatureKind,
    /// Dense only: the transform applied to the raw value (the short form of
    /// `ops = ["log1p"]`).
    #[serde(default, skip_serializing_if = "is_default")]
    pub transform: DenseTransform,
    /// The feature's own operator chain, applied to its column as it is read
    /// (`["fill_null(0)", "clamp(max=500)", "log1p"]`, `["bucketize([10, 100])"]`,
    /// `["ngram(2)"]`); what each kind may use is in [`crate::chain`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ops: Vec<String>,
    /// Categorical, bag and sequence: the table its ids are looked up in (a
    /// `[[data.table]]` name); default: a table named like the feature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<String>,
    /// Bag and sequence: how the ids' vectors are pooled.
    #[serde(default, skip_serializing_if = "is_default")]
    pub pooling: Pooling,
    /// Bag and sequence: the longest list kept (a bag keeps its first `max_len` ids, a
    /// sequence its last); longer lists are cut and counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_len: Option<usize>,
    /// Bag only: a `list<float>` column of per-id weights, as long as the id list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<String>,
    /// `pooling = "attention"` or `"transformer"` only: the categorical feature the ids
    /// are read against (the candidate item, usually reading the same table).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

impl FeatureSpec {
    /// A feature of `kind` read from the column `name`, with every default.
    pub fn new(name: &str, kind: FeatureKind) -> Self {
        Self {
            name: name.to_string(),
            column: None,
            kind,
            transform: DenseTransform::None,
            ops: Vec::new(),
            table: None,
            pooling: Pooling::Mean,
            max_len: None,
            weights: None,
            query: None,
        }
    }

    /// The column holding the feature.
    pub fn column(&self) -> &str {
        self.column.as_deref().unwrap_or(&self.name)
    }

    /// The table its ids are looked up in.
    pub fn table(&self) -> &str {
        self.table.as_deref().unwrap_or(&self.name)
    }

    /// The longest list kept.
    pub fn max_len(&self) -> usize {
        self.max_len.unwrap_or(DEFAULT_MAX_LEN)
    }

    /// Which of a list's `count` (non-null) items are kept: a bag's first `max_len`, a
    /// sequence's last (most recent) `max_len`.
    pub fn kept(&self, count: usize) -> std::ops::Range<usize> {
        let keep = count.min(self.max_len());
        if self.kind == FeatureKind::Sequence {
            count - keep..count
        } else {
            0..keep
        }
    }

    /// True for a bag or a sequence.
    pub fn is_list(&self) -> bool {
        matches!(self.kind, FeatureKind::Bag | FeatureKind::Sequence)
    }
}

/// One embedding table (`[[data.table]]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableSpec {
    /// The name features refer to.
    pub name: String,
    /// Rows the ids hash into (capped by `model.max_table_rows`).
    pub rows: u64,
}

/// Rows of a table no `[[data.table]]` declares.
pub const DEFAULT_SCHEMA_TABLE_ROWS: u64 = 1 << 16;

/// Rows of an undeclared table whose features' chains produce at most `ids` distinct ids:
/// ids hash into rows like any other, so 4 rows per id (at least 1,024) keep two buckets
/// from sharing a row, as a `[[preprocess]]` graph's tables are sized.
pub fn chain_table_rows(ids: u64) -> u64 {
    ids.saturating_mul(4).max(1024)
}

/// What defines a model's inputs, and so their names and transforms: the Criteo preset,
/// a `[[preprocess]]` graph's outputs, or named features.
#[derive(Debug, Clone, Copy)]
pub enum FeatureSource<'a> {
    /// The Criteo preset ([`crate::criteo`]): `I1`..`I13` as `log1p`, `C1`..`C26`.
    Criteo,
    /// A preprocessing graph: its dense and categorical outputs, in order.
    Plan,
    /// Named features.
    Named(&'a Schema),
}

impl<'a> FeatureSource<'a> {
    /// The source of a job with named features `schema` (if any) and a preprocessing
    /// graph or not.
    pub fn new(schema: Option<&'a Schema>, has_plan: bool) -> Self {
        match (schema, has_plan) {
            (Some(s), _) => Self::Named(s),
            (None, true) => Self::Plan,
            (None, false) => Self::Criteo,
        }
    }
}

/// The features of a data set with named columns.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Schema {
    /// Label columns, one per task (task 0 first).
    pub labels: Vec<String>,
    /// The column of each sample's weight in the loss (`data.weight`); none: 1 each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<String>,
    /// The features, in the order they fill a batch.
    pub features: Vec<FeatureSpec>,
    /// The tables; a feature's table not listed here gets [`DEFAULT_SCHEMA_TABLE_ROWS`].
    pub tables: Vec<TableSpec>,
    /// How CSV and TSV files separate fields and list items (Parquet ignores it).
    #[serde(default, skip_serializing_if = "is_default")]
    pub csv: CsvFormat,
}

impl Schema {
    /// Checks names, kinds and options; the error names the feature.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.labels.is_empty() {
            return Err("names no label column (data.label)".into());
        }
        self.csv.validate()?;
        if let Some(w) = &self.weight {
            if self.labels.contains(w) {
                return Err(format!("the weight column {w:?} is a label column"));
            }
            if let Some(f) = self.features.iter().find(|f| f.column() == w) {
                return Err(format!(
                    "the weight column {w:?} is also feature {:?}'s column",
                    f.name
                ));
            }
        }
        let mut names = HashSet::new();
        for f in &self.features {
            if !names.insert(f.name.as_str()) {
                return Err(format!("feature {:?} is declared twice", f.name));
            }
            if self.labels.iter().any(|l| l == f.column()) {
                return Err(format!(
                    "feature {:?} reads the label column {:?}",
                    f.name,
                    f.column()
                ));
            }
            let list_only = f.max_len.is_some() || f.weights.is_some();
            match f.kind {
                FeatureKind::Dense if f.table.is_some() || list_only => {
                    return Err(format!(
                        "feature {:?} is dense: `table`, `max_len` and `weights` are for \
                         categorical, bag and sequence features",
                        f.name
                    ))
                }
                FeatureKind::Categorical if list_only => {
                    return Err(format!(
                        "feature {:?} is categorical (one id per row): `max_len` and \
                         `weights` are for bags and sequences",
                        f.name
                    ))
                }
                FeatureKind::Sequence if f.weights.is_some() => {
                    return Err(format!(
                        "feature {:?} is a sequence: per-id `weights` are for bags",
                        f.name
                    ))
                }
                _ => {}
            }
            if f.max_len == Some(0) {
                return Err(format!("feature {:?}: max_len must be at least 1", f.name));
            }
            if f.transform != DenseTransform::None && !f.ops.is_empty() {
                return Err(format!(
                    "feature {:?} has both `transform` and `ops`: write the transform as \
                     the chain's first operator",
                    f.name
                ));
            }
            crate::chain::Chain::compile(f)
                .map_err(|e| format!("feature {:?}: ops: {e}", f.name))?;
            self.check_query(f)?;
        }
        let mut tables = HashSet::new();
        for t in &self.tables {
            if !tables.insert(t.name.as_str()) {
                return Err(format!("table {:?} is declared twice", t.name));
            }
            if t.rows == 0 {
                return Err(format!("table {:?} has 0 rows", t.name));
            }
            if !self
                .features
                .iter()
                .any(|f| f.kind != FeatureKind::Dense && f.table() == t.name)
            {
                return Err(format!("table {:?} is read by no feature", t.name));
            }
        }
        if self.embedding_slots() == 0 {
            return Err(
                "has no categorical, bag or sequence feature: a recommendation \
                        model needs at least one id to embed"
                    .into(),
            );
        }
        Ok(())
    }

    /// Features of `kind`, in order.
    pub fn of_kind(&self, kind: FeatureKind) -> impl Iterator<Item = &FeatureSpec> {
        self.features.iter().filter(move |f| f.kind == kind)
    }

    /// The dense features, in batch order.
    pub fn dense(&self) -> impl Iterator<Item = &FeatureSpec> {
        self.of_kind(FeatureKind::Dense)
    }

    /// The categorical features, in batch order.
    pub fn categorical(&self) -> impl Iterator<Item = &FeatureSpec> {
        self.of_kind(FeatureKind::Categorical)
    }

    /// A feature's `query`, which exactly a learned pooling needs: a categorical feature.
    fn check_query(&self, f: &FeatureSpec) -> std::result::Result<(), String> {
        let attends = f.is_list() && f.pooling.is_learned();
        let how = f.pooling.name();
        if attends && f.weights.is_some() {
            return Err(format!(
                "feature {:?} pools by {how}, which learns its own weights: drop `weights`",
                f.name
            ));
        }
        match (&f.query, attends) {
            (None, false) => Ok(()),
            (Some(_), false) => Err(format!(
                "feature {:?} names a query, which is for `pooling = \"attention\"` or \
                 `\"transformer\"` of a bag or sequence",
                f.name
            )),
            (None, true) => Err(format!(
                "feature {:?} pools by {how} and names no `query` (the categorical feature \
                 its ids are read against, e.g. the candidate item)",
                f.name
            )),
            (Some(q), true) => match self.features.iter().find(|g| &g.name == q) {
                Some(g) if g.kind == FeatureKind::Categorical => Ok(()),
                Some(_) => Err(format!(
                    "feature {:?}: its query {q:?} must be a categorical feature",
                    f.name
                )),
                None => Err(format!(
                    "feature {:?}: its query {q:?} is not a feature",
                    f.name
                )),
            },
        }
    }

    /// The lists pooled by a unit of the model (attention or a transformer) as `(slot,
    /// query slot, max_len, pooling)`, in batch order.
    pub fn attention_slots(&self) -> Vec<(usize, usize, usize, Pooling)> {
        let slots = self.slot_features();
        slots
            .iter()
            .enumerate()
            .filter(|(_, f)| f.is_list() && f.pooling.is_learned())
            .filter_map(|(s, f)| {
                let q = f.query.as_deref()?;
                let query = slots.iter().position(|g| g.name == q)?;
                Some((s, query, f.max_len(), f.pooling))
            })
            .collect()
    }

    /// The bags and sequences, in batch order.
    pub fn lists(&self) -> impl Iterator<Item = &FeatureSpec> {
        self.features.iter().filter(|f| f.is_list())
    }

    /// An empty batch of this schema's layout (widths, tasks, one list column per bag or
    /// sequence).
    pub fn empty_batch(&self) -> crate::Batch {
        let mut b = crate::Batch::with_widths(0, self.dense_width(), self.sparse_width());
        b.tasks = self.labels.len().max(1);
        b.bags = self.lists().map(|_| crate::Jagged::default()).collect();
        b
    }

    /// Dense values per row: one per dense feature, and at least 1: a schema without
    /// dense features feeds the bottom MLP a constant 0 (so its output is a learned
    /// vector, and the model is a DLRM of ids alone).
    pub fn dense_width(&self) -> usize {
        self.dense().count().max(1)
    }

    /// Single ids per row.
    pub fn sparse_width(&self) -> usize {
        self.categorical().count()
    }

    /// Embedding vectors per row: one per categorical, bag and sequence feature.
    pub fn embedding_slots(&self) -> usize {
        self.sparse_width() + self.lists().count()
    }

    /// The features in embedding-slot order: categorical, then bags and sequences.
    pub fn slot_features(&self) -> Vec<&FeatureSpec> {
        self.categorical().chain(self.lists()).collect()
    }

    /// The table names in the order of their first use by a slot.
    pub fn table_names(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for f in self.slot_features() {
            if !out.contains(&f.table()) {
                out.push(f.table());
            }
        }
        out
    }

    /// The table (an index into [`Schema::table_names`]) of each embedding slot.
    pub fn slot_tables(&self) -> Vec<usize> {
        let names = self.table_names();
        self.slot_features()
            .iter()
            .map(|f| {
                names
                    .iter()
                    .position(|&n| n == f.table())
                    .expect("every slot's table is named")
            })
            .collect()
    }

    /// Rows of each table, in [`Schema::table_names`] order: as declared, else room for
    /// the ids its features' chains can produce (`bucketize`'s buckets, `sigrid_hash`'s
    /// `mod`; [`chain_table_rows`]) when every feature reading it is bounded, else
    /// [`DEFAULT_SCHEMA_TABLE_ROWS`].
    pub fn table_rows(&self) -> Vec<u64> {
        self.table_names()
            .iter()
            .map(|n| match self.tables.iter().find(|t| t.name == *n) {
                Some(t) => t.rows,
                None => self
                    .natural_rows(n)
                    .map_or(DEFAULT_SCHEMA_TABLE_ROWS, chain_table_rows),
            })
            .collect()
    }

    /// The most ids the features reading `table` can produce, when all are bounded.
    fn natural_rows(&self, table: &str) -> Option<u64> {
        self.slot_features()
            .iter()
            .filter(|f| f.table() == table)
            .map(|f| {
                crate::chain::Chain::compile(f)
                    .ok()
                    .flatten()
                    .and_then(|c| c.cardinality())
            })
            .try_fold(0u64, |most, c| Some(most.max(c?)))
    }

    /// True when every slot has its own table and no slot is a list: batches of this
    /// schema train through the same single-id path as the Criteo layout.
    pub fn is_single_id(&self) -> bool {
        self.lists().next().is_none() && self.table_names().len() == self.sparse_width()
    }

    /// The columns a reader decodes: labels, then every feature's (and weights') column.
    pub fn columns(&self) -> Vec<&str> {
        let mut out: Vec<&str> = self.labels.iter().map(String::as_str).collect();
        for f in &self.features {
            out.push(f.column());
            if let Some(w) = &f.weights {
                out.push(w);
            }
        }
        out
    }
}

/// What [`infer`] made of each column it did not turn into a feature.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Inferred {
    /// The schema.
    pub schema: Schema,
    /// Columns left out, with the reason (`"list<double>: no id list"`).
    pub skipped: Vec<(String, String)>,
    /// Rows sampled to size the tables.
    pub sampled_rows: u64,
}

/// Rows [`infer`] samples from the start of the file to count distinct values.
pub const INFER_SAMPLE_ROWS: usize = 200_000;

/// Table rows per distinct value seen in the sample (hashing into 4× as many rows as
/// values keeps collisions of frequent ids rare).
pub const INFER_ROWS_PER_VALUE: u64 = 4;

/// Smallest inferred table: the Criteo layout's default size. Measured on MovieLens as
/// a named log (docs/models.md), tables of 4× the distinct ids (1,024 at least) reached
/// 0.7003 test AUC over three seeds, tables of at least 100,000 rows 0.7081, above
/// tuned LightGBM; fewer collisions and a smaller initial scale (uniform in
/// ±1/√rows) both come with the larger tables. A table costs about 7 MB at this size.
pub const INFER_MIN_ROWS: u64 = 100_000;

/// A schema for `path` (Parquet, or CSV/TSV with a header as `csv` says): `labels` are
/// the label columns; every other column becomes a feature by its type: float → dense
/// (`log1p` when the sample is non-negative with a long tail), int/bool/string →
/// categorical, `list<int|string>` → bag (mean pooling, `max_len` the sample's longest
/// list, at most 256). A CSV column has the type its sampled values read as: lists where
/// a value holds the list separator, float where all are numbers and not all integers.
/// Each table gets `clamp(4 · distinct values in the sample, 100,000, max_rows)` rows.
pub fn infer(path: &Path, labels: &[String], max_rows: u64, csv: &CsvFormat) -> Result<Inferred> {
    match crate::reader::detect_format(path)? {
        crate::FileFormat::Parquet => crate::named::infer_parquet(path, labels, max_rows),
        _ => crate::named_csv::infer_csv(path, labels, max_rows, csv),
    }
}

/// Column statistics [`infer`] gathers from its sample.
#[derive(Debug, Default)]
pub(crate) struct ColumnSample {
    pub distinct: HashSet<u64>,
    pub longest: usize,
    pub min: f64,
    pub max: f64,
    pub sum: f64,
    pub count: u64,
}

impl ColumnSample {
    pub(crate) fn new() -> Self {
        Self {
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            ..Self::default()
        }
    }

    pub(crate) fn number(&mut self, v: f64) {
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        self.sum += v;
        self.count += 1;
    }

    /// Non-negative values whose largest is far above their mean: a count or a price,
    /// which `log1p` brings to a scale an MLP learns from.
    pub(crate) fn long_tailed(&self) -> bool {
        self.count > 0 && self.min >= 0.0 && self.max > 10.0 * (self.sum / self.count as f64)
    }

    /// Table rows for the ids seen.
    pub(crate) fn table_rows(&self, cap: u64) -> u64 {
        (self.distinct.len() as u64)
            .saturating_mul(INFER_ROWS_PER_VALUE)
            .max(INFER_MIN_ROWS)
            .min(cap.max(1))
    }
}

/// A schema error naming the file.
pub(crate) fn schema_error(path: &Path, msg: impl Into<String>) -> DataError {
    DataError::Schema {
        path: path.to_path_buf(),
        message: msg.into(),
    }
}

/// Writes `schema` as the TOML of a job's `[data]` features (`label`, `[[data.feature]]`,
/// `[[data.table]]`), for `--print-config`.
pub fn to_toml(schema: &Schema) -> String {
    #[derive(Serialize)]
    struct Data<'a> {
        label: LabelOut<'a>,
        #[serde(skip_serializing_if = "Option::is_none")]
        weight: Option<&'a str>,
        feature: &'a [FeatureSpec],
        table: &'a [TableSpec],
    }
    #[derive(Serialize)]
    #[serde(untagged)]
    enum LabelOut<'a> {
        One(&'a str),
        Many(&'a [String]),
    }
    #[derive(Serialize)]
    struct Doc<'a> {
        data: Data<'a>,
    }
    let label = match schema.labels.as_slice() {
        [one] => LabelOut::One(one),
        many => LabelOut::Many(many),
    };
    toml::to_string(&Doc {
        data: Data {
            label,
            weight: schema.weight.as_deref(),
            feature: &schema.features,
            table: &schema.tables,
        },
    })
    .expect("a schema serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Schema {
        let mut hist = FeatureSpec::new("hist_items", FeatureKind::Sequence);
        hist.table = Some("item_id".into());
        hist.max_len = Some(20);
        Schema {
            labels: vec!["click".into()],
            weight: None,
            features: vec![
                FeatureSpec::new("price", FeatureKind::Dense),
                FeatureSpec::new("item_id", FeatureKind::Categorical),
                FeatureSpec::new("genres", FeatureKind::Bag),
                hist,
                FeatureSpec::new("user_id", FeatureKind::Categorical),
            ],
            tables: vec![TableSpec {
                name: "item_id".into(),
                rows: 5000,
            }],
            csv: Default::default(),
        }
    }

    /// The weight column is neither a label nor a feature's column.
    #[test]
    fn a_weight_column_is_no_label_and_no_feature() {
        let mut s = schema();
        s.weight = Some("w".into());
        assert_eq!(s.validate(), Ok(()));
        s.weight = Some(s.labels[0].clone());
        assert!(s.validate().unwrap_err().contains("is a label column"));
        s.weight = Some(s.features[0].column().to_string());
        let err = s.validate().unwrap_err();
        assert!(err.contains("is also feature"), "{err}");
    }

    #[test]
    fn a_plainly_written_integer_is_its_own_key_and_other_text_hashes() {
        assert_eq!(string_key(b"42"), 42);
        assert_eq!(string_key(b"0"), 0);
        assert_eq!(string_key(b"-7"), -7i64 as u64);
        assert_eq!(
            string_key(b"9223372036854775807"),
            i64::MAX as u64,
            "the largest i64"
        );
        for text in [
            &b"007"[..],
            b"+7",
            b"-0",
            b" 7",
            b"7.0",
            b"9223372036854775808",
            b"99999999999999999999",
            b"-",
            b"",
        ] {
            let key = string_key(text);
            assert_eq!(
                key,
                xxhash_rust::xxh3::xxh3_64(text) >> 1,
                "{:?} is text",
                std::str::from_utf8(text)
            );
            assert_ne!(key, NULL_KEY);
        }
    }

    #[test]
    fn attention_needs_a_categorical_query_and_no_weights() {
        let mut s = schema();
        fn hist(s: &mut Schema) -> &mut FeatureSpec {
            s.features
                .iter_mut()
                .find(|f| f.name == "hist_items")
                .unwrap()
        }
        hist(&mut s).pooling = Pooling::Attention;
        assert!(s.validate().unwrap_err().contains("names no `query`"));
        hist(&mut s).query = Some("price".into());
        assert!(s
            .validate()
            .unwrap_err()
            .contains("must be a categorical feature"));
        hist(&mut s).query = Some("nothing".into());
        assert!(s.validate().unwrap_err().contains("is not a feature"));
        hist(&mut s).query = Some("item_id".into());
        s.validate().unwrap();
        // Slots: item_id 0, user_id 1, genres 2, hist_items 3.
        assert_eq!(s.attention_slots(), [(3, 0, 20, Pooling::Attention)]);
        hist(&mut s).pooling = Pooling::Transformer;
        s.validate().unwrap();
        assert_eq!(s.attention_slots(), [(3, 0, 20, Pooling::Transformer)]);
        hist(&mut s).query = None;
        assert!(s.validate().unwrap_err().contains("pools by transformer"));
        hist(&mut s).query = Some("item_id".into());
        hist(&mut s).pooling = Pooling::Attention;
        hist(&mut s).weights = Some("w".into());
        assert!(s.validate().unwrap_err().contains("weights"));
        let genres = s.features.iter_mut().find(|f| f.name == "genres").unwrap();
        genres.query = Some("item_id".into());
        hist(&mut s).weights = None;
        assert!(s.validate().unwrap_err().contains("names a query"));
    }

    #[test]
    fn csv_separators_are_checked() {
        let mut s = schema();
        s.csv.list_separator = '"';
        assert!(s.validate().unwrap_err().contains("list_separator"));
        s.csv = CsvFormat {
            delimiter: Some('|'),
            list_separator: '|',
        };
        assert!(s.validate().unwrap_err().contains("both"));
        s.csv.delimiter = Some('é');
        assert!(s.validate().unwrap_err().contains("ASCII"));
    }

    #[test]
    fn shared_tables_map_slots_to_one_table() {
        let s = schema();
        s.validate().unwrap();
        assert_eq!((s.dense_width(), s.sparse_width()), (1, 2));
        assert_eq!(s.embedding_slots(), 4);
        // Slots: item_id, user_id, genres, hist_items.
        assert_eq!(s.table_names(), ["item_id", "user_id", "genres"]);
        assert_eq!(s.slot_tables(), [0, 1, 2, 0]);
        assert_eq!(
            s.table_rows(),
            [5000, DEFAULT_SCHEMA_TABLE_ROWS, DEFAULT_SCHEMA_TABLE_ROWS]
        );
        assert!(!s.is_single_id());
    }

    #[test]
    fn bad_schemas_name_the_feature() {
        let mut s = schema();
        s.features[0].table = Some("x".into());
        assert!(s.validate().unwrap_err().contains("\"price\" is dense"));
        let mut s = schema();
        s.features[1].max_len = Some(3);
        assert!(s
            .validate()
            .unwrap_err()
            .contains("\"item_id\" is categorical"));
        let mut s = schema();
        s.features
            .push(FeatureSpec::new("item_id", FeatureKind::Dense));
        assert!(s.validate().unwrap_err().contains("declared twice"));
        let mut s = schema();
        s.tables[0].name = "nobody".into();
        assert!(s.validate().unwrap_err().contains("read by no feature"));
        let mut s = schema();
        s.features
            .push(FeatureSpec::new("click", FeatureKind::Dense));
        assert!(s.validate().unwrap_err().contains("label column"));
    }

    #[test]
    fn the_printed_toml_reads_back_as_the_schema() {
        let s = schema();
        let text = to_toml(&s);
        #[derive(Deserialize)]
        struct Doc {
            data: Back,
        }
        #[derive(Deserialize)]
        struct Back {
            label: String,
            feature: Vec<FeatureSpec>,
            table: Vec<TableSpec>,
        }
        let back: Doc = toml::from_str(&text).unwrap();
        assert_eq!(back.data.label, "click");
        assert_eq!(back.data.feature, s.features);
        assert_eq!(back.data.table, s.tables);
    }

    #[test]
    fn string_keys_never_collide_with_null() {
        for s in ["", "a", "comedy", "item-18446744073709551615"] {
            assert_ne!(string_key(s.as_bytes()), NULL_KEY);
        }
        assert_eq!(string_key(b"comedy"), string_key(b"comedy"));
        assert_ne!(string_key(b"comedy"), string_key(b"drama"));
    }
}
