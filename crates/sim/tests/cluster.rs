//! The cluster simulator: exact small scenarios, determinism, the live policies running,
//! and bad traces.

use elastrec_sim::cluster::batch;
use elastrec_sim::cluster::trace::{self, JobKind, TraceSpec};
use elastrec_sim::cluster::truth::Truth;
use elastrec_sim::cluster::{job_rng, run_cluster, BatchPolicy, OnlinePolicy, SimSettings};

const HEADER: &str = "job_id,kind,submit_s,model,user,tables,rows_per_table,emb_dim,dense_params,samples,batch_size,peak_rate,duration_s,workers,ps,worker_cpu,ps_cpu,worker_mem_gb,ps_mem_gb";

fn quiet() -> SimSettings {
    SimSettings {
        nodes: 8,
        failures_per_pod_hour: 0.0,
        straggler_prob: 0.0,
        baseline_ckpt_s: 1e9,
        ..SimSettings::default()
    }
}

/// One job alone on the cluster with its own configuration: it starts when submitted and
/// ends after exactly `samples / throughput` of its true throughput.
#[test]
fn a_lone_static_job_ends_when_its_true_throughput_says() {
    let text = format!(
        "{HEADER}\nj1,batch,120,dlrm,u,26,100000,16,500000,200000000,512,0,0,8,2,4,4,8,16\n"
    );
    let jobs = trace::parse_csv(&text, "t.csv").unwrap();
    let s = quiet();
    let (out, totals) = batch::run(&jobs, BatchPolicy::StaticUser, &s, &|_| {});
    let truth = Truth::of(&jobs[0], &mut job_rng(s.seed, "j1"));
    let expected = 120.0 + 200_000_000.0 / truth.throughput(&jobs[0].requested);
    assert_eq!(out[0].start_s, Some(120.0));
    let end = out[0].end_s.unwrap();
    assert!((end - expected).abs() < 1e-3, "{end} vs {expected}");
    assert_eq!((out[0].scalings, out[0].failures, out[0].ooms), (0, 0, 0));
    // 8 workers x 4 cores + 2 PS x 4 cores held for the whole run.
    let hours = (end - 120.0) / 3600.0;
    assert!(
        (out[0].core_hours - 40.0 * hours).abs() < 40.0 / 60.0,
        "{out:?}"
    );
    assert!(totals.cpu_alloc_s > 0.0 && totals.cpu_used_s <= totals.cpu_alloc_s);
}

/// Two jobs that each need the whole cluster: the second waits for the first.
#[test]
fn a_job_that_does_not_fit_waits_for_the_one_before_it() {
    let row = |id: &str, at: u32| {
        format!("{id},batch,{at},dlrm,u,26,100000,16,500000,100000000,512,0,0,30,2,8,8,8,16")
    };
    let text = format!("{HEADER}\n{}\n{}\n", row("a", 0), row("b", 10));
    let jobs = trace::parse_csv(&text, "t.csv").unwrap();
    let s = SimSettings {
        nodes: 4,
        ..quiet()
    };
    let (out, _) = batch::run(&jobs, BatchPolicy::StaticUser, &s, &|_| {});
    let a_end = out[0].end_s.unwrap();
    let b_start = out[1].start_s.unwrap();
    assert!(
        b_start >= a_end,
        "b started at {b_start}, a ended at {a_end}"
    );
    // The queue is served at the next control cycle after the end.
    assert!(b_start - a_end <= s.control_s + 1e-9);
}

/// A user who asked for too little PS memory: the job dies of OOM, is restarted with
/// more, and still ends.
#[test]
fn an_undersized_ps_runs_out_of_memory_and_the_job_still_ends() {
    let text = format!(
        "{HEADER}\nj,batch,0,dlrm,u,40,20000000,32,500000,300000000,512,0,0,8,2,4,4,8,20\n"
    );
    let jobs = trace::parse_csv(&text, "t.csv").unwrap();
    let (out, _) = batch::run(&jobs, BatchPolicy::StaticUser, &quiet(), &|_| {});
    assert!(out[0].ooms >= 1, "{out:?}");
    assert!(out[0].end_s.is_some());
    assert!(out[0].retrained > 0.0);
}

/// A job that asks for far more workers than pay (64, where contention makes the last of
/// them nearly idle) and has the cluster to itself. Under elastrec, growth that does not
/// pay is undone and capped (`autoscale.growth_efficiency`): it gives cores back and
/// ends sooner than both its own configuration and elastrec without the rule.
#[test]
fn elastrec_gives_back_workers_that_do_not_pay() {
    let text = format!(
        "{HEADER}\nj,batch,0,dlrm,u,26,1000000,16,2000000,2000000000,512,0,0,64,16,16,4,8,16\n"
    );
    let jobs = trace::parse_csv(&text, "t.csv").unwrap();
    let truth = Truth::of(&jobs[0], &mut job_rng(quiet().seed, "j"));
    let tuned = truth.tuned();
    assert!(
        truth.throughput(&jobs[0].requested) < truth.throughput(&tuned),
        "the request is past the knee"
    );
    // 32 nodes: room for the 1,088 cores it asks for.
    let s = SimSettings {
        nodes: 32,
        ..quiet()
    };
    let run = |growth_efficiency: f64| {
        let s = SimSettings {
            growth_efficiency,
            ..s
        };
        batch::run(&jobs, BatchPolicy::Elastrec, &s, &|_| {})
            .0
            .remove(0)
    };
    let (with, without) = (run(0.3), run(0.0));
    let (user, _) = batch::run(&jobs, BatchPolicy::StaticUser, &s, &|_| {});
    let jct = |o: &batch::JobOutcome| o.end_s.unwrap() - o.submit_s;
    assert!(
        with.core_hours < without.core_hours,
        "{with:?} vs {without:?}"
    );
    assert!(
        with.core_hours < user[0].core_hours,
        "{with:?} vs {:?}",
        user[0]
    );
    assert!(jct(&with) < jct(&user[0]), "{with:?} vs {:?}", user[0]);
    assert!(jct(&with) < jct(&without), "{with:?} vs {without:?}");
    assert!(with.last.unwrap().workers < 64, "{with:?}");
}

fn small_trace() -> Vec<trace::JobRecord> {
    trace::generate(&TraceSpec {
        jobs: 12,
        online_jobs: 1,
        span_h: 2.0,
        online_h: 12.0,
        seed: 3,
    })
}

/// The same seed gives the same tables; elastrec's jobs run the brain's plans.
#[test]
fn the_same_seed_gives_the_same_report_and_elastrec_plans_with_the_brain() {
    let jobs = small_trace();
    assert_eq!(jobs.iter().filter(|j| j.kind == JobKind::Online).count(), 1);
    let s = SimSettings {
        nodes: 20,
        ..SimSettings::default()
    };
    let policies = [BatchPolicy::Elastrec, BatchPolicy::Es, BatchPolicy::Optimus];
    let online = [OnlinePolicy::Kale, OnlinePolicy::Hpa];
    let strip = |r: &elastrec_sim::cluster::ClusterReport| {
        let mut rows = r.batch.clone();
        for row in &mut rows {
            row.wall_s = 0.0;
        }
        (rows, r.online.clone())
    };
    let a = run_cluster(&jobs, &policies, &online, &s, &|_, _| {});
    let b = run_cluster(&jobs, &policies, &online, &s, &|_, _| {});
    assert_eq!(strip(&a), strip(&b));
    let e = &a.batch[0];
    assert_eq!(e.policy, BatchPolicy::Elastrec);
    assert_eq!(e.finished, 12, "{e:?}");
    assert!(e.plans > 0, "the brain planned: {e:?}");
    for row in &a.batch {
        assert_eq!(row.finished, row.submitted, "{row:?}");
        assert!(row.cpu_utilization > 0.0 && row.cpu_utilization <= 1.0);
    }
    // The tables name every policy and every claim compares with the paper.
    let text = a.render();
    for name in [
        "elastrec",
        "es",
        "optimus",
        "kale",
        "hpa",
        "JCT vs ES",
        "SLO violation",
    ] {
        assert!(text.contains(name), "{name} missing from\n{text}");
    }
}

#[test]
fn a_trace_survives_a_round_trip_through_csv() {
    let jobs = small_trace();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.csv");
    trace::write_csv(&path, &jobs).unwrap();
    let back = trace::read_csv(&path).unwrap();
    assert_eq!(back.len(), jobs.len());
    // Read traces come in submission order.
    let mut jobs = jobs;
    jobs.sort_by(|a, b| a.submit_s.total_cmp(&b.submit_s));
    for (a, b) in jobs.iter().zip(&back) {
        assert_eq!(a.job_id, b.job_id);
        assert_eq!(a.requested, b.requested);
        assert_eq!(
            (a.samples, a.kind, a.submit_s),
            (b.samples, b.kind, b.submit_s)
        );
    }
}

#[test]
fn bad_traces_name_the_line_and_the_column() {
    let err = |text: &str| trace::parse_csv(text, "t.csv").unwrap_err().to_string();
    let missing = HEADER.replace(",duration_s", "");
    assert!(
        err(&format!("{missing}\n")).contains("t.csv:1: missing column `duration_s`"),
        "{}",
        err(&format!("{missing}\n"))
    );
    let negative = format!(
        "{HEADER}\nok,batch,0,dlrm,u,26,100000,16,500000,1000000,512,0,0,8,2,4,4,8,16\ns,online,0,mmoe,u,26,100000,16,500000,0,512,1000,-5,8,2,4,4,8,16\n"
    );
    let e = err(&negative);
    assert!(e.contains("t.csv:3") && e.contains("`duration_s`"), "{e}");
    let kind =
        format!("{HEADER}\nx,weekly,0,dlrm,u,26,100000,16,500000,1000000,512,0,0,8,2,4,4,8,16\n");
    assert!(err(&kind).contains("`weekly` is neither `batch` nor `online`"));
    let bounds =
        format!("{HEADER}\nx,batch,0,dlrm,u,26,100000,16,500000,1000000,512,0,0,500,2,4,4,8,16\n");
    assert!(err(&bounds).contains("outside the brain's bounds"));
    assert!(err(HEADER).contains("no job after the header"));
    assert!(err("").contains("empty file"));
}

#[test]
fn settings_out_of_range_name_the_flag() {
    let bad = SimSettings {
        straggler_prob: 1.5,
        ..SimSettings::default()
    };
    assert!(bad
        .validate()
        .unwrap_err()
        .to_string()
        .contains("--straggler-prob"));
    let small = SimSettings {
        node_mem_gb: 16.0,
        ..SimSettings::default()
    };
    assert!(small.validate().is_err());
    assert!(SimSettings::default().validate().is_ok());
}
