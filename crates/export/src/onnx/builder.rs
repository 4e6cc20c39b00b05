//! Building an ONNX graph node by node: each method adds one operator and returns the
//! name of its output, so a layer reads as the expression it computes.

use super::proto::{
    attribute_type, data_type, AttributeProto, Dimension, GraphProto, NodeProto, TensorProto,
    TensorShapeProto, TensorTypeProto, TypeProto, ValueInfoProto,
};

/// A graph under construction.
#[derive(Default)]
pub struct Graph {
    nodes: Vec<NodeProto>,
    initializers: Vec<TensorProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
    next: usize,
}

/// The operator set of ONNX's classical-ML operators.
pub const ML_DOMAIN: &str = "ai.onnx.ml";
/// The version of [`ML_DOMAIN`] the graph is written against (`LabelEncoder` with int64
/// keys and values).
pub const ML_OPSET: i64 = 2;

/// A dimension of a graph input or output: fixed, or named (the batch).
#[derive(Clone, Debug)]
pub enum Dim {
    /// Known size.
    Fixed(usize),
    /// Any size; inputs sharing the name share the size.
    Named(&'static str),
}

impl Graph {
    /// A fresh value name with a readable stem.
    fn fresh(&mut self, stem: &str) -> String {
        self.next += 1;
        format!("{stem}_{}", self.next)
    }

    /// Declares a graph input.
    pub fn input(&mut self, name: &str, elem: i32, dims: &[Dim], doc: &str) -> String {
        self.inputs.push(value_info(name, elem, dims, doc));
        name.to_string()
    }

    /// Makes `value` a graph output named `name`.
    pub fn output(&mut self, value: &str, name: &str, elem: i32, dims: &[Dim], doc: &str) {
        self.op("Identity", &[value], vec![], Some(name));
        self.outputs.push(value_info(name, elem, dims, doc));
    }

    /// A float constant named `name`, `[dims]`, row-major.
    pub fn constant_f32(&mut self, name: &str, dims: &[usize], values: &[f32]) -> String {
        debug_assert_eq!(dims.iter().product::<usize>(), values.len());
        self.initializers.push(TensorProto {
            dims: dims.iter().map(|&d| d as i64).collect(),
            data_type: data_type::FLOAT,
            name: name.to_string(),
            raw_data: bytemuck::cast_slice(values).to_vec(),
            ..TensorProto::default()
        });
        name.to_string()
    }

    /// A float tensor whose bytes another writer places ([`TensorProto::external_data`]
    /// or `raw_data`, set by the caller).
    pub fn constant_tensor(&mut self, tensor: TensorProto) -> String {
        let name = tensor.name.clone();
        self.initializers.push(tensor);
        name
    }

    /// An int64 constant (indices, shapes, axes).
    pub fn constant_i64(&mut self, stem: &str, dims: &[usize], values: &[i64]) -> String {
        let name = self.fresh(stem);
        self.initializers.push(TensorProto {
            dims: dims.iter().map(|&d| d as i64).collect(),
            data_type: data_type::INT64,
            name: name.clone(),
            raw_data: bytemuck::cast_slice(values).to_vec(),
            ..TensorProto::default()
        });
        name
    }

    /// A float scalar constant.
    pub fn scalar(&mut self, stem: &str, v: f32) -> String {
        let name = self.fresh(stem);
        self.constant_f32(&name, &[], &[v])
    }

    /// Adds `op_type(inputs)` with `attrs`; returns its output's name (`out`, or a fresh
    /// one).
    pub fn op(
        &mut self,
        op_type: &str,
        inputs: &[&str],
        attrs: Vec<AttributeProto>,
        out: Option<&str>,
    ) -> String {
        let output = out.map_or_else(|| self.fresh(&op_type.to_lowercase()), str::to_string);
        self.nodes.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![output.clone()],
            name: format!("{op_type}_{}", self.nodes.len()),
            op_type: op_type.to_string(),
            attribute: attrs,
            domain: String::new(),
        });
        output
    }

    /// `keys[i] -> i` for each element of `x` (int64), `default` for any other value:
    /// ONNX-ML's `LabelEncoder` (operator set `ai.onnx.ml` 2), a hash map in ONNX Runtime.
    pub fn key_to_index(&mut self, x: &str, keys: &[i64], default: i64) -> String {
        let values: Vec<i64> = (0..keys.len() as i64).collect();
        let out = self.op(
            "LabelEncoder",
            &[x],
            vec![
                ints("keys_int64s", keys),
                ints("values_int64s", &values),
                int("default_int64", default),
            ],
            None,
        );
        let node = self.nodes.last_mut().expect("just added");
        node.domain = ML_DOMAIN.to_string();
        out
    }

    /// Whether an operator of [`ML_DOMAIN`] is in the graph (the model must import it).
    pub fn uses_ml(&self) -> bool {
        self.nodes.iter().any(|n| n.domain == ML_DOMAIN)
    }

    /// `a @ b` (batched when either has more than two dimensions).
    pub fn matmul(&mut self, a: &str, b: &str) -> String {
        self.op("MatMul", &[a, b], vec![], None)
    }

    /// `x W^T + b` for `x [n, in]`, `W [out, in]` (elastrec's layout), `b [out]`.
    pub fn gemm_t(&mut self, x: &str, w: &str, b: &str) -> String {
        self.op("Gemm", &[x, w, b], vec![int("transB", 1)], None)
    }

    /// Elementwise binary operators (with broadcasting).
    pub fn add(&mut self, a: &str, b: &str) -> String {
        self.op("Add", &[a, b], vec![], None)
    }

    /// See [`Graph::add`].
    pub fn sub(&mut self, a: &str, b: &str) -> String {
        self.op("Sub", &[a, b], vec![], None)
    }

    /// See [`Graph::add`].
    pub fn mul(&mut self, a: &str, b: &str) -> String {
        self.op("Mul", &[a, b], vec![], None)
    }

    /// `max(x, 0)`.
    pub fn relu(&mut self, x: &str) -> String {
        self.op("Relu", &[x], vec![], None)
    }

    /// `1 / (1 + e^-x)`.
    pub fn sigmoid(&mut self, x: &str) -> String {
        self.op("Sigmoid", &[x], vec![], None)
    }

    /// Softmax over the last axis.
    pub fn softmax(&mut self, x: &str) -> String {
        self.op("Softmax", &[x], vec![int("axis", -1)], None)
    }

    /// Sum over `axes`, keeping them as size 1 when `keep`.
    pub fn reduce_sum(&mut self, x: &str, axes: &[i64], keep: bool) -> String {
        let axes = self.constant_i64("axes", &[axes.len()], axes);
        self.op(
            "ReduceSum",
            &[x, &axes],
            vec![int("keepdims", i64::from(keep))],
            None,
        )
    }

    /// Concatenation along `axis`.
    pub fn concat(&mut self, parts: &[&str], axis: i64) -> String {
        self.op("Concat", parts, vec![int("axis", axis)], None)
    }

    /// A new axis of size 1 at `axis`.
    pub fn unsqueeze(&mut self, x: &str, axis: i64) -> String {
        let axes = self.constant_i64("axes", &[1], &[axis]);
        self.op("Unsqueeze", &[x, &axes], vec![], None)
    }

    /// `x` reshaped (0 keeps that dimension, -1 infers it).
    pub fn reshape(&mut self, x: &str, shape: &[i64]) -> String {
        let shape = self.constant_i64("shape", &[shape.len()], shape);
        self.op("Reshape", &[x, &shape], vec![], None)
    }

    /// Elements `start..end` of `axis`.
    pub fn slice(&mut self, x: &str, axis: i64, start: usize, end: usize) -> String {
        let s = self.constant_i64("start", &[1], &[start as i64]);
        let e = self.constant_i64("end", &[1], &[end as i64]);
        let a = self.constant_i64("axis", &[1], &[axis]);
        self.op("Slice", &[x, &s, &e, &a], vec![], None)
    }

    /// The rows of `data` at `indices` along `axis`.
    pub fn gather(&mut self, data: &str, indices: &str, axis: i64) -> String {
        self.op("Gather", &[data, indices], vec![int("axis", axis)], None)
    }

    /// The axes of `x` permuted.
    pub fn transpose(&mut self, x: &str, perm: &[i64]) -> String {
        self.op("Transpose", &[x], vec![ints("perm", perm)], None)
    }

    /// The finished graph.
    pub fn finish(self, name: &str, doc: &str) -> GraphProto {
        GraphProto {
            node: self.nodes,
            name: name.to_string(),
            initializer: self.initializers,
            doc_string: doc.to_string(),
            input: self.inputs,
            output: self.outputs,
        }
    }
}

/// An integer attribute.
pub fn int(name: &str, i: i64) -> AttributeProto {
    AttributeProto {
        name: name.to_string(),
        i,
        r#type: attribute_type::INT,
        ..AttributeProto::default()
    }
}

/// A float attribute.
pub fn float(name: &str, f: f32) -> AttributeProto {
    AttributeProto {
        name: name.to_string(),
        f,
        r#type: attribute_type::FLOAT,
        ..AttributeProto::default()
    }
}

/// A list-of-integers attribute.
pub fn ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.to_string(),
        ints: v.to_vec(),
        r#type: attribute_type::INTS,
        ..AttributeProto::default()
    }
}

fn value_info(name: &str, elem: i32, dims: &[Dim], doc: &str) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| match d {
            Dim::Fixed(v) => Dimension {
                dim_value: Some(*v as i64),
                dim_param: None,
            },
            Dim::Named(p) => Dimension {
                dim_value: None,
                dim_param: Some(p.to_string()),
            },
        })
        .collect();
    ValueInfoProto {
        name: name.to_string(),
        r#type: Some(TypeProto {
            tensor_type: Some(TensorTypeProto {
                elem_type: elem,
                shape: Some(TensorShapeProto { dim }),
            }),
        }),
        doc_string: doc.to_string(),
    }
}
