use super::*;

fn settings() -> Settings {
    Settings {
        workers: [1, 4],
        ps: [1, 1],
        interval_ms: 3000,
        sample_ms: 1000,
        min_gain: 0.05,
        batch_size: 100,
        worker_cpu: 1.0,
        worker_cpu_max: 1.0,
        ps_cpu: 1.0,
        ps_cpu_max: 1.0,
        worker_mem_gb: 2.0,
        ps_mem_gb: 2.0,
        cluster_cpu: 16.0,
        cluster_mem_gb: 64.0,
        worker_start_s: 2.0,
        ps_migration_s: 1.0,
        ps_scaling: false,
        hot_ratio: 3.0,
        send_capacity: true,
        explore: false,
        explore_efficiency: 0.75,
        explore_linear: 0.9,
        growth_efficiency: 0.5,
    }
}

fn view(now_ms: u64, workers: u32, samples_done: u64) -> View {
    View {
        now_ms,
        workers,
        target_workers: workers,
        ps: 1,
        steady: true,
        recovering: false,
        samples_done,
        samples_total: 1_000_000,
    }
}

fn plan(workers: u32, ps: u32, tp: f64) -> Proposal {
    Proposal {
        kind: PlanKind::Replan,
        allocation: Some(settings().allocation(workers, ps)),
        predicted_throughput: tp,
        fit_mape_percent: None,
        reasons: vec!["because".into()],
        for_memory: false,
    }
}

/// Runs `secs` seconds at `workers` workers and `rate` samples/s, one observation
/// every 100 ms; returns the clock and samples after.
fn run(a: &mut Autoscaler, t: &mut u64, s: &mut u64, workers: u32, rate: u64, secs: u64) {
    for _ in 0..secs * 10 {
        *t += 100;
        *s += rate / 10;
        a.observe(&view(*t, workers, *s));
    }
}

/// Halfway keeps the plan's cores per worker and PS count, and not a raise of the
/// PS's cores, which the halfway step could not tell apart from its workers.
#[test]
fn halfway_halves_the_workers_and_keeps_the_fewer_ps_cores() {
    let from = Allocation {
        ps_cpu: 2.0,
        ..settings().allocation(6, 2)
    };
    let to = Allocation {
        worker_cpu: 8.0,
        ps_cpu: 6.0,
        ..settings().allocation(24, 4)
    };
    let mid = halfway(&from, &to);
    assert_eq!(
        (mid.workers, mid.worker_cpu, mid.ps, mid.ps_cpu),
        (12, 8.0, 4, 2.0)
    );
    let fewer = Allocation { ps_cpu: 1.0, ..to };
    assert_eq!(halfway(&from, &fewer).ps_cpu, 1.0);
}

/// [`settings`] for the tests of a plan's growth judged at its first window: up to 32
/// workers, plans a minute apart (so windows, not plan rounds, decide), room for all.
fn growth_settings() -> Settings {
    Settings {
        workers: [1, 32],
        interval_ms: 60_000,
        cluster_cpu: 64.0,
        ..settings()
    }
}

/// Runs 2 s at `from`'s workers and samples/s, then a probe to `to`'s workers, run 2 s
/// at its samples/s.
fn probed(a: &mut Autoscaler, t: &mut u64, s: &mut u64, from: (u32, u64), to: (u32, u64)) {
    run(a, t, s, from.0, from.1, 2);
    let probe = a.worker_probe(&view(*t, from.0, *s), to.0, "probe".into());
    a.applied(&probe, &view(*t, from.0, *s), "probe");
    run(a, t, s, to.0, to.1, 2);
}

/// On a shared brain nothing probes, so the profile holds one core count and one PS
/// count: a plan that cuts cores per worker, or PS for speed, is a guess of the fit
/// and is not made; fewer PS for a plan that sized them with more memory than the
/// job's PS have would run them out of memory.
#[test]
fn a_profile_of_one_core_and_ps_count_changes_neither() {
    let shared = Settings {
        workers: [1, 8],
        ps: [1, 4],
        worker_cpu: 4.0,
        worker_cpu_max: 8.0,
        ps_mem_gb: 8.0,
        ps_scaling: true,
        send_capacity: false,
        ..settings()
    };
    let mut a = Autoscaler::new(shared.clone(), 0);
    let (mut t, mut s) = (0, 0);
    run(&mut a, &mut t, &mut s, 2, 1000, 3);
    let mut v = view(t, 2, s);
    v.ps = 2;
    let mut p = plan(3, 2, 2000.0);
    let mut fewer_cores = shared.allocation(3, 2);
    fewer_cores.worker_cpu = 1.0;
    p.allocation = Some(fewer_cores);
    match a.review(&p, &v) {
        Decision::Apply {
            workers,
            worker_cpu,
            ..
        } => assert_eq!((workers, worker_cpu), (3, 4.0)),
        d => panic!("{d:?}"),
    }
    let mut fewer_ps = shared.allocation(2, 1);
    fewer_ps.ps_mem_gb = 16.0;
    p.allocation = Some(fewer_ps);
    match a.review(&p, &v) {
        Decision::Keep(why) => assert!(why.contains("one PS count"), "{why}"),
        d => panic!("{d:?}"),
    }
    // With two PS counts measured, a cut for speed is made, unless the fewer PS need
    // more memory than the job's have.
    a.seen_ps.insert(2);
    match a.review(&p, &v) {
        Decision::Keep(why) => assert!(why.contains("more memory per PS"), "{why}"),
        d => panic!("{d:?}"),
    }
    fewer_ps.ps_mem_gb = 8.0;
    p.allocation = Some(fewer_ps);
    assert!(matches!(a.review(&p, &v), Decision::Apply { ps: 1, .. }));
}

#[test]
fn windows_become_samples_with_the_iteration_time_of_eq_1() {
    let mut a = Autoscaler::new(settings(), 0);
    let (mut t, mut s) = (0, 0);
    run(&mut a, &mut t, &mut s, 2, 1000, 3);
    // 2 workers x 100 rows at 1000 samples/s: one iteration takes 0.2 s.
    assert_eq!(
        a.unreported.len(),
        2,
        "the first observation only opens a window"
    );
    for p in &a.unreported {
        assert!((p.iter_time_s - 0.2).abs() < 1e-9, "{p:?}");
        assert_eq!(p.alloc.workers, 2);
    }
    assert_eq!(a.measured(), Some(1000.0));
    // Not steady (a worker starting): no sample, the window restarts.
    let mut v = view(t + 1500, 2, s + 1500);
    v.steady = false;
    a.observe(&v);
    assert!(a.window.is_none());
}

/// A cold job (no warm start) grows its workers while each growth pays, four times
/// while throughput keeps proportional, twice while it nearly does, and stops when a
/// growth no longer pays: the brain then plans from a profile that spans the curve. A
/// job that scales badly from the start stops after its first probe.
/// The worker counts a cold job explores through, window after window, until the
/// brain plans, when `w` workers train `rate(w)` samples/s.
fn explored(cold: &Settings, rate: impl Fn(u32) -> u64) -> (Vec<u32>, Autoscaler) {
    let mut a = Autoscaler::new(cold.clone(), 0);
    let (mut t, mut s) = (0, 0);
    let mut workers = 1;
    let mut path = vec![workers];
    loop {
        // Two 1-s windows, within the 3-s planning interval: exploring does not wait
        // for it.
        run(&mut a, &mut t, &mut s, workers, rate(workers), 2);
        match a.next_round(&view(t, workers, s)) {
            Round::Probe(_, d) => {
                let Decision::Apply { workers: to, .. } = d else {
                    panic!("{d:?}")
                };
                a.applied(&d, &view(t, workers, s), "probe");
                workers = to;
                path.push(workers);
            }
            Round::Plan(..) => break,
            Round::Revert(..) => panic!("a probe is never undone"),
            Round::Report(_) | Round::Idle => {}
        }
        assert!(path.len() < 8, "{path:?}");
    }
    (path, a)
}

#[test]
fn a_cold_job_doubles_its_workers_while_throughput_keeps_up() {
    let cold = Settings {
        workers: [1, 32],
        explore: true,
        explore_efficiency: 0.75,
        explore_linear: 0.9,
        cluster_cpu: 64.0,
        ..settings()
    };
    let rate = |w: u32| match w {
        8 => 7_000,
        16 => 8_400,
        w => 1_000 * u64::from(w),
    };
    let (path, a) = explored(&cold, rate);
    // 1 -> 2 is proportional: four times the workers; 2 -> 8 gives 3.5x (88%): twice;
    // 8 -> 16 gives 1.2x (60%): the brain plans from here.
    assert_eq!(path, [1, 2, 8, 16]);
    let probes: Vec<&str> = a.history().iter().map(|h| h.reasons[0].as_str()).collect();
    assert!(
        probes[2].contains("2 -> 8 workers raised throughput 3.50x"),
        "{probes:?}"
    );

    // The thresholds are the job's (`autoscale.explore_linear`, `explore_efficiency`):
    // never quadrupling, the same curve is walked in doublings; a stricter efficiency
    // stops where 2 -> 8 gave 88% of proportional.
    let doubling = Settings {
        explore_linear: 2.0,
        ..cold.clone()
    };
    assert_eq!(explored(&doubling, rate).0, [1, 2, 4, 8, 16]);
    let strict = Settings {
        explore_efficiency: 0.9,
        ..cold.clone()
    };
    assert_eq!(explored(&strict, rate).0, [1, 2, 8]);
    let off = Settings {
        explore_efficiency: 0.0,
        ..cold.clone()
    };
    // Off: only the one probe a fit needs (a second allocation), then the brain.
    assert_eq!(explored(&off, rate).0, [1, 2]);

    // Compute-bound: 2 workers are barely faster than 1; no second doubling.
    let mut a = Autoscaler::new(cold, 0);
    let (mut t, mut s) = (0, 0);
    run(&mut a, &mut t, &mut s, 1, 1000, 4);
    let v = view(t, 1, s);
    let Round::Probe(_, d) = a.next_round(&v) else {
        panic!("expected the first probe")
    };
    a.applied(&d, &v, "probe");
    run(&mut a, &mut t, &mut s, 2, 1100, 12);
    assert!(
        matches!(a.next_round(&view(t, 2, s)), Round::Plan(..)),
        "the brain plans once doubling stops paying"
    );
}

#[test]
fn a_single_allocation_is_probed_then_plans_follow_the_brain() {
    let mut a = Autoscaler::new(settings(), 0);
    let (mut t, mut s) = (0, 0);
    run(&mut a, &mut t, &mut s, 1, 1000, 4);
    let v = view(t, 1, s);
    let Round::Probe(report, d) = a.next_round(&v) else {
        panic!("expected a probe")
    };
    assert_eq!(report.samples.len(), 3);
    assert!(matches!(d, Decision::Apply { workers: 2, .. }), "{d:?}");
    a.applied(&d, &v, "probe");
    assert_eq!(
        a.next_round(&view(t + 100, 2, s)),
        Round::Idle,
        "not due yet"
    );
    run(&mut a, &mut t, &mut s, 2, 1800, 4);
    assert_eq!(a.history()[0].measured_after, Some(1800.0));
    // Six windows are too few for a fit with a held-out check: only a report.
    let Round::Report(report) = a.next_round(&view(t, 2, s)) else {
        panic!("expected a report round")
    };
    assert_eq!(report.samples.len(), 3);
    run(&mut a, &mut t, &mut s, 2, 1800, 3);
    let v = view(t, 2, s);
    let Round::Plan(report, req) = a.next_round(&v) else {
        panic!("expected a plan round")
    };
    assert_eq!(report.samples.len(), 3);
    assert_eq!(req.current.unwrap().workers, 2);
    assert_eq!(req.free_cpu, Some(16.0 - 3.0));
    assert!(req.horizon_s > 0.0);
    // A plan with enough gain is applied; one below min_gain is kept.
    let d = a.review(&plan(4, 1, 3000.0), &v);
    assert!(matches!(d, Decision::Apply { workers: 4, .. }), "{d:?}");
    let d = a.review(&plan(3, 1, 1850.0), &v);
    assert!(
        matches!(d, Decision::Keep(ref w) if w.contains("min_gain")),
        "{d:?}"
    );
    // Fewer workers for about the same speed is a saving: applied.
    let d = a.review(&plan(1, 1, 1790.0), &v);
    assert!(matches!(d, Decision::Apply { workers: 1, .. }), "{d:?}");
    // Fewer workers at a sixth less speed is not "about the same": kept.
    let d = a.review(&plan(1, 1, 1500.0), &v);
    assert!(
        matches!(d, Decision::Keep(ref w) if w.contains("-16.7%") && w.contains("fewer nodes")),
        "{d:?}"
    );
}

#[test]
fn a_worker_count_at_its_bound_probes_one_core_more_then_keeps_it() {
    let mut a = Autoscaler::new(
        Settings {
            workers: [1, 1],
            worker_cpu_max: 2.0,
            ..settings()
        },
        0,
    );
    let (mut t, mut s) = (0, 0);
    run(&mut a, &mut t, &mut s, 1, 1000, 4);
    let v = view(t, 1, s);
    let Round::Probe(_, d) = a.next_round(&v) else {
        panic!("expected a probe of the cores")
    };
    assert!(
        matches!(d, Decision::Apply { workers: 1, worker_cpu, .. } if worker_cpu == 2.0),
        "{d:?}"
    );
    a.applied(&d, &v, "probe");
    assert_eq!(a.settings().worker_cpu, 2.0);
    assert_eq!(a.history()[0].worker_cpu, (1.0, 2.0));
    // A plan beyond the cores bound is refused.
    let mut p = plan(1, 1, 5000.0);
    p.allocation.as_mut().unwrap().worker_cpu = 3.0;
    let d = a.review(&p, &view(t + 100, 1, s));
    assert!(
        matches!(d, Decision::Refuse(ref w) if w.contains("worker_cpu_max")),
        "{d:?}"
    );
}

fn two_ps(t: u64, s: u64) -> View {
    View {
        ps: 2,
        ..view(t, 1, s)
    }
}

/// An autoscaler of one worker whose plan wanted a second PS for speed, after the
/// probe that added it and a window at 60% of the throughput before; `during` sees
/// each round of that window (time, samples).
fn slower_ps_probe(
    settings: Settings,
    mut during: impl FnMut(&mut Autoscaler, u64),
) -> (Autoscaler, u64, u64) {
    let mut a = Autoscaler::new(settings, 0);
    let (mut t, mut s) = (0, 0);
    run(&mut a, &mut t, &mut s, 1, 1000, 4);
    a.next_round(&view(t, 1, s));
    a.review(&plan(1, 2, 1500.0), &view(t, 1, s));
    run(&mut a, &mut t, &mut s, 1, 1000, 4);
    let Round::Probe(_, d) = a.next_round(&view(t, 1, s)) else {
        panic!("expected the PS probe")
    };
    a.applied(&d, &view(t, 1, s), "probe");
    for _ in 0..20 {
        t += 100;
        s += 60;
        a.observe(&two_ps(t, s));
        during(&mut a, s);
    }
    (a, t, s)
}

/// The same PS probe that did not pay for speed stays where the servers' memory,
/// growing, will need two PS by the job's end (DLRover-RM's OOM prediction on their
/// total): undoing it would stop the job at its memory limit.
#[test]
fn an_unpaid_ps_probe_stays_when_the_memory_will_need_it() {
    let elastic_ps = Settings {
        workers: [1, 1],
        ps: [1, 2],
        ps_scaling: true,
        ..settings()
    };
    // 0.2 GiB + 0.3 GiB per 1,000 steps over both PS: 3.2 GiB at the last of 10,000
    // steps, above one PS's 0.9 x 2 GiB.
    let growing = |a: &mut Autoscaler, samples: u64| {
        let step = samples / 100;
        let total = 0.2 + 0.0003 * step as f64;
        a.observe_memory(0, step, total / 2.0);
        a.observe_memory(1, step, total / 2.0);
    };
    let (mut a, t, s) = slower_ps_probe(elastic_ps.clone(), growing);
    let Round::Revert(_, kept) = a.next_round(&two_ps(t, s)) else {
        panic!("the unpaid probe is judged")
    };
    assert!(
        matches!(&kept, Decision::Keep(why) if why.contains("PS count stays") && why.contains("2 PS of 2.00 GiB")),
        "{kept:?}"
    );
    // Flat memory needs one PS: the probe is undone.
    let flat = |a: &mut Autoscaler, samples: u64| {
        a.observe_memory(0, samples / 100, 0.3);
        a.observe_memory(1, samples / 100, 0.3);
    };
    let (mut a, t, s) = slower_ps_probe(elastic_ps, flat);
    let Round::Revert(_, back) = a.next_round(&two_ps(t, s)) else {
        panic!("the unpaid probe is judged")
    };
    assert!(matches!(back, Decision::Apply { ps: 1, .. }), "{back:?}");
}

/// A plan that wants more PS for speed while the profile holds one PS count (and a
/// PS's cores cannot vary) is held to the PS the job has, and the next round probes
/// one PS more so the fit can tell what a server is worth; without the plan's word,
/// or without PS scaling (synchronous mode), no PS probe.
#[test]
fn a_plan_for_more_ps_on_one_ps_count_is_followed_by_a_probe_of_one_ps_more() {
    let elastic_ps = Settings {
        workers: [1, 1],
        ps: [1, 2],
        ps_scaling: true,
        ..settings()
    };
    let wants_ps = |mut a: Autoscaler| {
        let (mut t, mut s) = (0, 0);
        run(&mut a, &mut t, &mut s, 1, 1000, 4);
        let round = a.next_round(&view(t, 1, s));
        assert!(
            !matches!(round, Round::Probe(..)),
            "no probe before a plan asks: {round:?}"
        );
        let d = a.review(&plan(1, 2, 1500.0), &view(t, 1, s));
        assert!(
            !matches!(d, Decision::Apply { ps: 2, .. }),
            "a PS change the fit cannot predict is not executed: {d:?}"
        );
        run(&mut a, &mut t, &mut s, 1, 1000, 4);
        a.next_round(&view(t, 1, s))
    };
    let Round::Probe(_, d) = wants_ps(Autoscaler::new(elastic_ps.clone(), 0)) else {
        panic!("expected a probe of the PS count")
    };
    assert!(
        matches!(d, Decision::Apply { workers: 1, ps: 2, ref reasons, .. } if reasons[0].contains("only 1 PS")),
        "{d:?}"
    );
    // Judged as a plan: one more PS that slows the job down is undone at its first
    // window, and later plans are not capped for it.
    let (mut a, t, s) = slower_ps_probe(elastic_ps.clone(), |_, _| {});
    let Round::Revert(_, back) = a.next_round(&two_ps(t, s)) else {
        panic!("a PS probe that cost 40% is undone")
    };
    assert!(
        matches!(
            back,
            Decision::Apply {
                workers: 1,
                ps: 1,
                ..
            }
        ),
        "{back:?}"
    );
    assert_eq!(
        (a.max_workers, a.max_cpu),
        (None, None),
        "no cap for a probe"
    );
    let sync = Autoscaler::new(
        Settings {
            ps_scaling: false,
            ..elastic_ps
        },
        0,
    );
    let round = wants_ps(sync);
    assert!(
        !matches!(round, Round::Probe(..)),
        "a job that cannot re-shard does not probe its PS count: {round:?}"
    );
}

/// A warm start that fills the capacity cannot probe upwards; it probes a quarter
/// down instead of planning from one allocation.
/// On a shared brain service a job gives back to measure: fewer workers, then fewer
/// cores per worker, then per PS; the PS term so identified lets a plan add PS for
/// speed, one doubling at a time.
#[test]
fn on_a_shared_brain_probes_give_back_and_then_the_ps_count_can_grow() {
    let shared = Settings {
        workers: [1, 16],
        ps: [1, 8],
        ps_scaling: true,
        worker_cpu: 4.0,
        worker_cpu_max: 16.0,
        ps_cpu: 4.0,
        ps_cpu_max: 16.0,
        send_capacity: false,
        ..settings()
    };
    let mut a = Autoscaler::new(shared, 0);
    let (mut t, mut s) = (0, 0);
    let mut probes = Vec::new();
    let mut workers = 8;
    for _ in 0..3 {
        run(&mut a, &mut t, &mut s, workers, 40_000, 4);
        let v = view(t, workers, s);
        let Round::Probe(_, d) = a.next_round(&v) else {
            panic!("expected a probe after {probes:?}")
        };
        let Decision::Apply {
            workers: w,
            worker_cpu,
            ps_cpu,
            ..
        } = d
        else {
            unreachable!()
        };
        probes.push((w, worker_cpu, ps_cpu));
        a.applied(&d, &v, "probe");
        workers = w;
    }
    assert_eq!(probes, vec![(6, 4.0, 4.0), (6, 3.0, 4.0), (6, 3.0, 3.0)]);
    run(&mut a, &mut t, &mut s, workers, 30_000, 4);
    let v = view(t, workers, s);
    let mut p = plan(6, 6, 60_000.0);
    if let Some(al) = p.allocation.as_mut() {
        al.worker_cpu = 3.0;
        al.ps_cpu = 3.0;
    }
    let d = a.review(&p, &v);
    assert!(
        matches!(d, Decision::Apply { ps: 2, predicted: None, ref reasons, .. }
            if reasons.iter().any(|r| r.contains("6 PS is outside"))),
        "{d:?}"
    );
}

/// A plan that doubles the workers for 10% more samples/s is halved at its first
/// window; when the halfway step does not pay either it is undone, the next plan
/// request carries the limit, and a plan beyond it is kept out; a growth that pays
/// stays.
#[test]
fn a_growth_that_does_not_pay_is_undone_and_the_workers_stay_within_the_last_that_did() {
    let s4 = Settings {
        workers: [1, 16],
        interval_ms: 60_000,
        ..settings()
    };
    let grow = |rate_after: u64| {
        let mut a = Autoscaler::new(s4.clone(), 0);
        let (mut t, mut s) = (0, 0);
        run(&mut a, &mut t, &mut s, 2, 1000, 3);
        let v = view(t, 2, s);
        let d = a.review(&plan(4, 1, 2000.0), &v);
        assert!(matches!(d, Decision::Apply { workers: 4, .. }), "{d:?}");
        a.applied(&d, &v, "plan");
        run(&mut a, &mut t, &mut s, 4, rate_after, 2);
        let round = a.next_round(&view(t, 4, s));
        (a, round, t, s)
    };
    // 4 workers at 1800/s: 80% of proportional. Judged, kept, no plan before the
    // interval.
    let (a, round, ..) = grow(1800);
    assert!(matches!(round, Round::Report(_)), "{round:?}");
    assert_eq!(a.status().limits.max_workers, None);
    // 4 workers at 1100/s: 10% of proportional. Halfway first: 3 workers, no limit
    // yet.
    let (mut a, round, mut t, mut s) = grow(1100);
    let Round::Revert(_, d) = round else {
        panic!("{round:?}")
    };
    let Decision::Apply {
        workers: 3,
        ref reasons,
        ..
    } = d
    else {
        panic!("{d:?}")
    };
    assert!(
        reasons.last().unwrap().contains("halfway: 3 workers"),
        "{reasons:?}"
    );
    assert_eq!(a.status().limits.max_workers, None);
    a.applied(&d, &view(t, 4, s), "revert");
    // 3 workers at 1050/s: 10% of proportional against the 2 workers before the plan.
    run(&mut a, &mut t, &mut s, 3, 1050, 2);
    let Round::Revert(_, d) = a.next_round(&view(t, 3, s)) else {
        panic!("the halfway step is judged at its first window")
    };
    let Decision::Apply {
        workers: 2,
        ref reasons,
        ..
    } = d
    else {
        panic!("{d:?}")
    };
    let why = reasons.join("; ");
    assert!(
        why.contains("below autoscale.growth_efficiency (50%)")
            && why.contains("plans stay within 2 workers")
            && !why.contains("halfway"),
        "{why}"
    );
    a.applied(&d, &view(t, 3, s), "revert");
    assert_eq!(a.history().last().unwrap().source, "revert");
    // The revert is measured by one window; from then on each window is a round
    // (reports while the profile is short of a fit) until a plan asks within the
    // limit, before the planning interval.
    let req = (0..20)
        .find_map(|_| {
            run(&mut a, &mut t, &mut s, 2, 1000, 1);
            match a.next_round(&view(t, 2, s)) {
                Round::Plan(_, req) => Some(req),
                Round::Report(_) | Round::Idle => None,
                r => panic!("{r:?}"),
            }
        })
        .expect("a plan after the undone growth");
    assert_eq!((req.max_workers, req.max_cpu), (Some(2), None));
    let d = a.review(&plan(3, 1, 3000.0), &view(t, 2, s));
    assert!(
        matches!(d, Decision::Keep(ref why) if why.contains("more than the 2 this job measured to pay")),
        "{d:?}"
    );
    assert_eq!(a.status().limits.max_workers, Some(2));
}

/// A growth from 8 to 16 workers that pays 6% of proportional goes halfway, to 11;
/// 11 workers paying 67% of proportional stay, and the plans stay below the 16 that
/// did not pay.
#[test]
fn an_unpaid_growth_goes_halfway_and_keeps_the_half_that_pays() {
    let mut a = Autoscaler::new(growth_settings(), 0);
    let (mut t, mut s) = (0, 0);
    run(&mut a, &mut t, &mut s, 4, 1000, 3);
    let v = view(t, 4, s);
    let d = a.review(&plan(16, 1, 4000.0), &v);
    // The review trusts at most twice the workers measured: 8 here, so the job
    // measures 8 (80% of proportional: kept) and grows from there to 16.
    assert!(matches!(d, Decision::Apply { workers: 8, .. }), "{d:?}");
    a.applied(&d, &v, "plan");
    run(&mut a, &mut t, &mut s, 8, 1800, 2);
    let round = a.next_round(&view(t, 8, s));
    assert!(matches!(round, Round::Report(_)), "{round:?}");
    let v = view(t, 8, s);
    let d = a.review(&plan(16, 1, 3600.0), &v);
    assert!(matches!(d, Decision::Apply { workers: 16, .. }), "{d:?}");
    a.applied(&d, &v, "plan");
    // 16 workers at 1890/s: +5% for +100% cores.
    run(&mut a, &mut t, &mut s, 16, 1890, 2);
    let Round::Revert(_, d) = a.next_round(&view(t, 16, s)) else {
        panic!("an unpaid growth is halved")
    };
    assert!(matches!(d, Decision::Apply { workers: 11, .. }), "{d:?}");
    a.applied(&d, &view(t, 16, s), "revert");
    // 11 workers at 2200/s: +22% for +33% cores, 67% of proportional: kept.
    run(&mut a, &mut t, &mut s, 11, 2200, 2);
    let round = a.next_round(&view(t, 11, s));
    assert!(matches!(round, Round::Report(_)), "{round:?}");
    assert_eq!(a.status().limits.max_workers, Some(15));
    let why = a.status().limits.why.unwrap();
    assert!(
        why.contains("the halfway step to 11 workers")
            && why.contains("where 16 workers and 17 cores did not"),
        "{why}"
    );
}

/// A growth that did not pay, halfway included, goes back to the allocation this job
/// measured fastest among those that paid, not to the smaller one a give-back probe
/// left: 8 workers ran at 1,800 samples/s, the probe's 6 at 1,400; a plan from 6 to
/// 16 workers and its halfway step to 10 pay too little, and the job returns to 8.
#[test]
fn an_unpaid_growth_goes_back_to_the_largest_allocation_measured_to_pay() {
    let mut a = Autoscaler::new(growth_settings(), 0);
    let (mut t, mut s) = (0, 0);
    probed(&mut a, &mut t, &mut s, (8, 1800), (6, 1400));
    let round = a.next_round(&view(t, 6, s));
    assert!(matches!(round, Round::Report(_)), "{round:?}");
    assert_eq!(a.status().limits.max_workers, None);
    let v = view(t, 6, s);
    let d = a.review(&plan(16, 1, 4000.0), &v);
    assert!(matches!(d, Decision::Apply { workers: 16, .. }), "{d:?}");
    a.applied(&d, &v, "plan");
    run(&mut a, &mut t, &mut s, 16, 1500, 2);
    let Round::Revert(_, d) = a.next_round(&view(t, 16, s)) else {
        panic!("an unpaid growth is halved")
    };
    assert!(matches!(d, Decision::Apply { workers: 10, .. }), "{d:?}");
    a.applied(&d, &view(t, 16, s), "revert");
    run(&mut a, &mut t, &mut s, 10, 1450, 2);
    let Round::Revert(_, d) = a.next_round(&view(t, 10, s)) else {
        panic!("the halfway step is judged at its first window")
    };
    let Decision::Apply {
        workers: 8,
        predicted: Some(predicted),
        reasons,
        ..
    } = &d
    else {
        panic!("back to the 8 workers that paid: {d:?}")
    };
    assert!((predicted - 1800.0).abs() < 1.0, "{predicted}");
    assert!(
        reasons.iter().any(|r| r
            .contains("8 workers x 1 cores and 1 PS x 1 cores (9 cores) were measured at 1800")),
        "{reasons:?}"
    );
    a.applied(&d, &view(t, 10, s), "revert");
    assert_eq!(a.status().limits.max_workers, Some(8));
}

/// A plan that raised the cores per PS and did not pay limits the cores per PS, not
/// the job's cores: a later plan may add workers, and its cores per PS are held to
/// those measured to pay.
#[test]
fn an_unpaid_raise_of_the_ps_cores_limits_the_ps_cores_only() {
    let mut a = Autoscaler::new(
        Settings {
            workers: [1, 8],
            ps_cpu: 2.0,
            ps_cpu_max: 8.0,
            ..growth_settings()
        },
        0,
    );
    let (mut t, mut s) = (0, 0);
    probed(&mut a, &mut t, &mut s, (3, 800), (4, 1000));
    // A give-back probe of the PS's cores: 2 -> 1 costs nothing.
    let v = view(t, 4, s);
    let probe = Decision::Apply {
        workers: 4,
        worker_cpu: 1.0,
        ps: 1,
        ps_cpu: 1.0,
        predicted: None,
        reasons: vec!["probe".into()],
    };
    a.applied(&probe, &v, "probe");
    run(&mut a, &mut t, &mut s, 4, 1000, 2);
    let round = a.next_round(&view(t, 4, s));
    assert!(matches!(round, Round::Report(_)), "{round:?}");
    let v = view(t, 4, s);
    let mut raise = plan(4, 1, 2000.0);
    raise.allocation.as_mut().unwrap().ps_cpu = 6.0;
    let d = a.review(&raise, &v);
    assert!(matches!(d, Decision::Apply { ps_cpu: 6.0, .. }), "{d:?}");
    a.applied(&d, &v, "plan");
    // 5 -> 10 cores for +2%.
    run(&mut a, &mut t, &mut s, 4, 1020, 2);
    let Round::Revert(_, d) = a.next_round(&view(t, 4, s)) else {
        panic!("an unpaid plan is undone")
    };
    assert!(
        matches!(
            d,
            Decision::Apply {
                workers: 4,
                ps_cpu: 1.0,
                ..
            }
        ),
        "{d:?}"
    );
    a.applied(&d, &view(t, 4, s), "revert");
    let limits = a.status().limits;
    assert_eq!(limits.max_ps_cpu, Some(1.0));
    assert_eq!(limits.max_cpu, None);
    assert_eq!(limits.max_workers, None);
    // More workers may come; their PS keep 1 core.
    run(&mut a, &mut t, &mut s, 4, 1000, 2);
    let v = view(t, 4, s);
    let mut grow = plan(8, 1, 2000.0);
    grow.allocation.as_mut().unwrap().ps_cpu = 4.0;
    let d = a.review(&grow, &v);
    let Decision::Apply {
        workers: 8,
        ps_cpu,
        predicted: None,
        reasons,
        ..
    } = &d
    else {
        panic!("the growth of workers is made: {d:?}")
    };
    assert_eq!(*ps_cpu, 1.0);
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("4 cores per PS are more than the 1")),
        "{reasons:?}"
    );
}

/// On a shared brain the first probe gives a quarter of the workers back; when they
/// were worth less than `growth_efficiency` of their cores, the plans stay within
/// the workers probed. Each probe takes one window, not a planning interval.
#[test]
fn a_give_back_probe_that_loses_little_caps_the_workers() {
    let shared = Settings {
        workers: [1, 16],
        worker_cpu: 4.0,
        worker_cpu_max: 16.0,
        send_capacity: false,
        interval_ms: 10_000,
        ..settings()
    };
    let mut a = Autoscaler::new(shared, 0);
    let (mut t, mut s) = (0, 0);
    // 10^9 samples to train: hours at 40,000 samples/s.
    let view = |t, workers, s| View {
        samples_total: 1_000_000_000,
        ..view(t, workers, s)
    };
    // A new job's first round comes after a planning interval.
    run(&mut a, &mut t, &mut s, 8, 40_000, 9);
    assert_eq!(a.next_round(&view(t, 8, s)), Round::Idle);
    run(&mut a, &mut t, &mut s, 8, 40_000, 2);
    // A job that ends within 4 planning intervals does not probe.
    let mut ending = a.clone();
    let nearly_done = View {
        samples_total: s + 1_000_000,
        ..view(t, 8, s)
    };
    let round = ending.next_round(&nearly_done);
    assert!(
        matches!(round, Round::Plan(..)),
        "25 s left, 40 s of planning intervals: a plan, no probe: {round:?}"
    );
    let v = view(t, 8, s);
    let Round::Probe(_, d) = a.next_round(&v) else {
        panic!("expected the first probe")
    };
    assert!(matches!(d, Decision::Apply { workers: 6, .. }), "{d:?}");
    a.applied(&d, &v, "probe");
    // 6 workers lose only 2.5%: the 2 given back were worth 8% of proportional.
    run(&mut a, &mut t, &mut s, 6, 39_000, 2);
    let v = view(t, 6, s);
    let Round::Probe(_, d) = a.next_round(&v) else {
        panic!("the next probe follows one window later")
    };
    assert!(
        matches!(
            d,
            Decision::Apply {
                workers: 6,
                worker_cpu: 3.0,
                ..
            }
        ),
        "{d:?}"
    );
    assert_eq!(a.status().limits.max_workers, Some(6));
    let why = a.status().limits.why.unwrap();
    assert!(why.contains("probe: 6 -> 8 workers"), "{why}");
}

#[test]
fn a_full_single_allocation_is_probed_downwards() {
    let mut a = Autoscaler::new(
        Settings {
            workers: [1, 16],
            cluster_cpu: 16.0,
            ..settings()
        },
        0,
    );
    let (mut t, mut s) = (0, 0);
    run(&mut a, &mut t, &mut s, 15, 60_000, 4);
    let v = view(t, 15, s);
    let Round::Probe(_, d) = a.next_round(&v) else {
        panic!("expected a probe, not a plan from one allocation")
    };
    assert!(matches!(d, Decision::Apply { workers: 11, .. }), "{d:?}");
    a.applied(&d, &v, "probe");
    run(&mut a, &mut t, &mut s, 11, 57_000, 4);
    let v = view(t, 11, s);
    // A fit over 11 and 15 workers that calls 1 worker as fast is not trusted that far:
    // the plan becomes a step to half the fewest workers measured.
    let d = a.review(&plan(1, 1, 63_000.0), &v);
    assert!(
        matches!(d, Decision::Apply { workers: 5, predicted: None, ref reasons, .. }
            if reasons.iter().any(|r| r.contains("1 workers is outside"))),
        "{d:?}"
    );
    let d = a.review(&plan(16, 1, 70_000.0), &v);
    assert!(
        matches!(
            d,
            Decision::Apply {
                workers: 16,
                predicted: Some(_),
                ..
            }
        ),
        "within twice the most measured: as planned: {d:?}"
    );
}

#[test]
fn no_probe_beyond_the_capacity() {
    let mut a = Autoscaler::new(
        Settings {
            cluster_cpu: 2.0,
            ..settings()
        },
        0,
    );
    let (mut t, mut s) = (0, 0);
    run(&mut a, &mut t, &mut s, 1, 1000, 4);
    // 1 worker + 1 PS fill the 2 cores: the samples are reported, nothing is probed.
    assert!(matches!(a.next_round(&view(t, 1, s)), Round::Report(_)));
}

#[test]
fn plans_outside_the_bounds_garbage_and_scaling_during_recovery_are_refused() {
    let mut a = Autoscaler::new(settings(), 0);
    let v = view(10_000, 2, 5000);
    let d = a.review(&plan(9, 1, 5000.0), &v);
    assert!(
        matches!(d, Decision::Refuse(ref w) if w.contains("autoscale.workers [1, 4]")),
        "{d:?}"
    );
    let d = a.review(&plan(2, 3, 5000.0), &v);
    assert!(
        matches!(d, Decision::Refuse(ref w) if w.contains("autoscale.ps")),
        "{d:?}"
    );
    let d = a.review(&plan(3, 1, f64::NAN), &v);
    assert!(
        matches!(d, Decision::Refuse(ref w) if w.contains("not a number")),
        "{d:?}"
    );
    let d = a.review(
        &Proposal {
            allocation: None,
            ..plan(3, 1, 1000.0)
        },
        &v,
    );
    assert!(
        matches!(d, Decision::Refuse(ref w) if w.contains("no allocation")),
        "{d:?}"
    );
    let mut r = v;
    r.recovering = true;
    let d = a.review(&plan(3, 1, 5000.0), &r);
    assert!(
        matches!(d, Decision::Refuse(ref w) if w.contains("recovered")),
        "{d:?}"
    );
    assert!(a.status().last_verdict.unwrap().starts_with("refused"));
}

#[test]
fn a_failed_report_keeps_its_samples_in_order() {
    let mut a = Autoscaler::new(settings(), 0);
    let (mut t, mut s) = (0, 0);
    run(&mut a, &mut t, &mut s, 1, 1000, 4);
    let Round::Probe(report, _) = a.next_round(&view(t, 1, s)) else {
        panic!()
    };
    let n = report.samples.len();
    run(&mut a, &mut t, &mut s, 1, 1000, 2);
    let newer = a.unreported.len();
    a.requeue(report);
    assert_eq!(a.unreported.len(), n + newer);
}

#[test]
fn the_memory_watchdog_compares_resident_memory_with_the_role_limit() {
    let s = settings();
    assert_eq!(memory_verdict(s.worker_mem_gb, false, 1 << 30), None);
    let v = memory_verdict(s.ps_mem_gb, true, 3 << 30).unwrap();
    assert!(
        v.contains("3.00 GiB") && v.contains("autoscale.ps_mem_gb"),
        "{v}"
    );
}

#[test]
fn more_ps_for_speed_needs_a_profile_of_two_ps_counts_more_for_memory_does_not() {
    let mut a = Autoscaler::new(
        Settings {
            ps: [1, 4],
            ps_scaling: true,
            ..settings()
        },
        0,
    );
    let (mut t, mut s) = (0, 0);
    run(&mut a, &mut t, &mut s, 2, 1000, 2);
    let v = view(t, 2, s);
    let d = a.review(&plan(2, 3, 5000.0), &v);
    assert!(
        matches!(d, Decision::Keep(ref w) if w.contains("one PS count")),
        "{d:?}"
    );
    let mut p = plan(2, 3, 1000.0);
    p.for_memory = true;
    let d = a.review(&p, &v);
    assert!(
        matches!(
            d,
            Decision::Apply {
                workers: 2,
                ps: 3,
                ..
            }
        ),
        "{d:?}"
    );
}

#[test]
fn a_ps_slower_than_its_peers_twice_in_a_row_gets_its_load_spread() {
    let load = |index, requests, serve_s| PsLoad {
        index,
        requests,
        serve_s,
    };
    // 10 ms per request against peers at 1 ms: hot; 2.5x is not; too few requests
    // do not count.
    let hot = hot_ps(
        &[load(0, 100, 0.1), load(1, 100, 1.0), load(2, 100, 0.1)],
        3.0,
    );
    assert_eq!(hot.map(|h| h.0), Some(1));
    assert_eq!(hot_ps(&[load(0, 100, 0.1), load(1, 100, 0.25)], 3.0), None);
    assert_eq!(hot_ps(&[load(0, 100, 0.1), load(1, 5, 1.0)], 3.0), None);
    let mut a = Autoscaler::new(
        Settings {
            ps: [2, 3],
            ps_scaling: true,
            ..settings()
        },
        0,
    );
    let mut v = view(1000, 2, 100);
    v.ps = 2;
    // Cumulative counters: the first check only sets the baseline.
    assert_eq!(a.check_hot_ps(&[(1, 0, 0, 0.0), (2, 1, 0, 0.0)], &v), None);
    assert_eq!(
        a.check_hot_ps(&[(1, 0, 100, 0.1), (2, 1, 100, 1.0)], &v),
        None
    );
    let d = a.check_hot_ps(&[(1, 0, 200, 0.2), (2, 1, 200, 2.0)], &v);
    assert!(
        matches!(d, Some(Decision::Apply { ps: 3, ref reasons, .. }) if reasons[0].contains("hot PS 1")),
        "{d:?}"
    );
    // At the PS bound nothing more can be done.
    v.ps = 3;
    a.check_hot_ps(&[(1, 0, 300, 0.3), (2, 1, 300, 3.0)], &v);
    assert_eq!(
        a.check_hot_ps(&[(1, 0, 400, 0.4), (2, 1, 400, 4.0)], &v),
        None
    );
}

#[test]
fn a_ps_change_without_resharding_keeps_the_ps_count() {
    let mut a = Autoscaler::new(
        Settings {
            ps: [1, 4],
            ..settings()
        },
        0,
    );
    let v = view(10_000, 2, 5000);
    let d = a.review(&plan(2, 3, 5000.0), &v);
    assert!(
        matches!(d, Decision::Keep(ref w) if w.contains("re-sharding")),
        "{d:?}"
    );
    let d = a.review(&plan(3, 3, 5000.0), &v);
    assert!(
        matches!(
            d,
            Decision::Apply {
                workers: 3,
                ps: 1,
                ..
            }
        ),
        "{d:?}"
    );
}
