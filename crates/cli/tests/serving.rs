//! `elastrec serve` end to end: a trained model served over HTTP/JSON and gRPC predicts
//! what the model file predicts; bad requests, pushes and files get clear errors while
//! the server keeps serving. Deltas pushed by an online job are tested in `online.rs`.

mod common;

use std::process::Command;

use common::*;

const TOKEN: &str = "servetoken1";

fn proto_rows(rows: &[elastrec_data::RawRow]) -> Vec<elastrec_proto::serve::Row> {
    rows.iter()
        .map(elastrec_serve::features::proto_row)
        .collect()
}

#[test]
fn a_trained_model_is_served_over_http_and_grpc_with_the_files_predictions() {
    let f = fixture();
    let model = f.dir.join("single/model.bin");
    let log = f.dir.join("serve-trained.log");
    let s = start_server(
        &[model.to_str().unwrap(), "--max-batch", "64"],
        Some(TOKEN),
        &log,
    );
    let (rows, body) = request_rows(&f.dir.join("data/day_2.tsv"), 40);
    let want = file_predictions(&model, &rows);

    let (code, reply) = http(&s.http, "POST", "/v1/predict", None, &body);
    assert_eq!(code, 200, "{reply}");
    let (got, checkpoint) = predictions(&reply);
    assert_eq!(
        checkpoint,
        serde_json::Value::Null,
        "a train model has no checkpoint"
    );
    assert_eq!(got.len(), rows.len());
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() < 1e-6, "served {g}, the file predicts {w}");
    }
    // Distinct rows get distinct scores: the features reached the model.
    assert!(got.iter().any(|&p| (p - got[0]).abs() > 1e-3), "{got:?}");

    // gRPC answers the same.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let grpc = rt.block_on(async {
        let mut c = elastrec_proto::serve::predictor_client::PredictorClient::connect(format!(
            "http://{}",
            s.grpc
        ))
        .await
        .unwrap();
        let ok = c
            .predict(elastrec_proto::serve::PredictRequest {
                rows: proto_rows(&rows),
            })
            .await
            .unwrap()
            .into_inner();
        let mut bad = proto_rows(&rows[..1]);
        bad[0].features.remove("C9");
        let err = c
            .predict(elastrec_proto::serve::PredictRequest { rows: bad })
            .await
            .unwrap_err();
        (ok, err)
    });
    assert_eq!(grpc.0.probabilities, got);
    assert_eq!(grpc.1.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        grpc.1.message(),
        "row 0: missing feature C9 (send null for an empty field)"
    );

    // Bad requests: 400 naming the row and feature.
    let mut doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
    doc["rows"][3].as_object_mut().unwrap().remove("I7");
    let (code, reply) = http(
        &s.http,
        "POST",
        "/v1/predict",
        None,
        &serde_json::to_vec(&doc).unwrap(),
    );
    assert_eq!(
        (code, reply.as_str()),
        (
            400,
            r#"{"error":"row 3: missing feature I7 (send null for an empty field)"}"#
        )
    );
    doc["rows"][3]["I7"] = serde_json::json!("12");
    let (code, reply) = http(
        &s.http,
        "POST",
        "/v1/predict",
        None,
        &serde_json::to_vec(&doc).unwrap(),
    );
    assert_eq!(code, 400);
    assert!(
        reply.contains("row 3: feature I7: must be an integer or null, got a string"),
        "{reply}"
    );
    doc["rows"][3]["I7"] = serde_json::json!(12);
    doc["rows"][3]["C30"] = serde_json::json!("00000000");
    let (code, reply) = http(
        &s.http,
        "POST",
        "/v1/predict",
        None,
        &serde_json::to_vec(&doc).unwrap(),
    );
    assert_eq!(code, 400);
    assert!(reply.contains("row 3: unknown feature `C30`"), "{reply}");
    let (_, too_many) = request_rows(&f.dir.join("data/day_2.tsv"), 65);
    let (code, reply) = http(&s.http, "POST", "/v1/predict", None, &too_many);
    assert_eq!(code, 400);
    assert!(
        reply.contains("65 rows in one request; this server takes at most 64"),
        "{reply}"
    );

    // Pushes need the token, and a cut model file is refused.
    let bytes = std::fs::read(&model).unwrap();
    let (code, _) = http(&s.http, "PUT", "/v1/model", None, &bytes);
    assert_eq!(code, 401);
    let (code, reply) = http(
        &s.http,
        "PUT",
        "/v1/model",
        Some(TOKEN),
        &bytes[..bytes.len() / 2],
    );
    assert_eq!(code, 400);
    assert!(reply.contains("checksum mismatch"), "{reply}");
    let (code, reply) = http(&s.http, "POST", "/v1/delta", Some(TOKEN), &bytes);
    assert_eq!(code, 400);
    assert!(
        reply.contains("a model file where a model delta file was expected"),
        "{reply}"
    );

    // The server kept serving the same model through all of it.
    let (code, reply) = http(&s.http, "POST", "/v1/predict", None, &body);
    assert_eq!(code, 200);
    assert_eq!(predictions(&reply).0, got);
    let (code, info) = http(&s.http, "GET", "/v1/model", None, b"");
    assert_eq!(code, 200);
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["requests"], 3, "{info}");
    assert_eq!(info["rows"], 3 * rows.len(), "{info}");
    assert_eq!(info["refused"], 5, "{info}");
    assert_eq!(info["models"], 0, "{info}");
}

fn serve_fails(args: &[&str]) -> String {
    let out = Command::new(exe())
        .arg("serve")
        .args(args)
        .env_remove("ELASTREC_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success(), "elastrec serve {args:?} started");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn bad_model_files_busy_ports_and_open_binds_are_refused() {
    let f = fixture();
    let model = f.dir.join("single/model.bin");
    let bytes = std::fs::read(&model).unwrap();
    let cut = f.dir.join("serve-cut.bin");
    std::fs::write(&cut, &bytes[..bytes.len() - 100]).unwrap();
    let err = serve_fails(&[cut.to_str().unwrap()]);
    assert!(
        err.contains("serve-cut.bin") && err.contains("checksum mismatch"),
        "{err}"
    );
    let mut other = bytes.clone();
    other[16..20].copy_from_slice(&7u32.to_le_bytes());
    let n = other.len() - 8;
    let sum = xxhash_rust::xxh3::xxh3_64(&other[..n]);
    other[n..].copy_from_slice(&sum.to_le_bytes());
    let newer = f.dir.join("serve-newer.bin");
    std::fs::write(&newer, &other).unwrap();
    let err = serve_fails(&[newer.to_str().unwrap()]);
    assert!(
        err.contains("format version 7; this build reads 1"),
        "{err}"
    );

    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().to_string();
    let err = serve_fails(&[model.to_str().unwrap(), "--listen", &port]);
    assert!(
        err.contains(&format!("binding the HTTP endpoint to {port}")),
        "{err}"
    );

    let err = serve_fails(&[model.to_str().unwrap(), "--listen", "0.0.0.0:0"]);
    assert!(
        err.contains("beyond loopback, needs a token: set ELASTREC_TOKEN"),
        "{err}"
    );
}

/// Every row of a Parquet file with named columns as a JSON request row (lists as
/// arrays), with its label.
fn named_json_rows(file: &std::path::Path) -> (Vec<serde_json::Value>, Vec<u8>) {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float64Type, Int32Type, Int64Type};
    use arrow_array::Array;
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
        std::fs::File::open(file).unwrap(),
    )
    .unwrap()
    .build()
    .unwrap();
    let (mut rows, mut labels) = (Vec::new(), Vec::new());
    for b in reader {
        let b = b.unwrap();
        let schema = b.schema();
        for r in 0..b.num_rows() {
            let mut m = serde_json::Map::new();
            for (field, col) in schema.fields().iter().zip(b.columns()) {
                let v = if col.is_null(r) {
                    serde_json::Value::Null
                } else {
                    match col.data_type() {
                        arrow_schema::DataType::Int32 => {
                            serde_json::json!(col.as_primitive::<Int32Type>().value(r))
                        }
                        arrow_schema::DataType::Int64 => {
                            serde_json::json!(col.as_primitive::<Int64Type>().value(r))
                        }
                        arrow_schema::DataType::Float64 => {
                            serde_json::json!(col.as_primitive::<Float64Type>().value(r))
                        }
                        arrow_schema::DataType::Utf8 => {
                            serde_json::json!(col.as_string::<i32>().value(r))
                        }
                        arrow_schema::DataType::List(_) => {
                            let items = col.as_list::<i32>().value(r);
                            let items = items.as_string::<i32>();
                            serde_json::json!(items.iter().collect::<Vec<_>>())
                        }
                        other => panic!("column {} of type {other}", field.name()),
                    }
                };
                if field.name() == "click" {
                    labels.push(u8::from(v == serde_json::json!(1)));
                }
                m.insert(field.name().clone(), v);
            }
            rows.push(serde_json::Value::Object(m));
        }
    }
    (rows, labels)
}

/// A model trained on named features (string ids, a genre list, a click history) is
/// served: requests name its columns and send lists as arrays, and the predictions over
/// the evaluation day give exactly `elastrec eval`'s AUC; a row missing a feature or
/// with a wrong type is refused naming both.
#[test]
fn a_named_feature_model_serves_json_rows_with_lists() {
    serve_named("serve-named", "label = \"click\"");
}

/// As [`a_named_feature_model_serves_json_rows_with_lists`], with the click history read
/// by a transformer against the candidate item: each request row's history list goes
/// through the encoder.
#[test]
fn a_history_read_by_a_transformer_is_served_from_each_rows_list() {
    serve_named(
        "serve-transformer",
        &named_features("max_len = 20\npooling = \"transformer\"\nquery = \"item_id\""),
    );
}

/// As [`a_named_feature_model_serves_json_rows_with_lists`], with features that carry
/// their own operator chains (a bucketized price, hashed users, history 2-grams): a
/// request's raw values go through the same chains as the file's.
#[test]
fn features_with_their_own_chains_are_served_as_eval_reads_them() {
    serve_named("serve-chains", &common::chained_features());
}

fn serve_named(name: &str, features: &str) {
    let f = fixture();
    let data = f.dir.join(format!("{name}-data"));
    gen_named(&data, 9000);
    let job = f.dir.join(format!("{name}.toml"));
    std::fs::write(
        &job,
        format!(
            "[data]\ndir = \"{name}-data\"\ntrain = [\"day_0.parquet\", \"day_1.parquet\"]\n\
             eval = [\"day_2.parquet\"]\n{features}\n[train]\nprogress = false\n\
             [output]\ndir = \"{name}\"\n"
        ),
    )
    .unwrap();
    elastrec_ok(&["train", job.to_str().unwrap()]);
    let model = f.dir.join(format!("{name}/model.bin"));
    let day2 = data.join("day_2.parquet");
    let want = eval_model_on(&model, &day2)["auc"].as_f64().unwrap();

    let log = f.dir.join(format!("{name}.log"));
    let s = start_server(&[model.to_str().unwrap(), "--max-batch", "500"], None, &log);
    let (rows, labels) = named_json_rows(&day2);
    assert_eq!(rows.len(), 3000);
    let mut scores = Vec::new();
    for chunk in rows.chunks(500) {
        let body = serde_json::to_vec(&serde_json::json!({ "rows": chunk })).unwrap();
        let (code, reply) = http(&s.http, "POST", "/v1/predict", None, &body);
        assert_eq!(code, 200, "{reply}");
        scores.extend(predictions(&reply).0);
    }
    let got = elastrec_data::gen::exact_auc(&scores, &labels).unwrap();
    assert!((got - want).abs() < 1e-6, "served AUC {got} vs eval {want}");

    let mut bad = rows[0].clone();
    bad.as_object_mut().unwrap().remove("genres");
    let body = serde_json::to_vec(&serde_json::json!({ "rows": [bad] })).unwrap();
    let (code, reply) = http(&s.http, "POST", "/v1/predict", None, &body);
    assert_eq!(code, 400, "{reply}");
    assert!(reply.contains("row 0: missing feature `genres`"), "{reply}");
    let mut bad = rows[0].clone();
    bad["price"] = serde_json::json!("cheap");
    let body = serde_json::to_vec(&serde_json::json!({ "rows": [bad] })).unwrap();
    let (code, reply) = http(&s.http, "POST", "/v1/predict", None, &body);
    assert_eq!(code, 400, "{reply}");
    assert!(
        reply.contains("`price`: must be a number or null"),
        "{reply}"
    );
}
