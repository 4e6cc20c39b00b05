//! `--raw-dense`: the graph's `dense` input takes each dense column as the log holds it
//! (NaN for a null) and applies the column's transform itself, as elastrec's reader does:
//! `log1p` (`ln(1 + max(x, 0))`, the Criteo preset's and a named feature's
//! `transform = "log1p"`), or the numeric chain of a named feature or of a
//! `[[preprocess]]` graph's one-column dense feature (`fill_null`, `clamp`, `log1p`,
//! `logit`, `box_cox`, `cast(float)`). A null, and anything a chain makes not finite,
//! reads 0.
//!
//! Per column the graph slices `[batch, 1]`, applies its operators, and concatenates the
//! columns back. Computed in fp32 where the reader computes chains in f64: the
//! difference is a rounding of the input's magnitude, far below the predictions' 1e-5.

use elastrec_data::ops::types::Element;
use elastrec_data::ops::Op;

use super::builder::Graph;
use crate::error::{ExportError, Result};
use crate::signature::{DenseColumn, Signature};

/// What one column's transform is in the graph.
enum Steps {
    /// The value as it is; a null reads 0.
    Plain,
    /// `ln(1 + max(x, 0))`; a null reads 0.
    Log1p,
    /// The feature's own chain over nulls as NaN, then non-finite values read 0.
    Chain(Vec<Op>),
}

fn column_steps(c: &DenseColumn) -> Result<Steps> {
    match c.transform {
        "none" => Ok(Steps::Plain),
        "log1p" => Ok(Steps::Log1p),
        "ops" => {
            let ops = c
                .ops
                .iter()
                .map(|text| {
                    let op = Op::parse(text).map_err(|e| {
                        ExportError::Shape(format!("feature {}: `{text}`: {e}", c.feature))
                    })?;
                    match op {
                        Op::FillNull(_)
                        | Op::Clamp { .. }
                        | Op::Log1p
                        | Op::Logit { .. }
                        | Op::BoxCox { .. }
                        | Op::Cast(Element::Float) => Ok(op),
                        other => Err(ExportError::Unsupported(format!(
                            "--raw-dense: feature {}'s operator `{}` has no ONNX form here; \
                             export without --raw-dense and apply the chain before the graph",
                            c.feature,
                            other.name()
                        ))),
                    }
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Steps::Chain(ops))
        }
        _ => Err(ExportError::Unsupported(format!(
            "--raw-dense: dense column {} of the [[preprocess]] graph reads {} through `{}`, \
             which is not one number through numeric operators; export without --raw-dense",
            c.feature,
            c.column,
            c.ops.join(" → ")
        ))),
    }
}

/// Every dense column's transform as the graph applies it.
pub struct Transforms(Vec<Steps>);

impl Transforms {
    /// The transforms of `sig`'s dense columns, or why the graph cannot apply one: asked
    /// before anything is written.
    pub fn of(sig: &Signature) -> Result<Self> {
        sig.dense
            .iter()
            .map(column_steps)
            .collect::<Result<_>>()
            .map(Self)
    }

    /// The transformed dense columns `[batch, D]` from the raw ones in `raw`.
    pub(super) fn apply(&self, g: &mut Graph, raw: &str) -> String {
        if self.0.is_empty() {
            return raw.to_string();
        }
        let zero = g.scalar("raw.zero", 0.0);
        let one = g.scalar("raw.one", 1.0);
        let nan = g.scalar("raw.nan", f32::NAN);
        let k = Consts { zero, one, nan };
        let columns: Vec<String> = self
            .0
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let x = g.slice(raw, 1, i, i + 1);
                match s {
                    Steps::Plain => k.null_zero(g, &x),
                    Steps::Log1p => {
                        let x = k.null_zero(g, &x);
                        let pos = g.op("Max", &[&x, &k.zero], vec![], None);
                        let p1 = g.add(&pos, &k.one);
                        g.op("Log", &[&p1], vec![], None)
                    }
                    Steps::Chain(ops) => {
                        let y = ops.iter().fold(x, |x, op| k.apply(g, op, &x));
                        k.finite_or_zero(g, &y)
                    }
                }
            })
            .collect();
        let parts: Vec<&str> = columns.iter().map(String::as_str).collect();
        g.concat(&parts, 1)
    }
}

/// The scalar constants the transforms share.
struct Consts {
    zero: String,
    one: String,
    nan: String,
}

impl Consts {
    /// `x`, with NaN (null) as 0.
    fn null_zero(&self, g: &mut Graph, x: &str) -> String {
        let null = g.op("IsNaN", &[x], vec![], None);
        g.op("Where", &[&null, &self.zero, x], vec![], None)
    }

    /// Whether `x` is NaN or infinite.
    fn not_finite(&self, g: &mut Graph, x: &str) -> String {
        let nan = g.op("IsNaN", &[x], vec![], None);
        let inf = g.op("IsInf", &[x], vec![], None);
        g.op("Or", &[&nan, &inf], vec![], None)
    }

    /// `x`, with what is not finite as NaN (a null), as the chain's kernels leave it.
    fn nan_unless_finite(&self, g: &mut Graph, x: &str) -> String {
        let bad = self.not_finite(g, x);
        g.op("Where", &[&bad, &self.nan, x], vec![], None)
    }

    /// `x`, with what is not finite as 0: the end of a dense chain.
    fn finite_or_zero(&self, g: &mut Graph, x: &str) -> String {
        let bad = self.not_finite(g, x);
        g.op("Where", &[&bad, &self.zero, x], vec![], None)
    }

    /// `lo <= x <= hi` (either bound optional), a NaN passing through.
    fn clamp(&self, g: &mut Graph, x: &str, lo: Option<f64>, hi: Option<f64>) -> String {
        let mut y = x.to_string();
        if let Some(lo) = lo {
            let c = g.scalar("raw.lo", lo as f32);
            y = g.op("Max", &[&y, &c], vec![], None);
        }
        if let Some(hi) = hi {
            let c = g.scalar("raw.hi", hi as f32);
            y = g.op("Min", &[&y, &c], vec![], None);
        }
        let null = g.op("IsNaN", &[x], vec![], None);
        g.op("Where", &[&null, x, &y], vec![], None)
    }

    /// One operator of a dense chain (`ops/kernels.rs` on floats).
    fn apply(&self, g: &mut Graph, op: &Op, x: &str) -> String {
        match op {
            Op::FillNull(v) => {
                let fill = g.scalar("raw.fill", v.float as f32);
                let null = g.op("IsNaN", &[x], vec![], None);
                g.op("Where", &[&null, &fill, x], vec![], None)
            }
            Op::Clamp { min, max } => self.clamp(g, x, min.map(|n| n.float), max.map(|n| n.float)),
            Op::Log1p => {
                let p1 = g.add(x, &self.one);
                let y = g.op("Log", &[&p1], vec![], None);
                self.nan_unless_finite(g, &y)
            }
            Op::Logit { eps } => {
                let p = self.clamp(g, x, Some(*eps), Some(1.0 - eps));
                let q = g.sub(&self.one, &p);
                let odds = g.op("Div", &[&p, &q], vec![], None);
                g.op("Log", &[&odds], vec![], None)
            }
            Op::BoxCox { lambda } => {
                let y = if *lambda == 0.0 {
                    g.op("Log", &[x], vec![], None)
                } else {
                    let l = g.scalar("raw.lambda", *lambda as f32);
                    let pow = g.op("Pow", &[x, &l], vec![], None);
                    let m1 = g.sub(&pow, &self.one);
                    g.op("Div", &[&m1, &l], vec![], None)
                };
                // `x <= 0` (and a null) gives a null.
                let positive = g.op("Greater", &[x, &self.zero], vec![], None);
                let y = g.op("Where", &[&positive, &y, &self.nan], vec![], None);
                self.nan_unless_finite(g, &y)
            }
            // An int as a float: the graph's input is already one.
            Op::Cast(_) => x.to_string(),
            // `column_steps` lets no other operator through.
            _ => unreachable!("refused by column_steps"),
        }
    }
}
