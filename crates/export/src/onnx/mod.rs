//! `elastrec export --format onnx`: the whole model as one ONNX graph (opset 17), which
//! ONNX Runtime, Triton or any ONNX reader runs without elastrec.
//!
//! The graph reads what elastrec's reader makes of a row (see [`crate::signature`]):
//! `dense [batch, D]` (the dense columns after their transforms), `sparse_rows
//! [batch, S]` (each single id's row in its table) and, per bag or sequence, `<name>_rows`
//! and `<name>_weights` `[batch, max_len]` (its ids' rows, and their weights: 1 each
//! without a weight column, 0 on padding). Turning raw ids into rows is a hash ONNX has no
//! operator for, so it stays outside, written down in the side file `<out>.json` and in
//! the model's metadata (`elastrec.signature`, `elastrec.rows`). A dynamic table's inputs
//! are 64-bit keys instead, which the graph turns into its rows with ONNX-ML's
//! `LabelEncoder` (operator set `ai.onnx.ml` 2, in ONNX Runtime's default build); a key the
//! table never admitted reads a row of zeros, where elastrec reads the key's seeded
//! initial value (at most the table's init bound, `1/sqrt(rows)`, in each coordinate).
//!
//! Inside: the embedding lookups are `Gather`s of the tables (constants `embedding.<t>`),
//! a bag is the `ReduceSum` of its rows scaled by its pooling's weights (a history pooled
//! by target attention, by DIN's scores of its items against the candidate), then the dense
//! model as elastrec computes it: standardization, bottom MLP (with layer or batch
//! norms), the dot or concatenation interaction, DCN-v2 cross layers, the MMoE/CGC head,
//! the towers, the FM and first-order terms, MTRM's adapt tower. Outputs: `logit` and
//! `probability`, `[batch, tasks]`. Constants carry the names of [`crate::params`], so
//! they match the safetensors export.

pub mod builder;
pub mod proto;
pub mod raw_dense;

use std::path::{Path, PathBuf};

use elastrec_data::{FeatureSource, Pooling};
use elastrec_model::norm::{Norm, EPS};
use elastrec_model::{Activation, InteractionKind, Mlp};
use elastrec_worker::Dlrm;
use prost::Message;
use serde::Serialize;

use crate::error::{io, Result};
use crate::params::{self, bias, layer, norm_part, weight};
use crate::signature::Signature;
use builder::{float, int, Dim, Graph};
use proto::{data_type, ModelProto, OperatorSetIdProto, StringStringEntryProto, TensorProto};

/// The operator set the graph is written against.
pub const OPSET: i64 = 17;
/// ONNX IR version 8 (ONNX 1.10 on; read by every ONNX Runtime since 1.10).
const IR_VERSION: i64 = 8;
/// Above this many bytes of tables the tables go to an external data file whatever the
/// options say: one protobuf message cannot exceed 2 GiB.
const INLINE_LIMIT: u64 = 1 << 30;

/// How to lay the graph out on disk, and what its `dense` input holds.
#[derive(Debug, Clone, Copy, Default)]
pub struct OnnxOptions {
    /// Put the embedding tables in `<out>.data` beside the graph (ONNX external data)
    /// rather than inside it; forced past 1 GiB of tables.
    pub external_data: bool,
    /// The `dense` input takes the raw columns (NaN: null) and the graph applies their
    /// transforms ([`raw_dense`]); otherwise it takes them transformed, as
    /// `eval --onnx-inputs` writes them.
    pub raw_dense: bool,
}

/// What [`write`] wrote.
#[derive(Debug, Clone, Serialize)]
pub struct OnnxExport {
    /// The graph.
    pub path: PathBuf,
    /// The tables' file, when external.
    pub data: Option<PathBuf>,
    /// The side file describing the inputs.
    pub signature_file: PathBuf,
    /// Bytes of the graph file (and of the data file).
    pub bytes: u64,
    /// Operators in the graph.
    pub nodes: usize,
    /// The inputs the graph reads.
    pub signature: Signature,
}

/// How a raw id becomes the row an input holds (`elastrec.rows` in the metadata).
pub const ROWS_RULE: &str = "row = xxh3_64_with_seed(key as 8 little-endian bytes, \
seed = 0x656c617374726563 XOR table index) mod table rows; key of an integer id: its \
64-bit two's complement; of a string: xxh3_64(UTF-8 bytes) >> 1, or the integer when the \
text is a plain integer; of a null or missing id: 2^64 - 1. An empty list is one id, \
the null key, with weight 1. A dynamic table's input (\"dynamic\": true) is the same hash \
mod 2^64 - 1 instead, as int64 bits; the graph finds its row, and a key the table never \
admitted reads zeros.";

/// Writes `model` (its inputs from `source`) as an ONNX graph to `out`.
pub fn write(
    model: &Dlrm,
    source: FeatureSource<'_>,
    out: &Path,
    opts: OnnxOptions,
) -> Result<OnnxExport> {
    write_signed(model, Signature::of(model, source)?, out, opts)
}

/// Writes `model`, whose inputs `sig` describes ([`Signature::of_job`] knows a
/// `[[preprocess]]` graph's dense chains), as an ONNX graph to `out`.
pub fn write_signed(
    model: &Dlrm,
    sig: Signature,
    out: &Path,
    opts: OnnxOptions,
) -> Result<OnnxExport> {
    // Refused before anything is written.
    let raw = opts
        .raw_dense
        .then(|| raw_dense::Transforms::of(&sig))
        .transpose()?;
    let mut g = Graph::default();
    for p in params::dense_params(&model.dense) {
        g.constant_f32(&p.name, &p.shape, &p.values);
    }
    let data = add_tables(&mut g, model, &sig, out, opts)?;
    // Each dynamic table's keys as ONNX takes them: int64 bits, converted once.
    let keys = (0..sig.tables.len())
        .map(|t| {
            let keys = crate::tables::table_keys(model, t)?;
            Ok(keys.map(|k| k.into_iter().map(|k| k as i64).collect()))
        })
        .collect::<Result<Vec<Option<Vec<i64>>>>>()?;
    let logits = model_graph(&mut g, model, &sig, &keys, raw.as_ref());
    let tasks = model.dense.tasks();
    let batch = [Dim::Named("batch"), Dim::Fixed(tasks)];
    g.output(
        &logits,
        "logit",
        data_type::FLOAT,
        &batch,
        "each task's logit",
    );
    let probs = g.sigmoid(&logits);
    g.output(
        &probs,
        "probability",
        data_type::FLOAT,
        &batch,
        "each task's predicted probability (task 0: the click)",
    );
    let mut opset_import = vec![OperatorSetIdProto {
        domain: String::new(),
        version: OPSET,
    }];
    if g.uses_ml() {
        opset_import.push(OperatorSetIdProto {
            domain: builder::ML_DOMAIN.into(),
            version: builder::ML_OPSET,
        });
    }
    let graph = g.finish("elastrec", "an elastrec model (docs/serving.md, \"ONNX\")");
    let nodes = graph.node.len();
    let signature_json = serde_json::to_string_pretty(&sig).expect("plain data");
    let proto = ModelProto {
        ir_version: IR_VERSION,
        producer_name: "elastrec".into(),
        producer_version: env!("CARGO_PKG_VERSION").into(),
        doc_string: "A recommendation model trained by elastrec.".into(),
        graph: Some(graph),
        opset_import,
        metadata_props: vec![
            entry("elastrec.signature", &signature_json),
            entry("elastrec.rows", ROWS_RULE),
            entry("elastrec.dense", dense_form(opts.raw_dense)),
            entry(
                "elastrec.model",
                &serde_json::to_string(model.dense.config()).expect("plain data"),
            ),
        ],
    };
    let bytes = proto.encode_to_vec();
    elastrec_job::fsio::write_atomic(out, &bytes)?;
    let signature_file = side_file(out);
    let side = serde_json::json!({
        "graph": out.file_name().map(|n| n.to_string_lossy().to_string()),
        "inputs": &sig,
        "rows": ROWS_RULE,
        "dense": dense_form(opts.raw_dense),
        "outputs": {"logit": "[batch, tasks]", "probability": "[batch, tasks]"},
    });
    elastrec_job::fsio::write_atomic(
        &signature_file,
        serde_json::to_string_pretty(&side)
            .expect("plain data")
            .as_bytes(),
    )?;
    let data_bytes = data.as_ref().map_or(0, |(_, b)| *b);
    Ok(OnnxExport {
        path: out.to_path_buf(),
        data: data.map(|(p, _)| p),
        signature_file,
        bytes: bytes.len() as u64 + data_bytes,
        nodes,
        signature: sig,
    })
}

/// What the `dense` input holds (`elastrec.dense` in the metadata, `dense` in the side
/// file).
fn dense_form(raw: bool) -> &'static str {
    if raw {
        "raw: each column as the data holds it, NaN for a null; the graph applies the transforms"
    } else {
        "transformed: each column after the transform the side file names"
    }
}

/// The side file of graph `out`: `<out>.json`.
pub fn side_file(out: &Path) -> PathBuf {
    let mut name = out.as_os_str().to_owned();
    name.push(".json");
    PathBuf::from(name)
}

fn entry(key: &str, value: &str) -> StringStringEntryProto {
    StringStringEntryProto {
        key: key.into(),
        value: value.into(),
    }
}

/// Adds every table as a constant `embedding.<name>`; returns the external data file
/// and its bytes, when the tables went there.
fn add_tables(
    g: &mut Graph,
    model: &Dlrm,
    sig: &Signature,
    out: &Path,
    opts: OnnxOptions,
) -> Result<Option<(PathBuf, u64)>> {
    let width = model.embeddings.dim();
    let total: u64 = sig.tables.iter().map(|t| t.rows * width as u64 * 4).sum();
    let tensor = |info: &crate::signature::TableInfo| TensorProto {
        dims: vec![info.rows as i64, width as i64],
        data_type: data_type::FLOAT,
        name: table_constant(&info.name),
        ..TensorProto::default()
    };
    if !(opts.external_data || total > INLINE_LIMIT) {
        for (t, info) in sig.tables.iter().enumerate() {
            let rows = crate::tables::table_rows(model, t)?;
            g.constant_tensor(TensorProto {
                raw_data: bytemuck::cast_slice(&rows).to_vec(),
                ..tensor(info)
            });
        }
        return Ok(None);
    }
    let data_path = {
        let mut name = out.as_os_str().to_owned();
        name.push(".data");
        PathBuf::from(name)
    };
    let location = data_path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let mut offset = 0u64;
    elastrec_job::fsio::write_atomic_with(&data_path, |w| -> Result<()> {
        for (t, info) in sig.tables.iter().enumerate() {
            let rows = crate::tables::table_rows(model, t)?;
            let bytes: &[u8] = bytemuck::cast_slice(&rows);
            w.write_all(bytes).map_err(io(&data_path))?;
            g.constant_tensor(TensorProto {
                data_location: 1,
                external_data: vec![
                    entry("location", &location),
                    entry("offset", &offset.to_string()),
                    entry("length", &bytes.len().to_string()),
                ],
                ..tensor(info)
            });
            offset += bytes.len() as u64;
        }
        Ok(())
    })?;
    Ok(Some((data_path, offset)))
}

/// The constant holding table `name`.
pub fn table_constant(name: &str) -> String {
    format!("embedding.{name}")
}

/// Declares the inputs and builds the model; returns the logits `[batch, tasks]`.
/// `keys`: each dynamic table's stored keys (as int64 bits), in its rows' order. `raw`:
/// the dense columns' transforms, when the `dense` input takes them raw.
fn model_graph(
    g: &mut Graph,
    model: &Dlrm,
    sig: &Signature,
    keys: &[Option<Vec<i64>>],
    raw: Option<&raw_dense::Transforms>,
) -> String {
    let c = model.dense.config();
    let (nd, d) = (c.num_dense(), c.embedding_dim);
    let batch = Dim::Named("batch");
    let doc = match raw {
        Some(_) => {
            "the dense columns as the data holds them, NaN for a null (the graph applies the \
             transforms the side file lists)"
        }
        None => "the dense columns after their transforms (the side file lists them)",
    };
    let input = g.input(
        "dense",
        data_type::FLOAT,
        &[batch.clone(), Dim::Fixed(nd)],
        doc,
    );
    let dense = match raw {
        Some(t) => t.apply(g, &input),
        None => input,
    };
    let dense_x = if c.dense_shift.is_empty() {
        dense
    } else {
        let centred = g.sub(&dense, "dense.shift");
        g.mul(&centred, "dense.scale")
    };
    let emb = embeddings(g, model, sig, keys);
    // The interaction and the FM term read the rows without their first-order weights.
    let emb_d = if c.first_order {
        g.slice(&emb, 2, 0, d)
    } else {
        emb.clone()
    };
    let z = mlp(g, "bottom", model.dense.bottom(), &dense_x);
    let t = c.num_tables;
    let inter = match model.dense.interaction().kind {
        InteractionKind::Dot => dot_interaction(g, &z, &emb_d, t),
        InteractionKind::Concat => {
            let flat = g.reshape(&emb_d, &[0, (t * d) as i64]);
            g.concat(&[&z, &flat], 1)
        }
    };
    let mut top_in = inter.clone();
    for l in 0..model.dense.cross().layers.len() {
        let prefix = layer("cross", l);
        let u = g.gemm_t(&top_in, &weight(&prefix), &bias(&prefix));
        let scaled = g.mul(&inter, &u);
        top_in = g.add(&scaled, &top_in);
    }
    let mut task_logits = Vec::new();
    if let Some(head) = model.dense.mmoe() {
        let experts: Vec<String> = head
            .experts
            .iter()
            .enumerate()
            .map(|(j, e)| mlp(g, &format!("mmoe.expert.{j}"), e, &top_in))
            .collect();
        let mut mixes = Vec::new();
        for task in 0..head.tasks() {
            let prefix = format!("mmoe.gate.{task}");
            let scores = g.gemm_t(&top_in, &weight(&prefix), &bias(&prefix));
            let gate = g.softmax(&scores);
            let stacked: Vec<String> = head
                .gated(task)
                .map(|(_, j)| g.unsqueeze(&experts[j], 1))
                .collect();
            let refs: Vec<&str> = stacked.iter().map(String::as_str).collect();
            let stacked = g.concat(&refs, 1);
            let row = g.unsqueeze(&gate, 1);
            let mixed = g.matmul(&row, &stacked);
            mixes.push(g.reshape(&mixed, &[0, -1]));
        }
        for (k, tower) in head.towers.iter().enumerate() {
            let task = k + 1;
            task_logits.push(mlp(g, &format!("mmoe.tower.{task}"), tower, &mixes[task]));
        }
        top_in = mixes.swap_remove(0);
    }
    let mut logit = mlp(g, "top", model.dense.top(), &top_in);
    if c.fm {
        let fm = fm_term(g, &emb_d);
        logit = g.add(&logit, &fm);
    }
    if model.dense.wide().is_some() {
        let linear = g.gemm_t(&dense_x, &weight("wide"), &bias("wide"));
        let w = g.slice(&emb, 2, d, d + 1);
        let first_order = g.reduce_sum(&w, &[1], false);
        let wide = g.add(&linear, &first_order);
        logit = g.add(&logit, &wide);
    }
    if let Some(adapt) = model.dense.adapt() {
        // MTRM predicts from its adapt tower over [interaction, memory tower's logit].
        let a_in = g.concat(&[&inter, &logit], 1);
        logit = mlp(g, "adapt", adapt, &a_in);
    }
    if task_logits.is_empty() {
        return logit;
    }
    let mut all = vec![logit.as_str()];
    all.extend(task_logits.iter().map(String::as_str));
    g.concat(&all, 1)
}

/// The embedding slots `[batch, slots, width]`: single ids, then pooled lists (a
/// history pooled by target attention, by its unit).
fn embeddings(g: &mut Graph, model: &Dlrm, sig: &Signature, keys: &[Option<Vec<i64>>]) -> String {
    // A table's rows of the inputs' rows (a dynamic table's: of its keys).
    let lookup = |g: &mut Graph, t: usize, rows: &str| {
        let table = table_constant(&sig.tables[t].name);
        match &keys[t] {
            None => g.gather(&table, rows, 0),
            Some(keys) => {
                let unknown = keys.len() as i64;
                let index = g.key_to_index(rows, keys, unknown);
                g.gather(&table, &index, 0)
            }
        }
    };
    let batch = Dim::Named("batch");
    let mut slots = Vec::new();
    if !sig.singles.is_empty() {
        let rows = g.input(
            "sparse_rows",
            data_type::INT64,
            &[batch.clone(), Dim::Fixed(sig.singles.len())],
            "each single-id feature's row in its table (the side file says how)",
        );
        for (s, slot) in sig.singles.iter().enumerate() {
            let col = g.constant_i64("slot", &[1], &[s as i64]);
            let idx = g.gather(&rows, &col, 1);
            slots.push(lookup(g, slot.table, &idx));
        }
    }
    for (b, list) in sig.lists.iter().enumerate() {
        let dims = [batch.clone(), Dim::Fixed(list.max_len)];
        let rows = g.input(
            &sig.list_rows(b),
            data_type::INT64,
            &dims,
            "the list's ids' rows, padded with any row",
        );
        let weights = g.input(
            &sig.list_weights(b),
            data_type::FLOAT,
            &dims,
            "each id's weight (1 without a weight column), 0 on padding",
        );
        let vectors = lookup(g, list.table, &rows);
        let slot = sig.singles.len() + b;
        let unit = model
            .dense
            .attention()
            .iter()
            .enumerate()
            .find(|(_, u)| u.config.slot == slot);
        let d = model.dense.config().embedding_dim;
        let scale = match unit {
            Some((u, unit)) => {
                let query = slots[unit.config.query].clone();
                if let Some(t) = unit.transformer() {
                    let row = model.embeddings.dim();
                    let pooled = transformer_pool(g, u, t, &vectors, &query, &weights, d, row);
                    slots.push(pooled);
                    continue;
                }
                target_attention(g, u, unit, &vectors, &query, &weights, d)
            }
            None => pooling_scale(g, &weights, list.pooling),
        };
        let scale = g.unsqueeze(&scale, 2);
        let scaled = g.mul(&vectors, &scale);
        slots.push(g.reduce_sum(&scaled, &[1], true));
    }
    let refs: Vec<&str> = slots.iter().map(String::as_str).collect();
    g.concat(&refs, 1)
}

/// Each id's factor in its bag's vector: its weight, divided by the weights' sum (mean)
/// or their root sum of squares (sqrt-n); 0 when that is 0.
fn pooling_scale(g: &mut Graph, weights: &str, pooling: Pooling) -> String {
    let norm_of = |g: &mut Graph, total: String| {
        let zero = g.scalar("zero", 0.0);
        let positive = g.op("Greater", &[&total, &zero], vec![], None);
        let inverse = g.op("Reciprocal", &[&total], vec![], None);
        g.op("Where", &[&positive, &inverse, &zero], vec![], None)
    };
    match pooling {
        Pooling::Mean => {
            let total = g.reduce_sum(weights, &[1], true);
            let norm = norm_of(g, total);
            g.mul(weights, &norm)
        }
        Pooling::Sqrtn => {
            let squares = g.mul(weights, weights);
            let sum = g.reduce_sum(&squares, &[1], true);
            let total = g.op("Sqrt", &[&sum], vec![], None);
            let norm = norm_of(g, total);
            g.mul(weights, &norm)
        }
        // Attention pools by its unit; transformers are refused before the graph is built.
        Pooling::Sum | Pooling::Attention | Pooling::Transformer => weights.to_string(),
    }
}

/// DIN's weights `[batch, max_len]` of a history's items (`vectors [batch, max_len,
/// row]`) against the query slot (`[batch, 1, row]`): the unit's MLP scores `[h, q,
/// h − q, h ⊙ q]` of each item's first `d` floats; padding (weight 0) gets 0, and with
/// `softmax` the scores of the items present are normalized.
fn target_attention(
    g: &mut Graph,
    u: usize,
    unit: &elastrec_model::TargetAttention,
    vectors: &str,
    query: &str,
    weights: &str,
    d: usize,
) -> String {
    let cfg = &unit.config;
    let h = g.slice(vectors, 2, 0, d);
    let q = g.slice(query, 2, 0, d);
    let shape = g.op("Shape", &[&h], vec![], None);
    let q = g.op("Expand", &[&q, &shape], vec![], None);
    let diff = g.sub(&h, &q);
    let prod = g.mul(&h, &q);
    let x = g.concat(&[&h, &q, &diff, &prod], 2);
    let x = g.reshape(&x, &[-1, (4 * d) as i64]);
    let mlp_ = unit.din_mlp().expect("transformers are refused before");
    let scores = mlp(g, &format!("attention.{u}"), mlp_, &x);
    let scores = g.reshape(&scores, &[-1, cfg.max_len as i64]);
    let zero = g.scalar("zero", 0.0);
    let present = g.op("Greater", &[weights, &zero], vec![], None);
    if !cfg.softmax {
        return g.op("Where", &[&present, &scores, &zero], vec![], None);
    }
    let lowest = g.scalar("lowest", f32::MIN);
    let masked = g.op("Where", &[&present, &scores, &lowest], vec![], None);
    let p = g.softmax(&masked);
    g.op("Where", &[&present, &p, &zero], vec![], None)
}

/// BST's pooled slot `[batch, 1, row]` of a history (`vectors [batch, max_len, row]`,
/// items oldest first, padding weighing 0) and its candidate (`query [batch, 1, row]`):
/// the tokens are the items then the candidate, each plus the embedding of its recency
/// (the candidate 0, the newest item 1); each pre-norm encoder layer attends within the
/// row's present tokens; the candidate's last output is the slot's first `d` floats, the
/// items' mean first-order weight the rest.
#[allow(clippy::too_many_arguments)]
fn transformer_pool(
    g: &mut Graph,
    u: usize,
    t: &elastrec_model::transformer::SequenceTransformer,
    vectors: &str,
    query: &str,
    weights: &str,
    d: usize,
    row: usize,
) -> String {
    let cfg = t.config();
    let unit = format!("attention.{u}");
    let zero = g.scalar("zero", 0.0);
    let present = g.op("Greater", &[weights, &zero], vec![], None);
    let present_f = g.op(
        "Cast",
        &[&present],
        vec![int("to", data_type::FLOAT.into())],
        None,
    );
    let lens = g.reduce_sum(&present_f, &[1], true);
    let items = g.slice(vectors, 2, 0, d);
    let candidate = g.slice(query, 2, 0, d);
    let (items, candidate) = if cfg.positions {
        let table = format!("{unit}.positions");
        let max_len = (t.positions().len() / d) - 1;
        let steps: Vec<f32> = (0..max_len).map(|i| i as f32).collect();
        let steps = {
            let name = format!("{unit}.steps");
            g.constant_f32(&name, &[1, max_len], &steps)
        };
        // Item t of a row of `len` items is `len - t` places before the candidate.
        let recency = g.sub(&lens, &steps);
        let recency = g.relu(&recency);
        let recency = g.op(
            "Cast",
            &[&recency],
            vec![int("to", data_type::INT64.into())],
            None,
        );
        let item_pos = g.gather(&table, &recency, 0);
        let first = g.constant_i64("candidate", &[1], &[0]);
        let candidate_pos = g.gather(&table, &first, 0);
        (g.add(&items, &item_pos), g.add(&candidate, &candidate_pos))
    } else {
        (items, candidate)
    };
    let mut x = g.concat(&[&items, &candidate], 1);
    // Keys: the present items and the candidate; the others get a score no softmax keeps.
    let blocked = g.scalar("blocked", -1e9);
    let item_bias = g.op("Where", &[&present, &zero, &blocked], vec![], None);
    let first_col = g.slice(weights, 1, 0, 1);
    let candidate_bias = g.mul(&first_col, &zero);
    let bias = g.concat(&[&item_bias, &candidate_bias], 1);
    let bias = g.reshape(&bias, &[0, 1, 1, -1]);
    let (heads, hd) = (cfg.heads, d / cfg.heads);
    let scale = g.scalar("scale", 1.0 / (hd as f32).sqrt());
    for i in 0..t.blocks().len() {
        let block = params::encoder_layer(&unit, i);
        let xn = layer_norm(g, &x, &format!("{block}.norm1"));
        let split = |g: &mut Graph, name: &str, perm: &[i64]| {
            let y = token_linear(g, &xn, &format!("{block}.{name}"));
            let y = g.reshape(&y, &[0, 0, heads as i64, hd as i64]);
            g.transpose(&y, perm)
        };
        let q = split(g, "q", &[0, 2, 1, 3]);
        let k = split(g, "k", &[0, 2, 3, 1]);
        let v = split(g, "v", &[0, 2, 1, 3]);
        let scores = g.matmul(&q, &k);
        let scores = g.mul(&scores, &scale);
        let scores = g.add(&scores, &bias);
        let p = g.softmax(&scores);
        let c = g.matmul(&p, &v);
        let c = g.transpose(&c, &[0, 2, 1, 3]);
        let c = g.reshape(&c, &[0, 0, d as i64]);
        let o = token_linear(g, &c, &format!("{block}.o"));
        let y1 = g.add(&x, &o);
        let y1n = layer_norm(g, &y1, &format!("{block}.norm2"));
        let h = token_linear(g, &y1n, &format!("{block}.ffn1"));
        let h = g.relu(&h);
        let f = token_linear(g, &h, &format!("{block}.ffn2"));
        x = g.add(&y1, &f);
    }
    let last = g.constant_i64("candidate", &[1], &[(t.positions().len() / d - 1) as i64]);
    let out = g.gather(&x, &last, 1);
    if row == d {
        return out;
    }
    let first_order = g.slice(vectors, 2, d, row);
    let mask = g.unsqueeze(&present_f, 2);
    let first_order = g.mul(&first_order, &mask);
    let total = g.reduce_sum(&first_order, &[1], true);
    let lens = g.unsqueeze(&lens, 2);
    let mean = g.op("Div", &[&total, &lens], vec![], None);
    g.concat(&[&out, &mean], 2)
}

/// `x W^T + b` over the last axis of `x [.., in]` (layer `prefix`'s `W [out, in]`).
fn token_linear(g: &mut Graph, x: &str, prefix: &str) -> String {
    let w = g.transpose(&weight(prefix), &[1, 0]);
    let y = g.matmul(x, &w);
    g.add(&y, &bias(prefix))
}

/// Layer normalization over the last axis with `prefix.weight` and `prefix.bias`.
fn layer_norm(g: &mut Graph, x: &str, prefix: &str) -> String {
    g.op(
        "LayerNormalization",
        &[x, &weight(prefix), &bias(prefix)],
        vec![int("axis", -1), float("epsilon", EPS)],
        None,
    )
}

/// An MLP's layers over `x [batch, in]`: `Gemm`, then the layer's activation, or its norm
/// and a ReLU.
fn mlp(g: &mut Graph, name: &str, m: &Mlp, x: &str) -> String {
    let mut h = x.to_string();
    for (i, l) in m.layers.iter().enumerate() {
        let prefix = layer(name, i);
        h = g.gemm_t(&h, &weight(&prefix), &bias(&prefix));
        h = match l.act {
            Activation::None => h,
            Activation::Relu => g.relu(&h),
            Activation::Sigmoid => g.sigmoid(&h),
        };
        if let Some(norm) = m.norms.get(i) {
            let (scale, shift) = (norm_part(&prefix, "weight"), norm_part(&prefix, "bias"));
            h = match norm {
                Norm::Layer(_) => layer_norm(g, &h, &format!("{prefix}.norm")),
                Norm::Batch(_) => {
                    let mean = norm_part(&prefix, "running_mean");
                    let var = norm_part(&prefix, "running_var");
                    g.op(
                        "BatchNormalization",
                        &[&h, &scale, &shift, &mean, &var],
                        vec![float("epsilon", EPS)],
                        None,
                    )
                }
            };
            h = g.relu(&h);
        }
    }
    h
}

/// DLRM's dot interaction: `z` and each slot's vector as `T + 1` features, the dot
/// product of every pair `(i, j < i)` in elastrec's order, after `z`.
fn dot_interaction(g: &mut Graph, z: &str, emb: &str, t: usize) -> String {
    let zf = g.unsqueeze(z, 1);
    let features = g.concat(&[&zf, emb], 1);
    let transposed = g.transpose(&features, &[0, 2, 1]);
    let gram = g.matmul(&features, &transposed);
    let flat = g.reshape(&gram, &[0, -1]);
    let f = t + 1;
    let pairs: Vec<i64> = (1..f)
        .flat_map(|i| (0..i).map(move |j| (i * f + j) as i64))
        .collect();
    let idx = g.constant_i64("pairs", &[pairs.len()], &pairs);
    let dots = g.gather(&flat, &idx, 1);
    g.concat(&[z, &dots], 1)
}

/// The FM term `½ (‖Σ v‖² − Σ ‖v‖²)` of the slots `[batch, T, d]`, `[batch, 1]`.
fn fm_term(g: &mut Graph, emb: &str) -> String {
    let sum = g.reduce_sum(emb, &[1], false);
    let sum_sq = g.mul(&sum, &sum);
    let total = g.reduce_sum(&sum_sq, &[1], true);
    let sq = g.mul(emb, emb);
    let squares = g.reduce_sum(&sq, &[1, 2], false);
    let squares = g.unsqueeze(&squares, 1);
    let diff = g.sub(&total, &squares);
    let half = g.scalar("half", 0.5);
    g.mul(&diff, &half)
}
