//! The crate's error type.

/// Errors raised by the dense model: invalid configurations (the caller's fault) and
/// shape mismatches between the inputs of a call and the model or its workspace.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// An MLP was given fewer sizes than it needs (`bottom` needs input and output,
    /// `top` needs at least the output layer).
    #[error("{mlp} MLP needs at least {min} sizes, got {got}")]
    MlpTooShort {
        /// `"bottom"` or `"top"`.
        mlp: &'static str,
        /// Minimum number of sizes.
        min: usize,
        /// Number of sizes given.
        got: usize,
    },
    /// A layer width of zero.
    #[error("{mlp} MLP size #{index} is zero")]
    ZeroWidth {
        /// `"bottom"` or `"top"`.
        mlp: &'static str,
        /// Position in the size list.
        index: usize,
    },
    /// Cross layers (DCN-v2), an FM or first-order term (DeepFM, Wide & Deep) or layer
    /// norms and an MTRM adapt tower in one model are not built.
    #[error("cross layers (DCN-v2), an FM or first-order term (DeepFM, Wide & Deep) or layer or batch norms and an MTRM adapt tower cannot be combined; choose one")]
    CrossWithAdapt,
    /// The top MLP (or MTRM's adapt tower) must end in a single logit.
    #[error("top MLP and adapt tower must end with 1 output (the logit), got {got}")]
    TopOutputNotOne {
        /// The last top size given.
        got: usize,
    },
    /// Dot interaction needs the bottom-MLP output to have the embedding dimension.
    #[error(
        "dot interaction needs bottom MLP output ({bottom_out}) == embedding_dim ({embedding_dim})"
    )]
    DotDimMismatch {
        /// Last bottom size.
        bottom_out: usize,
        /// Embedding dimension.
        embedding_dim: usize,
    },
    /// `num_tables` or `embedding_dim` is zero.
    #[error("{what} must be positive")]
    ZeroEmbedding {
        /// `"num_tables"` or `"embedding_dim"`.
        what: &'static str,
    },
    /// An input slice has the wrong length for the batch.
    #[error("{what}: expected {expected} values, got {got}")]
    Shape {
        /// Which input.
        what: &'static str,
        /// Expected length.
        expected: usize,
        /// Given length.
        got: usize,
    },
    /// A sample weight that is negative or not a number.
    #[error("sample weight of batch row {row} is {value}: weights must be finite and >= 0")]
    BadWeight {
        /// Row in the batch.
        row: usize,
        /// The weight, as written (`NaN`, `-1`, ...).
        value: String,
    },
    /// The batch is larger than the workspace was sized for.
    #[error("batch of {batch} exceeds workspace capacity {capacity}")]
    BatchTooLarge {
        /// Requested batch size.
        batch: usize,
        /// Workspace capacity.
        capacity: usize,
    },
    /// A workspace built for a different model was passed.
    #[error("workspace was built for a different model layout")]
    WorkspaceMismatch,
    /// A standardization constant that is not a finite number.
    #[error("{what}[{index}] is not a finite number")]
    BadNormalization {
        /// `"dense_shift"` or `"dense_scale"`.
        what: &'static str,
        /// The feature.
        index: usize,
    },
    /// A dropout rate outside `[0, 1)`.
    #[error("dropout must be at least 0 and below 1, got {got}")]
    BadDropout {
        /// The rate given, as written.
        got: String,
    },
    /// An adapt-tower step on a model without one (not an MTRM).
    #[error("the model has no adapt tower (model.adapt_mlp is empty): it is not an MTRM")]
    NoAdaptTower,
    /// Layer and batch norms asked for together.
    #[error(
        "layer_norm and batch_norm cannot both be set: a hidden layer has one norm; choose one"
    )]
    TwoNorms,
    /// A multi-task MMoE head that cannot be built.
    #[error("invalid MMoE head: {why}")]
    BadMmoe {
        /// What is wrong.
        why: String,
    },
    /// A target-attention unit that does not fit the model.
    #[error("model.attention: {why}")]
    BadAttention {
        /// What is wrong.
        why: String,
    },
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, ModelError>;
