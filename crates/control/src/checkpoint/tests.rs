//! The policy on an injected clock (ms): schedules and recoveries without waiting.

use super::*;

/// Settings as the job file's defaults, with `interval_s` (0: CPR's choice).
fn settings(interval_s: f64) -> CheckpointSettings {
    CheckpointSettings {
        enabled: true,
        interval_s,
        recovery: RecoveryChoice::Auto,
        target_pls: 0.1,
        mtbf_s: 3600.0,
        min_benefit: 0.1,
        priority: SavePriority::None,
        ratio: 0.125,
    }
}

/// `secs` seconds on the ms clock.
fn s(secs: f64) -> u64 {
    (secs * 1e3).round() as u64
}

/// A policy for a job of 1,000 samples on 2 PS, with `interval_s` (0: CPR's choice).
fn policy(interval_s: f64) -> (CheckpointPolicy, u64) {
    let t0 = 1_000;
    (
        CheckpointPolicy::new(settings(interval_s), 2, 1000, None, t0),
        t0,
    )
}

fn commit(p: &mut CheckpointPolicy, at: u64, delta: bool, samples: u64) {
    let id = p.stats().last_id + 1;
    p.committed(
        at,
        &Commit {
            id,
            delta,
            samples,
            stall_us: 2_000,
            memcpy_us: 1_000,
            persist_us: 500_000,
            bytes: 1 << 20,
            ..Commit::default()
        },
    );
}

fn record(ps: u32, at_failure: u64) -> RecoveryRecord {
    RecoveryRecord {
        at_ms: 0,
        ps: vec![ps],
        reason: "killed".into(),
        mode: RecoveryMode::Partial,
        checkpoint: None,
        samples_at_failure: at_failure,
        samples_at_checkpoint: 0,
        pls_added: 0.0,
        seconds: None,
        load_s: None,
        dense_rewound: false,
        decision: String::new(),
    }
}

/// A busy coordinator takes no second checkpoint, whatever the policy says.
/// The schedule reads no clock of its own: checkpoints fall due on the clock reading it
/// is given, from the start, then from the last commit.
#[test]
fn checkpoints_fall_due_on_the_injected_clock() {
    let (mut p, t0) = policy(10.0);
    assert!(!p.due(t0 + s(9.9), 0));
    assert!(p.due(t0 + s(10.0), 0));
    commit(&mut p, t0 + s(10.0), false, 100);
    assert!(!p.due(t0 + s(19.9), 100));
    assert!(p.due(t0 + s(20.0), 100));
    // Chosen by the policy: the first one comes early, to measure the save cost.
    let (q, t0) = policy(0.0);
    assert_eq!(q.interval_s(t0, 0), FIRST_CHECKPOINT_S);
    assert!(!q.due(t0 + s(FIRST_CHECKPOINT_S - 0.1), 0));
    assert!(q.due(t0 + s(FIRST_CHECKPOINT_S), 0));
}

/// With a save priority, `1/ratio − 1` deltas follow each full checkpoint; a change of
/// the PS layout makes the next one full (a delta's base was written by other servers).
#[test]
fn deltas_follow_full_checkpoints_and_a_new_layout_starts_with_a_full_one() {
    let cfg = CheckpointSettings {
        priority: SavePriority::Mfu,
        ratio: 0.25,
        ..settings(0.0)
    };
    let t0 = 1_000;
    let mut p = CheckpointPolicy::new(cfg, 2, 1000, None, t0);
    let mut kinds = Vec::new();
    for i in 0..9 {
        let delta = p.next_is_delta();
        kinds.push(if delta { 'd' } else { 'F' });
        commit(&mut p, t0 + s(i as f64), delta, 10 * i);
    }
    assert_eq!(kinds.iter().collect::<String>(), "FdddFdddF");
    let delta = p.next_is_delta();
    commit(&mut p, t0 + s(10.0), delta, 100);
    p.layout_changed(3);
    assert!(
        !p.next_is_delta(),
        "a new layout starts with a full checkpoint"
    );
    assert_eq!(p.num_ps(), 3);
    assert_eq!(p.stats().pls.as_ref().unwrap().n_emb, 3);
}

/// A recovery is timed on the injected clock from its start until every PS serves again;
/// that time replaces the assumed load and rescheduling costs, and is closed once.
#[test]
fn a_recovery_is_timed_and_its_time_becomes_the_measured_cost() {
    let (mut p, t0) = policy(0.0);
    commit(&mut p, t0 + s(1.0), false, 200);
    let d = p.recovery_decision(t0 + s(5.0), 500, None);
    assert!(p.recovered(t0 + s(5.0)).is_none(), "nothing to close yet");
    let lost = p.partial_loss(500, 1);
    // Eq. 3: one of two servers lost the 300 samples since the checkpoint of 1,000.
    assert!((lost - 300.0 / 2000.0).abs() < 1e-12, "{lost}");
    p.recovery_started(t0 + s(5.0), record(1, 500), d);
    assert!(p.recovering());
    // The relaunched server reports 1.25 s of loading.
    p.loaded(1.25);
    assert_eq!(p.recovered(t0 + s(8.5)), Some(3.5));
    assert!(!p.recovering());
    assert_eq!(p.recovered(t0 + s(9.0)), None, "closed once");
    let st = p.stats();
    assert_eq!(st.recoveries[0].seconds, Some(3.5));
    assert_eq!(st.recoveries[0].load_s, Some(1.25));
    // Eq. 2 adds O_load and O_res: together they are the recovery's time, not twice it.
    assert_eq!((st.o_load_s, st.o_res_s), (Some(1.25), Some(2.25)));
    assert!((st.pls.as_ref().unwrap().pls() - lost).abs() < 1e-12);
}

/// With MFU/SSU a delta saves only the large tables' hottest rows: the other rows of a
/// failed server go back to the last full checkpoint, so its lost samples count from
/// there (CPR's PLS for MFU/SSU), not from the delta.
#[test]
fn pls_counts_from_the_last_full_checkpoint_across_deltas() {
    let cfg = CheckpointSettings {
        interval_s: 10.0,
        priority: SavePriority::Mfu,
        ratio: 0.25,
        ..settings(0.0)
    };
    let t0 = 1_000;
    let mut p = CheckpointPolicy::new(cfg, 2, 1000, None, t0);
    commit(&mut p, t0 + s(1.0), false, 100);
    commit(&mut p, t0 + s(2.0), true, 200);
    commit(&mut p, t0 + s(3.0), true, 300);
    let lost = p.partial_loss(400, 1);
    // One of two servers lost the 300 samples since the full checkpoint at 100.
    assert!((lost - 300.0 / 2000.0).abs() < 1e-12, "{lost}");
    // A full checkpoint moves the point.
    commit(&mut p, t0 + s(4.0), false, 500);
    let lost = p.partial_loss(600, 1);
    assert!((lost - 100.0 / 2000.0).abs() < 1e-12, "{lost}");
}

/// A configured mode wins over CPR's choice and says so; a whole-job restart forces a
/// full recovery whatever was configured.
#[test]
fn configured_and_forced_modes_override_cpr_and_say_so() {
    let cfg = CheckpointSettings {
        recovery: RecoveryChoice::Partial,
        ..settings(0.0)
    };
    let t0 = 1_000;
    let p = CheckpointPolicy::new(cfg, 2, 1000, None, t0);
    let d = p.recovery_decision(t0 + s(10.0), 100, None);
    assert_eq!(d.mode, RecoveryMode::Partial);
    assert!(d.reason.contains("(configured"), "{}", d.reason);
    let forced = p.recovery_decision(t0 + s(10.0), 100, Some(RecoveryMode::Full));
    assert_eq!(forced.mode, RecoveryMode::Full);
    assert!(
        forced.reason.contains("whole job restarted"),
        "{}",
        forced.reason
    );
}

/// Failures observed faster than the configured MTBF shorten CPR's interval: the
/// policy plans with what it saw, never with a rosier figure.
#[test]
fn observed_failures_shorten_the_interval() {
    let (mut p, t0) = policy(0.0);
    commit(&mut p, t0 + s(1.0), false, 10);
    let calm = p.interval_s(t0 + s(600.0), 500);
    for i in 0..4 {
        let at = t0 + s(100.0 * (i + 1) as f64);
        let d = p.recovery_decision(at, 500, Some(RecoveryMode::Full));
        p.recovery_started(at, record(0, 500), d);
        p.recovered(at + s(1.0));
    }
    let stormy = p.interval_s(t0 + s(600.0), 500);
    assert!(
        stormy < calm,
        "interval {stormy} s with 4 failures vs {calm} s without"
    );
}
