//! The checks a job file passes when it loads, beyond what its types express: each
//! section's ranges and the settings that exclude each other, in the order a reader
//! meets them; the first failure names its field and says what to do.

use std::path::Path;

use elastrec_embedding::SparseOptimizerConfig;
use elastrec_model::{DenseOptimizerConfig, InteractionKind};
use elastrec_stream::MessageFormat;

use crate::config::*;

/// A failed check: the field, and why.
type Invalid = (&'static str, String);

/// One section's checks of a job file.
type Check = fn(&JobConfig) -> Result<(), Invalid>;

impl JobConfig {
    /// A job names its training (evaluation) data either as files or as datasets: both
    /// would leave one of them silently unused.
    pub(crate) fn check_dataset_fields(
        &self,
        given: &toml::Table,
        path: &Path,
    ) -> Result<(), ConfigError> {
        let data = given.get("data").and_then(|d| d.as_table());
        for (role, field) in [
            (elastrec_orchestrate::DatasetRole::Train, "data.train"),
            (elastrec_orchestrate::DatasetRole::Eval, "data.eval"),
        ] {
            let key = field.trim_start_matches("data.");
            // An empty list names nothing (a following job's resolved file keeps its
            // training datasets and an empty `train`).
            let named = data
                .and_then(|d| d.get(key))
                .is_some_and(|v| v.as_array().is_none_or(|a| !a.is_empty()));
            if self.data.has_dataset(role) && named {
                return Err(ConfigError::Invalid {
                    path: path.to_path_buf(),
                    field,
                    reason: format!(
                        "both `{field}` and a [[data.dataset]] with role = \"{key}\" name the job's {key} data; keep one"
                    ),
                });
            }
        }
        Ok(())
    }

    /// Checks that every training and evaluation file exists (unless the data is to be
    /// generated), naming the field at fault.
    pub fn check_data(&self, path: &Path) -> Result<(), ConfigError> {
        if self.data.generate.is_some() && !self.data.dir.exists() {
            return Ok(());
        }
        // An online job trains from its [stream]; `data.train` is not read (unless it is a
        // mixture's history).
        let train =
            if (self.stream.is_some() && !self.is_mixture()) || !self.data.dataset.is_empty() {
                Vec::new()
            } else {
                self.train_files()
            };
        let eval = if self
            .data
            .has_dataset(elastrec_orchestrate::DatasetRole::Eval)
        {
            Vec::new()
        } else {
            self.eval_files()
        };
        for (field, files) in [("data.train", train), ("data.eval", eval)] {
            for f in files {
                if !f.is_file() {
                    return Err(ConfigError::Invalid {
                        path: path.to_path_buf(),
                        field,
                        reason: format!(
                            "data file {} does not exist (data.dir is {})",
                            f.display(),
                            self.data.dir.display()
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// A following job reads growing training datasets, once each, in time order.
    fn check_follow(&self) -> Result<(), (&'static str, String)> {
        let every = humantime::parse_duration(&self.data.follow_every).map_err(|e| {
            (
                "data.follow_every",
                format!(
                    "`{}` is not a duration like \"1m\": {e}",
                    self.data.follow_every
                ),
            )
        })?;
        if every < std::time::Duration::from_millis(10) {
            return Err(("data.follow_every", "must be at least 10ms".into()));
        }
        if !self.data.follow {
            return Ok(());
        }
        if !self
            .data
            .has_dataset(elastrec_orchestrate::DatasetRole::Train)
        {
            return Err((
                "data.follow",
                "follows the training datasets, and the job has no [[data.dataset]] with role = \"train\"".into(),
            ));
        }
        if self.train.epochs != 1 {
            return Err((
                "train.epochs",
                format!(
                    "a following job (data.follow) trains each partition once as it lands; set train.epochs = 1 (it is {})",
                    self.train.epochs
                ),
            ));
        }
        Ok(())
    }

    /// A mixture job (`[data.mix]`) needs a stream and a history, each trained once.
    fn check_mix(&self) -> Result<(), (&'static str, String)> {
        let train_datasets = self
            .data
            .has_dataset(elastrec_orchestrate::DatasetRole::Train);
        let Some(mix) = &self.data.mix else {
            if self.stream.is_some() && train_datasets {
                return Err((
                    "data.mix",
                    "an online job ([stream]) with training datasets mixes batch and stream data: \
                     add a [data.mix] section to say how (mode = \"sequential\", \"weighted\" or \"priority\"; docs/data.md)"
                        .into(),
                ));
            }
            return Ok(());
        };
        mix.validate()?;
        let Some(stream) = &self.stream else {
            if !self.data.source.is_empty() {
                return Ok(()); // it mixes the [[data.source]] buffers only
            }
            return Err((
                "data.mix",
                "mixes the history with a stream or several [[data.source]]s, and the job has neither".into(),
            ));
        };
        if self.data.follow {
            return Err((
                "data.follow",
                "a mixture job ([data.mix]) trains a fixed history, then its stream; following datasets is not built for it".into(),
            ));
        }
        if self.train.epochs != 1 {
            return Err((
                "train.epochs",
                format!(
                    "a mixture job ([data.mix]) trains each history row once before or beside its stream; set train.epochs = 1 (it is {})",
                    self.train.epochs
                ),
            ));
        }
        if stream.assignment == crate::stream::PartitionAssignment::Pinned {
            return Err((
                "stream.assignment",
                "\"pinned\" deals partitions to fixed workers, which a mixture's history tasks have no place in; use \"shared\"".into(),
            ));
        }
        if self.data.train.is_empty() && !train_datasets {
            return Err((
                "data.train",
                "a mixture job ([data.mix]) needs a history: name data.train files or a [[data.dataset]] with role = \"train\"".into(),
            ));
        }
        Ok(())
    }

    /// Range checks that serde's types cannot express, section by section; the first
    /// failure names its field.
    pub fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let bad = |field: &'static str, reason: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            field,
            reason,
        };
        let sections: [Check; 9] = [
            Self::check_dashboard,
            Self::check_train_loop,
            Self::check_data_sources,
            Self::check_model_shape,
            Self::check_model_combinations,
            Self::check_feature_widths,
            Self::check_output,
            Self::check_stream,
            Self::check_optimizer,
        ];
        for check in sections {
            check(self).map_err(|(field, reason)| bad(field, reason))?;
        }
        self.validate_named(path)?;
        crate::distributed::validate_distributed(self, path)?;
        crate::autoscale::validate_autoscale(self, path)
    }

    /// `[dashboard]`: a listen address and a polling interval.
    fn check_dashboard(&self) -> Result<(), Invalid> {
        let bad = |field: &'static str, reason: String| (field, reason);
        if let Some(d) = &self.dashboard {
            d.listen.parse::<std::net::SocketAddr>().map_err(|e| {
                bad(
                    "dashboard.listen",
                    format!("`{}` is not an address like 127.0.0.1:8090: {e}", d.listen),
                )
            })?;
            if d.every_ms == 0 {
                return Err(bad("dashboard.every_ms", "must be at least 1".into()));
            }
        }
        Ok(())
    }

    /// `[train]`: shuffling, batches, epochs, validation and progressive windows.
    fn check_train_loop(&self) -> Result<(), Invalid> {
        let bad = |field: &'static str, reason: String| (field, reason);
        if self.train.shuffle_buffer > 0 {
            if self.stream.is_some() && !self.is_mixture() {
                return Err(bad(
                    "train.shuffle_buffer",
                    "an online job trains its stream in arrival order; remove it (a mixture \
                     job, [data.mix], shuffles its history)"
                        .into(),
                ));
            }
            let max = elastrec_data::shuffled::MAX_BLOCK_ROWS;
            if self.rows_per_shard() > max {
                return Err(bad(
                    "train.shuffle_buffer",
                    format!(
                        "`elastrec run` permutes the rows of each shard in a worker's memory: \
                         a shard of {} rows (shuffle_buffer, or batch_size × \
                         cluster.batches_per_shard) is over the {max}-row limit; lower them",
                        self.rows_per_shard()
                    ),
                ));
            }
        }
        if self.train.progressive_window > crate::stream::MAX_EVAL_WINDOW {
            return Err(bad(
                "train.progressive_window",
                format!(
                    "must be at most {} samples (the master keeps them in memory), got {}",
                    crate::stream::MAX_EVAL_WINDOW,
                    self.train.progressive_window
                ),
            ));
        }
        let every = self.train.progressive_every_s;
        if !(every.is_finite() && every > 0.0) {
            return Err(bad(
                "train.progressive_every_s",
                format!("must be a number of seconds > 0, got {every}"),
            ));
        }
        if self.train.batch_size == 0 {
            return Err(bad("train.batch_size", "must be at least 1".into()));
        }
        let v = self.train.validation;
        if !(v.is_finite() && (0.0..0.5).contains(&v)) {
            return Err(bad(
                "train.validation",
                format!("a share of the training rows in [0, 0.5), got {v}"),
            ));
        }
        if self.train.epochs == 0 {
            return Err(bad("train.epochs", "must be at least 1".into()));
        }
        Ok(())
    }

    /// `[data]`: datasets, the mixture, sources, the clock, following, something to train on, generated data.
    fn check_data_sources(&self) -> Result<(), Invalid> {
        let bad = |field: &'static str, reason: String| (field, reason);
        let mut names = std::collections::HashSet::new();
        for (i, d) in self.data.dataset.iter().enumerate() {
            d.check(i).map_err(|e| bad("data.dataset", e.to_string()))?;
            if !names.insert(d.display_name(i)) {
                return Err(bad(
                    "data.dataset",
                    format!("two datasets are named `{}`; names must be unique", d.name),
                ));
            }
        }
        self.check_mix()
            .map_err(|(field, reason)| bad(field, reason))?;
        crate::mix::check_sources(self).map_err(|(field, reason)| bad(field, reason))?;
        if let Some(now) = &self.data.now {
            elastrec_orchestrate::parse_time(now).map_err(|e| bad("data.now", e))?;
        }
        self.check_follow()
            .map_err(|(field, reason)| bad(field, reason))?;
        let train_datasets = self
            .data
            .has_dataset(elastrec_orchestrate::DatasetRole::Train);
        if self.data.train.is_empty() && self.stream.is_none() && !train_datasets {
            return Err(bad(
                "data.train",
                "names no training file (and there is no [stream] to train from)".into(),
            ));
        }
        if let Some(g) = &self.data.generate {
            if g.rows == 0 || g.days == 0 {
                return Err(bad(
                    "data.generate",
                    "rows and days must be at least 1".into(),
                ));
            }
            if !(g.scale.is_finite() && g.scale > 0.0) {
                return Err(bad(
                    "data.generate.scale",
                    format!("must be a positive number, got {}", g.scale),
                ));
            }
        }
        Ok(())
    }

    /// `[model]`: layer sizes, the model family's own settings, dense normalization.
    fn check_model_shape(&self) -> Result<(), Invalid> {
        let bad = |field: &'static str, reason: String| (field, reason);
        let m = &self.model;
        if m.embedding_dim == 0 {
            return Err(bad("model.embedding_dim", "must be at least 1".into()));
        }
        if m.bottom_mlp.is_empty() || m.bottom_mlp.contains(&0) {
            return Err(bad(
                "model.bottom_mlp",
                "needs at least one layer, every size ≥ 1".into(),
            ));
        }
        if m.interaction == InteractionKind::Dot && m.bottom_mlp.last() != Some(&m.embedding_dim) {
            return Err(bad(
                "model.bottom_mlp",
                format!(
                    "the last size ({}) must equal model.embedding_dim ({}) for the dot interaction",
                    m.bottom_mlp.last().copied().unwrap_or(0),
                    m.embedding_dim
                ),
            ));
        }
        if m.top_mlp.last() != Some(&1) || m.top_mlp.contains(&0) {
            return Err(bad(
                "model.top_mlp",
                "sizes must be ≥ 1 and the last must be 1 (the click logit)".into(),
            ));
        }
        if m.model_type == ModelType::DcnV2 && m.cross_layers == 0 {
            return Err(bad(
                "model.cross_layers",
                "a dcn_v2 model needs at least 1 cross layer (or use type = \"dlrm\")".into(),
            ));
        }
        if m.mmoe.is_some() && m.model_type != ModelType::Mmoe {
            return Err(bad(
                "model.mmoe",
                "is the head of model.type = \"mmoe\"; set that type or remove [model.mmoe]".into(),
            ));
        }
        if let Some(h) = m.mmoe_settings() {
            if !(1..=elastrec_model::MAX_TASKS).contains(&h.tasks) {
                return Err(bad(
                    "model.mmoe.tasks",
                    format!(
                        "must be 1 to {} (one 0/1 label digit per task), got {}",
                        elastrec_model::MAX_TASKS,
                        h.tasks
                    ),
                ));
            }
            if h.experts == 0 {
                return Err(bad("model.mmoe.experts", "must be at least 1".into()));
            }
            if h.task_experts > MAX_TASK_EXPERTS {
                return Err(bad(
                    "model.mmoe.task_experts",
                    format!(
                        "must be 0 to {MAX_TASK_EXPERTS} (each of the {} tasks gets that many experts), got {}",
                        h.tasks, h.task_experts
                    ),
                ));
            }
            crate::prepare::mmoe_config(&h)
                .check_weights()
                .map_err(|why| bad("model.mmoe.task_weights", why))?;
            if h.expert_mlp.is_empty() || h.expert_mlp.contains(&0) {
                return Err(bad(
                    "model.mmoe.expert_mlp",
                    "needs at least one size, each at least 1 (the last is the width the towers read)"
                        .into(),
                ));
            }
            for (on, field) in [
                (m.first_order, "model.first_order"),
                (!m.adapt_mlp.is_empty(), "model.adapt_mlp"),
            ] {
                if on {
                    return Err(bad(
                        field,
                        format!("{field} does not combine with model.type = \"mmoe\" (it would reach task 0 only)"),
                    ));
                }
            }
        }
        if let Some(d) = &m.dynamic_embeddings {
            d.validate().map_err(|e| {
                bad(
                    "model.dynamic_embeddings.admit_count",
                    e.to_string()
                        .trim_start_matches("invalid dynamic embedding config: ")
                        .to_string(),
                )
            })?;
        }
        if !(0.0..1.0).contains(&m.dropout) {
            return Err(bad(
                "model.dropout",
                format!("must be at least 0 and below 1, got {}", m.dropout),
            ));
        }
        if m.dense_mean.len() != m.dense_std.len() {
            return Err(bad(
                "model.dense_std",
                format!(
                    "gives {} values for the {} of model.dense_mean; give both or neither",
                    m.dense_std.len(),
                    m.dense_mean.len()
                ),
            ));
        }
        if let Some(i) = m
            .dense_std
            .iter()
            .position(|s| !(s.is_finite() && *s > 0.0))
        {
            return Err(bad(
                "model.dense_std",
                format!("value {i} ({}) must be a positive number", m.dense_std[i]),
            ));
        }
        if let Some(i) = m.dense_mean.iter().position(|v| !v.is_finite()) {
            return Err(bad(
                "model.dense_mean",
                format!("value {i} ({}) must be a finite number", m.dense_mean[i]),
            ));
        }
        if !m.dense_mean.is_empty() && m.dense_norm == DenseNorm::None {
            return Err(bad(
                "model.dense_mean",
                "is used only with model.dense_norm = \"standardize\" (or \"auto\")".into(),
            ));
        }
        Ok(())
    }

    /// `[model]` settings that exclude each other or an optimizer setting.
    fn check_model_combinations(&self) -> Result<(), Invalid> {
        let bad = |field: &'static str, reason: String| (field, reason);
        let m = &self.model;
        if self.optimizer.dense.weight_decay() != 0.0 && !m.adapt_mlp.is_empty() {
            return Err(bad(
                "optimizer.dense.weight_decay",
                "would shrink the MTRM tower a step does not train (its gradient is zero, \
                 its decay is not); not supported with model.adapt_mlp"
                    .into(),
            ));
        }
        let decay = self.optimizer.dense.weight_decay();
        if !(decay.is_finite() && decay >= 0.0) {
            return Err(bad(
                "optimizer.dense.weight_decay",
                format!(
                    "must be at least 0, got {}",
                    self.optimizer.dense.weight_decay()
                ),
            ));
        }
        if m.model_type != ModelType::Dlrm && !m.adapt_mlp.is_empty() {
            return Err(bad(
                "model.type",
                "dcn_v2, deepfm or wide_deep and an MTRM adapt tower (model.adapt_mlp) cannot be combined; choose one".into(),
            ));
        }
        if m.has_first_order()
            && matches!(
                self.optimizer.sparse,
                SparseOptimizerConfig::RowWiseAdagrad { .. }
            )
        {
            // Measured on the quickstart data: 0.7955 AUC against 0.8115 with `adagrad`.
            return Err(bad(
                "optimizer.sparse",
                "row_wise_adagrad keeps one accumulator per row, which the first-order term \
                 (model.type = \"wide_deep\" or model.first_order) would share between an \
                 embedding and its row's weight, and that costs accuracy (docs/models.md); set \
                 [optimizer.sparse] type = \"adagrad\" (a state per float) or \"ftrl\""
                    .into(),
            ));
        }
        if m.layer_norm && m.batch_norm {
            return Err(bad(
                "model.batch_norm",
                "model.layer_norm and model.batch_norm cannot both be true: a hidden layer has \
                 one norm; choose one"
                    .into(),
            ));
        }
        for (on, field) in [
            (m.first_order, "model.first_order"),
            (m.layer_norm, "model.layer_norm"),
            (m.batch_norm, "model.batch_norm"),
        ] {
            if on && !m.adapt_mlp.is_empty() {
                return Err(bad(
                    field,
                    format!("{field} and an MTRM adapt tower (model.adapt_mlp) cannot be combined; choose one"),
                ));
            }
        }
        if !m.adapt_mlp.is_empty() {
            if m.adapt_mlp.last() != Some(&1) || m.adapt_mlp.contains(&0) {
                return Err(bad(
                    "model.adapt_mlp",
                    "sizes must be ≥ 1 and the last must be 1 (the adapt tower's logit)".into(),
                ));
            }
            if !self.is_mixture() {
                return Err(bad(
                    "model.adapt_mlp",
                    "an MTRM trains its memory tower on a history and its adapt tower on a stream: it needs a mixture job ([stream] and [data.mix])".into(),
                ));
            }
        }
        Ok(())
    }

    /// The model's inputs as the preprocessing or the data layout give them, against the sizes the model file states.
    fn check_feature_widths(&self) -> Result<(), Invalid> {
        let bad = |field: &'static str, reason: String| (field, reason);
        let m = &self.model;
        let (dense_width, sparse_width) = match crate::prepare::feature_plan(self) {
            Ok(Some(plan)) => (plan.dense_width(), plan.sparse_width()),
            Ok(None) => crate::prepare::feature_widths(self),
            Err(e) => return Err(bad("preprocess", e.to_string())),
        };
        if dense_width == 0 {
            return Err(bad(
                "preprocess",
                "no entry produces a dense feature, and the bottom MLP needs at least one: \
                 end a chain with floats (log1p, cast(float), onehot, ...)"
                    .into(),
            ));
        }
        if !m.dense_mean.is_empty() && m.dense_mean.len() != dense_width {
            return Err(bad(
                "model.dense_mean",
                format!(
                    "needs {dense_width} values (one per dense feature), got {}",
                    m.dense_mean.len()
                ),
            ));
        }
        if let TableRows::PerTable(v) = &m.table_rows {
            if v.len() != sparse_width {
                return Err(bad(
                    "model.table_rows",
                    format!(
                        "a list needs {sparse_width} entries (one per sparse feature column), got {}",
                        v.len()
                    ),
                ));
            }
        }
        if m.max_table_rows == 0 {
            return Err(bad("model.max_table_rows", "must be at least 1".into()));
        }
        Ok(())
    }

    /// `[output]`: periodic exports and where they are pushed.
    fn check_output(&self) -> Result<(), Invalid> {
        let bad = |field: &'static str, reason: String| (field, reason);
        let o = &self.output;
        if !(o.export_every_s.is_finite() && o.export_every_s >= 0.0) {
            return Err(bad(
                "output.export_every_s",
                format!(
                    "must be ≥ 0 seconds (0: no periodic export), got {}",
                    o.export_every_s
                ),
            ));
        }
        for url in &o.push {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(bad(
                    "output.push",
                    format!("`{url}` is not an http:// or https:// URL of an `elastrec serve`"),
                ));
            }
        }
        if !o.push.is_empty() && o.export_every_s <= 0.0 {
            return Err(bad(
                "output.push",
                "pushes the periodic exports, so it needs output.export_every_s > 0".into(),
            ));
        }
        if o.export_keep == 0 {
            return Err(bad(
                "output.export_keep",
                "must be at least 1 (the newest export is what serving reads)".into(),
            ));
        }
        Ok(())
    }

    /// `[stream]`, and no batch autoscaler beside it.
    fn check_stream(&self) -> Result<(), Invalid> {
        let bad = |field: &'static str, reason: String| (field, reason);
        if let Some(s) = &self.stream {
            s.validate().map_err(|(field, reason)| bad(field, reason))?;
            if self.autoscale.enabled {
                return Err(bad(
                    "autoscale.enabled",
                    "online jobs ([stream]) scale with the traffic through stream.autoscale \
                     (\"kale\" or \"hpa\"), not [autoscale]"
                        .into(),
                ));
            }
        }
        Ok(())
    }

    /// `[optimizer]`: the schedule and the learning rates.
    fn check_optimizer(&self) -> Result<(), Invalid> {
        let bad = |field: &'static str, reason: String| (field, reason);
        self.optimizer
            .schedule
            .validate()
            .map_err(|(field, reason)| bad(field, reason))?;
        let dense_lr = match self.optimizer.dense {
            DenseOptimizerConfig::Sgd { lr, .. }
            | DenseOptimizerConfig::Adagrad { lr, .. }
            | DenseOptimizerConfig::Adam { lr, .. } => lr,
        };
        if !(dense_lr.is_finite() && dense_lr > 0.0) {
            return Err(bad(
                "optimizer.dense.lr",
                format!("must be a positive number, got {dense_lr}"),
            ));
        }
        if let Err(e) = self.optimizer.sparse.validate() {
            return Err(bad("optimizer.sparse", e.to_string()));
        }
        Ok(())
    }

    /// Checks a named-feature job: a label for its features, a schema that holds
    /// together, and no setting that still assumes the Criteo layout.
    fn validate_named(&self, path: &Path) -> Result<(), ConfigError> {
        let bad = |field: &'static str, reason: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            field,
            reason,
        };
        if !self.data.is_named() {
            if self.data.weight.is_some() {
                return Err(bad(
                    "data.weight",
                    "sample weights are a column of named features: add data.label (the \
                     Criteo layout has no weight column)"
                        .into(),
                ));
            }
            if self.data.user.is_some() {
                return Err(bad(
                    "data.user",
                    "the user column is one of the named features: add data.label (the \
                     Criteo layout names no user)"
                        .into(),
                ));
            }
            if !self.data.table.is_empty() {
                return Err(bad(
                    "data.table",
                    "tables belong to named features: add data.label and [[data.feature]]".into(),
                ));
            }
            if self
                .stream
                .as_ref()
                .is_some_and(|st| st.format == MessageFormat::Json)
            {
                return Err(bad(
                    "stream.format",
                    "JSON messages are objects of named features: add data.label and \
                     [[data.feature]] (a stream cannot be sampled to infer them)"
                        .into(),
                ));
            }
            return Ok(());
        }
        if self.data.label.is_none() {
            return Err(bad(
                "data.label",
                "[[data.feature]] needs the label column(s): data.label = \"click\"".into(),
            ));
        }
        if let Some(schema) = self.data.schema() {
            schema
                .validate()
                .map_err(|e| bad("data.feature", format!("the schema {e}")))?;
            if let Some(user) = &self.data.user {
                if self.data.user_slot().is_none() {
                    return Err(bad(
                        "data.user",
                        format!(
                            "{user:?} is not a categorical feature of the job; name one of \
                             its [[data.feature]] of kind \"categorical\""
                        ),
                    ));
                }
            }
            let transforms = schema
                .attention_slots()
                .iter()
                .any(|u| u.3 == elastrec_data::schema::Pooling::Transformer);
            let d = self.model.embedding_dim;
            if let Some(why) = transforms
                .then(|| self.model.transformer.model_config(d).check(d))
                .flatten()
            {
                return Err(bad("model.transformer", why));
            }
        }
        for (set, field, why) in [
            (
                !self.preprocess.is_empty(),
                "preprocess",
                "preprocessing graphs read the Criteo columns; a named feature carries its \
                 own operator chain (data.feature.ops, the same operators)",
            ),
            (
                self.data.generate.is_some(),
                "data.generate",
                "generates Criteo-layout files; `elastrec gen-data --named` writes a data set \
                 with named features",
            ),
            (
                self.model.table_rows != TableRows::Auto,
                "model.table_rows",
                "named features size their tables in [[data.table]] (rows = ...), or by \
                 inference from the data",
            ),
            (
                self.stream
                    .as_ref()
                    .is_some_and(|st| st.format != MessageFormat::Json),
                "stream.format",
                "tsv and batch messages hold Criteo-layout rows; a stream of named features \
                 is read as JSON objects (stream.format = \"json\")",
            ),
        ] {
            if set {
                return Err(bad(
                    field,
                    format!("not with named features (data.label): {why}"),
                ));
            }
        }
        Ok(())
    }
}
