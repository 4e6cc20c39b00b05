//! The dense DLRM's configuration: layer sizes, interaction, towers and heads, checked.

use crate::attention::AttentionConfig;
use crate::error::{ModelError, Result};
use crate::interaction::InteractionKind;
use crate::mmoe::{MmoeConfig, MAX_TASKS};
use crate::norm::NormKind;

/// Configuration of the dense DLRM.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DlrmConfig {
    /// Bottom MLP sizes including the dense-feature input, e.g. `[13, 512, 256, 64, 16]`.
    pub bottom: Vec<usize>,
    /// Top MLP sizes excluding the input (derived from the interaction), ending with 1,
    /// e.g. `[512, 256, 1]`.
    pub top: Vec<usize>,
    /// Number of embedding tables `T` (one vector per table per sample).
    pub num_tables: usize,
    /// Embedding dimension `d`.
    pub embedding_dim: usize,
    /// Interaction between bottom output and embeddings.
    #[serde(default = "default_interaction")]
    pub interaction: InteractionKind,
    /// Seed of the deterministic initialization.
    #[serde(default)]
    pub seed: u64,
    /// MTRM (Primus §5.1): sizes of the adapt tower excluding its input, ending with 1;
    /// empty for a plain DLRM. The top MLP is then the memory tower; the adapt tower reads
    /// the interaction output and the memory tower's logit (see [`Tower`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adapt: Vec<usize>,
    /// DCN-v2 cross layers between the interaction and the top MLP ([`crate::CrossNet`]);
    /// 0 for a plain DLRM. Their parameters follow every other layer's.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cross_layers: usize,
    /// DeepFM: the embeddings' factorization-machine term ([`crate::fm`]) is added to the
    /// logit of the top MLP (the deep part). No parameters of its own.
    #[serde(default, skip_serializing_if = "is_false")]
    pub fm: bool,
    /// Standardization of the dense features in front of the bottom MLP: the model reads
    /// `(x - dense_shift) * dense_scale` per feature (a training set's means and inverse
    /// standard deviations). Both empty (the default): the features as given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dense_shift: Vec<f32>,
    /// See `dense_shift`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dense_scale: Vec<f32>,
    /// Dropout rate of the top MLP's hidden activations while training (inverted
    /// dropout: kept units are scaled by `1 / (1 - p)`, so predictions use every unit
    /// unscaled). 0: none.
    #[serde(default, skip_serializing_if = "is_zero_f32")]
    pub dropout: f32,
    /// The first-order (wide, linear) term added to the logit: one weight per embedding
    /// row, stored as the row's last float (a row is `embedding_dim + 1` floats, so the
    /// weight lives, is optimized, sharded and checkpointed with its row), plus a linear
    /// layer over the dense features (`nd` weights and a bias, after every other
    /// parameter): `logit += Σ_t w[id_t] + v · x + c`. Wide & Deep's wide part and the
    /// first-order term of an FM (DeepFM).
    #[serde(default, skip_serializing_if = "is_false")]
    pub first_order: bool,
    /// Layer normalization of every hidden layer of the bottom and top MLPs
    /// (`Linear → LayerNorm → ReLU`; [`crate::norm`]); `γ`, `β` after every other
    /// parameter.
    #[serde(default, skip_serializing_if = "is_false")]
    pub layer_norm: bool,
    /// Batch normalization of the same hidden layers (`Linear → BatchNorm → ReLU`;
    /// [`crate::norm`]): statistics of each training step's row blocks, running averages
    /// for predictions; `γ`, `β` and the running mean and variance where the layer norms'
    /// parameters would be. Not with `layer_norm`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub batch_norm: bool,
    /// Multi-task MMoE head ([`crate::mmoe`]) between the interaction (or cross layers)
    /// and the towers: experts, a gate per task, and a tower per task with the top MLP's
    /// sizes (task 0's is the top MLP). `None`: one task, the top MLP reads the
    /// interaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mmoe: Option<MmoeConfig>,
    /// Target-attention units ([`crate::attention`]): each pools a history into its
    /// embedding slot, scored against a query slot, before any family reads the slots.
    /// Their parameters come last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attention: Vec<AttentionConfig>,
}

fn is_zero_f32(v: &f32) -> bool {
    *v == 0.0
}

fn is_false(v: &bool) -> bool {
    !*v
}

pub(crate) fn is_zero(v: &usize) -> bool {
    *v == 0
}

/// Which tower a step trains and which logit it returns. A plain DLRM has only the top
/// MLP ([`Tower::Memory`]). An MTRM trains its memory tower (the top MLP) on history
/// batches and its adapt tower on stream batches: the adapt tower reads the interaction
/// output and the memory tower's logit `h_M`, and no gradient flows into the memory tower
/// through `h_M` (Algorithm 1). Predictions of an MTRM come from the adapt tower.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tower {
    /// The top MLP (the memory tower of an MTRM).
    Memory,
    /// The adapt tower of an MTRM.
    Adapt,
}

fn default_interaction() -> InteractionKind {
    InteractionKind::Dot
}

impl DlrmConfig {
    /// The Criteo-Kaggle model of the DLRM paper: bottom 13-512-256-64-16, 26 tables of
    /// dim 16, dot interaction, top 512-256-1.
    pub fn criteo_kaggle() -> Self {
        Self {
            bottom: vec![13, 512, 256, 64, 16],
            top: vec![512, 256, 1],
            num_tables: 26,
            embedding_dim: 16,
            interaction: InteractionKind::Dot,
            seed: 0,
            adapt: Vec::new(),
            cross_layers: 0,
            fm: false,
            dense_shift: Vec::new(),
            dense_scale: Vec::new(),
            dropout: 0.0,
            first_order: false,
            layer_norm: false,
            batch_norm: false,
            mmoe: None,
            attention: Vec::new(),
        }
    }

    /// Checks the configuration.
    pub fn validate(&self) -> Result<()> {
        if self.bottom.len() < 2 {
            return Err(ModelError::MlpTooShort {
                mlp: "bottom",
                min: 2,
                got: self.bottom.len(),
            });
        }
        if self.top.is_empty() {
            return Err(ModelError::MlpTooShort {
                mlp: "top",
                min: 1,
                got: 0,
            });
        }
        if let Some(index) = self.bottom.iter().position(|&s| s == 0) {
            return Err(ModelError::ZeroWidth {
                mlp: "bottom",
                index,
            });
        }
        if let Some(index) = self.top.iter().position(|&s| s == 0) {
            return Err(ModelError::ZeroWidth { mlp: "top", index });
        }
        if let Some(index) = self.adapt.iter().position(|&s| s == 0) {
            return Err(ModelError::ZeroWidth {
                mlp: "adapt",
                index,
            });
        }
        if let Some(&last) = self.adapt.last() {
            if last != 1 {
                return Err(ModelError::TopOutputNotOne { got: last });
            }
        }
        let extras = self.cross_layers > 0
            || self.fm
            || self.first_order
            || self.layer_norm
            || self.batch_norm;
        if extras && !self.adapt.is_empty() {
            return Err(ModelError::CrossWithAdapt);
        }
        if self.layer_norm && self.batch_norm {
            return Err(ModelError::TwoNorms);
        }
        if let Some(h) = &self.mmoe {
            if !(1..=MAX_TASKS).contains(&h.tasks) {
                return Err(ModelError::BadMmoe {
                    why: format!("tasks must be 1 to {MAX_TASKS}, got {}", h.tasks),
                });
            }
            if h.experts == 0 || h.expert.is_empty() || h.expert.contains(&0) {
                return Err(ModelError::BadMmoe {
                    why: "it needs at least one expert of at least one layer, each at least 1 wide"
                        .into(),
                });
            }
            h.check_weights()
                .map_err(|why| ModelError::BadMmoe { why })?;
            if !self.adapt.is_empty() || self.fm || self.first_order {
                return Err(ModelError::BadMmoe {
                    why: "an MMoE does not combine with an MTRM adapt tower, the FM term or \
                          the first-order term (they would reach task 0 only)"
                        .into(),
                });
            }
        }
        if self.num_tables == 0 {
            return Err(ModelError::ZeroEmbedding { what: "num_tables" });
        }
        if self.embedding_dim == 0 {
            return Err(ModelError::ZeroEmbedding {
                what: "embedding_dim",
            });
        }
        let last = *self.top.last().expect("nonempty");
        if last != 1 {
            return Err(ModelError::TopOutputNotOne { got: last });
        }
        self.validate_attention()?;
        let nd = self.bottom[0];
        for (what, v) in [
            ("dense_shift", &self.dense_shift),
            ("dense_scale", &self.dense_scale),
        ] {
            if v.len() != nd && !(self.dense_shift.is_empty() && self.dense_scale.is_empty()) {
                return Err(ModelError::Shape {
                    what,
                    expected: nd,
                    got: v.len(),
                });
            }
            if let Some(index) = v.iter().position(|x| !x.is_finite()) {
                return Err(ModelError::BadNormalization { what, index });
            }
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(ModelError::BadDropout {
                got: self.dropout.to_string(),
            });
        }
        let bottom_out = *self.bottom.last().expect("nonempty");
        if self.interaction == InteractionKind::Dot && bottom_out != self.embedding_dim {
            return Err(ModelError::DotDimMismatch {
                bottom_out,
                embedding_dim: self.embedding_dim,
            });
        }
        Ok(())
    }

    fn validate_attention(&self) -> Result<()> {
        let bad = |why: String| Err(ModelError::BadAttention { why });
        let mut pooled = std::collections::HashSet::new();
        for a in &self.attention {
            if a.slot >= self.num_tables || a.query >= self.num_tables {
                return bad(format!(
                    "slot {} or query {} is not one of the model's {} embedding slots",
                    a.slot, a.query, self.num_tables
                ));
            }
            if a.slot == a.query {
                return bad(format!("slot {} attends to itself", a.slot));
            }
            if !pooled.insert(a.slot) {
                return bad(format!("slot {} is pooled by two units", a.slot));
            }
            if a.max_len == 0 || a.mlp.contains(&0) {
                return bad("max_len and every MLP width must be at least 1".into());
            }
            if let Some(why) = a
                .transformer
                .as_ref()
                .and_then(|t| t.check(self.embedding_dim))
            {
                return bad(format!("the transformer of slot {}: {why}", a.slot));
            }
        }
        if let Some(a) = self.attention.iter().find(|a| pooled.contains(&a.query)) {
            return bad(format!(
                "the query of slot {} is slot {}, itself a pooled history",
                a.slot, a.query
            ));
        }
        Ok(())
    }

    /// Number of dense input features (`bottom[0]`).
    pub fn num_dense(&self) -> usize {
        self.bottom[0]
    }

    /// Floats per embedding row the model reads: `embedding_dim`, plus the row's
    /// first-order weight when [`DlrmConfig::first_order`].
    pub fn row_width(&self) -> usize {
        self.embedding_dim + usize::from(self.first_order)
    }

    /// Tasks (labels) the model predicts: 1 unless it has an MMoE head.
    pub fn tasks(&self) -> usize {
        self.mmoe.as_ref().map_or(1, |h| h.tasks)
    }

    /// The norm of the hidden layers, if any.
    pub fn norm(&self) -> Option<NormKind> {
        if self.batch_norm {
            Some(NormKind::Batch)
        } else if self.layer_norm {
            Some(NormKind::Layer)
        } else {
            None
        }
    }
}

/// Analytic FLOP count per sample (multiply-add = 2 FLOPs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlopCount {
    /// GEMM FLOPs of the forward pass.
    pub forward_gemm: u64,
    /// GEMM FLOPs of the backward pass (weight grads everywhere, input grads except
    /// for the first bottom layer).
    pub backward_gemm: u64,
    /// Interaction FLOPs, forward + backward.
    pub interaction: u64,
}

impl FlopCount {
    /// Everything.
    pub fn total(&self) -> u64 {
        self.forward_gemm + self.backward_gemm + self.interaction
    }
}
