//! The coordinator's turn, and fingerprints (the policy's tests are with it, in
//! `elastrec-control`).

use super::*;

#[test]
fn one_checkpoint_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let mut job = JobConfig::default();
    job.checkpoint.location = dir.path().to_string_lossy().into_owned();
    job.checkpoint.interval_s = 10.0;
    let c = Coordinator::new(
        &job,
        Fingerprint::of(&job, &[]),
        1000,
        "t",
        "ns".into(),
        None,
    )
    .unwrap();
    let later = monotonic_ms() + 60_000;
    assert!(c.due_at(later, 0));
    let turn = c.running.try_lock().unwrap();
    assert!(c.busy());
    assert!(!c.due_at(later, 0));
    drop(turn);
    assert!(c.due_at(later, 0));
}

#[test]
fn fingerprint_names_the_section_that_differs() {
    let job = JobConfig::default();
    let files = vec![("/d/day_0.tsv".to_string(), 100)];
    let a = Fingerprint::of(&job, &files);
    assert_eq!(a.files[0].0, "day_0.tsv");
    assert!(a.mismatch(&a.clone()).is_none());
    let mut other = job.clone();
    other.model.embedding_dim += 1;
    let b = Fingerprint::of(&other, &files);
    assert_ne!(a.digest(), b.digest());
    assert!(a.mismatch(&b).unwrap().contains("[model]"));
    let c = Fingerprint::of(&job, &[("/d/day_0.tsv".to_string(), 99)]);
    assert!(a.mismatch(&c).unwrap().contains("training files"));
    // The default graph leaves the digest as it was before [[preprocess]] existed; a
    // graph is part of what a checkpoint belongs to.
    assert!(!serde_json::to_string(&a).unwrap().contains("preprocess"));
    let mut graph = job.clone();
    graph.preprocess = elastrec_preprocess::default_graph();
    let d = Fingerprint::of(&graph, &files);
    assert!(a.mismatch(&d).unwrap().contains("[[preprocess]] differs"));
}

/// A checkpoint taken while a long list was still being counted names the files counted
/// so far: it restores into the same job once more are counted (a PS recovery), and into
/// a new job over the complete list (`--from-checkpoint`), but not into another list.
#[test]
fn a_checkpoint_of_a_list_being_counted_restores_into_the_longer_list() {
    let job = JobConfig::default();
    let file = |i: u32| (format!("/d/part-{i}.tsv"), 40);
    let counted: Vec<_> = (0..2).map(file).collect();
    let all: Vec<_> = (0..3).map(file).collect();
    let taken = Fingerprint::of(&job, &counted).growing(true);
    assert!(Fingerprint::of(&job, &all)
        .growing(true)
        .mismatch(&taken)
        .is_none());
    assert!(Fingerprint::of(&job, &all).mismatch(&taken).is_none());
    let other: Vec<_> = [0, 2, 1].into_iter().map(file).collect();
    assert!(Fingerprint::of(&job, &other)
        .mismatch(&taken)
        .unwrap()
        .contains("training files"));
    // A complete list does not restore into a shorter one.
    let whole = Fingerprint::of(&job, &all);
    assert!(Fingerprint::of(&job, &counted).mismatch(&whole).is_some());
}

/// A fingerprint read back from a manifest matches the job it was taken of, dense
/// statistics included: their floats survive the JSON text. (Without serde_json's
/// `float_roundtrip`, 7.5146660804748535 read back one ulp lower, and a standardized
/// job's PS recovery refused its own checkpoint as another job's.)
#[test]
fn a_fingerprint_read_back_from_its_manifest_matches_its_job() {
    let mut job = JobConfig::default();
    job.model.dense_norm = elastrec_job::config::DenseNorm::Standardize;
    // Statistics a job computed, each an f32 written exactly as an f64 (those whose
    // manifest failed to match).
    let seen = [
        7.514_666_080_474_853_5_f64,
        1.595_842_003_822_326_9,
        0.027_498_817_071_318_626,
        1.632_921_695_709_228_5,
    ];
    job.model.dense_mean = (0..13).map(|i| seen[i % 4] as f32).collect();
    job.model.dense_std = (0..13).map(|i| seen[(i + 1) % 4] as f32).collect();
    let files = vec![("/d/day_0.tsv".to_string(), 100)];
    let fp = Fingerprint::of(&job, &files);
    let text = serde_json::to_string(&serde_json::json!({ "fingerprint_parts": fp })).unwrap();
    let manifest: serde_json::Value = serde_json::from_str(&text).unwrap();
    let read: Fingerprint = serde_json::from_value(manifest["fingerprint_parts"].clone()).unwrap();
    assert_eq!(fp.mismatch(&read), None);
    assert_eq!(fp.digest(), read.digest());
}
