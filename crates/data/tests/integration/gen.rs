//! The generator: report, click rate, teacher AUC, cardinalities, determinism across seeds
//! and thread counts, TSV/Parquet equivalence, progress callback.

use elastrec_data::gen::{read_report, CRITEO_KAGGLE_CARDINALITIES};
use elastrec_data::tsv::parse_line;
use elastrec_data::{
    count_rows, criteo, generate, generate_with_progress, read_all, BadRowPolicy, GenSpec,
    OutputFormat, RawRow,
};
use std::collections::HashSet;
use std::path::Path;

fn spec(out: &Path, rows: u64, seed: u64) -> GenSpec {
    GenSpec {
        out: out.to_path_buf(),
        rows,
        format: OutputFormat::Tsv,
        seed,
        days: 3,
        scale: 0.001,
        drift: 0.0,
        conversions: false,
    }
}

fn files_bytes(dir: &Path, days: u32, ext: &str) -> Vec<Vec<u8>> {
    (0..days)
        .map(|d| std::fs::read(dir.join(format!("day_{d}.{ext}"))).unwrap())
        .collect()
}

#[test]
fn report_and_statistics() {
    let dir = tempfile::tempdir().unwrap();
    let s = spec(dir.path(), 100_000, 42);
    let report = generate(&s).unwrap();
    let on_disk = read_report(dir.path()).unwrap();
    assert_eq!(
        (&on_disk.files, &on_disk.cardinalities, on_disk.seed),
        (&report.files, &report.cardinalities, 42)
    );
    assert!((on_disk.teacher_auc - report.teacher_auc).abs() < 1e-12);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("report.json")).unwrap())
            .unwrap();
    for key in [
        "rows",
        "files",
        "seed",
        "scale",
        "click_rate",
        "teacher_auc",
        "cardinalities",
        "generation_secs",
    ] {
        assert!(json.get(key).is_some(), "report.json lacks {key}");
    }
    assert_eq!(report.rows, 100_000);
    assert_eq!(report.files.iter().map(|f| f.rows).sum::<u64>(), 100_000);
    assert_eq!(
        report
            .files
            .iter()
            .map(|f| f.name.as_str())
            .collect::<Vec<_>>(),
        ["day_0.tsv", "day_1.tsv", "day_2.tsv"]
    );
    assert!(
        (report.click_rate - 0.25).abs() < 0.015,
        "click rate {}",
        report.click_rate
    );
    assert!(
        (0.75..=0.85).contains(&report.teacher_auc),
        "teacher AUC {}",
        report.teacher_auc
    );
    assert_eq!(report.teacher_auc_rows, 100_000);
    let expected: Vec<u64> = CRITEO_KAGGLE_CARDINALITIES
        .iter()
        .map(|&c| ((c as f64 * 0.001).round() as u64).max(2))
        .collect();
    assert_eq!(report.cardinalities, expected);

    // Read the raw rows back and check the data's shape.
    let mut distinct: Vec<HashSet<u32>> = vec![HashSet::new(); criteo::CATEGORICAL];
    let mut missing = [0u64; criteo::CATEGORICAL];
    let mut int_missing = [0u64; 13];
    let mut negatives = 0u64;
    let mut clicks = 0u64;
    let mut first_cat_counts = std::collections::HashMap::<u32, u64>::new();
    let mut row = RawRow::default();
    for f in &report.files {
        let path = dir.path().join(&f.name);
        assert_eq!(count_rows(&path).unwrap(), f.rows);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), f.bytes);
        for line in std::fs::read(&path)
            .unwrap()
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
        {
            parse_line(line, &mut row).unwrap();
            clicks += row.label as u64;
            for (i, c) in row.cats.iter().enumerate() {
                match c {
                    Some(v) => {
                        distinct[i].insert(*v);
                    }
                    None => missing[i] += 1,
                }
            }
            for (i, v) in row.ints.iter().enumerate() {
                match v {
                    None => int_missing[i] += 1,
                    Some(v) if *v < 0 => negatives += 1,
                    _ => {}
                }
            }
            if let Some(c) = row.cats[2] {
                *first_cat_counts.entry(c).or_default() += 1;
            }
        }
    }
    assert_eq!(clicks as f64 / 100_000.0, report.click_rate);
    for f in 0..criteo::CATEGORICAL {
        assert!(
            distinct[f].len() as u64 <= expected[f],
            "C{} has {} ids > {}",
            f + 1,
            distinct[f].len(),
            expected[f]
        );
        assert!(missing[f] < 100_000);
    }
    // Small vocabularies are fully used; large ones are heavy-tailed.
    assert_eq!(distinct[8].len() as u64, expected[8]);
    assert!(
        distinct[2].len() > 2000,
        "C3 distinct {}",
        distinct[2].len()
    );
    let top = first_cat_counts.values().max().copied().unwrap();
    assert!(
        top > 3000,
        "C3's most frequent id only {top} times: not heavy-tailed"
    );
    // The most frequent id is not a small number (scrambled).
    let top_id = first_cat_counts.iter().max_by_key(|(_, n)| **n).unwrap().0;
    assert!(*top_id > 0xffff, "top id {top_id:#x}");
    // Realistic missing rates: C22 ~76 %, I12 ~76 %, C1 rare; I2 has a few negatives.
    assert!((missing[21] as f64 / 1e5 - 0.76).abs() < 0.02);
    assert!((int_missing[11] as f64 / 1e5 - 0.76).abs() < 0.02);
    assert!(missing[0] < 200);
    assert!(
        negatives > 1000 && negatives < 5000,
        "negatives {negatives}"
    );
}

#[test]
fn deterministic_across_runs_and_thread_counts() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let c = tempfile::tempdir().unwrap();
    let d = tempfile::tempdir().unwrap();
    let rows = 40_000; // several chunks per day
    let pool = |n| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .unwrap()
    };
    let ra = pool(1)
        .install(|| generate(&spec(a.path(), rows, 7)))
        .unwrap();
    let rb = pool(3)
        .install(|| generate(&spec(b.path(), rows, 7)))
        .unwrap();
    generate(&spec(c.path(), rows, 7)).unwrap();
    generate(&spec(d.path(), rows, 8)).unwrap();
    assert_eq!((ra.threads, rb.threads), (1, 3));
    let fa = files_bytes(a.path(), 3, "tsv");
    assert_eq!(fa, files_bytes(b.path(), 3, "tsv"));
    assert_eq!(fa, files_bytes(c.path(), 3, "tsv"));
    assert_ne!(fa, files_bytes(d.path(), 3, "tsv"));
    assert_eq!(ra.teacher_auc, rb.teacher_auc);
    assert_eq!(ra.click_rate, rb.click_rate);
}

#[test]
fn parquet_output_matches_tsv_output() {
    let t = tempfile::tempdir().unwrap();
    let p = tempfile::tempdir().unwrap();
    let p2 = tempfile::tempdir().unwrap();
    let mut s = spec(t.path(), 30_000, 3);
    s.days = 2;
    generate(&s).unwrap();
    s.format = OutputFormat::Parquet;
    s.out = p.path().to_path_buf();
    let rp = generate(&s).unwrap();
    assert_eq!(rp.files[1].name, "day_1.parquet");
    s.out = p2.path().to_path_buf();
    rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap()
        .install(|| generate(&s))
        .unwrap();
    assert_eq!(
        files_bytes(p.path(), 2, "parquet"),
        files_bytes(p2.path(), 2, "parquet")
    );
    for d in 0..2 {
        let (tb, _) = read_all(&t.path().join(format!("day_{d}.tsv")), BadRowPolicy::Fail).unwrap();
        let (pb, _) = read_all(
            &p.path().join(format!("day_{d}.parquet")),
            BadRowPolicy::Fail,
        )
        .unwrap();
        assert_eq!(tb.len(), 15_000);
        assert_eq!(tb, pb);
    }
}

#[test]
fn progress_reaches_total_and_edge_specs() {
    let dir = tempfile::tempdir().unwrap();
    let seen = std::cell::RefCell::new(Vec::new());
    let mut s = spec(dir.path(), 50_000, 1);
    s.days = 1;
    generate_with_progress(&s, &|n| seen.borrow_mut().push(n)).unwrap();
    let seen = seen.into_inner();
    assert_eq!(seen.last(), Some(&50_000));
    assert!(seen.windows(2).all(|w| w[0] < w[1]));

    // More days than rows: empty day files still exist.
    let e = tempfile::tempdir().unwrap();
    let mut s = spec(e.path(), 2, 1);
    s.days = 4;
    let r = generate(&s).unwrap();
    assert_eq!(
        r.files.iter().map(|f| f.rows).collect::<Vec<_>>(),
        [1, 1, 0, 0]
    );
    assert_eq!(count_rows(&e.path().join("day_3.tsv")).unwrap(), 0);

    for bad in [
        GenSpec {
            days: 0,
            ..s.clone()
        },
        GenSpec {
            scale: 0.0,
            ..s.clone()
        },
        GenSpec {
            drift: 1.5,
            ..s.clone()
        },
        GenSpec {
            drift: f64::NAN,
            ..s.clone()
        },
        GenSpec { scale: 1e4, ..s },
    ] {
        assert!(matches!(
            generate(&bad),
            Err(elastrec_data::DataError::InvalidSpec(_))
        ));
    }
}
