//! Dense math of DLRM-family models (Naumov et al. 2019) on CPU.
//!
//! This crate owns everything of the model except the embedding store:
//!
//! * [`layers`]: [`Linear`] with fused bias + activation and its backward, [`Mlp`] stacks;
//! * [`interaction`]: DLRM dot interaction and concatenation;
//! * [`loss`]: numerically stable BCE with logits;
//! * [`DenseDlrm`]: bottom MLP → interaction with the embeddings → top MLP → logit, with
//!   all dense parameters in **one flat `Vec<f32>`** and gradients in a matching flat
//!   buffer, so the parameter server ships and optimizes plain slices. A [`Workspace`]
//!   holds every activation and temporary for a maximum batch size, so steps never
//!   allocate. `forward_backward` also yields `d_emb` for the sparse update;
//! * [`optim`]: dense SGD / Adagrad / Adam over flat slices;
//! * [`mmoe`]: the multi-task head (experts, a gate per task, a tower per task);
//! * [`metrics`]: exact AUC, logloss, a streaming accumulator.
//!
//! A step runs the batch in row blocks of [`dlrm::BLOCK_ROWS`], one rayon task each: a
//! block's whole forward and backward stay on one core (single-threaded GEMMs through the
//! `gemm` crate, on strided views so no operand is ever transposed in memory), and the
//! blocks' partial dense gradients are summed in block order, so results do not depend on
//! the thread count. Bias + activation are one pass over the GEMM output, the ReLU mask is
//! fused with the bias-gradient reduction, and the dot interaction runs sample-lane
//! AVX2+FMA kernels (runtime-detected, portable fallback).
//!
//! ```
//! use elastrec_model::{DenseDlrm, DlrmConfig, DenseOptimizer, Adagrad};
//! let cfg = DlrmConfig { bottom: vec![4, 8, 2], top: vec![8, 1], num_tables: 3,
//!     embedding_dim: 2, ..DlrmConfig::criteo_kaggle() };
//! let mut model = DenseDlrm::new(cfg).unwrap();
//! let mut ws = model.workspace(16);
//! let mut opt = Adagrad::new(model.num_params(), 0.01, 0.0, 1e-10);
//! let (dense, emb, labels) = (vec![0.5; 16 * 4], vec![0.1; 16 * 3 * 2], vec![1.0; 16]);
//! let loss = model.forward_backward(&dense, &emb, &labels, &mut ws).unwrap();
//! assert!(loss.is_finite());
//! assert_eq!(ws.d_emb().len(), 16 * 3 * 2);
//! opt.step(model.params_mut(), ws.grads());
//! ```

pub mod attention;
pub mod cross;
pub mod dlrm;
pub mod error;
pub mod fm;
pub mod gemm;
pub mod init;
pub mod interaction;
pub mod layers;
pub mod loss;
pub mod metrics;
pub mod mmoe;
pub mod norm;
pub mod optim;
pub mod schedule;
pub mod transformer;

pub use attention::{AttentionActs, AttentionConfig, TargetAttention};
pub use cross::CrossNet;
pub use dlrm::{DenseDlrm, DlrmConfig, FlopCount, Labels, Tower, Workspace};
pub use error::{ModelError, Result};
pub use interaction::{Interaction, InteractionKind};
pub use layers::{sigmoid, Activation, Linear, Mlp};
pub use loss::{bce_with_logits, bce_with_logits_loss};
pub use metrics::{auc, logloss, EvalAccumulator};
pub use mmoe::{Mmoe, MmoeConfig, MAX_TASKS};
pub use norm::{NormKind, NormMode};
pub use optim::{Adagrad, Adam, DenseOptimizer, DenseOptimizerConfig, RunningAverages, Sgd};
pub use schedule::{Decay, LrSchedule};
pub use transformer::TransformerConfig;
