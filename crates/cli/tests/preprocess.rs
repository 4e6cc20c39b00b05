//! `[[preprocess]]` end to end: a job with its own feature graph trains in one process and
//! on a cluster (workers and data executors read through the graph), its `model.bin`
//! carries the graph, `elastrec preprocess` writes the features, and a bad graph is
//! refused naming the entry and the op.

mod common;

use std::fs::File;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, UInt64Type};
use common::*;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

/// Dense: the default transform written out, a bucketized one-hot; sparse: the raw
/// categorical columns, a bucketized integer and a hashed cross.
const GRAPH: &str = r#"
[[preprocess]]
input = "I1..I13"
ops = ["fill_null(0)", "clamp(min=0)", "log1p"]

[[preprocess]]
name = "I11_onehot"
input = "I11"
ops = ["fill_null(0)", "bucketize([1, 2, 4])", "onehot(4)"]

[[preprocess]]
input = "C1..C26"

[[preprocess]]
name = "I5_bucket"
input = "I5"
ops = ["fill_null(0)", "bucketize([1, 10, 100, 1000, 10000])"]

[[preprocess]]
input = ["C1", "C2"]
ops = ["ngram(2)", "sigrid_hash(salt=1, mod=5000)"]
"#;

fn graph_job(name: &str, cluster: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    write_job_file(name, &(job_text(name, cluster) + GRAPH))
}

fn summary(dir: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap()
}

#[test]
fn a_job_with_its_own_graph_trains_and_its_model_applies_the_graph() {
    let (job, dir) = graph_job("graph-train", "");
    elastrec_ok(&["train", job.to_str().unwrap()]);
    let s = summary(&dir);
    let auc = s["eval"]["auc"].as_f64().unwrap();
    // The graph keeps every default feature and adds three: as good as the default
    // graph on this data, within the run-to-run spread of a different model.
    assert!(
        auc > fixture().baseline_auc - 0.01,
        "AUC {auc:.4} with the graph, {:.4} with the default one",
        fixture().baseline_auc
    );
    // 13 + 4 dense inputs and 26 + 2 tables: the model follows the graph.
    assert_eq!(s["table_rows"].as_array().unwrap().len(), 28, "{s}");
    // model.bin carries the graph: evaluated alone on raw rows it scores what the job did.
    let e = eval_model(&dir.join("model.bin"));
    assert!(
        (e["auc"].as_f64().unwrap() - auc).abs() < 1e-9,
        "model.bin {e} vs the job's {auc}"
    );
}

#[test]
fn workers_and_data_executors_read_through_the_graph_and_the_ledger_is_exact() {
    let _g = serial();
    let cluster = "[cluster]\nps = 2\nworkers = 2\nexecutors = 1\nheartbeat_ms = 200\n";
    let (job, dir) = graph_job("graph-run", cluster);
    let log = dir.with_extension("log");
    let mut g = Group::spawn(&["run", job.to_str().unwrap()], &log);
    g.wait_success(&log);
    check_result(&dir, &log, 0.01);
    let r = result(&dir);
    check_saved_model(&dir, &r, &eval_day());
}

#[test]
fn elastrec_preprocess_writes_the_features_as_parquet() {
    let (job, _) = graph_job("graph-materialize", "");
    let out_dir = fixture().dir.join("graph-features");
    elastrec_ok(&[
        "preprocess",
        "--job",
        job.to_str().unwrap(),
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    let day = fixture().dir.join("data/day_0.tsv");
    let (plain, _) = elastrec_data::read_all(&day, elastrec_data::BadRowPolicy::Fail).unwrap();

    let file = File::open(out_dir.join("day_0.parquet")).unwrap();
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap();
    let mut rows = 0;
    for batch in reader {
        let batch = batch.unwrap();
        let col = |name: &str| {
            batch
                .column_by_name(name)
                .unwrap_or_else(|| panic!("column {name}"))
        };
        for r in 0..batch.num_rows() {
            let at = rows + r;
            // I1..I13 went through the default transform: the plain reader's values.
            for i in 0..13 {
                let v = col(&format!("I{}", i + 1))
                    .as_primitive::<Float32Type>()
                    .value(r);
                assert_eq!(
                    v.to_bits(),
                    plain.dense_row(at)[i].to_bits(),
                    "row {at} I{}",
                    i + 1
                );
            }
            // The raw categorical ids, as the plain reader gives them.
            for j in 0..26 {
                let v = col(&format!("C{}", j + 1))
                    .as_primitive::<UInt64Type>()
                    .value(r);
                assert_eq!(v, plain.sparse_row(at)[j], "row {at} C{}", j + 1);
            }
            // A one-hot has exactly one 1.
            let hot: f32 = (0..4)
                .map(|k| {
                    col(&format!("I11_onehot.{k}"))
                        .as_primitive::<Float32Type>()
                        .value(r)
                })
                .sum();
            assert_eq!(hot, 1.0, "row {at}");
            assert!(col("I5_bucket").as_primitive::<UInt64Type>().value(r) <= 5);
            // A cross of an empty field is the shared missing id, as the model sees it.
            let cross = col("C1_C2").as_primitive::<UInt64Type>().value(r);
            assert!(
                cross < 5000 || cross == elastrec_data::MISSING_CATEGORY,
                "{cross}"
            );
            assert_eq!(
                col("label").as_primitive::<Float32Type>().value(r),
                plain.labels[at]
            );
        }
        rows += batch.num_rows();
    }
    assert_eq!(rows, plain.len());
    let features: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("features.json")).unwrap())
            .unwrap();
    assert_eq!(features["dense_width"], 17);
    assert_eq!(features["sparse_width"], 28);
    assert!(out_dir.join("day_2.parquet").exists(), "the eval day too");

    // --explain: the compiled graph, nothing written.
    let out = elastrec(&["preprocess", "--job", job.to_str().unwrap(), "--explain"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("42 features: 17 dense columns, 28 sparse columns"),
        "{text}"
    );
    assert!(
        text.contains("I11_onehot") && text.contains("floats(4)"),
        "{text}"
    );
    assert!(text.contains("fused steps"), "{text}");
}

#[test]
fn a_bad_graph_is_refused_when_the_job_loads_naming_the_entry_and_the_op() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "[[preprocess]]\ninput = \"C1\"\n[[preprocess]]\ninput = \"I2\"\nops = [\"fill_null(0)\", \"logp1\"]\n",
            "[[preprocess]] entry 2 (I2), op 2 `logp1`: unknown operator `logp1`",
        ),
        (
            "[[preprocess]]\ninput = \"C1\"\n[[preprocess]]\ninput = \"I2\"\nops = [\"bucketize([10, 1])\"]\n",
            "strictly increasing",
        ),
        (
            "[[preprocess]]\ninput = \"C1\"\n[[preprocess]]\ninput = \"C2\"\nops = [\"log1p\"]\n",
            "log1p takes int or float, not id",
        ),
        (
            "[[preprocess]]\ninput = \"C1\"\n[[preprocess]]\ninput = \"I14\"\nops = [\"log1p\"]\n",
            "no input column `I14`",
        ),
        ("[[preprocess]]\ninput = \"C1\"\n", "no entry produces a dense feature"),
    ];
    for (i, (graph, want)) in cases.iter().enumerate() {
        let job = dir.path().join(format!("bad{i}.toml"));
        std::fs::write(&job, format!("[data]\ndir = \"data\"\n{graph}")).unwrap();
        let out = elastrec(&["train", job.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(err.contains(want), "case {i}: {err}");
        assert!(
            err.contains("preprocess"),
            "case {i} names the section: {err}"
        );
    }
}
