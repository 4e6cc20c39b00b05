//! Models in the formats other tools read. ONNX Runtime runs the graph of `elastrec
//! export --format onnx` on the rows `elastrec eval --onnx-inputs` wrote and predicts
//! what `eval` predicted, for every model family; the safetensors package opens
//! `--format safetensors` and a DLRM rebuilt by hand from its tensors predicts the same.

mod common;

use std::path::{Path, PathBuf};

use common::{
    elastrec, elastrec_ok, gen_data, gen_named, gen_named_csv, named_features, python_json,
};
use elastrec_common::skip::python_imports;

/// Where a family's data comes from.
#[derive(Clone, Copy)]
enum Data {
    /// Criteo-layout TSV.
    Criteo,
    /// Criteo-layout TSV with a conversion label (two tasks).
    Conversions,
    /// `gen-data --named`: named columns, a bag and a history.
    Named,
}

/// One model family to export.
struct Family {
    name: &'static str,
    data: Data,
    /// Lines of `[model]`.
    model: &'static str,
    /// Lines of `[optimizer.sparse]`, if any.
    sparse: &'static str,
    /// Lines added to the named features' history (`Data::Named`).
    hist: &'static str,
}

const SMALL: &str = "embedding_dim = 8\nbottom_mlp = [16, 8]\ntop_mlp = [16, 1]\n";

/// Generates `data` once into `dir`; returns the data directory.
fn data_dir(root: &Path, data: Data) -> PathBuf {
    let (name, eval) = match data {
        Data::Criteo => ("criteo", "day_2.tsv"),
        Data::Conversions => ("conversions", "day_2.tsv"),
        Data::Named => ("named", "day_2.parquet"),
    };
    let dir = root.join(name);
    if !dir.join(eval).exists() {
        match data {
            Data::Criteo => drop(gen_data(&dir, 30_000, &[])),
            Data::Conversions => drop(gen_data(&dir, 30_000, &["--conversions"])),
            Data::Named => gen_named(&dir, 30_000),
        }
    }
    dir
}

/// Trains `family` on two days; returns its model file and the third day.
fn train(root: &Path, family: &Family) -> (PathBuf, PathBuf) {
    let data = data_dir(root, family.data);
    let ext = match family.data {
        Data::Named => "parquet",
        _ => "tsv",
    };
    let features = match family.data {
        Data::Named => named_features(family.hist),
        _ => String::new(),
    };
    let out = root.join(family.name);
    let sparse = if family.sparse.is_empty() {
        String::new()
    } else {
        format!("[optimizer.sparse]\n{}\n", family.sparse)
    };
    let job = root.join(format!("{}.toml", family.name));
    std::fs::write(
        &job,
        format!(
            "[data]\ndir = \"{}\"\ntrain = [\"day_0.{ext}\", \"day_1.{ext}\"]\n\
             eval = [\"day_2.{ext}\"]\n{features}\n[model]\n{SMALL}max_table_rows = 5000\n{}\n\
             {sparse}[train]\nprogress = false\n[output]\ndir = \"{}\"\n",
            data.display(),
            family.model,
            out.display()
        ),
    )
    .unwrap();
    elastrec_ok(&["train", job.to_str().unwrap()]);
    (out.join("model.bin"), data.join(format!("day_2.{ext}")))
}

/// `elastrec export` of `model` as `format` to `out`.
fn export(model: &Path, format: &str, out: &Path) {
    elastrec_ok(&[
        "export",
        "--model",
        model.to_str().unwrap(),
        "--format",
        format,
        "--out",
        out.to_str().unwrap(),
    ]);
}

/// `eval` of `model` on `data` with its predictions and ONNX inputs written to `dir`.
fn eval_with_inputs(model: &Path, data: &Path, dir: &Path) -> (PathBuf, PathBuf) {
    let (predictions, inputs) = (dir.join("predictions.csv"), dir.join("inputs.safetensors"));
    elastrec_ok(&[
        "eval",
        "--model",
        model.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--predictions",
        predictions.to_str().unwrap(),
        "--onnx-inputs",
        inputs.to_str().unwrap(),
    ]);
    (predictions, inputs)
}

#[test]
fn onnx_runtime_predicts_what_eval_predicts_for_every_family() {
    if !python_imports("ONNXRUNTIME", "onnxruntime, safetensors, numpy") {
        return;
    }
    let families = [
        Family {
            name: "dlrm",
            data: Data::Criteo,
            model: "",
            sparse: "",
            hist: "",
        },
        Family {
            name: "dcn-layer-norm",
            data: Data::Criteo,
            model: "type = \"dcn_v2\"\ncross_layers = 2\ninteraction = \"concat\"\nlayer_norm = true",
            sparse: "",
            hist: "",
        },
        Family {
            name: "deepfm-first-order-batch-norm",
            data: Data::Criteo,
            model: "type = \"deepfm\"\nfirst_order = true\nbatch_norm = true",
            sparse: "type = \"adagrad\"",
            hist: "",
        },
        Family {
            name: "wide-deep",
            data: Data::Criteo,
            model: "type = \"wide_deep\"",
            sparse: "type = \"adagrad\"",
            hist: "",
        },
        Family {
            name: "cgc",
            data: Data::Conversions,
            model: "type = \"mmoe\"\nmmoe = { tasks = 2, experts = 2, task_experts = 1, expert_mlp = [16] }",
            sparse: "",
            hist: "",
        },
        Family {
            name: "named-sum",
            data: Data::Named,
            model: "",
            sparse: "",
            hist: "max_len = 20\npooling = \"sum\"",
        },
        Family {
            name: "named-din",
            data: Data::Named,
            model: "",
            sparse: "",
            hist: "max_len = 20\npooling = \"attention\"\nquery = \"item_id\"",
        },
        Family {
            name: "named-din-softmax-first-order",
            data: Data::Named,
            model: "type = \"wide_deep\"\n[model.attention]\nsoftmax = true\nmlp = [8]",
            sparse: "type = \"adagrad\"",
            hist: "max_len = 20\npooling = \"attention\"\nquery = \"item_id\"",
        },
        Family {
            name: "named-transformer",
            data: Data::Named,
            model: "[model.transformer]\nheads = 2\nlayers = 2\nffn = 16",
            sparse: "",
            hist: "max_len = 20\npooling = \"transformer\"\nquery = \"item_id\"",
        },
        Family {
            name: "named-transformer-first-order",
            data: Data::Named,
            model: "type = \"wide_deep\"\n[model.transformer]\nheads = 1\nlayers = 1\nffn = 8\npositions = false",
            sparse: "type = \"adagrad\"",
            hist: "max_len = 20\npooling = \"transformer\"\nquery = \"item_id\"",
        },
        Family {
            name: "named-sqrtn",
            data: Data::Named,
            model: "interaction = \"concat\"",
            sparse: "",
            hist: "max_len = 20\npooling = \"sqrtn\"",
        },
    ];
    let tmp = tempfile::tempdir().unwrap();
    for family in &families {
        let (model, eval_file) = train(tmp.path(), family);
        let dir = tmp.path().join(format!("{}-export", family.name));
        std::fs::create_dir_all(&dir).unwrap();
        let onnx = dir.join("model.onnx");
        // The first family's tables go beside the graph, as a model past 1 GiB's would.
        let mut args = vec![
            "export",
            "--model",
            model.to_str().unwrap(),
            "--format",
            "onnx",
            "--out",
            onnx.to_str().unwrap(),
            "--json",
        ];
        if family.name == "dlrm" {
            args.push("--external-data");
        }
        let record: serde_json::Value = serde_json::from_slice(&elastrec_ok(&args).stdout).unwrap();
        assert_eq!(record["format"], "onnx", "{record}");
        assert_eq!(
            dir.join("model.onnx.data").exists(),
            family.name == "dlrm",
            "external data only when asked for"
        );
        let side: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("model.onnx.json")).unwrap())
                .unwrap();
        assert!(side["rows"].as_str().unwrap().contains("xxh3_64"), "{side}");
        let (predictions, inputs) = eval_with_inputs(&model, &eval_file, &dir);
        let got = python_json("onnx_predictions.py", &[&onnx, &inputs, &predictions]);
        eprintln!("{}: {got}", family.name);
        assert_eq!(got["rows"], 10_000, "{}: {got}", family.name);
        let tasks = if matches!(family.data, Data::Conversions) {
            2
        } else {
            1
        };
        assert_eq!(got["tasks"], tasks, "{}: {got}", family.name);
        let diff = got["max_abs_diff"].as_f64().unwrap();
        assert!(
            diff <= 1e-5,
            "{}: ONNX Runtime's probabilities differ from eval's by {diff}",
            family.name
        );
        // A model that predicts a constant would match trivially: this one does not.
        let mean = got["mean_probability"].as_f64().unwrap();
        assert!(mean > 0.01 && mean < 0.99, "{}: {got}", family.name);
        if matches!(family.data, Data::Named) {
            let names = got["inputs"].to_string();
            for want in ["genres_rows", "hist_items_weights", "sparse_rows", "dense"] {
                assert!(names.contains(want), "{}: {names}", family.name);
            }
        }
    }
}

#[test]
fn a_dlrm_rebuilt_from_the_safetensors_export_predicts_what_eval_predicts() {
    if !python_imports("SAFETENSORS", "safetensors, numpy") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let family = Family {
        name: "dlrm",
        data: Data::Criteo,
        model: "",
        sparse: "",
        hist: "",
    };
    let (model, eval_file) = train(tmp.path(), &family);
    let tensors = tmp.path().join("model.safetensors");
    let out = elastrec_ok(&[
        "export",
        "--model",
        model.to_str().unwrap(),
        "--format",
        "safetensors",
        "--out",
        tensors.to_str().unwrap(),
    ]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("wrote"));
    let (predictions, inputs) = eval_with_inputs(&model, &eval_file, tmp.path());
    let got = python_json("safetensors_dlrm.py", &[&tensors, &inputs, &predictions]);
    eprintln!("safetensors: {got}");
    assert_eq!(got["rows"], 10_000);
    // 26 tables, the standardization, 2 + 2 layers of weights and biases.
    assert_eq!(got["tensors"], 26 + 2 + 8, "{got}");
    let diff = got["max_abs_diff"].as_f64().unwrap();
    assert!(diff <= 1e-5, "the rebuilt DLRM differs from eval by {diff}");
}

/// Dynamic tables (collision-free keys) export their stored rows with their keys: the
/// ONNX graph turns each id's key into its row, and on the rows it trained on (every id
/// admitted, none evicted) ONNX Runtime predicts what `eval` predicts; the safetensors
/// file holds each table's keys beside its rows.
#[test]
fn dynamic_tables_export_their_stored_rows_and_keys() {
    if !python_imports("ONNXRUNTIME", "onnxruntime, safetensors, numpy") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    gen_data(&tmp.path().join("criteo"), 3_000, &[]);
    let family = Family {
        name: "dynamic",
        data: Data::Criteo,
        model: "table_rows = \"auto\"\n[model.dynamic_embeddings]\nadmit_count = 1",
        sparse: "",
        hist: "",
    };
    let (model, eval_file) = train(tmp.path(), &family);
    let trained_on = eval_file.with_file_name("day_1.tsv");
    let onnx = tmp.path().join("dynamic.onnx");
    export(&model, "onnx", &onnx);
    let (predictions, inputs) = eval_with_inputs(&model, &trained_on, tmp.path());
    let got = python_json("onnx_predictions.py", &[&onnx, &inputs, &predictions]);
    eprintln!("dynamic: {got}");
    let rows = std::fs::read_to_string(&trained_on)
        .unwrap()
        .lines()
        .count();
    assert_eq!(got["rows"], rows, "{got}");
    let diff = got["max_abs_diff"].as_f64().unwrap();
    assert!(
        diff <= 1e-5,
        "ONNX Runtime differs from eval by {diff}: {got}"
    );
    let mean = got["mean_probability"].as_f64().unwrap();
    assert!(mean > 0.01 && mean < 0.99, "{got}");

    let tensors = tmp.path().join("dynamic.safetensors");
    export(&model, "safetensors", &tensors);
    let tables = python_json("safetensors_keys.py", &[&tensors]);
    let tables = tables.as_object().unwrap();
    assert_eq!(tables.len(), 26, "{tables:?}");
    for (name, t) in tables {
        assert_eq!(t["dtype"], "uint64", "{name}: {t}");
        assert_eq!(
            t["rows"].as_u64(),
            t["keys"].as_u64().map(|k| k + 1),
            "{name}: {t}"
        );
        assert!(t["keys"].as_u64().unwrap() > 0, "{name}: {t}");
        assert_eq!(t["distinct"], true, "{name}: {t}");
        assert_eq!(t["last_row_zero"], true, "{name}: {t}");
    }
}

#[test]
fn exports_that_cannot_be_written_say_why() {
    let tmp = tempfile::tempdir().unwrap();
    // A model file that is not one.
    let bogus = tmp.path().join("model.bin");
    std::fs::write(&bogus, b"not a model").unwrap();
    let out = elastrec(&[
        "export",
        "--model",
        bogus.to_str().unwrap(),
        "--format",
        "onnx",
        "--out",
        tmp.path().join("m.onnx").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("model.bin"), "{err}");
    assert!(!tmp.path().join("m.onnx").exists());
    // A model file is already `bin`.
    let out = elastrec(&[
        "export",
        "--model",
        bogus.to_str().unwrap(),
        "--out",
        tmp.path().join("m.bin").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--format onnx or safetensors"));
    // Neither a model nor a checkpoint.
    let out = elastrec(&["export", "--format", "onnx", "--out", "m.onnx"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--checkpoint"));
}

/// Exports `model` as ONNX with `--raw-dense` to `dir/model.onnx`, then runs it in ONNX
/// Runtime on `data`'s own dense columns (empty fields as NaN) with the other inputs
/// from `eval --onnx-inputs`; returns what `onnx_predictions.py` measured.
fn raw_dense_predictions(model: &Path, data: &Path, dir: &Path) -> serde_json::Value {
    std::fs::create_dir_all(dir).unwrap();
    let onnx = dir.join("model.onnx");
    elastrec_ok(&[
        "export",
        "--model",
        model.to_str().unwrap(),
        "--format",
        "onnx",
        "--raw-dense",
        "--out",
        onnx.to_str().unwrap(),
    ]);
    let (predictions, inputs) = eval_with_inputs(model, data, dir);
    python_json("onnx_predictions.py", &[&onnx, &inputs, &predictions, data])
}

/// `export --raw-dense`: the graph takes the dense columns as a service logs them (NaN
/// for a null) and applies their transforms itself: the Criteo preset's `ln(1 + max(x,
/// 0))`, and a named feature's `log1p` or own chain (`fill_null`, `clamp`, `log1p`,
/// `logit`, `box_cox`), or a `[[preprocess]]` graph's one-column numeric chain. ONNX
/// Runtime fed the data files' raw columns predicts what `eval` predicts within 1e-5,
/// nulls included; a dense feature the graph cannot compute (a one-hot) is refused,
/// saying what to do.
#[test]
fn raw_dense_columns_are_transformed_inside_the_onnx_graph() {
    if !python_imports("ONNXRUNTIME", "onnxruntime, safetensors, numpy") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let criteo = Family {
        name: "raw-criteo",
        data: Data::Criteo,
        model: "",
        sparse: "",
        hist: "",
    };
    let (model, day) = train(tmp.path(), &criteo);
    let got = raw_dense_predictions(&model, &day, &tmp.path().join("raw-criteo-export"));
    eprintln!("criteo: {got}");
    assert_eq!(got["rows"], 10_000, "{got}");
    assert!(got["dense_nulls"].as_u64().unwrap() > 0, "{got}");
    assert!(got["max_abs_diff"].as_f64().unwrap() <= 1e-5, "{got}");

    let data = tmp.path().join("named-csv");
    gen_named_csv(&data, 30000, 3);
    let out = tmp.path().join("raw-named");
    let job = tmp.path().join("raw-named.toml");
    let dense = [
        ("price_plain", ""),
        ("price_log", "transform = \"log1p\""),
        (
            "price_chain",
            "ops = [\"fill_null(3)\", \"clamp(max = 200)\", \"log1p\"]",
        ),
        ("price_bc", "ops = [\"box_cox(0.5)\"]"),
        (
            "price_logit",
            "ops = [\"clamp(min = 0, max = 2)\", \"fill_null(0.5)\", \"logit(0.01)\"]",
        ),
    ]
    .map(|(name, line)| {
        format!(
            "[[data.feature]]\nname = \"{name}\"\ncolumn = \"price\"\nkind = \"dense\"\n{line}\n"
        )
    })
    .concat();
    std::fs::write(
        &job,
        format!(
            "[data]\ndir = \"{}\"\ntrain = [\"day_0.csv\", \"day_1.csv\"]\neval = [\"day_2.csv\"]\n\
             label = \"click\"\n[[data.feature]]\nname = \"item_id\"\nkind = \"categorical\"\n\
             {dense}[model]\n{SMALL}max_table_rows = 5000\n[train]\nprogress = false\n\
             [output]\ndir = \"{}\"\n",
            data.display(),
            out.display()
        ),
    )
    .unwrap();
    elastrec_ok(&["train", job.to_str().unwrap()]);
    let model = out.join("model.bin");
    let got = raw_dense_predictions(
        &model,
        &data.join("day_2.csv"),
        &tmp.path().join("raw-named-export"),
    );
    eprintln!("named: {got}");
    assert_eq!(got["rows"], 10_000, "{got}");
    assert!(got["dense_nulls"].as_u64().unwrap() > 0, "{got}");
    assert!(got["max_abs_diff"].as_f64().unwrap() <= 1e-5, "{got}");

    // A [[preprocess]] graph's one-column numeric chains are in the graph too; a dense
    // feature of several columns (a one-hot) is refused, saying what to do.
    let criteo_data = data_dir(tmp.path(), Data::Criteo);
    let preprocess_job = |name: &str, extra: &str| {
        let job = tmp.path().join(format!("{name}.toml"));
        std::fs::write(
            &job,
            format!(
                "[data]\ndir = \"{}\"\ntrain = [\"day_0.tsv\"]\neval = [\"day_2.tsv\"]\n\
                 [model]\n{SMALL}max_table_rows = 5000\n\
                 [[preprocess]]\ninput = \"I1..I12\"\nops = [\"fill_null(1)\", \"clamp(max = 1000)\", \"log1p\"]\n\
                 [[preprocess]]\ninput = \"I13\"\nops = [\"cast(float)\", \"box_cox(0.5)\"]\n\
                 {extra}[[preprocess]]\ninput = \"C1..C26\"\n\
                 [train]\nprogress = false\n[output]\ndir = \"{}\"\n",
                criteo_data.display(),
                tmp.path().join(name).display()
            ),
        )
        .unwrap();
        elastrec_ok(&["train", job.to_str().unwrap()]);
        tmp.path().join(name).join("model.bin")
    };
    let model = preprocess_job("pre", "");
    let got = raw_dense_predictions(
        &model,
        &criteo_data.join("day_2.tsv"),
        &tmp.path().join("pre-export"),
    );
    eprintln!("preprocess: {got}");
    assert_eq!(got["rows"], 10_000, "{got}");
    assert!(got["dense_nulls"].as_u64().unwrap() > 0, "{got}");
    assert!(got["max_abs_diff"].as_f64().unwrap() <= 1e-5, "{got}");
    let model = preprocess_job(
        "onehot",
        "[[preprocess]]\nname = \"I5_bands\"\ninput = \"I5\"\n\
         ops = [\"fill_null(0)\", \"bucketize([1, 10])\", \"onehot(3)\"]\n",
    );
    let onehot_onnx = tmp.path().join("onehot.onnx");
    let refused = elastrec(&[
        "export",
        "--model",
        model.to_str().unwrap(),
        "--format",
        "onnx",
        "--raw-dense",
        "--out",
        onehot_onnx.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{err}");
    assert!(
        err.contains("I5_bands") && err.contains("export without --raw-dense"),
        "{err}"
    );
    assert!(
        !onehot_onnx.exists(),
        "nothing is written for a refused export"
    );
}
