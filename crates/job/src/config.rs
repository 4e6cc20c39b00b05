//! The training job file (TOML): typed, documented, defaulted and typo-proof.
//!
//! Every field has a default, so the smallest job file names only its data. Unknown keys are
//! rejected (`deny_unknown_fields`) so a typo is an error, not a silently ignored setting.
//! The field-by-field reference lives in `docs/config.md`; a test checks that every field
//! of these structs appears there.

use std::path::{Path, PathBuf};

use elastrec_data::BadRowPolicy;
use elastrec_embedding::SparseOptimizerConfig;
use elastrec_model::{DenseOptimizerConfig, InteractionKind};
use serde::{Deserialize, Serialize};

use crate::distributed::{CheckpointConfig, ClusterConfig};

/// A whole training job: one file for `elastrec train` (single process) and `elastrec run`
/// (distributed; `[cluster]` and `[checkpoint]` apply there and are ignored by `train`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct JobConfig {
    /// Where the samples come from.
    pub data: DataConfig,
    /// Model shape.
    pub model: ModelConfig,
    /// Loop settings: epochs, batch size, evaluation, threads.
    pub train: TrainConfig,
    /// Dense and sparse optimizers.
    pub optimizer: OptimizerConfig,
    /// Where results go.
    pub output: OutputConfig,
    /// Distributed layout and policies (`elastrec run`).
    pub cluster: ClusterConfig,
    /// Checkpoints and recovery (`elastrec run`).
    pub checkpoint: CheckpointConfig,
    /// Closed-loop resource planning (`elastrec run`).
    pub autoscale: crate::autoscale::AutoscaleConfig,
    /// What each role asks of the cluster engine (`elastrec run`).
    pub resources: crate::resources::ResourcesConfig,
    /// Cluster engine settings (`elastrec run --backend`).
    pub engine: crate::resources::EngineConfig,
    /// Online training from Kafka: when present, the job trains from these topics until
    /// stopped instead of from `[data] train` files.
    pub stream: Option<crate::stream::StreamConfig>,
    /// `[[preprocess]]`: the model's features, one chain of operators per entry
    /// (`docs/preprocess.md`). Empty: the default Criteo graph (`ln(1 + max(x, 0))` for
    /// `I1..I13`, `C1..C26` as they are).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub preprocess: Vec<elastrec_preprocess::FeatureSpec>,
    /// `[dashboard]`: `elastrec run` also serves the job's web page (`elastrec dashboard`,
    /// `docs/dashboard.md`). Absent: no page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dashboard: Option<DashboardConfig>,
}

/// `[dashboard]` of a job file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DashboardConfig {
    /// Address of the page. Beyond loopback every request needs the job's token (the
    /// contents of `output.dir/token`, given as `?token=`).
    pub listen: String,
    /// Milliseconds between two reads of the job's status.
    pub every_ms: u64,
}

impl Default for DashboardConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8090".into(),
            every_ms: 1000,
        }
    }
}

/// Data source: a directory of Criteo-layout day files.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// Directory holding the day files (relative paths are relative to the job file).
    pub dir: PathBuf,
    /// File names (inside `dir`) used for training, in order.
    pub train: Vec<String>,
    /// File names (inside `dir`) held out for evaluation.
    pub eval: Vec<String>,
    /// What to do with a malformed row: `"fail"` stops with `file:line: field N: reason`,
    /// `"skip"` counts it and reports the count at the end.
    pub on_bad_row: BadRowPolicy,
    /// When set and `dir` does not exist, the data is generated there first.
    pub generate: Option<GenerateConfig>,
    /// Time-partitioned datasets (`[[data.dataset]]`, see `docs/data.md`), resolved into
    /// `train` / `eval` files when the job starts. A job with a training dataset names no
    /// `train` files.
    pub dataset: Vec<elastrec_orchestrate::DatasetConfig>,
    /// The job's "now" for dataset windows, a UTC time like `2026-11-04T00`; default: the
    /// wall clock at start. Set in the resolved job file the master ships.
    pub now: Option<String>,
    /// Keep following the training datasets after start (`elastrec run` only): the master
    /// lists their windows again every `follow_every` and trains the partitions that
    /// landed since. The job ends once every window is bounded (`to`), closed and
    /// trained; otherwise it runs until `elastrec stop`. Needs `train.epochs = 1`.
    pub follow: bool,
    /// How often a following job lists its datasets (a duration like `"1m"` or `"30s"`).
    pub follow_every: String,
    /// Batch + stream mixture (`[data.mix]`, `elastrec run` with a `[stream]`): the job
    /// trains its history (`train` files or training datasets) and its stream together,
    /// served as `mode` says (`docs/data.md`). Absent: an online job trains its stream
    /// only.
    pub mix: Option<crate::mix::MixConfig>,
    /// The training data split into weighted sources (`[[data.source]]`, see
    /// `docs/data.md`); empty: one source. With sources, every training dataset and file
    /// is in exactly one, and `[data.mix]` (default `weighted`) says how they are served.
    pub source: Vec<crate::mix::SourceConfig>,
    /// The label column(s) of a data set with named columns (Parquet, or CSV/TSV with a
    /// header): `"click"`, or
    /// `["click", "buy"]` for a multi-task model. With `label` and no `[[data.feature]]`
    /// the features are inferred from the first training file when the job starts
    /// (`elastrec train --print-config` shows them). Absent: the Criteo layout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<LabelColumns>,
    /// The column of each sample's weight in the loss (named columns only): a number at
    /// least 0; the loss is the weighted mean (`docs/data.md`, "Sample weights"). Absent:
    /// 1 each.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<String>,
    /// The categorical feature naming the user each row belongs to (named features
    /// only): evaluation then also reports GAUC, each user's AUC over their own rows,
    /// averaged over users weighted by their rows. Inferred as a categorical feature
    /// named `user_id`, `userid`, `user` or `uid`. Absent: no GAUC.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The features of a data set with named columns (`[[data.feature]]`, see
    /// `docs/data.md`): name, kind (`dense`, `categorical`, `bag`, `sequence`), table,
    /// pooling, `max_len`, weights.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub feature: Vec<elastrec_data::FeatureSpec>,
    /// The embedding tables of the named features (`[[data.table]]`: name, rows); a
    /// table several features name is shared by them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub table: Vec<elastrec_data::TableSpec>,
    /// How a CSV or TSV file with a header separates fields and list items
    /// (`[data.csv]`: `delimiter`, default a tab when the header has one, else a comma;
    /// `list_separator`, default `|`). Named features only; Parquet ignores it.
    #[serde(skip_serializing_if = "is_default_csv")]
    pub csv: elastrec_data::CsvFormat,
}

fn is_default_csv(c: &elastrec_data::CsvFormat) -> bool {
    *c == elastrec_data::CsvFormat::default()
}

/// One label column or several (one per task).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum LabelColumns {
    /// One task.
    One(String),
    /// One column per task, task 0 first.
    Many(Vec<String>),
}

impl LabelColumns {
    /// The columns, task 0 first.
    pub fn names(&self) -> Vec<String> {
        match self {
            Self::One(l) => vec![l.clone()],
            Self::Many(v) => v.clone(),
        }
    }
}

impl DataConfig {
    /// True when a `[[data.dataset]]` has this role.
    pub fn has_dataset(&self, role: elastrec_orchestrate::DatasetRole) -> bool {
        self.dataset.iter().any(|d| d.role == role)
    }

    /// The named-feature schema (`label`, `[[data.feature]]`, `[[data.table]]`); `None`
    /// for the Criteo layout, and for a job whose features are still to be inferred
    /// (`label` without features, see [`crate::prepare::resolve_schema`]).
    pub fn schema(&self) -> Option<elastrec_data::Schema> {
        if self.feature.is_empty() {
            return None;
        }
        Some(elastrec_data::Schema {
            labels: self
                .label
                .as_ref()
                .map(LabelColumns::names)
                .unwrap_or_default(),
            weight: self.weight.clone(),
            features: self.feature.clone(),
            tables: self.table.clone(),
            csv: self.csv.clone(),
        })
    }

    /// Makes `schema` the job's named features.
    pub fn set_schema(&mut self, schema: elastrec_data::Schema) {
        self.label = Some(LabelColumns::Many(schema.labels));
        self.weight = schema.weight;
        self.feature = schema.features;
        self.table = schema.tables;
        self.csv = schema.csv;
    }

    /// The position of the user feature (`data.user`) among the single-id columns of a
    /// batch; `None` without one.
    pub fn user_slot(&self) -> Option<usize> {
        let user = self.user.as_deref()?;
        self.feature
            .iter()
            .filter(|f| f.kind == elastrec_data::FeatureKind::Categorical)
            .position(|f| f.name == user)
    }

    /// Names `data.user` after a categorical feature called like a user id (`user_id`,
    /// `userid`, `user`, `uid`, any case), when the job does not name one.
    pub fn infer_user(&mut self) {
        if self.user.is_some() {
            return;
        }
        self.user = self
            .feature
            .iter()
            .filter(|f| f.kind == elastrec_data::FeatureKind::Categorical)
            .find(|f| {
                ["user_id", "userid", "user", "uid"]
                    .iter()
                    .any(|n| f.name.eq_ignore_ascii_case(n))
            })
            .map(|f| f.name.clone());
    }

    /// True when the job names its columns (features given or still to be inferred).
    pub fn is_named(&self) -> bool {
        self.label.is_some() || !self.feature.is_empty()
    }
}

impl Default for DataConfig {
    fn default() -> Self {
        Self {
            dir: PathBuf::from("data/quickstart"),
            train: (0..6).map(|d| format!("day_{d}.tsv")).collect(),
            eval: vec!["day_6.tsv".into()],
            on_bad_row: BadRowPolicy::Fail,
            generate: None,
            dataset: Vec::new(),
            now: None,
            follow: false,
            follow_every: "1m".into(),
            mix: None,
            source: Vec::new(),
            label: None,
            weight: None,
            user: None,
            feature: Vec::new(),
            table: Vec::new(),
            csv: elastrec_data::CsvFormat::default(),
        }
    }
}

/// Parameters for generating the data set when it is missing.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct GenerateConfig {
    /// Total rows over all day files.
    pub rows: u64,
    /// Number of day files.
    pub days: u32,
    /// Seed of the generator (same seed, same bytes).
    pub seed: u64,
    /// Factor applied to the published Criteo Kaggle per-feature cardinalities.
    pub scale: f64,
    /// Drift of the click behaviour per day (`gen-data --drift`; 0: none).
    pub drift: f64,
    /// A second label per row, a conversion after the click (`gen-data --conversions`):
    /// the data of a two-task `mmoe` model.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub conversions: bool,
}

impl Default for GenerateConfig {
    fn default() -> Self {
        Self {
            rows: 1_400_000,
            days: 7,
            seed: 42,
            scale: 0.01,
            drift: 0.0,
            conversions: false,
        }
    }
}

/// DLRM shape.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Embedding dimension `d` of every table (equals the bottom MLP's output for `dot`).
    pub embedding_dim: usize,
    /// Hidden and output sizes of the bottom MLP (its input is the 13 integer features).
    pub bottom_mlp: Vec<usize>,
    /// Hidden and output sizes of the top MLP (its input size follows from the
    /// interaction; the last size must be 1).
    pub top_mlp: Vec<usize>,
    /// Feature interaction: `"dot"` (pairwise dot products) or `"concat"`.
    pub interaction: InteractionKind,
    /// Hashed rows per table: one number for every table, or a list of one per table.
    pub table_rows: TableRows,
    /// Upper bound applied to every table's row count (keeps memory predictable).
    pub max_table_rows: u64,
    /// Seed of the parameter initialization.
    pub seed: u64,
    /// MTRM (Primus §5.1, mixture jobs only): hidden and output sizes of the adapt tower
    /// (the last must be 1). The top MLP becomes the memory tower, trained on the
    /// history; the adapt tower reads the interaction output and the memory tower's
    /// logit and is trained on the stream, and predictions come from it. Empty: a plain
    /// DLRM. (Not written when empty, so plain models serialize, and fingerprint, as
    /// before MTRM existed.)
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub adapt_mlp: Vec<usize>,
    /// The model family: `"dlrm"` (bottom MLP, interaction, top MLP), `"dcn_v2"` (the
    /// same, with `cross_layers` DCN-v2 cross layers between the interaction and the top
    /// MLP) or `"deepfm"` (the embeddings' factorization-machine term added to the top
    /// MLP's logit); `docs/models.md`. Not written when `dlrm`, so existing jobs
    /// fingerprint as before.
    #[serde(rename = "type", skip_serializing_if = "ModelType::is_dlrm")]
    pub model_type: ModelType,
    /// `dcn_v2`: cross layers (each adds one degree of explicit feature crosses).
    #[serde(skip_serializing_if = "is_default_cross_layers")]
    pub cross_layers: usize,
    /// Dense-feature normalization: `"standardize"` (each feature shifted by its mean and
    /// divided by its standard deviation on the training data, computed in a first pass
    /// when the job starts and written to `dense_mean`/`dense_std`), `"none"` (the
    /// features as the reader or the `[[preprocess]]` graph give them), or `"auto"` (the
    /// default: standardize when the job has training files to compute the statistics
    /// from, else none). A started job holds `standardize` or `none`; only `standardize`
    /// is written, so jobs that did not standardize fingerprint as before (the model
    /// standardizes exactly when `dense_mean` is set).
    #[serde(skip_serializing_if = "DenseNorm::is_not_standardize")]
    pub dense_norm: DenseNorm,
    /// `standardize`: each dense feature's mean. Empty: computed at start. The stored
    /// job file (and every model file) holds the values used, so a resumed job, its
    /// workers and a served model standardize alike.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dense_mean: Vec<f32>,
    /// `standardize`: each dense feature's standard deviation (see `dense_mean`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dense_std: Vec<f32>,
    /// Dropout rate of the top MLP's hidden activations during training (0: none).
    #[serde(skip_serializing_if = "is_zero_rate")]
    pub dropout: f32,
    /// The first-order (linear) term: a weight per embedding row (stored as the row's
    /// last float) and a linear layer over the dense features, added to the logit. Always
    /// on for `wide_deep` (it is the wide part); DeepFM's first-order term for `deepfm`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub first_order: bool,
    /// Layer normalization between the affine map and the ReLU of every hidden layer of
    /// the bottom and top MLPs.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub layer_norm: bool,
    /// Batch normalization at the same places (statistics of each 256-row block of a
    /// training step; running averages, kept with the dense parameters, for predictions).
    /// Not with `layer_norm`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub batch_norm: bool,
    /// Dynamic embedding tables (`[model.dynamic_embeddings]`): each table a collision-free
    /// id → row map, within the memory of the hashed table `table_rows` sizes, with
    /// admission and eviction (`admit_count`, `eviction`, `ttl_steps`). Absent: hashed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dynamic_embeddings: Option<elastrec_embedding::DynamicConfig>,
    /// `mmoe`: the multi-task head (`[model.mmoe]`: `tasks`, `experts`, `expert_mlp`).
    /// Absent with `type = "mmoe"`: the defaults of [`MmoeSettings`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mmoe: Option<MmoeSettings>,
    /// Target attention (`[model.attention]`) of the named features pooled by
    /// `pooling = "attention"`: the scoring MLP's hidden sizes and the normalization.
    #[serde(skip_serializing_if = "is_default_attention")]
    pub attention: AttentionSettings,
    /// The transformer (`[model.transformer]`) of the named features pooled by
    /// `pooling = "transformer"` (BST): heads, layers, feed-forward width, positions.
    #[serde(skip_serializing_if = "is_default_transformer")]
    pub transformer: TransformerSettings,
}

/// `[model.transformer]`: the encoder over `[history…, candidate]` of BST.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct TransformerSettings {
    /// Attention heads; they split `model.embedding_dim`, so they must divide it.
    pub heads: usize,
    /// Encoder layers.
    pub layers: usize,
    /// Hidden width of each layer's feed-forward network; 0: four times
    /// `model.embedding_dim` (the transformer's usual ratio).
    pub ffn: usize,
    /// Learned embeddings of each item's recency (the newest item 1, the candidate 0)
    /// added to the tokens; `false`: the encoder does not see the order.
    pub positions: bool,
}

impl Default for TransformerSettings {
    fn default() -> Self {
        Self {
            heads: 2,
            layers: 1,
            ffn: 0,
            positions: true,
        }
    }
}

impl TransformerSettings {
    /// The model's transformer for `d`-wide embeddings.
    pub fn model_config(&self, d: usize) -> elastrec_model::TransformerConfig {
        elastrec_model::TransformerConfig {
            heads: self.heads,
            layers: self.layers,
            ffn: if self.ffn == 0 { 4 * d } else { self.ffn },
            positions: self.positions,
        }
    }
}

fn is_default_transformer(t: &TransformerSettings) -> bool {
    *t == TransformerSettings::default()
}

/// `[model.attention]`: how DIN's attention scores a history item against its query.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct AttentionSettings {
    /// Hidden sizes of the MLP over `[h, q, h - q, h * q]` (its output is one score).
    pub mlp: Vec<usize>,
    /// Weights are the softmax of the scores over the history; `false`: the raw scores,
    /// as DIN (their sum keeps how much of the history relates to the candidate).
    pub softmax: bool,
}

impl Default for AttentionSettings {
    fn default() -> Self {
        Self {
            mlp: vec![32],
            softmax: false,
        }
    }
}

fn is_default_attention(a: &AttentionSettings) -> bool {
    *a == AttentionSettings::default()
}

// The model's bound on tasks is the data's: a row's label field has a digit per task, and
// readers keep the labels after the first in a byte's bits.
const _: () =
    assert!(elastrec_model::MAX_TASKS == 1 + elastrec_data::raw::MAX_EXTRA_TASKS as usize);

/// `[model.mmoe]`: a multi-gate mixture of experts (Ma et al. 2018) over the interaction
/// output, a gate and a tower (`top_mlp`'s sizes) per task.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MmoeSettings {
    /// Tasks, 1 to 8: labels per row. A row's label field holds one 0/1 digit per task
    /// (`10`: task 0 yes, task 1 no); task 0 (the first digit) is the prediction every
    /// single-label consumer (AUC, serving's `probability`) reads.
    pub tasks: usize,
    /// Experts every task's gate mixes.
    pub experts: usize,
    /// Hidden and output sizes of each expert (its input is the interaction output).
    pub expert_mlp: Vec<usize>,
    /// Each task's weight in the loss (`Σ_t w_t · mean BCE_t`), one per task, finite and
    /// at least 0, not all 0. Empty (the default): 1 for every task.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub task_weights: Vec<f32>,
    /// Experts of each task's own beside the shared ones (CGC, PLE's extraction layer):
    /// each task's gate mixes the `experts` shared ones and its own. 0 (the default): an
    /// MMoE, every expert shared.
    #[serde(skip_serializing_if = "is_zero_count")]
    pub task_experts: usize,
}

impl Default for MmoeSettings {
    fn default() -> Self {
        Self {
            tasks: 2,
            experts: 4,
            expert_mlp: vec![256],
            task_weights: Vec::new(),
            task_experts: 0,
        }
    }
}

/// Most experts of each task's own (`model.mmoe.task_experts`).
pub const MAX_TASK_EXPERTS: usize = 16;

fn is_zero_count(v: &usize) -> bool {
    *v == 0
}

fn is_zero_rate(v: &f32) -> bool {
    *v == 0.0
}

/// Normalization of the dense features (`model.dense_norm`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DenseNorm {
    /// `Standardize` when the job has training files, else `None`; decided when the job
    /// starts. The default: on real data with features of different scales (an income
    /// beside an age), raw `log1p` values cost the DLRM more AUC than a logistic
    /// regression loses (`docs/models.md`, "Real data").
    #[default]
    Auto,
    /// The features as given.
    None,
    /// Zero mean and unit variance per feature, from a first pass over the training data.
    Standardize,
}

impl DenseNorm {
    fn is_not_standardize(&self) -> bool {
        *self != DenseNorm::Standardize
    }
}

/// The model family (`model.type`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelType {
    /// DLRM (Naumov et al. 2019).
    #[default]
    Dlrm,
    /// DCN-v2 (Wang et al. 2021): cross layers on the interaction output.
    DcnV2,
    /// DeepFM (Guo et al. 2017): the embeddings' FM term added to the top MLP's logit.
    #[serde(rename = "deepfm")]
    DeepFm,
    /// Wide & Deep (Cheng et al. 2016): the DLRM as the deep part plus a wide linear
    /// part (the first-order term) over the sparse ids, the dense features and any
    /// crossed columns a `[[preprocess]]` graph makes.
    WideDeep,
    /// Multi-task MMoE (Ma et al. 2018): the DLRM's interaction feeds experts, a softmax
    /// gate per task mixes them, and a tower per task gives its logit (`[model.mmoe]`).
    Mmoe,
}

impl ModelType {
    /// The name a job file gives it (`model.type`).
    pub fn name(&self) -> &'static str {
        match self {
            ModelType::Dlrm => "dlrm",
            ModelType::DcnV2 => "dcn_v2",
            ModelType::DeepFm => "deepfm",
            ModelType::WideDeep => "wide_deep",
            ModelType::Mmoe => "mmoe",
        }
    }

    fn is_dlrm(&self) -> bool {
        *self == ModelType::Dlrm
    }
}

const DEFAULT_CROSS_LAYERS: usize = 3;

/// `optimizer.schedule.warmup_samples` of a DeepFM batch job that does not set it. On the
/// quickstart data (1 epoch): 0.7954 AUC without a warm-up, 0.8109 with 50,000 samples
/// (default sparse optimizer); with sparse `adagrad`, 0.8033 without, 0.8125 with 50,000,
/// 0.8116 with 200,000, 0.8108 with 500,000.
pub const DEEPFM_WARMUP_SAMPLES: u64 = 50_000;

fn is_default_cross_layers(n: &usize) -> bool {
    *n == DEFAULT_CROSS_LAYERS
}

impl ModelConfig {
    /// Cross layers the model has (0 unless `dcn_v2`).
    pub fn cross_layers(&self) -> usize {
        match self.model_type {
            ModelType::Dlrm | ModelType::DeepFm | ModelType::WideDeep | ModelType::Mmoe => 0,
            ModelType::DcnV2 => self.cross_layers,
        }
    }

    /// Whether the model has the first-order term (`wide_deep`, or `first_order = true`).
    pub fn has_first_order(&self) -> bool {
        self.first_order || self.model_type == ModelType::WideDeep
    }

    /// The multi-task head of an `mmoe` model (the section's values or the defaults);
    /// `None` for the other families.
    pub fn mmoe_settings(&self) -> Option<MmoeSettings> {
        (self.model_type == ModelType::Mmoe).then(|| self.mmoe.clone().unwrap_or_default())
    }

    /// Tasks (labels per row) the model predicts: 1 unless `mmoe`.
    pub fn tasks(&self) -> usize {
        self.mmoe_settings().map_or(1, |h| h.tasks)
    }

    /// Floats per embedding row in the store: `embedding_dim`, plus the row's
    /// first-order weight when the model has that term.
    pub fn row_width(&self) -> usize {
        self.embedding_dim + usize::from(self.has_first_order())
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            embedding_dim: 16,
            bottom_mlp: vec![512, 256, 64, 16],
            top_mlp: vec![512, 256, 1],
            interaction: InteractionKind::Dot,
            table_rows: TableRows::Auto,
            max_table_rows: 1_000_000,
            seed: 1,
            adapt_mlp: Vec::new(),
            model_type: ModelType::Dlrm,
            cross_layers: DEFAULT_CROSS_LAYERS,
            dense_norm: DenseNorm::Auto,
            dense_mean: Vec::new(),
            dense_std: Vec::new(),
            dropout: 0.0,
            first_order: false,
            layer_norm: false,
            batch_norm: false,
            dynamic_embeddings: None,
            mmoe: None,
            attention: AttentionSettings::default(),
            transformer: TransformerSettings::default(),
        }
    }
}

/// How many hashed rows each embedding table has.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum TableRows {
    /// The per-feature cardinalities in the data set's `report.json` (written by
    /// `elastrec gen-data`), capped by `max_table_rows`; 100,000 each without a report.
    #[default]
    Auto,
    /// The same row count for every table.
    All(u64),
    /// One row count per table (26 values).
    PerTable(Vec<u64>),
}

impl Serialize for TableRows {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            TableRows::Auto => s.serialize_str("auto"),
            TableRows::All(n) => s.serialize_u64(*n),
            TableRows::PerTable(v) => v.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for TableRows {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Name(String),
            One(i64),
            Many(Vec<i64>),
        }
        let positive = |n: i64| -> Result<u64, D::Error> {
            if n <= 0 {
                Err(serde::de::Error::custom(format!(
                    "table_rows must be positive, got {n}"
                )))
            } else {
                Ok(n as u64)
            }
        };
        match Raw::deserialize(d)? {
            Raw::Name(s) if s == "auto" => Ok(TableRows::Auto),
            Raw::Name(s) => Err(serde::de::Error::custom(format!(
                "table_rows must be \"auto\", a number or a list of one number per table, got \"{s}\""
            ))),
            Raw::One(n) => Ok(TableRows::All(positive(n)?)),
            Raw::Many(v) => Ok(TableRows::PerTable(
                v.into_iter().map(positive).collect::<Result<_, _>>()?,
            )),
        }
    }
}

/// Training-loop settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// Passes over the training files.
    pub epochs: u32,
    /// Samples per step. A job file that leaves it out gets 2048, or less on a small
    /// training set (`batch_size_auto`).
    pub batch_size: usize,
    /// The job file left `batch_size` out: where the job starts, a batch job over fewer
    /// than 100 batches of 2048 rows takes the largest power of two that still makes
    /// 100 steps an epoch (`prepare::fill_batch_size`). Not written: the stored job
    /// holds the batch decided, and a job built in code names its batch.
    #[serde(skip)]
    pub batch_size_auto: bool,
    /// Evaluate on the held-out files every this many training samples (0: only at the
    /// end of each epoch).
    pub eval_every: u64,
    /// Worker threads for the math (0: all cores).
    pub threads: usize,
    /// Stop after this many training samples (0: no limit). Useful for smoke runs.
    pub max_samples: u64,
    /// Show a progress bar (off automatically when stderr is not a terminal).
    pub progress: bool,
    /// `elastrec train` with a `[[preprocess]]` graph: where the plan runs. `"auto"`
    /// chooses from measured costs and moves it when the other place is predicted
    /// faster; `"reader"`: on the reader thread, overlapped with the step; `"trainer"`:
    /// on the training threads between steps (`docs/preprocess.md`).
    pub preprocess_on: PreprocessOn,
    /// `elastrec train`: the share of the training rows held out as a validation slice,
    /// taken from the end of the training files (the most recent rows of time-ordered
    /// data); model selection and early stopping judge it instead of the eval files.
    /// 0: no slice.
    pub validation: f64,
    /// `elastrec train`: stop after this many evaluations in a row without a better AUC
    /// (on the validation slice, else on the eval files); `model.bin` is then the best
    /// model seen. 0: never stop early.
    pub early_stopping: u32,
    /// Rows that mix before training. `elastrec train`: a shuffle buffer of this many rows,
    /// each batch drawn from it at random (seeded by `model.seed` and the epoch).
    /// `elastrec run`: each shard holds at least this many rows, permuted by
    /// `cluster.seed` and the epoch. 0: rows in file order.
    pub shuffle_buffer: usize,
    /// `elastrec run`, batch jobs: progressive validation (the loss and AUC of the
    /// predictions the workers made just before training on each batch) over this many
    /// most recent samples, for `status`, the dashboard's curves, `/metrics` and
    /// `result.json`; 0 turns it off. Online jobs use `stream.eval_window`.
    pub progressive_window: u64,
    /// How often the progressive-validation figures are recorded, seconds.
    pub progressive_every_s: f64,
}

/// Where `elastrec train` runs a `[[preprocess]]` plan.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PreprocessOn {
    /// From the cost model.
    #[default]
    Auto,
    /// The reader thread.
    Reader,
    /// The training threads.
    Trainer,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            epochs: 1,
            batch_size: 2048,
            batch_size_auto: false,
            eval_every: 0,
            threads: 0,
            max_samples: 0,
            progress: true,
            preprocess_on: PreprocessOn::Auto,
            validation: 0.0,
            early_stopping: 0,
            shuffle_buffer: 0,
            progressive_window: 100_000,
            progressive_every_s: 5.0,
        }
    }
}

/// Dense and sparse optimizer choice. The types are the optimizer crates' own, so a job
/// file configures exactly what runs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct OptimizerConfig {
    /// Optimizer of the MLP parameters.
    pub dense: DenseOptimizerConfig,
    /// Optimizer of the embedding rows.
    pub sparse: SparseOptimizerConfig,
    /// Learning-rate warm-up and decay (`[optimizer.schedule]`), a multiplier of both
    /// rates; default: constant. `elastrec train` only. Not written when constant, so the
    /// checkpoint fingerprints of jobs without one stay as they were.
    #[serde(skip_serializing_if = "elastrec_model::LrSchedule::is_constant")]
    pub schedule: elastrec_model::LrSchedule,
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        Self {
            dense: DenseOptimizerConfig::Adagrad {
                lr: 0.01,
                initial_accumulator: 0.0,
                eps: 1e-10,
                weight_decay: 0.0,
            },
            sparse: SparseOptimizerConfig::RowWiseAdagrad {
                lr: 0.05,
                eps: 1e-8,
                initial_accumulator: 0.0,
            },
            schedule: elastrec_model::LrSchedule::default(),
        }
    }
}

/// Where results are written.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct OutputConfig {
    /// Run directory: `metrics.jsonl`, `summary.json` and `model.bin` go here (relative
    /// paths are relative to the job file).
    pub dir: PathBuf,
    /// Save the trained model to `<dir>/model.bin` for `elastrec eval` (`elastrec run`:
    /// from a final checkpoint, so it needs `checkpoint.enabled`).
    pub save_model: bool,
    /// `elastrec run`: every this many seconds, write the newest checkpoint as a servable
    /// model under `<dir>/export/` (with `latest.json` naming it); 0 turns it off. Meant
    /// for online jobs, which never end.
    pub export_every_s: f64,
    /// Exported models kept (older ones are deleted).
    pub export_keep: usize,
    /// `elastrec run`: model servers (`elastrec serve`, base URLs such as
    /// `http://127.0.0.1:8500`) each periodic export is pushed to, as a delta when the
    /// server holds the previous export. The token is read from `ELASTREC_SERVE_TOKEN`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub push: Vec<String>,
}

impl Default for OutputConfig {
    fn default() -> Self {
        Self {
            dir: PathBuf::from("runs/quickstart"),
            save_model: true,
            export_every_s: 0.0,
            export_keep: 3,
            push: Vec::new(),
        }
    }
}

/// A configuration error, naming the field at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read job file {path}: {source}")]
    Read {
        /// The job file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// TOML syntax error, unknown field or wrong type.
    #[error("{path}: {message}")]
    Parse {
        /// The job file.
        path: PathBuf,
        /// The TOML parser's message, which names the field and position.
        message: String,
    },
    /// A value out of its allowed range.
    #[error("{path}: field `{field}`: {reason}")]
    Invalid {
        /// The job file.
        path: PathBuf,
        /// Dotted field name, e.g. `train.batch_size`.
        field: &'static str,
        /// What is wrong and what is allowed.
        reason: String,
    },
}

impl JobConfig {
    /// Parses TOML text; `path` only names the source in errors.
    pub fn from_toml(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let mut cfg: JobConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        // The fields the file itself sets (the struct above has every default filled in).
        let given: toml::Table = toml::from_str(text).unwrap_or_default();
        crate::resources::resolve_resources(&mut cfg, &given, path)?;
        crate::autoscale::resolve_autoscale(&mut cfg, &given);
        cfg.apply_family_defaults(&given);
        cfg.check_dataset_fields(&given, path)?;
        cfg.validate(path)?;
        Ok(cfg)
    }

    /// Defaults that depend on the model family or on the data, for the fields the file
    /// leaves out. The batch size is decided where the job starts, from its rows.
    ///
    /// A DeepFM warms its learning rates up over [`DEEPFM_WARMUP_SAMPLES`]: without it,
    /// its first full-rate steps cost it 0.015 AUC on the quickstart data. Our reading:
    /// the FM term sends every embedding of a sample the sum of the others as gradient,
    /// and the Adagrads' first steps (each a full `lr` per weight) taken on those large,
    /// still random gradients scatter the embeddings (docs/models.md, "DeepFM's
    /// warm-up"). Online jobs take no schedule, so they keep none.
    fn apply_family_defaults(&mut self, given: &toml::Table) {
        let warmup_given = given
            .get("optimizer")
            .and_then(|o| o.get("schedule"))
            .and_then(|s| s.get("warmup_samples"))
            .is_some();
        if self.model.model_type == ModelType::DeepFm && self.stream.is_none() && !warmup_given {
            self.optimizer.schedule.warmup_samples = DEEPFM_WARMUP_SAMPLES;
        }
        self.train.batch_size_auto = given
            .get("train")
            .and_then(|t| t.get("batch_size"))
            .is_none();
    }

    /// Reads and validates a job file; relative data and output paths are resolved
    /// against the file's directory.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut cfg = Self::from_toml(&text, path)?;
        // `job.toml` has the parent "", which `std::path::absolute` refuses.
        let base = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        // Absolute: the distributed job ships this config to processes in other directories.
        cfg.data.dir = crate::distributed::absolute(&base.join(&cfg.data.dir));
        let job_dir = crate::distributed::absolute(base);
        for d in &mut cfg.data.dataset {
            d.resolve_root(&job_dir);
        }
        for j in cfg.data.source.iter_mut().filter_map(|s| s.join.as_mut()) {
            j.resolve_root(&job_dir);
        }
        cfg.output.dir = crate::distributed::absolute(&base.join(&cfg.output.dir));
        crate::distributed::resolve_checkpoint_location(&mut cfg, base);
        Ok(cfg)
    }

    /// Fields set in this job that only `elastrec train` carries out (training hygiene the
    /// distributed workers and parameter servers do not apply yet); `elastrec run`
    /// refuses a job that sets any, rather than ignore it.
    pub fn train_only_settings(&self) -> Vec<&'static str> {
        let mut out = Vec::new();

        // An online job has no end to decay towards.
        if !self.optimizer.schedule.is_constant() && self.stream.is_some() {
            out.push("optimizer.schedule");
        }
        out
    }

    /// Rows of a data task in `elastrec run`: `cluster.batches_per_shard` batches, or
    /// more with `train.shuffle_buffer`, whose rows a worker permutes within each shard
    /// (so that each row mixes with at least that many others).
    pub fn rows_per_shard(&self) -> u64 {
        let b = self.train.batch_size as u64;
        (b * u64::from(self.cluster.batches_per_shard))
            .max((self.train.shuffle_buffer as u64).div_ceil(b.max(1)) * b)
    }

    /// True for a batch + stream mixture job.
    pub fn is_mixture(&self) -> bool {
        self.stream.is_some() && self.data.mix.is_some()
    }

    /// How often a following job lists its datasets.
    pub fn follow_every(&self) -> std::time::Duration {
        humantime::parse_duration(&self.data.follow_every)
            .unwrap_or(std::time::Duration::from_secs(60))
    }

    /// Resolved paths of the training files.
    pub fn train_files(&self) -> Vec<PathBuf> {
        self.data
            .train
            .iter()
            .map(|f| self.data.dir.join(f))
            .collect()
    }

    /// Resolved paths of the evaluation files.
    pub fn eval_files(&self) -> Vec<PathBuf> {
        self.data
            .eval
            .iter()
            .map(|f| self.data.dir.join(f))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<JobConfig, ConfigError> {
        JobConfig::from_toml(text, Path::new("job.toml"))
    }

    /// Normalization, dropout and weight decay are read, checked field by field, and not
    /// written when off (so jobs from before them fingerprint as before).
    #[test]
    fn dense_norm_dropout_and_weight_decay_are_checked() {
        let cfg = parse(
            "[model]\ndense_norm = \"standardize\"\ndropout = 0.2\n\
             [optimizer.dense]\ntype = \"adam\"\nlr = 0.001\nweight_decay = 1e-5\n",
        )
        .unwrap();
        assert_eq!(cfg.model.dense_norm, DenseNorm::Standardize);
        assert_eq!(cfg.optimizer.dense.weight_decay(), 1e-5);
        let d = crate::prepare::dense_config(&cfg);
        assert_eq!((d.dropout, d.dense_shift.len()), (0.2, 0));
        let bn = parse("[model]\nbatch_norm = true\n").unwrap();
        assert!(crate::prepare::dense_config(&bn).batch_norm);
        let plain = toml::to_string(&JobConfig::default()).unwrap();
        for field in [
            "dense_norm",
            "dense_mean",
            "dropout",
            "weight_decay",
            "batch_norm",
        ] {
            assert!(!plain.contains(field), "{field} written when off");
        }
        let explicit = parse(&format!(
            "[model]\ndense_norm = \"standardize\"\ndense_mean = {:?}\ndense_std = {:?}\n",
            vec![1.0; 13],
            vec![2.0; 13]
        ))
        .unwrap();
        let d = crate::prepare::dense_config(&explicit);
        assert_eq!((d.dense_shift[0], d.dense_scale[12]), (1.0, 0.5));
        for (text, field, says) in [
            ("[model]\ndropout = 1.0\n", "model.dropout", "below 1"),
            (
                "[model.dynamic_embeddings]\nadmit_count = 0\n",
                "model.dynamic_embeddings.admit_count",
                "must be in 1..=255",
            ),
            (
                "[model.dynamic_embeddings]\nevict = \"lru\"\n",
                "evict",
                "unknown field",
            ),
            (
                "[model]\ntype = \"wide_deep\"\n",
                "optimizer.sparse",
                "type = \"adagrad\"",
            ),
            (
                "[model]\ndense_norm = \"none\"\ndense_mean = [1.0]\ndense_std = [1.0]\n",
                "model.dense_mean",
                "only with",
            ),
            (
                "[model]\ndense_norm = \"standardize\"\ndense_mean = [1.0]\ndense_std = [1.0]\n",
                "model.dense_mean",
                "needs 13 values",
            ),
            (
                "[model]\ndense_norm = \"standardize\"\ndense_mean = [1.0]\ndense_std = []\n",
                "model.dense_std",
                "give both",
            ),
            (
                "[model]\ndense_norm = \"standardize\"\ndense_mean = [1.0]\ndense_std = [0.0]\n",
                "model.dense_std",
                "positive",
            ),
            (
                "[optimizer.dense]\ntype = \"sgd\"\nlr = 0.1\nweight_decay = -1.0\n",
                "optimizer.dense.weight_decay",
                "at least 0",
            ),
            (
                "[model]\nlayer_norm = true\nbatch_norm = true\n",
                "model.batch_norm",
                "choose one",
            ),
            (
                "[model]\nbatch_norm = true\nadapt_mlp = [8, 1]\n",
                "model.batch_norm",
                "adapt tower",
            ),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(field) && e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn empty_file_gives_documented_defaults() {
        let cfg = parse("").unwrap();
        // A job built in code names its batch; a file that leaves it out has it decided
        // from its rows where it starts (2048 on the quickstart's).
        let mut in_code = JobConfig::default();
        in_code.train.batch_size_auto = true;
        // ... and its resources decided by the master: it pins no worker count.
        in_code.autoscale.enabled = true;
        in_code.autoscale.enforce = Some(false);
        assert_eq!(cfg, in_code);
        assert_eq!(cfg.train.batch_size, 2048);
        assert_eq!(cfg.model.bottom_mlp, vec![512, 256, 64, 16]);
    }

    #[test]
    fn unknown_field_is_named() {
        let err = parse("[train]\nbatch_sise = 10\n").unwrap_err().to_string();
        assert!(err.contains("batch_sise"), "{err}");
    }

    #[test]
    fn negative_and_zero_values_are_rejected_with_field() {
        let err = parse("[train]\nbatch_size = -1\n").unwrap_err().to_string();
        assert!(err.contains("batch_size"), "{err}");
        let err = parse("[train]\nbatch_size = 0\n").unwrap_err().to_string();
        assert!(err.contains("train.batch_size"), "{err}");
        let err = parse("[model]\ntable_rows = -5\n").unwrap_err().to_string();
        assert!(err.contains("table_rows must be positive"), "{err}");
    }

    #[test]
    fn a_dashboard_address_or_interval_that_cannot_work_is_named() {
        let err = parse("[dashboard]\nlisten = \"localhost\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("dashboard.listen"), "{err}");
        let err = parse("[dashboard]\nevery_ms = 0\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("dashboard.every_ms"), "{err}");
        let cfg = parse("[dashboard]\n").unwrap();
        assert_eq!(cfg.dashboard, Some(DashboardConfig::default()));
    }

    #[test]
    fn dot_interaction_needs_matching_bottom_output() {
        let err = parse("[model]\nbottom_mlp = [64, 8]\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("model.bottom_mlp"), "{err}");
        assert!(parse("[model]\nbottom_mlp = [64, 8]\ninteraction = \"concat\"\n").is_ok());
    }

    #[test]
    fn optimizers_are_tagged_by_type() {
        let cfg = parse(
            "[optimizer.dense]\ntype = \"adam\"\nlr = 0.001\n[optimizer.sparse]\ntype = \"sgd\"\nlr = 0.1\n",
        )
        .unwrap();
        assert!(
            matches!(cfg.optimizer.dense, DenseOptimizerConfig::Adam { lr, .. } if lr == 0.001)
        );
        assert_eq!(cfg.optimizer.sparse, SparseOptimizerConfig::Sgd { lr: 0.1 });
        let cfg = parse("[optimizer.sparse]\ntype = \"ftrl\"\nl1 = 0.01\n").unwrap();
        assert_eq!(
            cfg.optimizer.sparse,
            SparseOptimizerConfig::Ftrl {
                lr: 0.05,
                beta: 1.0,
                l1: 0.01,
                l2: 0.0,
                initial_accumulator: 0.1
            }
        );
        let err = parse("[optimizer.sparse]\ntype = \"adam\"\nbeta2 = 1.0\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("optimizer.sparse") && err.contains("beta2"),
            "{err}"
        );
        let err = parse("[optimizer.dense]\ntype = \"adagrad\"\nlr = -1.0\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("optimizer.dense.lr"), "{err}");
    }

    #[test]
    fn table_rows_forms() {
        let cfg = parse("[model]\ntable_rows = 1000\n").unwrap();
        assert_eq!(cfg.model.table_rows, TableRows::All(1000));
        let err = parse("[model]\ntable_rows = [1, 2]\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("26 entries"), "{err}");
    }

    /// `model.type` selects the family; a plain DLRM writes neither `type` nor
    /// `cross_layers` (its fingerprint is unchanged); what cannot combine is refused.
    #[test]
    fn model_families_parse_and_refuse_what_cannot_combine() {
        let cfg = parse("[model]\ntype = \"dcn_v2\"\n").unwrap();
        assert_eq!(cfg.model.cross_layers(), 3);
        let d = crate::prepare::dense_config(&cfg);
        assert_eq!((d.cross_layers, d.fm), (3, false));
        let cfg = parse("[model]\ntype = \"deepfm\"\ncross_layers = 5\n").unwrap();
        let d = crate::prepare::dense_config(&cfg);
        assert_eq!((d.cross_layers, d.fm), (0, true));
        let optimizer = toml::to_string(&parse("").unwrap().optimizer).unwrap();
        assert!(!optimizer.contains("schedule"), "{optimizer}");
        let plain = toml::to_string(&parse("").unwrap().model).unwrap();
        assert!(
            !plain.contains("type") && !plain.contains("cross_layers"),
            "{plain}"
        );
        let field = |text: &str| match parse(text).unwrap_err() {
            ConfigError::Invalid { field, .. } => field,
            e => panic!("{e}"),
        };
        assert_eq!(
            field("[model]\ntype = \"dcn_v2\"\ncross_layers = 0\n"),
            "model.cross_layers"
        );
        assert_eq!(
            field("[model]\ntype = \"deepfm\"\nadapt_mlp = [4, 1]\n"),
            "model.type"
        );
        assert!(parse("[model]\ntype = \"wide\"\n").is_err());
    }

    /// `mmoe` takes its head from `[model.mmoe]` (or the defaults), and what it cannot
    /// carry is refused naming the field.
    #[test]
    fn mmoe_settings_are_read_and_checked() {
        let cfg = parse("[model]\ntype = \"mmoe\"\n").unwrap();
        assert_eq!(cfg.model.tasks(), 2);
        let h = crate::prepare::dense_config(&cfg).mmoe.unwrap();
        assert_eq!((h.tasks, h.experts, h.expert), (2, 4, vec![256]));
        let cfg =
            parse("[model]\ntype = \"mmoe\"\n[model.mmoe]\ntasks = 3\nexperts = 2\n").unwrap();
        assert_eq!(cfg.model.tasks(), 3);
        assert_eq!(parse("").unwrap().model.tasks(), 1);
        let weighted = "[model]\ntype = \"mmoe\"\n[model.mmoe]\ntask_weights = [1.0, 0.25]\n";
        let h = crate::prepare::dense_config(&parse(weighted).unwrap())
            .mmoe
            .unwrap();
        assert_eq!((h.weight(0), h.weight(1)), (1.0, 0.25));
        let cgc = "[model]\ntype = \"mmoe\"\n[model.mmoe]\nexperts = 1\ntask_experts = 2\n";
        let h = crate::prepare::dense_config(&parse(cgc).unwrap())
            .mmoe
            .unwrap();
        assert_eq!((h.experts, h.task_experts), (1, 2));
        let field = |text: &str| match parse(text).unwrap_err() {
            ConfigError::Invalid { field, .. } => field,
            e => panic!("{e}"),
        };
        let mmoe = "[model]\ntype = \"mmoe\"\n";
        for (extra, want) in [
            ("[model.mmoe]\ntasks = 9\n", "model.mmoe.tasks"),
            ("[model.mmoe]\ntasks = 0\n", "model.mmoe.tasks"),
            ("[model.mmoe]\nexperts = 0\n", "model.mmoe.experts"),
            (
                "[model.mmoe]\ntask_experts = 17\n",
                "model.mmoe.task_experts",
            ),
            ("[model.mmoe]\nexpert_mlp = []\n", "model.mmoe.expert_mlp"),
            (
                "[model.mmoe]\ntask_weights = [1.0]\n",
                "model.mmoe.task_weights",
            ),
            (
                "[model.mmoe]\ntask_weights = [1.0, -0.5]\n",
                "model.mmoe.task_weights",
            ),
            (
                "[model.mmoe]\ntask_weights = [0.0, 0.0]\n",
                "model.mmoe.task_weights",
            ),
            (
                "[model.mmoe]\ntask_weights = [1.0, nan]\n",
                "model.mmoe.task_weights",
            ),
        ] {
            assert_eq!(field(&format!("{mmoe}{extra}")), want, "{extra}");
        }
        assert_eq!(
            field("[model]\ntype = \"mmoe\"\nfirst_order = true\n"),
            "model.first_order"
        );
        assert_eq!(field("[model.mmoe]\ntasks = 2\n"), "model.mmoe");
    }

    /// `run` permutes each shard's rows in a worker's memory: a shuffle buffer makes shards
    /// at least that big, within a limit; an online job keeps its stream's order.
    #[test]
    fn a_shuffle_buffer_sizes_the_shards_of_run() {
        let cfg = parse(
            "[train]\nbatch_size = 256\nshuffle_buffer = 2000\n[cluster]\nbatches_per_shard = 4\n",
        )
        .unwrap();
        assert_eq!(cfg.rows_per_shard(), 2048, "rounded up to whole batches");
        let cfg = parse("[train]\nbatch_size = 256\n").unwrap();
        assert_eq!(
            cfg.rows_per_shard(),
            256 * 16,
            "cluster.batches_per_shard's default"
        );
        let err = parse("[train]\nshuffle_buffer = 100000000\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("train.shuffle_buffer") && err.contains("limit"),
            "{err}"
        );
        let err = parse("[train]\nshuffle_buffer = 1000\n[stream]\ntopics = [\"clicks\"]\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("train.shuffle_buffer") && err.contains("arrival order"),
            "{err}"
        );
    }

    /// The brain compares jobs by these names: each is what a job file writes.
    #[test]
    fn a_model_type_is_named_as_a_job_file_writes_it() {
        use ModelType::*;
        for t in [Dlrm, DcnV2, DeepFm, WideDeep, Mmoe] {
            let text = format!("type = \"{}\"", t.name());
            #[derive(Deserialize)]
            struct M {
                r#type: ModelType,
            }
            let m: M = toml::from_str(&text).unwrap();
            assert_eq!(m.r#type, t, "{text}");
        }
    }

    /// A schedule parses with its defaults, and the hygiene settings `run` does not carry
    /// out are listed so that it can refuse them.
    #[test]
    fn named_features_are_checked_when_the_job_loads() {
        let features = "[[data.feature]]\nname = \"item\"\nkind = \"categorical\"\n";
        let err = parse(&format!("[data]\n{features}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("data.label"), "{err}");
        let cfg = parse(&format!("[data]\nlabel = \"click\"\n{features}")).unwrap();
        let schema = cfg.data.schema().unwrap();
        assert_eq!(schema.labels, ["click"]);
        assert_eq!(schema.sparse_width(), 1);
        assert!(
            cfg.train_only_settings().is_empty(),
            "`run` trains them too"
        );
        let err = parse(&format!(
            "[data]\nlabel = \"click\"\n{features}[[data.feature]]\nname = \"item\"\nkind = \"dense\"\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("\"item\" is declared twice"), "{err}");
        let err = parse("[data]\nweight = \"w\"\n").unwrap_err().to_string();
        assert!(
            err.contains("data.weight") && err.contains("data.label"),
            "{err}"
        );
        let cfg = parse(&format!(
            "[data]\nlabel = \"click\"\nweight = \"w\"\n{features}"
        ))
        .unwrap();
        assert_eq!(cfg.data.schema().unwrap().weight.as_deref(), Some("w"));
        let err = parse(&format!(
            "[data]\nlabel = \"click\"\nweight = \"item\"\n{features}"
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("weight column \"item\""), "{err}");
        // The user column of GAUC: a categorical feature, named or found by its name.
        let with_user = "[[data.feature]]\nname = \"User_Id\"\nkind = \"categorical\"\n\
                         [[data.feature]]\nname = \"price\"\nkind = \"dense\"\n";
        let mut cfg = parse(&format!("[data]\nlabel = \"click\"\n{features}{with_user}")).unwrap();
        assert_eq!(cfg.data.user_slot(), None);
        cfg.data.infer_user();
        assert_eq!(cfg.data.user.as_deref(), Some("User_Id"));
        assert_eq!(cfg.data.user_slot(), Some(1), "the second single-id column");
        for (user, why) in [
            ("price", "not a categorical"),
            ("nobody", "not a categorical"),
        ] {
            let err = parse(&format!(
                "[data]\nlabel = \"click\"\nuser = \"{user}\"\n{features}{with_user}"
            ))
            .unwrap_err()
            .to_string();
            assert!(err.contains("data.user") && err.contains(why), "{err}");
        }
        let err = parse("[data]\nuser = \"u\"\n").unwrap_err().to_string();
        assert!(
            err.contains("data.user") && err.contains("data.label"),
            "{err}"
        );
        let err = parse("[data]\nlabel = \"click\"\n[model]\ntable_rows = 1000\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("model.table_rows"), "{err}");
        // Labels of several tasks.
        let cfg = parse("[data]\nlabel = [\"click\", \"buy\"]\n").unwrap();
        assert_eq!(
            cfg.data.label.unwrap().names(),
            ["click".to_string(), "buy".to_string()]
        );
    }

    #[test]
    fn train_only_settings_are_listed() {
        let cfg =
            parse("[optimizer.schedule]\nwarmup_samples = 1000\ndecay = \"cosine\"\n").unwrap();
        assert_eq!(cfg.optimizer.schedule.decay, elastrec_model::Decay::Cosine);
        assert_eq!(cfg.optimizer.schedule.final_scale, 0.1);
        // `run` carries a schedule out for batch jobs (the master sends the multiplier).
        assert!(cfg.train_only_settings().is_empty());
        // `run` selects models and shuffles too.
        let cfg =
            parse("[train]\nvalidation = 0.1\nearly_stopping = 2\nshuffle_buffer = 10\n").unwrap();
        assert!(cfg.train_only_settings().is_empty());
        assert!(parse("").unwrap().train_only_settings().is_empty());
        let err = parse("[train]\nprogressive_window = 100000000\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("train.progressive_window"), "{err}");
        let err = parse("[train]\nprogressive_every_s = 0\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("train.progressive_every_s"), "{err}");
        let err = parse("[optimizer.schedule]\nfinal_scale = 3\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("optimizer.schedule.final_scale"), "{err}");
    }

    /// A DeepFM batch job warms its rates up unless its file sets `warmup_samples` (to 0
    /// as well); other families, and online jobs (which take no schedule), do not.
    #[test]
    fn a_deepfm_batch_job_warms_up_by_default() {
        let deepfm = "[model]\ntype = \"deepfm\"\n";
        let warmup = |text: &str| parse(text).unwrap().optimizer.schedule.warmup_samples;
        assert_eq!(warmup(deepfm), DEEPFM_WARMUP_SAMPLES);
        assert_eq!(
            warmup(&format!(
                "{deepfm}[optimizer.schedule]\nwarmup_samples = 0\n"
            )),
            0
        );
        assert_eq!(
            warmup(&format!(
                "{deepfm}[optimizer.schedule]\nwarmup_samples = 7\ndecay = \"cosine\"\n"
            )),
            7
        );
        // Another schedule field keeps the family's warm-up.
        let cfg = parse(&format!(
            "{deepfm}[optimizer.schedule]\ndecay = \"linear\"\n"
        ))
        .unwrap();
        assert_eq!(cfg.optimizer.schedule.warmup_samples, DEEPFM_WARMUP_SAMPLES);
        assert_eq!(cfg.optimizer.schedule.decay, elastrec_model::Decay::Linear);
        assert_eq!(warmup(""), 0);
        assert_eq!(warmup("[model]\ntype = \"dcn_v2\"\n"), 0);
        let online = parse(&format!("{deepfm}[stream]\ntopics = [\"clicks\"]\n")).unwrap();
        assert!(online.optimizer.schedule.is_constant());
        assert!(online.train_only_settings().is_empty());
    }

    /// `[[data.source]]`: every training file in exactly one named, weighted source; a
    /// job with sources serves them by weight unless `[data.mix]` says otherwise, and
    /// `[data.mix]` needs no stream then. Each refusal names the source or the file.
    #[test]
    fn sources_are_checked_against_the_training_data() {
        let head = "[data]\ntrain = [\"day_0.tsv\", \"day_1.tsv\", \"day_2.tsv\"]\n";
        let recent = "[[data.source]]\nname = \"recent\"\nfiles = [\"day_2.tsv\"]\nweight = 3\n";
        let old = "[[data.source]]\nname = \"old\"\nfiles = [\"day_0.tsv\", \"day_1.tsv\"]\n";
        let cfg = parse(&format!("{head}{recent}{old}")).unwrap();
        assert_eq!(crate::mix::train_file_sources(&cfg), vec![1, 1, 0]);
        assert_eq!(
            crate::mix::serving(&cfg),
            elastrec_control::serving::Serving::Weighted {
                weights: vec![3.0, 1.0]
            }
        );
        assert_eq!(crate::mix::source_names(&cfg), ["recent", "old", "stream"]);
        let cfg = parse(&format!(
            "{head}{recent}{old}[data.mix]\nmode = \"sequential\"\n"
        ))
        .unwrap();
        assert_eq!(
            crate::mix::serving(&cfg),
            elastrec_control::serving::Serving::Sequential
        );
        let reason_of = |text: String| match parse(&text).unwrap_err() {
            ConfigError::Invalid { field, reason, .. } => {
                assert_eq!(field, "data.source", "{reason}");
                reason
            }
            e => panic!("{e}"),
        };
        let r = reason_of(format!("{head}{recent}"));
        assert!(
            r.contains("`day_0.tsv` is training data in no [[data.source]]"),
            "{r}"
        );
        let r = reason_of(format!("{head}{recent}{old}{recent}"));
        assert!(r.contains("the name `recent` is taken"), "{r}");
        let r = reason_of(format!(
            "{head}{recent}{old}[[data.source]]\nname = \"x\"\nfiles = [\"day_2.tsv\"]\n"
        ));
        assert!(
            r.contains("`day_2.tsv` is in two sources (`recent` and `x`)"),
            "{r}"
        );
        let r = reason_of(format!(
            "{head}{old}[[data.source]]\nname = \"recent\"\nfiles = [\"day_9.tsv\"]\n"
        ));
        assert!(r.contains("`day_9.tsv`, which is not in data.train"), "{r}");
        let r = reason_of(format!(
            "{head}{old}[[data.source]]\nname = \"stream\"\nfiles = [\"day_2.tsv\"]\n"
        ));
        assert!(r.contains("`stream` is the stream's"), "{r}");
        let r = reason_of(format!(
            "{head}{old}[[data.source]]\nname = \"r\"\nfiles = [\"day_2.tsv\"]\nweight = 0\n"
        ));
        assert!(
            r.contains("source `r`: weight must be a positive number"),
            "{r}"
        );
        let r = reason_of(format!("{head}{old}[[data.source]]\nname = \"r\"\ndatasets = [\"clicks\"]\nfiles = [\"day_2.tsv\"]\n"));
        assert!(
            r.contains("dataset `clicks`, which is not a [[data.dataset]]"),
            "{r}"
        );
    }

    /// The config reference must document every field the structs accept.
    /// A mixture needs its stream and a history, each trained once; a stream with
    /// training datasets must say how to mix them. Each refusal names its field.
    #[test]
    fn mixture_jobs_are_checked_field_by_field() {
        let stream = "[stream]\ntopics = [\"clicks\"]\n";
        let field_of = |text: &str| match parse(text).unwrap_err() {
            ConfigError::Invalid { field, reason, .. } => (field, reason),
            e => panic!("{e}"),
        };
        let ok = format!("[data]\ntrain = [\"day_0.tsv\"]\n[data.mix]\n{stream}");
        let cfg = parse(&ok).unwrap();
        assert!(cfg.is_mixture());
        assert_eq!(cfg.data.mix.unwrap().mode, crate::mix::MixMode::Priority);
        assert_eq!(field_of("[data.mix]\n").0, "data.mix", "no stream");
        assert_eq!(
            field_of(&format!("{ok}[train]\nepochs = 2\n")).0,
            "train.epochs"
        );
        assert_eq!(
            field_of(&format!("{ok}assignment = \"pinned\"\n")).0,
            "stream.assignment"
        );
        assert_eq!(
            field_of(&format!("[data]\ntrain = []\n[data.mix]\n{stream}")).0,
            "data.train"
        );
        assert_eq!(
            field_of(&format!(
                "[data]\ntrain = [\"a\"]\n[data.mix]\nstream_weight = 0\n{stream}"
            ))
            .0,
            "data.mix.stream_weight"
        );
        let datasets = format!(
            "[data]\ntrain = []\n[[data.dataset]]\npath = \"logs/dt={{date}}\"\nlast = \"1d\"\n{stream}"
        );
        let (field, reason) = field_of(&datasets);
        assert_eq!(field, "data.mix");
        assert!(reason.contains("add a [data.mix]"), "{reason}");
        // MTRM needs a mixture, and its adapt tower ends in one logit.
        assert_eq!(
            field_of("[model]\nadapt_mlp = [8, 1]\n").0,
            "model.adapt_mlp"
        );
        assert_eq!(
            field_of(&format!("{ok}[model]\nadapt_mlp = [8, 2]\n")).0,
            "model.adapt_mlp"
        );
        let mtrm = parse(&format!("{ok}[model]\nadapt_mlp = [8, 1]\n")).unwrap();
        assert_eq!(crate::prepare::dense_config(&mtrm).adapt, vec![8, 1]);
    }

    #[test]
    fn config_reference_documents_every_field() {
        let doc = include_str!("../../../docs/config.md");
        let defaults = toml::to_string(&JobConfig {
            data: DataConfig {
                generate: Some(GenerateConfig::default()),
                mix: Some(crate::mix::MixConfig::default()),
                ..DataConfig::default()
            },
            stream: Some(crate::stream::StreamConfig::default()),
            dashboard: Some(DashboardConfig::default()),
            ..JobConfig::default()
        })
        .unwrap();
        let mut missing = Vec::new();
        let value: toml::Value = toml::from_str(&defaults).unwrap();
        collect_keys(&value, "", &mut missing, doc);
        assert!(missing.is_empty(), "docs/config.md lacks: {missing:?}");
    }

    fn collect_keys(v: &toml::Value, prefix: &str, missing: &mut Vec<String>, doc: &str) {
        if let toml::Value::Table(t) = v {
            for (k, child) in t {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                let documented = doc.contains(&format!("`{key}`"))
                    || (child.is_table() && doc.contains(&format!("`[{key}]`")));
                if !documented {
                    missing.push(key.clone());
                }
                collect_keys(child, &key, missing, doc);
            }
        }
    }
}
