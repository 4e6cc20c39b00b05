use super::*;
use crate::tasks::DataSharding;

fn policy() -> Policy {
    Policy {
        num_ps: 2,
        dead_after_ms: 1000,
        max_worker_restarts: 2,
        straggler_ratio: 0.5,
        evaluate: true,
        recover_ps: false,
        warmup_samples: 0,
        pin_partitions: false,
        executors: 0,
    }
}

/// One file of 1000 rows in shards of 100, one epoch.
fn queue() -> TaskQueue {
    TaskQueue::new(
        DataSharding {
            rows_per_shard: 100,
            min_rows: 10,
            epochs: 1,
            seed: 1,
            shuffle: true,
            shuffle_rows: false,
        },
        vec![1000],
    )
}

fn job(cx: &mut Recorder, workers: u32) -> Job {
    let mut j = Job::start(policy(), queue(), workers, cx);
    for n in cx.launched.clone() {
        let addr = if n.role == Role::Ps {
            format!("127.0.0.1:{}", 9000 + n.index)
        } else {
            String::new()
        };
        j.register(n.id, n.role, &addr, "", 100 + n.id, cx).unwrap();
    }
    j
}

/// A node waiting in the engine's queue is not silent: the heartbeat timeout starts
/// once it runs. Without the engine's word, the same wait is a death.
#[test]
fn a_node_queued_by_the_engine_is_not_declared_dead() {
    let mut cx = Recorder::default();
    let mut j = Job::start(policy(), queue(), 1, &mut cx);
    let worker = cx.launched.last().unwrap().id;
    for t in 1..=5u64 {
        cx.now = t * 900;
        j.queued(worker, &mut cx);
        j.tick(&mut cx);
    }
    assert_eq!(j.node(worker).unwrap().state, NodeState::Pending);
    cx.now += 1500;
    j.tick(&mut cx);
    assert_eq!(j.node(worker).unwrap().state, NodeState::Dead);
}

#[test]
fn launches_ps_and_workers_and_publishes_addresses() {
    let mut cx = Recorder::default();
    let j = job(&mut cx, 3);
    assert_eq!(cx.launched.len(), 5);
    assert_eq!(
        j.ps_addrs().unwrap(),
        vec!["127.0.0.1:9000", "127.0.0.1:9001"]
    );
    assert_eq!(j.active_workers(), 3);
}

#[test]
fn async_warm_up_lets_one_worker_train_alone_first() {
    let mut cx = Recorder::default();
    let mut j = job(&mut cx, 2);
    j.policy.warmup_samples = 150;
    let TaskReply::Task(t) = j.get_task(3, &mut cx).unwrap() else {
        panic!()
    };
    assert_eq!(j.get_task(4, &mut cx).unwrap(), TaskReply::Wait);
    // Between its tasks the first worker holds nothing; the other still waits.
    j.report(3, t.id, 100, &mut cx).unwrap();
    assert_eq!(j.get_task(4, &mut cx).unwrap(), TaskReply::Wait);
    let TaskReply::Task(t2) = j.get_task(3, &mut cx).unwrap() else {
        panic!()
    };
    j.report(3, t2.id, 60, &mut cx).unwrap();
    // 160 samples reported: everyone trains.
    assert!(matches!(
        j.get_task(4, &mut cx).unwrap(),
        TaskReply::Task(_)
    ));
}

#[test]
fn a_restored_pause_point_holds_the_job_without_being_written_again() {
    let mut cx = Recorder::default();
    let mut j = job(&mut cx, 2);
    cx.changes.clear();
    j.restore_pause(Some(0));
    assert!(j.held(), "a pause point of 0 samples holds at once");
    assert_eq!(j.get_task(3, &mut cx).unwrap(), TaskReply::Wait);
    assert!(
        !cx.changes
            .iter()
            .any(|c| matches!(c, Change::Meta("pause_at", _))),
        "restoring re-wrote the stored pause point"
    );
}

#[test]
fn a_paused_job_hands_out_nothing_past_its_pause_point_until_released() {
    let mut cx = Recorder::default();
    let mut j = job(&mut cx, 2);
    j.set_pause(Some(150), &mut cx);
    assert!(cx
        .changes
        .iter()
        .any(|c| matches!(c, Change::Meta("pause_at", v) if v == "150")));
    let TaskReply::Task(t) = j.get_task(3, &mut cx).unwrap() else {
        panic!()
    };
    // Below the pause point: tasks are handed out.
    let TaskReply::Task(t2) = j.get_task(4, &mut cx).unwrap() else {
        panic!()
    };
    j.report(3, t.id, 100, &mut cx).unwrap();
    assert!(!j.held());
    // The task a worker holds is finished even past the pause point.
    j.report(4, t2.id, 100, &mut cx).unwrap();
    assert!(j.held());
    assert_eq!(j.get_task(3, &mut cx).unwrap(), TaskReply::Wait);
    assert_eq!(j.get_task(4, &mut cx).unwrap(), TaskReply::Wait);
    // Moving the point further lets the job go on until it gets there.
    j.set_pause(Some(300), &mut cx);
    assert!(matches!(
        j.get_task(3, &mut cx).unwrap(),
        TaskReply::Task(_)
    ));
    j.set_pause(None, &mut cx);
    assert!(!j.held());
}

#[test]
fn pinned_partitions_go_to_the_worker_of_their_rank_and_move_when_one_leaves() {
    let mut cx = Recorder::default();
    let files = DataSharding {
        rows_per_shard: 100,
        min_rows: 10,
        epochs: 1,
        seed: 1,
        shuffle: false,
        shuffle_rows: false,
    };
    let mut j = Job::start(
        Policy {
            pin_partitions: true,
            executors: 0,
            ..policy()
        },
        TaskQueue::new(files, vec![200, 300, 200]),
        2,
        &mut cx,
    );
    for n in cx.launched.clone() {
        let addr = format!("127.0.0.1:{}", 9000 + n.index);
        j.register(n.id, n.role, &addr, "", 100 + n.id, &mut cx)
            .unwrap();
    }
    // Workers 3 and 4 rank 0 and 1: files 0 and 2 are worker 3's, file 1 worker 4's.
    let files_of = |j: &mut Job, w: u32, cx: &mut Recorder| {
        let mut seen = Vec::new();
        while let TaskReply::Task(t) = j.get_task(w, cx).unwrap() {
            seen.push(t.file);
            j.report(w, t.id, t.len(), cx).unwrap();
            if seen.len() == 2 {
                break;
            }
        }
        seen
    };
    assert_eq!(files_of(&mut j, 4, &mut cx), vec![1, 1]);
    assert_eq!(files_of(&mut j, 3, &mut cx), vec![0, 0]);
    // File 1's last task comes first in the queue, but it is worker 4's.
    let TaskReply::Task(t) = j.get_task(3, &mut cx).unwrap() else {
        panic!("file 2 is worker 3's")
    };
    assert_eq!(t.file, 2);
    j.report(3, t.id, t.len(), &mut cx).unwrap();
    // Worker 4 is scaled away: worker 3 is alone and owns every file, file 1's last
    // task (first in queue order) included.
    j.scale(1, &mut cx);
    assert_eq!(j.get_task(4, &mut cx).unwrap(), TaskReply::Stop);
    assert_eq!(files_of(&mut j, 3, &mut cx), vec![1, 2]);
}

#[test]
fn a_retried_report_adds_no_rows_so_its_predictions_are_not_counted_twice() {
    let mut cx = Recorder::default();
    let mut j = job(&mut cx, 2);
    let TaskReply::Task(t) = j.get_task(3, &mut cx).unwrap() else {
        panic!()
    };
    let first = j.report(3, t.id, 40, &mut cx).unwrap();
    assert_eq!(first.new_rows, 40);
    // The reply was lost; the worker sends the same report again.
    let again = j.report(3, t.id, 40, &mut cx).unwrap();
    assert_eq!(again.new_rows, 0);
    assert_eq!(j.samples_done(), 40);
    assert_eq!(j.report(3, t.id, 70, &mut cx).unwrap().new_rows, 30);
}

#[test]
fn silent_worker_is_replaced_and_its_remainder_requeued() {
    let mut cx = Recorder::default();
    let mut j = job(&mut cx, 2);
    let TaskReply::Task(t) = j.get_task(3, &mut cx).unwrap() else {
        panic!()
    };
    j.report(3, t.id, 40, &mut cx).unwrap();
    cx.now = 500;
    j.heartbeat(4, 0, 0, &mut cx);
    j.heartbeat(1, 0, 0, &mut cx);
    j.heartbeat(2, 0, 0, &mut cx);
    cx.now = 1200;
    j.tick(&mut cx);
    assert_eq!(j.node(3).unwrap().state, NodeState::Dead);
    assert_eq!(cx.killed, vec![3]);
    assert!(cx
        .events
        .iter()
        .any(|e| matches!(e, Event::Requeued { worker: 3, .. })));
    assert_eq!(cx.launched.last().unwrap().restarts, 1);
    // The dead worker's late report and heartbeat are refused.
    assert!(j.report(3, t.id, 50, &mut cx).is_err());
    assert_eq!(j.heartbeat(3, 0, 0, &mut cx), Directive::Unknown);
    // The next worker gets exactly the remainder.
    let TaskReply::Task(r) = j.get_task(4, &mut cx).unwrap() else {
        panic!()
    };
    assert_eq!((r.start, r.end), (t.start + 40, t.end));
}

#[test]
fn dead_ps_fails_the_job_naming_it() {
    let mut cx = Recorder::default();
    let mut j = job(&mut cx, 1);
    j.heartbeat(1, 0, 17, &mut cx);
    j.process_exited(2, &mut cx);
    let Phase::Failed(msg) = j.phase() else {
        panic!("{:?}", j.phase())
    };
    assert!(msg.contains("parameter server 1"), "{msg}");
    assert!(msg.contains("last step 0"), "{msg}");
    assert!(cx.killed.contains(&1) && cx.killed.contains(&3));
}

#[test]
fn dead_ps_with_checkpoints_awaits_recovery_and_full_restore_rewinds() {
    let mut cx = Recorder::default();
    let mut j = Job::start(
        Policy {
            recover_ps: true,
            ..policy()
        },
        TaskQueue::new(
            DataSharding {
                rows_per_shard: 100,
                min_rows: 10,
                epochs: 1,
                seed: 1,
                shuffle: true,
                shuffle_rows: false,
            },
            vec![1000],
        ),
        2,
        &mut cx,
    );
    for n in cx.launched.clone() {
        j.register(n.id, n.role, "127.0.0.1:1", "", 1, &mut cx)
            .unwrap();
    }
    let TaskReply::Task(t) = j.get_task(3, &mut cx).unwrap() else {
        panic!()
    };
    j.report(3, t.id, 40, &mut cx).unwrap();
    let pos = j.data_position();
    j.report(3, t.id, 70, &mut cx).unwrap();
    j.process_exited(2, &mut cx);
    assert_eq!(j.phase(), &Phase::Training);
    assert!(j.recovering());
    let f = j.take_ps_failures();
    assert_eq!((f.len(), f[0].index, f[0].samples), (1, 1, 70));
    // Partial: one new PS with the same index.
    let before = cx.launched.len();
    let id = j.relaunch_ps(1, 1, &mut cx);
    assert_eq!(cx.launched.len(), before + 1);
    assert_eq!(j.node(id).unwrap().index, 1);
    // Full: everything replaced, ledger back at 40 rows, the held task requeued.
    let q = TaskQueue::from_position(j.tasks().spec().clone(), vec![1000], &pos);
    j.full_restore(q, pos.epochs_closed.clone(), &mut cx);
    assert_eq!(j.samples_done(), 40);
    assert!(j.nodes().filter(|n| n.state.is_live()).all(|n| n.id > id));
    assert_eq!(j.active_workers(), 2);
    let TaskReply::Task(r) = j.get_task(id + 3, &mut cx).unwrap() else {
        panic!()
    };
    assert_eq!((r.start, r.end), (t.start + 40, t.end));
}

#[test]
fn scale_down_stops_newest_after_its_report_then_scale_up() {
    let mut cx = Recorder::default();
    let mut j = job(&mut cx, 3);
    let TaskReply::Task(t) = j.get_task(5, &mut cx).unwrap() else {
        panic!()
    };
    assert_eq!(j.scale(1, &mut cx), 3);
    assert_eq!(j.heartbeat(5, 0, 0, &mut cx), Directive::Stop);
    assert_eq!(j.node(3).unwrap().state, NodeState::Running);
    let ack = j.report(5, t.id, 20, &mut cx).unwrap();
    assert!(ack.stop);
    assert_eq!(j.node(5).unwrap().state, NodeState::Exited);
    assert_eq!(j.get_task(4, &mut cx).unwrap(), TaskReply::Stop);
    assert_eq!(j.active_workers(), 1);
    j.scale(3, &mut cx);
    assert_eq!(j.active_workers(), 3);
    assert_eq!(cx.launched.len(), 7);
}

#[test]
fn restart_budget_is_bounded_and_job_fails_without_workers() {
    let mut cx = Recorder::default();
    let mut j = job(&mut cx, 1);
    for _ in 0..3 {
        let w = j
            .nodes()
            .find(|n| n.role == Role::Worker && n.state.is_live())
            .unwrap()
            .id;
        j.process_exited(w, &mut cx);
    }
    assert!(matches!(j.phase(), Phase::Failed(m) if m.contains("restart budget")));
}

#[test]
fn full_run_ends_with_evaluation_and_clean_ledger() {
    let mut cx = Recorder::default();
    let mut j = job(&mut cx, 2);
    let mut finished = 0;
    while finished < 2 {
        for w in [3, 4] {
            match j.get_task(w, &mut cx) {
                Ok(TaskReply::Task(t)) => {
                    j.report(w, t.id, t.len(), &mut cx).unwrap();
                }
                Ok(TaskReply::Finished { evaluate: true }) => {
                    j.report_eval(
                        w,
                        EvalResult {
                            auc: 0.7,
                            logloss: 0.5,
                            samples: 10,
                            ne: None,
                            calibration: None,
                            gauc: None,
                        },
                        Vec::new(),
                        &mut cx,
                    )
                    .unwrap();
                    finished += 1;
                }
                Ok(TaskReply::Finished { evaluate: false }) | Err(_) => finished += 1,
                Ok(other) => panic!("{other:?}"),
            }
        }
    }
    assert_eq!(j.phase(), &Phase::Finished);
    assert_eq!(j.epochs_closed().len(), 1);
    assert!(j.epochs_closed()[0].1.exactly_once());
    assert!(j.eval().is_some());
}

/// A worker that was as fast as its peers for a long time and then slows down is
/// flagged within a few seconds: the rate is recent, not an average since launch.
#[test]
fn a_worker_that_slows_down_is_flagged_quickly() {
    let mut cx = Recorder::default();
    let mut j = job(&mut cx, 3);
    let mut samples = [0u64; 3];
    for t in 1..=60u64 {
        cx.now = t * 1000;
        for (k, w) in [3u32, 4, 5].into_iter().enumerate() {
            // Worker 5 drops to a fifth of its speed after 50 s.
            samples[k] += if w == 5 && t > 50 { 200 } else { 1000 };
            j.heartbeat(w, samples[k], t, &mut cx);
        }
        if t == 50 {
            assert!(!j.is_straggler(5));
        }
    }
    // Its rate since launch is still 87% of its peers'; its recent rate is not.
    assert!(j.is_straggler(5));
    assert!(!j.is_straggler(3));
}

/// Start-up and waiting are not slowness: a worker is judged only on a whole window
/// of work, and a worker told to wait (here: while another warms the model up) is
/// not flagged once it starts, though it trained nothing during its first seconds.
#[test]
fn waiting_or_starting_workers_are_not_stragglers() {
    let mut cx = Recorder::default();
    let mut j = job(&mut cx, 3);
    cx.now = 500;
    j.heartbeat(3, 4000, 1, &mut cx);
    j.heartbeat(4, 4000, 1, &mut cx);
    j.heartbeat(5, 100, 1, &mut cx);
    assert!(!j.is_straggler(5), "judged before a whole window");
    // Worker 5 is told to wait (held at a pause point) for 3 s; its peers train.
    j.set_pause(Some(0), &mut cx);
    assert!(matches!(j.get_task(5, &mut cx), Ok(TaskReply::Wait)));
    j.set_pause(None, &mut cx);
    for t in 1..=3u64 {
        cx.now = 500 + t * 1000;
        j.heartbeat(3, 4000 + t * 1000, 1, &mut cx);
        j.heartbeat(4, 4000 + t * 1000, 1, &mut cx);
        j.heartbeat(5, 100, 1, &mut cx);
    }
    assert!(!j.is_straggler(5), "flagged for waiting");
    // Once it works, it is judged on its work: as fast as its peers here.
    assert!(matches!(j.get_task(5, &mut cx), Ok(TaskReply::Task(_))));
    cx.now += 1000;
    j.heartbeat(3, 8000, 2, &mut cx);
    j.heartbeat(4, 8000, 2, &mut cx);
    j.heartbeat(5, 1100, 2, &mut cx);
    assert!(!j.is_straggler(5));
    cx.now += 1000;
    j.heartbeat(3, 9000, 3, &mut cx);
    j.heartbeat(4, 9000, 3, &mut cx);
    j.heartbeat(5, 1100, 3, &mut cx);
    assert!(j.is_straggler(5), "stalled for a whole window");
}

#[test]
fn straggler_detection_uses_peer_median() {
    let mut cx = Recorder::default();
    let mut j = job(&mut cx, 3);
    cx.now = 10_000;
    j.heartbeat(3, 1000, 1, &mut cx);
    j.heartbeat(4, 1000, 1, &mut cx);
    j.heartbeat(5, 100, 1, &mut cx);
    assert!(j.is_straggler(5));
    assert!(!j.is_straggler(3));
    let TaskReply::Task(t) = j.get_task(5, &mut cx).unwrap() else {
        panic!()
    };
    assert_eq!(t.len(), 50);
    assert!(cx.events.contains(&Event::Straggler { id: 5, slow: true }));
}

/// A job whose nodes gave metrics addresses, so a silent one can be probed.
fn probed_job(cx: &mut Recorder, workers: u32) -> Job {
    let mut j = Job::start(policy(), queue(), workers, cx);
    for n in cx.launched.clone() {
        let metrics = format!("127.0.0.1:{}", 9100 + n.id);
        j.register(n.id, n.role, "127.0.0.1:9000", &metrics, 100 + n.id, cx)
            .unwrap();
    }
    j
}

/// Silence is a suspicion, not a verdict: a silent node that answers the master's direct
/// probe stays (a busy machine); one that does not answer, or whose probe fails, is
/// declared dead, and the reason says which.
#[test]
fn a_silent_node_is_probed_and_kept_when_it_answers() {
    let mut cx = Recorder::default();
    let mut j = probed_job(&mut cx, 1);
    let worker = 3;
    let beat_others = |j: &mut Job, cx: &mut Recorder| {
        for id in [1, 2] {
            j.heartbeat(id, 0, 0, cx);
        }
    };
    cx.now = 1200;
    beat_others(&mut j, &mut cx);
    j.tick(&mut cx);
    assert_eq!(cx.probed, vec![worker]);
    assert_eq!(j.node(worker).unwrap().state, NodeState::Running);
    assert!(cx
        .events
        .iter()
        .any(|e| matches!(e, Event::NodeSuspected { id: 3, silent_ms, .. } if *silent_ms == 1200)));
    // A tick while the probe is out changes nothing, and probes no second time.
    cx.now = 1500;
    j.tick(&mut cx);
    assert_eq!(cx.probed, vec![worker]);
    j.probe_answered(worker, &mut cx);
    assert!(cx
        .events
        .iter()
        .any(|e| matches!(e, Event::ProbeAnswered { id: 3, .. })));
    cx.now = 2400;
    beat_others(&mut j, &mut cx);
    j.tick(&mut cx);
    assert_eq!(j.node(worker).unwrap().state, NodeState::Running);
    // Silent again, probed again; this time nothing answers within dead_after_ms.
    cx.now = 2600;
    beat_others(&mut j, &mut cx);
    j.tick(&mut cx);
    assert_eq!(cx.probed, vec![worker, worker]);
    cx.now = 3700;
    beat_others(&mut j, &mut cx);
    j.tick(&mut cx);
    assert_eq!(j.node(worker).unwrap().state, NodeState::Dead);
    let reason = cx
        .events
        .iter()
        .find_map(|e| match e {
            Event::NodeDead { id: 3, reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .unwrap();
    assert!(
        reason.contains("no answer to a direct probe of 127.0.0.1:9103"),
        "{reason}"
    );
    assert!(cx.killed.contains(&worker));
}

#[test]
fn a_failed_probe_is_a_death_and_a_heartbeat_ends_a_suspicion() {
    let mut cx = Recorder::default();
    let mut j = probed_job(&mut cx, 2);
    cx.now = 1200;
    for id in [1, 2] {
        j.heartbeat(id, 0, 0, &mut cx);
    }
    j.tick(&mut cx);
    assert_eq!(j.suspected(), vec![3, 4]);
    // Worker 4's heartbeat arrives after all: no longer suspected, and a late probe
    // answer or failure about it changes nothing.
    j.heartbeat(4, 0, 0, &mut cx);
    assert_eq!(j.suspected(), vec![3]);
    j.probe_failed(4, "connection refused", &mut cx);
    assert_eq!(j.node(4).unwrap().state, NodeState::Running);
    j.probe_failed(3, "connection refused", &mut cx);
    assert_eq!(j.node(3).unwrap().state, NodeState::Dead);
    assert!(cx.events.iter().any(|e| matches!(e,
        Event::NodeDead { id: 3, reason, .. } if reason.contains("probe of 127.0.0.1:9103 failed: connection refused"))));
    assert!(j.suspected().is_empty());
}

/// A node that answers probes but never beats again does no work: after
/// MAX_PROBE_SAVES answers in a row its next silence is a death.
#[test]
fn a_node_that_only_answers_probes_is_declared_dead() {
    let mut cx = Recorder::default();
    let mut j = probed_job(&mut cx, 1);
    let mut t = 0;
    for round in 0..=MAX_PROBE_SAVES {
        t += 1100;
        cx.now = t;
        for id in [1, 2] {
            j.heartbeat(id, 0, 0, &mut cx);
        }
        j.tick(&mut cx);
        if round < MAX_PROBE_SAVES {
            assert_eq!(
                j.node(3).unwrap().state,
                NodeState::Running,
                "round {round}"
            );
            j.probe_answered(3, &mut cx);
        }
    }
    assert_eq!(cx.probed.len(), MAX_PROBE_SAVES as usize);
    assert_eq!(j.node(3).unwrap().state, NodeState::Dead);
    assert!(cx.events.iter().any(|e| matches!(e,
        Event::NodeDead { id: 3, reason, .. } if reason.contains("answered 3 probes in a row"))));
}

/// A server whose lease ran out says so in its heartbeats (it hears no replies: an
/// asymmetric partition). Those heartbeats are no sign of life: it is suspected, probed
/// and declared dead as a silent node is, instead of staying fenced for ever; its
/// heartbeats are answered meanwhile, and "unknown" once it is dead.
#[test]
fn a_fenced_servers_heartbeats_do_not_keep_it_alive() {
    let mut cx = Recorder::default();
    let mut j = probed_job(&mut cx, 1);
    let ps = 1;
    assert_eq!(j.node(ps).unwrap().role, Role::Ps);
    cx.now = 600;
    assert_eq!(j.fenced_heartbeat(ps), Directive::Continue);
    cx.now = 1200;
    assert_eq!(j.fenced_heartbeat(ps), Directive::Continue);
    for id in [2, 3] {
        j.heartbeat(id, 0, 0, &mut cx);
    }
    j.tick(&mut cx);
    assert_eq!(j.suspected(), vec![ps]);
    assert_eq!(j.fenced_heartbeat(ps), Directive::Continue);
    assert_eq!(
        j.suspected(),
        vec![ps],
        "a fenced heartbeat ended the suspicion"
    );
    j.probe_failed(ps, "no route to host", &mut cx);
    assert_eq!(j.node(ps).unwrap().state, NodeState::Dead);
    assert_eq!(j.fenced_heartbeat(ps), Directive::Unknown);
    assert_eq!(
        j.running_ps_nodes()[0],
        0,
        "a dead server is still published"
    );
}
