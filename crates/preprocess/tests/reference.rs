//! The operators against an independent implementation: `tests/data/reference.py` (plain
//! Python written from the documented contracts) computed `reference.json` from the same
//! raw rows and graph. Regenerate with `python3 crates/preprocess/tests/data/reference.py`.

use elastrec_data::{Batch, RawColumns, RawRow};
use elastrec_preprocess::{FeatureSpec, Plan};
use serde_json::Value;

fn reference() -> Value {
    // The directory `cargo test` runs from, not the one the binary was built in: a test
    // binary reused from a shared target directory may come from another checkout.
    let dir = std::env::var("CARGO_MANIFEST_DIR")
        .unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
    let text = std::fs::read_to_string(format!("{dir}/tests/data/reference.json"))
        .expect("reference.json");
    serde_json::from_str(&text).expect("reference.json parses")
}

fn columns(rows: &[Value]) -> RawColumns {
    let mut cols = RawColumns::with_capacity(rows.len());
    for r in rows {
        let mut row = RawRow {
            label: r["label"].as_u64().unwrap() as u8,
            ..RawRow::default()
        };
        for (slot, v) in row.ints.iter_mut().zip(r["ints"].as_array().unwrap()) {
            *slot = v.as_i64();
        }
        for (slot, v) in row.cats.iter_mut().zip(r["cats"].as_array().unwrap()) {
            *slot = v.as_u64().map(|c| c as u32);
        }
        cols.push(&row);
    }
    cols
}

#[test]
fn every_operator_matches_the_python_reference() {
    let reference = reference();
    let rows = reference["rows"].as_array().unwrap();
    let specs: Vec<FeatureSpec> = serde_json::from_value(reference["graph"].clone()).unwrap();
    let plan = Plan::compile(&specs).unwrap();
    let input = columns(rows);
    for threads in [1, 2] {
        let mut out = Batch::default();
        plan.run_parallel(&input, &mut out, threads);
        assert_eq!(out.len(), rows.len());
        for (i, (want_d, want_s)) in reference["dense"]
            .as_array()
            .unwrap()
            .iter()
            .zip(reference["sparse"].as_array().unwrap())
            .enumerate()
        {
            let want_d: Vec<f64> = want_d
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect();
            let want_s: Vec<u64> = want_s
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().parse().unwrap())
                .collect();
            assert_eq!(out.dense_row(i).len(), want_d.len());
            for (c, (&got, &want)) in out.dense_row(i).iter().zip(&want_d).enumerate() {
                let tol = 2.0 * f32::EPSILON as f64 * want.abs().max(1.0);
                assert!(
                    (got as f64 - want).abs() <= tol,
                    "row {i} dense column {c}: got {got}, the reference says {want}"
                );
            }
            assert_eq!(out.sparse_row(i), &want_s[..], "row {i} sparse columns");
            assert_eq!(out.labels[i], rows[i]["label"].as_f64().unwrap() as f32);
        }
    }
}
