//! Models no quick `train` run makes (an MTRM's adapt tower; cross layers with every
//! option; a three-task head with batch norms), randomly initialized, exported as ONNX
//! and run by ONNX Runtime on generated rows: its probabilities equal elastrec's own.

use std::path::Path;
use std::process::Command;

use elastrec_common::splitmix::derive;
use elastrec_data::{Batch, FeatureSource};
use elastrec_export::{onnx, Inputs, OnnxOptions, Signature};
use elastrec_job::config::{JobConfig, MmoeSettings, ModelType};
use elastrec_worker::{Dlrm, Predictor};

const ROWS: usize = 300;

/// `ROWS` rows of the Criteo layout with every id spread over `0..5000`, dense values
/// after `log1p` in `0..5`, and `tasks` labels.
fn batch(tasks: usize) -> Batch {
    let u = |k: u64| derive(17, k);
    Batch {
        labels: (0..ROWS).map(|r| (u(r as u64) % 2) as f32).collect(),
        tasks,
        task_labels: vec![0.0; ROWS * (tasks - 1)],
        weights: Vec::new(),
        dense: (0..ROWS * 13)
            .map(|i| (u(1 << 40 | i as u64) % 5000) as f32 / 1000.0)
            .collect(),
        sparse: (0..ROWS * 26)
            .map(|i| u(2 << 40 | i as u64) % 5000)
            .collect(),
        dense_width: 13,
        sparse_width: 26,
        bags: Vec::new(),
    }
}

/// Exports `job`'s freshly initialized model and checks ONNX Runtime against it.
fn check(name: &str, job: &JobConfig) {
    if !elastrec_common::skip::python_imports("ONNXRUNTIME", "onnxruntime, safetensors, numpy") {
        return;
    }
    let mut model = Dlrm::new(job, vec![5000; 26]).unwrap();
    let tasks = model.dense.tasks();
    let b = batch(tasks);
    if model.embeddings.config().dynamic.is_some() {
        // Every id of the rows gets a slot, as its first update gives it: a zero gradient
        // admits it and leaves its initial value.
        let zeros = vec![0.0; b.sparse.len() * model.embeddings.dim()];
        let mut scratch = elastrec_embedding::UpdateScratch::new();
        model
            .embeddings
            .apply_gradients(&b.sparse, &zeros, &mut scratch)
            .unwrap();
    }
    let mut want = Vec::new();
    Predictor::new(&model, ROWS)
        .predict_tasks(&model, &b, &mut want)
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let graph = tmp.path().join("model.onnx");
    onnx::write(
        &model,
        FeatureSource::Criteo,
        &graph,
        OnnxOptions::default(),
    )
    .unwrap();
    let mut inputs = Inputs::new(Signature::of(&model, FeatureSource::Criteo).unwrap());
    inputs.push(&b).unwrap();
    inputs
        .write(&tmp.path().join("inputs.safetensors"))
        .unwrap();
    let expected: Vec<String> = want.iter().map(f32::to_string).collect();
    std::fs::write(tmp.path().join("want.txt"), expected.join("\n")).unwrap();
    let diff = max_difference(tmp.path());
    eprintln!("{name}: {tasks} task(s), largest difference {diff:e}");
    assert!(diff <= 1e-5, "{name}: ONNX Runtime differs by {diff}");
}

/// ONNX Runtime's probabilities of `dir`'s graph and inputs against `want.txt`.
fn max_difference(dir: &Path) -> f64 {
    let script = r#"
import sys, numpy as np, onnxruntime as ort
from safetensors.numpy import load_file
d = sys.argv[1]
s = ort.InferenceSession(d + "/model.onnx", providers=["CPUExecutionProvider"])
x = load_file(d + "/inputs.safetensors")
p = s.run(["probability"], {i.name: x[i.name] for i in s.get_inputs()})[0]
want = np.loadtxt(d + "/want.txt").reshape(p.shape)
print(float(np.abs(p.astype(np.float64) - want).max()))
"#;
    let out = Command::new("python3")
        .args(["-c", script, dir.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

fn small() -> JobConfig {
    let mut job = JobConfig::default();
    job.model.embedding_dim = 8;
    job.model.bottom_mlp = vec![16, 8];
    job.model.top_mlp = vec![16, 1];
    job
}

#[test]
fn an_mtrm_predicts_from_its_adapt_tower_in_onnx_as_in_elastrec() {
    let mut job = small();
    job.model.adapt_mlp = vec![12, 1];
    check("mtrm", &job);
}

#[test]
fn cross_layers_with_first_order_norms_and_standardization_match() {
    let mut job = small();
    job.model.model_type = ModelType::DcnV2;
    job.model.cross_layers = 2;
    job.model.first_order = true;
    job.model.layer_norm = true;
    job.model.dense_mean = (0..13).map(|i| i as f32 * 0.1).collect();
    job.model.dense_std = (0..13).map(|i| 1.0 + i as f32 * 0.2).collect();
    check("dcn-v2", &job);
}

#[test]
fn a_three_task_head_with_batch_norms_matches_on_every_task() {
    let mut job = small();
    job.model.model_type = ModelType::Mmoe;
    job.model.batch_norm = true;
    job.model.mmoe = Some(MmoeSettings {
        tasks: 3,
        experts: 3,
        expert_mlp: vec![16, 8],
        ..MmoeSettings::default()
    });
    check("mmoe", &job);
}

/// Dynamic tables (collision-free keys): the graph reads each id's 64-bit key and finds
/// its stored row with ONNX-ML's `LabelEncoder`, then computes what elastrec computes.
#[test]
fn dynamic_tables_find_their_keys_rows_in_onnx_as_in_elastrec() {
    let mut job = small();
    job.model.dynamic_embeddings = Some(elastrec_embedding::DynamicConfig::default());
    check("dynamic", &job);
}
