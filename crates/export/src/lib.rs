//! A trained model in the formats other tools read.
//!
//! * [`onnx`]: the whole model as an ONNX graph for ONNX Runtime, Triton and other
//!   ONNX readers;
//! * [`tensors`]: every table and dense parameter in a safetensors file, for PyTorch and
//!   numpy;
//! * [`inputs`]: the ONNX graph's inputs of a data set (safetensors), so a user
//!   reproduces `elastrec eval`'s predictions in ONNX Runtime;
//! * [`signature`]: what a model reads, the one description the three share;
//! * [`params`]: the dense parameters by name, as PyTorch's modules name them.

pub mod error;
pub mod inputs;
pub mod onnx;
pub mod params;
pub mod signature;
pub mod tables;
pub mod tensors;

pub use error::{ExportError, Result};
pub use inputs::Inputs;
pub use onnx::{OnnxExport, OnnxOptions};
pub use signature::Signature;
pub use tensors::TensorsExport;
