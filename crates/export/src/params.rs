//! Every parameter of a model as a named tensor, in the shapes PyTorch's modules use
//! (`weight [out, in]`, `bias [out]`, a norm's `weight`/`bias` and running statistics),
//! so the safetensors file and the ONNX graph's constants carry the same names.
//!
//! Names: `bottom.{i}.weight`, `bottom.{i}.bias`, `bottom.{i}.norm.weight` (and `.bias`,
//! `.running_mean`, `.running_var` for a batch norm), `top.{i}...`, `adapt.{i}...`,
//! `cross.{l}...`, `wide.weight [1, dense]`, `wide.bias`, `mmoe.expert.{j}.{i}...`,
//! `mmoe.gate.{t}...`, `mmoe.tower.{t}.{i}...` (tasks 1 on; task 0's tower is `top`),
//! `attention.{u}.{i}...` (a DIN unit's scoring MLP), `attention.{u}.positions`
//! `[max_len + 1, d]` and `attention.{u}.layer.{i}.{q,k,v,o,ffn1,ffn2}.{weight,bias}`,
//! `...{norm1,norm2}.{weight,bias}` (a transformer unit's encoder), and `dense.shift`, `dense.scale`
//! (the standardization of the dense input, when the model has one).

use elastrec_model::norm::Norm;
use elastrec_model::{DenseDlrm, Linear, Mlp};

/// One named tensor of `f32`, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    /// Its name (see the module's list).
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its values.
    pub values: Vec<f32>,
}

impl Param {
    fn new(name: String, shape: Vec<usize>, values: &[f32]) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), values.len());
        Self {
            name,
            shape,
            values: values.to_vec(),
        }
    }
}

/// The weight's name of layer `prefix` (e.g. `bottom.0`).
pub fn weight(prefix: &str) -> String {
    format!("{prefix}.weight")
}

/// The bias's name of layer `prefix`.
pub fn bias(prefix: &str) -> String {
    format!("{prefix}.bias")
}

/// The name of a norm's part (`weight`, `bias`, `running_mean`, `running_var`) after
/// layer `prefix`.
pub fn norm_part(prefix: &str, part: &str) -> String {
    format!("{prefix}.norm.{part}")
}

/// Encoder layer `i` of the transformer unit `unit` (`attention.U`).
pub fn encoder_layer(unit: &str, i: usize) -> String {
    format!("{unit}.layer.{i}")
}

/// Layer `i` of the MLP named `mlp`.
pub fn layer(mlp: &str, i: usize) -> String {
    format!("{mlp}.{i}")
}

/// Every dense parameter of `model`, named.
pub fn dense_params(model: &DenseDlrm) -> Vec<Param> {
    let p = model.params();
    let c = model.config();
    let mut out = Vec::new();
    if !c.dense_shift.is_empty() {
        let nd = c.num_dense();
        out.push(Param::new("dense.shift".into(), vec![nd], &c.dense_shift));
        out.push(Param::new("dense.scale".into(), vec![nd], &c.dense_scale));
    }
    mlp_params(&mut out, "bottom", model.bottom(), p);
    mlp_params(&mut out, "top", model.top(), p);
    if let Some(adapt) = model.adapt() {
        mlp_params(&mut out, "adapt", adapt, p);
    }
    for (l, lin) in model.cross().layers.iter().enumerate() {
        linear_params(&mut out, &layer("cross", l), lin, p);
    }
    if let Some(wide) = model.wide() {
        linear_params(&mut out, "wide", wide, p);
    }
    if let Some(head) = model.mmoe() {
        for (j, expert) in head.experts.iter().enumerate() {
            mlp_params(&mut out, &format!("mmoe.expert.{j}"), expert, p);
        }
        for (t, gate) in head.gates.iter().enumerate() {
            linear_params(&mut out, &format!("mmoe.gate.{t}"), gate, p);
        }
        for (t, tower) in head.towers.iter().enumerate() {
            mlp_params(&mut out, &format!("mmoe.tower.{}", t + 1), tower, p);
        }
    }
    for (u, unit) in model.attention().iter().enumerate() {
        let prefix = format!("attention.{u}");
        if let Some(mlp) = unit.din_mlp() {
            mlp_params(&mut out, &prefix, mlp, p);
        }
        if let Some(t) = unit.transformer() {
            let pos = t.positions();
            let rows = unit.config.max_len + 1;
            out.push(Param::new(
                format!("{prefix}.positions"),
                vec![rows, pos.len() / rows],
                &p[pos],
            ));
            for (i, b) in t.blocks().iter().enumerate() {
                let block = encoder_layer(&prefix, i);
                for (name, l) in [
                    ("q", &b.q),
                    ("k", &b.k),
                    ("v", &b.v),
                    ("o", &b.o),
                    ("ffn1", &b.ffn1),
                    ("ffn2", &b.ffn2),
                ] {
                    linear_params(&mut out, &format!("{block}.{name}"), l, p);
                }
                for (name, n) in [("norm1", &b.norm1), ("norm2", &b.norm2)] {
                    let at = n.offset;
                    out.push(Param::new(
                        format!("{block}.{name}.weight"),
                        vec![n.width],
                        &p[at..at + n.width],
                    ));
                    out.push(Param::new(
                        format!("{block}.{name}.bias"),
                        vec![n.width],
                        &p[at + n.width..at + 2 * n.width],
                    ));
                }
            }
        }
    }
    out
}

fn mlp_params(out: &mut Vec<Param>, name: &str, mlp: &Mlp, p: &[f32]) {
    for (i, lin) in mlp.layers.iter().enumerate() {
        let prefix = layer(name, i);
        linear_params(out, &prefix, lin, p);
        if let Some(norm) = mlp.norms.get(i) {
            norm_params(out, &prefix, norm, p);
        }
    }
}

fn linear_params(out: &mut Vec<Param>, prefix: &str, l: &Linear, p: &[f32]) {
    let w = &p[l.w_offset..l.w_offset + l.in_dim * l.out_dim];
    let b = &p[l.b_offset..l.b_offset + l.out_dim];
    out.push(Param::new(weight(prefix), vec![l.out_dim, l.in_dim], w));
    out.push(Param::new(bias(prefix), vec![l.out_dim], b));
}

fn norm_params(out: &mut Vec<Param>, prefix: &str, norm: &Norm, p: &[f32]) {
    let (width, offset, parts): (usize, usize, &[&str]) = match norm {
        Norm::Layer(n) => (n.width, n.offset, &["weight", "bias"]),
        Norm::Batch(n) => (
            n.width,
            n.offset,
            &["weight", "bias", "running_mean", "running_var"],
        ),
    };
    for (k, part) in parts.iter().enumerate() {
        let at = offset + k * width;
        out.push(Param::new(
            norm_part(prefix, part),
            vec![width],
            &p[at..at + width],
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use elastrec_model::TransformerConfig;
    use elastrec_model::{AttentionConfig, DlrmConfig, InteractionKind, MmoeConfig};

    /// Every float of the flat dense vector is in exactly one named tensor, whatever
    /// parts the model has, so an export leaves nothing out and copies nothing twice.
    #[test]
    fn the_named_tensors_cover_every_dense_parameter_once() {
        let base = DlrmConfig {
            bottom: vec![5, 8, 4],
            top: vec![6, 1],
            num_tables: 3,
            embedding_dim: 4,
            ..DlrmConfig::criteo_kaggle()
        };
        let variants = [
            base.clone(),
            DlrmConfig {
                interaction: InteractionKind::Concat,
                cross_layers: 2,
                layer_norm: true,
                first_order: true,
                fm: true,
                dense_shift: vec![0.5; 5],
                dense_scale: vec![2.0; 5],
                ..base.clone()
            },
            DlrmConfig {
                batch_norm: true,
                mmoe: Some(MmoeConfig {
                    tasks: 2,
                    experts: 2,
                    expert: vec![7],
                    weights: Vec::new(),
                    task_experts: 1,
                }),
                ..base.clone()
            },
            DlrmConfig {
                adapt: vec![3, 1],
                ..base.clone()
            },
            DlrmConfig {
                first_order: true,
                attention: vec![
                    AttentionConfig {
                        slot: 2,
                        query: 0,
                        max_len: 5,
                        mlp: vec![4],
                        softmax: false,
                        transformer: None,
                    },
                    AttentionConfig {
                        slot: 1,
                        query: 0,
                        max_len: 3,
                        mlp: Vec::new(),
                        softmax: false,
                        transformer: Some(TransformerConfig {
                            heads: 2,
                            layers: 2,
                            ffn: 6,
                            positions: true,
                        }),
                    },
                ],
                ..base
            },
        ];
        for config in variants {
            let shifted = usize::from(!config.dense_shift.is_empty()) * 2 * config.num_dense();
            let model = DenseDlrm::new(config.clone()).unwrap();
            let params = dense_params(&model);
            let floats: usize = params.iter().map(|p| p.values.len()).sum();
            assert_eq!(floats, model.num_params() + shifted, "{config:?}");
            let mut names: Vec<&str> = params.iter().map(|p| p.name.as_str()).collect();
            names.sort_unstable();
            let before = names.len();
            names.dedup();
            assert_eq!(names.len(), before, "a name is used twice: {names:?}");
            for p in &params {
                assert_eq!(
                    p.shape.iter().product::<usize>(),
                    p.values.len(),
                    "{}",
                    p.name
                );
            }
        }
    }
}
