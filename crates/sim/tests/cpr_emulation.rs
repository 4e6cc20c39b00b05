//! A tiny CPR emulation end to end: generated data, every strategy, the checks a user
//! would make on the table.

use elastrec_control::cpr::RecoveryMode;
use elastrec_job::config::TableRows;
use elastrec_sim::cpr::{run_cpr_emulation, CprEmulationConfig, CprReport, Strategy};

fn tiny(dir: &std::path::Path) -> CprEmulationConfig {
    let mut job = CprEmulationConfig::generated_job(6_000, dir.join("data"));
    if let Some(g) = &mut job.data.generate {
        g.scale = 0.001;
    }
    job.model.embedding_dim = 8;
    job.model.bottom_mlp = vec![32, 8];
    job.model.top_mlp = vec![32, 1];
    job.model.table_rows = TableRows::Auto;
    job.train.batch_size = 64;
    CprEmulationConfig {
        job,
        failures: 3,
        progress: false,
        ..CprEmulationConfig::default()
    }
}

fn get(report: &CprReport, s: Strategy) -> &elastrec_sim::cpr::StrategyResult {
    report
        .result(s)
        .unwrap_or_else(|| panic!("{s} missing from the report"))
}

#[test]
fn tiny_emulation_reports_every_strategy_consistently() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny(dir.path());
    let report = run_cpr_emulation(&config).unwrap();
    // Shown when an assertion fails.
    println!("{}", report.to_markdown());
    let s_total = report.train_samples;
    assert!(s_total > 4_000, "{s_total} training samples");
    assert_eq!(report.injected.len(), 3);
    assert_eq!(report.results.len(), 6);
    assert_eq!(
        report.decision.mode,
        RecoveryMode::Partial,
        "{}",
        report.decision.reason
    );
    assert!(!report.large_tables.is_empty() && report.large_tables.len() < 26);
    assert!(report.large_table_share >= config.large_table_coverage);

    let base = get(&report, Strategy::NoFailures);
    assert_eq!((base.failures, base.checkpoints), (0, 0));
    assert_eq!(base.samples_trained, s_total);
    assert_eq!(base.overhead_pct, 0.0);
    assert!(base.auc > 0.55, "failure-free AUC {}", base.auc);

    // Every strategy sees the same failures.
    for s in Strategy::WITH_FAILURES {
        let r = get(&report, s);
        assert_eq!(r.failures, 3, "{s}");
        assert!(r.auc.is_finite() && r.logloss.is_finite(), "{s}");
        assert!(r.overhead_pct > 0.0, "{s}");
    }

    // Full recovery loses no sample but re-trains some, ledger-like: trained = epoch + redone.
    let full = get(&report, Strategy::Full);
    assert_eq!(full.recovery, RecoveryMode::Full);
    assert_eq!(full.pls, 0.0);
    assert_eq!(full.stale_rows_restored, 0);
    assert!(full.samples_retrained > 0);
    assert_eq!(full.samples_trained, s_total + full.samples_retrained);
    assert!(full.overhead.lost_s > 0.0);

    // Partial recovery at the same interval: same saves, no re-training, some PLS.
    let part = get(&report, Strategy::Partial);
    assert_eq!(part.recovery, RecoveryMode::Partial);
    assert_eq!(part.checkpoints, full.checkpoints);
    assert_eq!(part.samples_retrained, 0);
    assert_eq!(part.samples_trained, s_total);
    assert!(part.pls > 0.0);
    assert!(part.stale_rows_restored > 0);
    assert!(part.overhead_pct < full.overhead_pct);

    // CPR-vanilla: the PLS target allows far fewer saves, so far less overhead.
    let van = get(&report, Strategy::CprVanilla);
    assert_eq!(van.recovery, RecoveryMode::Partial);
    assert!(
        van.checkpoints < full.checkpoints,
        "{} vs {}",
        van.checkpoints,
        full.checkpoints
    );
    assert!(van.overhead_pct < part.overhead_pct);
    assert!(van.pls >= part.pls);
    // Eq. 3 with one server per failure: each failure adds at most 1/(N_emb) of the epoch.
    assert!(van.pls <= 3.0 / f64::from(config.n_emb));

    // MFU/SSU: r·T_save saves of at most r·N rows each, same PLS bookkeeping as vanilla.
    for s in [Strategy::CprMfu, Strategy::CprSsu] {
        let r = get(&report, s);
        let budget = r.prioritized_row_budget.unwrap();
        let max = r.max_prioritized_rows.unwrap();
        assert!(
            max > 0 && max <= budget,
            "{s}: {max} rows per save, budget {budget}"
        );
        assert!(r.checkpoints > van.checkpoints, "{s}");
        assert_eq!(r.pls, van.pls, "{s}");
        // Large tables are never saved whole again, so their stale rows are not fewer
        // than vanilla's by construction; but some rows were lost.
        assert!(r.stale_rows_restored > 0, "{s}");
        assert!(r.tracking_bytes.unwrap() > 0);
    }
    let mfu = get(&report, Strategy::CprMfu).tracking_bytes.unwrap();
    let ssu = get(&report, Strategy::CprSsu).tracking_bytes.unwrap();
    assert!(ssu < mfu, "SSU {ssu} bytes vs MFU {mfu}");

    // The outputs a user reads.
    let md = report.to_markdown();
    for s in [
        "no failures",
        "full recovery",
        "CPR-vanilla",
        "CPR-MFU",
        "CPR-SSU",
        "| AUC |",
    ] {
        assert!(md.contains(s), "{s} missing from\n{md}");
    }
    let json = serde_json::to_string(&report).unwrap();
    let back: CprReport = serde_json::from_str(&json).unwrap();
    assert_eq!(back.results.len(), report.results.len());
    assert_eq!(back.injected, report.injected);
}

#[test]
fn cpr_falls_back_to_full_recovery_when_partial_does_not_pay() {
    // A tiny PLS target needs saves so frequent that Eq. 2 loses to Eq. 1.
    let dir = tempfile::tempdir().unwrap();
    let mut config = tiny(dir.path());
    config.job.train.max_samples = 1_000;
    config.target_pls = 0.0005;
    config.strategies = vec![Strategy::CprVanilla, Strategy::CprSsu];
    let report = run_cpr_emulation(&config).unwrap();
    assert_eq!(
        report.decision.mode,
        RecoveryMode::Full,
        "{}",
        report.decision.reason
    );
    assert_eq!(report.train_samples, 1_000);
    for s in [Strategy::CprVanilla, Strategy::CprSsu] {
        let r = get(&report, s);
        assert_eq!(r.recovery, RecoveryMode::Full, "{s}");
        assert_eq!(r.pls, 0.0);
        assert_eq!(r.max_prioritized_rows, None);
    }
}
