//! `plan_for_job_file` on the documented example job file.

use elastrec_brain::{plan_for_job_file, JobFile, PlanKind};

fn example() -> std::path::PathBuf {
    // Read when the test runs (cargo sets it): `env!` would name the checkout the binary
    // was first built in, which a shared target directory may have reused.
    std::path::PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("run with cargo test"))
        .join("tests/data/job.toml")
}

#[test]
fn example_job_file_plans_with_oom_prevention() {
    let plan = plan_for_job_file(example()).unwrap();
    let file = JobFile::read(&example()).unwrap();
    assert_eq!(plan.kind, PlanKind::Replan, "{:?}", plan.reasons);
    assert!(file.job.bounds.contains(&plan.allocation));
    // PS memory 4 + 0.0015/step reaches 19 GiB at step 10,000 (> 16 GiB): raised before
    // the limit is hit (~step 8,000).
    assert_eq!(plan.memory.len(), 1, "{:?}", plan.memory);
    let m = plan.memory[0];
    assert!((m.predicted_peak_gb - 19.0).abs() < 0.5, "{m:?}");
    let hit = m.step_at_limit.unwrap();
    assert!((7_500..8_500).contains(&hit), "{m:?}");
    let a = plan.allocation;
    assert!(
        f64::from(a.ps) * a.ps_mem_gb >= 1.2 * m.predicted_peak_gb,
        "{a:?}"
    );
    assert!(
        plan.reasons.iter().any(|r| r.contains("OOM prediction")),
        "{:?}",
        plan.reasons
    );
    let table = plan.render_table();
    println!("{table}");
    assert!(table.contains("ctr-example") && table.contains("reasons:") && table.contains("MAPE"));
}

#[test]
fn job_file_without_profile_gets_a_start_up_plan_and_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("j.toml");
    std::fs::write(
        &p,
        "[job]\njob_id = \"x\"\ndataset_samples = 10\ntables = [{ rows = 100, dim = 4 }]\n",
    )
    .unwrap();
    let plan = plan_for_job_file(&p).unwrap();
    assert_eq!(plan.kind, PlanKind::WarmStart);
    assert!(plan.reasons[0].contains("0 samples"), "{:?}", plan.reasons);
    let e = plan_for_job_file(dir.path().join("missing.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing.toml"), "{e}");
}

#[test]
fn plans_never_leave_the_bounds() {
    // Randomized bounds around the example: every plan lies inside them.
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let base = JobFile::read(&example()).unwrap();
    for _ in 0..15 {
        let mut f = base.clone();
        let b = &mut f.job.bounds;
        b.workers.min = rng.random_range(1..8);
        b.workers.max = b.workers.min + rng.random_range(0..20);
        b.ps.min = rng.random_range(1..4);
        b.ps.max = b.ps.min + rng.random_range(0..4);
        b.worker_cpu.min = f64::from(rng.random_range(1..4u32));
        b.worker_cpu.max = b.worker_cpu.min + f64::from(rng.random_range(0..8u32)) + 0.25;
        b.ps_mem_gb.max = b.ps_mem_gb.min + f64::from(rng.random_range(0..40u32));
        match elastrec_brain::plan_for_job(&f) {
            Ok(p) => assert!(
                f.job.bounds.contains(&p.allocation),
                "{:?} outside {:?}",
                p.allocation,
                f.job.bounds
            ),
            Err(e) => assert!(
                matches!(e, elastrec_brain::BrainError::Infeasible(_)),
                "{e}"
            ),
        }
    }
}
