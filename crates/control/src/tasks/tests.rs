use super::*;
use rand::{Rng, SeedableRng};

fn spec(rows: u64, epochs: u32) -> DataSharding {
    DataSharding {
        rows_per_shard: rows,
        min_rows: 10,
        epochs,
        seed: 3,
        shuffle: true,
        shuffle_rows: false,
    }
}

fn drain(q: &mut TaskQueue, worker: u32) -> Vec<(u32, LedgerSummary)> {
    let mut epochs = Vec::new();
    loop {
        match q.assign(worker, false) {
            Assignment::Task(t) => {
                let r = q.report(worker, t.id, t.len()).unwrap();
                epochs.extend(r.epoch_done);
            }
            Assignment::Wait => panic!("single worker never waits"),
            Assignment::Finished => return epochs,
        }
    }
}

/// Trains every task handed out until the queue makes the worker wait.
fn train_until_wait(q: &mut TaskQueue, worker: u32) -> Vec<(u32, LedgerSummary)> {
    let mut epochs = Vec::new();
    while let Assignment::Task(t) = q.assign(worker, false) {
        epochs.extend(q.report(worker, t.id, t.len()).unwrap().epoch_done);
    }
    epochs
}

/// A following job's queue waits for more files while it grows, trains appended files
/// after the ones before them, and closes its one epoch exactly once, with the ledger
/// exact over every file, when growth stops.
#[test]
fn a_following_queue_trains_appended_files_and_ends_when_growth_stops() {
    let mut q = TaskQueue::new(spec(100, 1), vec![250, 50]);
    q.follow();
    assert!(
        train_until_wait(&mut q, 1).is_empty(),
        "no verdict while growing"
    );
    assert_eq!(q.assign(1, false), Assignment::Wait);
    assert!(!q.is_finished());
    let first = q.append_files(&[120, 0, 30], &[]);
    assert_eq!(first, 2);
    // Appended tasks come in file order (never shuffled in before older data).
    let mut files = Vec::new();
    while let Assignment::Task(t) = q.assign(1, false) {
        files.push(t.file);
        q.report(1, t.id, t.len()).unwrap();
    }
    assert_eq!(files, vec![2, 2, 4]);
    let (epoch, verdict) = q.stop_growing().expect("everything was trained");
    assert_eq!(epoch, 0);
    assert_eq!((verdict.consumed, verdict.missing), (450, 0));
    assert!(verdict.exactly_once());
    assert!(q.is_finished());
    assert_eq!(q.stop_growing(), None, "closed once");
}

/// Growth that stops while tasks are open closes the epoch with the last report.
#[test]
fn a_following_queue_closes_with_its_last_task_after_growth_stops() {
    let mut q = TaskQueue::new(spec(100, 1), vec![100]);
    q.follow();
    let Assignment::Task(t) = q.assign(1, false) else {
        panic!()
    };
    assert_eq!(q.stop_growing(), None, "a task is still open");
    let r = q.report(1, t.id, t.len()).unwrap();
    assert_eq!(r.epoch_done.map(|e| e.1.missing), Some(0));
    assert_eq!(q.assign(1, false), Assignment::Finished);
}

/// Files appended after a checkpointed position (or stored just before a master
/// stopped) have no task in the rebuilt queue: following again cuts them, once.
#[test]
fn following_again_cuts_the_files_a_rebuilt_queue_has_no_task_for() {
    let mut q = TaskQueue::new(spec(100, 1), vec![100]);
    q.follow();
    let pos = q.position();
    q.append_files(&[200], &[]);
    let mut r = TaskQueue::from_position(spec(100, 1), vec![100, 200], &pos);
    r.follow();
    r.follow();
    let tasks: Vec<_> = r.tasks.values().map(|t| (t.file, t.start, t.end)).collect();
    assert_eq!(tasks, vec![(0, 0, 100), (1, 0, 100), (1, 100, 200)]);
    r.stop_growing();
    let verdicts = drain(&mut r, 1);
    assert_eq!(verdicts.len(), 1);
    assert_eq!((verdicts[0].1.consumed, verdicts[0].1.missing), (300, 0));
}

/// A job whose list is still being counted trains the counted files, waits instead of
/// cutting its second epoch, takes the rest as they are counted, and then closes epoch 0
/// and runs epoch 1 over every file: each row once per epoch.
#[test]
fn a_queue_counting_its_list_holds_the_next_epoch_until_the_list_is_complete() {
    let mut q = TaskQueue::new(spec(100, 2), vec![250, 50]);
    q.count_later(700);
    assert_eq!(q.total_rows(), 1400, "the estimate while counting");
    assert!(
        train_until_wait(&mut q, 1).is_empty(),
        "epoch 0 is still open"
    );
    assert_eq!(q.assign(1, false), Assignment::Wait);
    assert_eq!(
        q.generated_epochs(),
        1,
        "no epoch 1 before the list is counted"
    );
    assert_eq!(q.append_files(&[120, 0, 330], &[]), 2);
    let mut files = std::collections::BTreeSet::new();
    while let Assignment::Task(t) = q.assign(1, false) {
        assert_eq!(t.epoch, 0);
        files.insert(t.file);
        q.report(1, t.id, t.len()).unwrap();
    }
    assert_eq!(files, [2, 4].into());
    let (epoch, verdict) = q.stop_growing().expect("epoch 0 is done");
    assert_eq!((epoch, verdict.consumed, verdict.missing), (0, 750, 0));
    assert_eq!(q.total_rows(), 1500, "the counted rows once complete");
    let rest = drain(&mut q, 1);
    assert_eq!(rest.len(), 1);
    assert_eq!((rest[0].0, rest[0].1.consumed), (1, 750));
    assert!(rest[0].1.exactly_once());
}

/// An appended batch is shuffled among itself, the same way for the same job, and never
/// ahead of the tasks already queued.
#[test]
fn a_counted_batch_is_shuffled_behind_the_queued_tasks() {
    let order = || {
        let mut q = TaskQueue::new(spec(10, 1), vec![10]);
        q.count_later(0);
        q.append_files(&[100, 100], &[]);
        let mut got = Vec::new();
        while let Assignment::Task(t) = q.assign(1, false) {
            got.push((t.file, t.start));
            q.report(1, t.id, t.len()).unwrap();
        }
        got
    };
    let got = order();
    assert_eq!(got[0], (0, 0), "the counted file's task first");
    assert_eq!(got.len(), 21);
    let mut sorted = got.clone();
    sorted.sort();
    assert_ne!(got, sorted, "shuffled");
    assert_eq!(got, order(), "deterministic");
}

/// A queue rebuilt from a position taken before the last files were counted (a full
/// recovery, a master's restart) cuts those files into epoch 0: nothing is skipped.
#[test]
fn a_rebuilt_queue_cuts_files_counted_after_its_position() {
    let mut q = TaskQueue::new(spec(100, 1), vec![100]);
    q.count_later(0);
    let pos = q.position();
    q.append_files(&[200], &[]);
    let mut r = TaskQueue::from_position(spec(100, 1), vec![100, 200], &pos);
    let tasks: Vec<_> = r.tasks.values().map(|t| (t.file, t.start, t.end)).collect();
    assert_eq!(tasks, vec![(0, 0, 100), (1, 0, 100), (1, 100, 200)]);
    let verdicts = drain(&mut r, 1);
    assert_eq!(verdicts.len(), 1);
    assert_eq!((verdicts[0].1.consumed, verdicts[0].1.missing), (300, 0));
}

/// A queue rebuilt from a mid-epoch position (one task held) finishes the job with the
/// ledger exact: the held task's unreported rows are trained once, nothing twice.
#[test]
fn position_round_trip_resumes_exactly() {
    let mut q = TaskQueue::new(spec(100, 1), vec![1000]);
    let Assignment::Task(a) = q.assign(1, false) else {
        panic!()
    };
    q.report(1, a.id, a.len()).unwrap();
    let Assignment::Task(b) = q.assign(1, false) else {
        panic!()
    };
    q.report(1, b.id, 30).unwrap();
    let pos = q.position();
    assert_eq!(pos.samples(), a.len() + 30);
    let json = serde_json::to_string(&pos).unwrap();
    let pos: DataPosition = serde_json::from_str(&json).unwrap();
    // Training went on after the checkpoint; the rebuilt queue forgets it.
    q.report(1, b.id, 60).unwrap();
    let mut r = TaskQueue::from_position(spec(100, 1), vec![1000], &pos);
    assert_eq!(r.ledger().summary(0).consumed, a.len() + 30);
    let Assignment::Task(next) = r.assign(2, false) else {
        panic!()
    };
    assert_eq!((next.start, next.end), (b.start + 30, b.end));
    let closed = drain(&mut r, 2);
    assert_eq!(closed.len(), 1);
    assert!(closed[0].1.exactly_once(), "{:?}", closed[0].1);
}

#[test]
fn one_worker_covers_every_epoch_exactly_once() {
    let mut q = TaskQueue::new(spec(64, 3), vec![1000, 17, 0, 300]);
    let epochs = drain(&mut q, 1);
    assert_eq!(epochs.len(), 3);
    for (e, (epoch, s)) in epochs.iter().enumerate() {
        assert_eq!(*epoch, e as u32);
        assert_eq!(s.consumed, 1317);
        assert!(s.exactly_once(), "{s}");
    }
    assert!(q.is_finished());
}

#[test]
fn shuffle_is_seeded_and_differs_per_epoch() {
    let order = |seed| {
        let mut s = spec(10, 2);
        s.seed = seed;
        let mut q = TaskQueue::new(s, vec![200]);
        let mut v = Vec::new();
        while let Assignment::Task(t) = q.assign(1, false) {
            v.push((t.epoch, t.start));
            q.report(1, t.id, t.len()).unwrap();
        }
        v
    };
    assert_eq!(order(5), order(5));
    assert_ne!(order(5), order(6));
    let v = order(5);
    let e0: Vec<u64> = v.iter().filter(|x| x.0 == 0).map(|x| x.1).collect();
    let e1: Vec<u64> = v.iter().filter(|x| x.0 == 1).map(|x| x.1).collect();
    assert_ne!(e0, e1);
}

/// With `shuffle_rows`, a task of a file carries its rows' order: blocks are the
/// shards, and each epoch and file has its own seed; a mixture's stream partitions
/// keep their arrival order.
#[test]
fn row_shuffle_is_per_epoch_and_file_and_spares_streams() {
    let s = DataSharding {
        shuffle_rows: true,
        ..spec(100, 2)
    };
    let mut q = TaskQueue::new(s.clone(), vec![250, 130]);
    let mut seeds = std::collections::BTreeMap::new();
    while let Assignment::Task(t) = q.assign(1, false) {
        let r = q.row_shuffle(&t).expect("a file task is shuffled");
        assert_eq!(
            (r.block_rows, r.file_rows),
            (100, [250, 130][t.file as usize])
        );
        assert_eq!(*seeds.entry((t.epoch, t.file)).or_insert(r.seed), r.seed);
        q.report(1, t.id, t.len()).unwrap();
    }
    let distinct: std::collections::BTreeSet<u64> = seeds.values().copied().collect();
    assert_eq!((seeds.len(), distinct.len()), (4, 4));
    let mut mixed = TaskQueue::new_mixed(s.clone(), vec![100], vec![0]);
    mixed.extend_stream(1, 50, true);
    let mut kinds = Vec::new();
    while let Assignment::Task(t) = mixed.assign(1, false) {
        kinds.push((t.file, mixed.row_shuffle(&t).is_some()));
        mixed.report(1, t.id, t.len()).unwrap();
        if kinds.len() > 10 {
            break;
        }
    }
    assert!(
        kinds.contains(&(0, true)) && kinds.contains(&(1, false)),
        "{kinds:?}"
    );
    let mut plain = TaskQueue::new(spec(100, 1), vec![250]);
    let Assignment::Task(t) = plain.assign(1, false) else {
        panic!("no task")
    };
    assert_eq!(plain.row_shuffle(&t), None);
}

#[test]
fn lost_worker_requeues_exactly_the_unreported_remainder() {
    let mut q = TaskQueue::new(spec(100, 1), vec![100]);
    let Assignment::Task(t) = q.assign(1, false) else {
        panic!()
    };
    q.report(1, t.id, 30).unwrap();
    let r = q.release(1).unwrap();
    let rem = q.task(r).unwrap().clone();
    assert_eq!((rem.start, rem.end, rem.state), (30, 100, TaskState::Todo));
    // The dead worker's late report is refused.
    assert!(matches!(
        q.report(1, t.id, 50),
        Err(ReportError::NotHeld { .. })
    ));
    let Assignment::Task(t2) = q.assign(2, false) else {
        panic!()
    };
    assert_eq!(t2.id, rem.id);
    let r = q.report(2, t2.id, 70).unwrap();
    let (_, s) = r.epoch_done.unwrap();
    assert_eq!(s.to_string(), "consumed 100, duplicated 0, missing 0");
}

#[test]
fn repeated_or_backward_reports() {
    let mut q = TaskQueue::new(spec(100, 1), vec![100]);
    let Assignment::Task(t) = q.assign(1, false) else {
        panic!()
    };
    q.report(1, t.id, 40).unwrap();
    assert_eq!(q.report(1, t.id, 40).unwrap().range, None);
    assert!(matches!(
        q.report(1, t.id, 39),
        Err(ReportError::BadOffset { .. })
    ));
    assert!(matches!(
        q.report(1, t.id, 101),
        Err(ReportError::BadOffset { .. })
    ));
    // Asking again returns the held task.
    assert_eq!(
        q.assign(1, false),
        Assignment::Task(q.task(t.id).unwrap().clone())
    );
}

#[test]
fn straggler_gets_a_smaller_task_and_the_tail_stays_first() {
    let mut q = TaskQueue::new(
        DataSharding {
            shuffle: false,
            ..spec(100, 1)
        },
        vec![200],
    );
    let Assignment::Task(t) = q.assign(1, true) else {
        panic!()
    };
    assert_eq!((t.start, t.end), (0, 50));
    let Assignment::Task(t2) = q.assign(2, false) else {
        panic!()
    };
    assert_eq!((t2.start, t2.end), (50, 100));
}

#[test]
fn waits_while_others_hold_tasks_then_finishes() {
    let mut q = TaskQueue::new(spec(100, 1), vec![100]);
    let Assignment::Task(t) = q.assign(1, false) else {
        panic!()
    };
    assert_eq!(q.assign(2, false), Assignment::Wait);
    q.report(1, t.id, 100).unwrap();
    assert_eq!(q.assign(2, false), Assignment::Finished);
}

/// Interleaves assignments, partial reports, worker deaths (with and without the
/// master restarting from its persisted rows) and checks the ledger proves
/// exactly-once for every epoch.
#[test]
fn randomized_interleaving_is_exactly_once() {
    for seed in 0..60u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let files: Vec<u64> = (0..rng.random_range(1..4))
            .map(|_| rng.random_range(0..500))
            .collect();
        let epochs = rng.random_range(1..4);
        let mut q = TaskQueue::new(spec(rng.random_range(10..80), epochs), files.clone());
        // Mirror of the persisted tables.
        let mut db_tasks: BTreeMap<u64, Task> = BTreeMap::new();
        let mut db_ranges = Vec::new();
        let mut workers: Vec<u32> = vec![1, 2, 3];
        let mut next_worker = 4;
        let mut done_epochs = Vec::new();
        for _step in 0..20_000 {
            if q.is_finished() {
                break;
            }
            let w = workers[rng.random_range(0..workers.len())];
            match rng.random_range(0..10) {
                0 => {
                    q.release(w);
                    workers.retain(|&x| x != w);
                    workers.push(next_worker);
                    next_worker += 1;
                }
                1 => {
                    // Master restart from persisted state.
                    let gen = q.generated_epochs();
                    q = TaskQueue::restore(
                        q.spec().clone(),
                        files.clone(),
                        db_tasks.values().cloned().collect(),
                        &db_ranges,
                        gen,
                    );
                }
                _ => match q.assign(w, rng.random_bool(0.2)) {
                    Assignment::Task(t) => {
                        let step = rng.random_range(1..=t.len().max(1));
                        let off = (t.offset + step).min(t.len());
                        let r = q.report(w, t.id, off).unwrap();
                        done_epochs.extend(r.epoch_done);
                    }
                    Assignment::Wait | Assignment::Finished => {}
                },
            }
            let (tasks, ranges) = q.take_dirty();
            for t in tasks {
                db_tasks.insert(t.id, t);
            }
            db_ranges.extend(ranges);
        }
        assert!(q.is_finished(), "seed {seed} did not finish");
        for e in 0..epochs {
            let s = q.ledger().summary(e);
            assert!(s.exactly_once(), "seed {seed} epoch {e}: {s}");
            assert_eq!(s.consumed, files.iter().sum::<u64>());
        }
    }
}

#[test]
fn a_stream_worker_continues_its_partition_when_the_next_range_is_near_the_head() {
    let mut q = TaskQueue::new_stream(spec(10, 1), vec![0, 0]);
    // Two polls: tasks alternate between the partitions, oldest first.
    for high in [10, 20] {
        q.extend_stream(0, high, false);
        q.extend_stream(1, high, false);
    }
    let Assignment::Task(a) = q.assign(1, false) else {
        panic!("a task")
    };
    assert_eq!((a.file, a.start), (0, 0));
    let Assignment::Task(b) = q.assign(2, false) else {
        panic!("a task")
    };
    assert_eq!((b.file, b.start), (1, 0));
    q.report(1, a.id, a.len()).unwrap();
    // The head is partition 0's next range anyway; worker 2 then skips past
    // it to continue partition 1.
    q.report(2, b.id, b.len()).unwrap();
    let Assignment::Task(c) = q.assign(2, false) else {
        panic!("a task")
    };
    assert_eq!(
        (c.file, c.start),
        (1, 10),
        "worker 2 reads on in partition 1"
    );
    let Assignment::Task(d) = q.assign(1, false) else {
        panic!("a task")
    };
    assert_eq!((d.file, d.start), (0, 10));
    // A worker whose partition has nothing near the head takes the head.
    q.report(1, d.id, d.len()).unwrap();
    q.extend_stream(1, 30, false);
    let Assignment::Task(e) = q.assign(1, false) else {
        panic!("a task")
    };
    assert_eq!((e.file, e.start), (1, 20));
    assert_eq!(q.ledger().summary(0).duplicated, 0);
}

#[test]
fn compacting_a_stream_queue_keeps_its_position_exactly() {
    let mut q = TaskQueue::new_stream(spec(10, 1), vec![5, 0]);
    q.extend_stream(0, 105, false);
    q.extend_stream(1, 47, true);
    // Train most of it, leave one task held half-way and some untouched.
    for _ in 0..12 {
        let Assignment::Task(t) = q.assign(1, false) else {
            panic!("a task")
        };
        q.report(1, t.id, t.len()).unwrap();
    }
    let Assignment::Task(held) = q.assign(2, false) else {
        panic!("a task")
    };
    q.report(2, held.id, 4).unwrap();
    let (todo, doing, done) = q.counts();
    let before = (q.position(), q.committed(), q.ledger().summary(0));
    let dropped = q.compact();
    assert_eq!(
        dropped, 11,
        "partition 0's furthest task stays (1's is not done)"
    );
    assert_eq!(q.counts(), (todo, doing, done), "status still counts them");
    assert_eq!(q.committed(), before.1);
    assert_eq!(q.ledger().summary(0), before.2);
    // A queue rebuilt from the compacted position is where the full one was.
    let pos = q.position();
    assert!(pos.tasks.len() < before.0.tasks.len());
    let r = TaskQueue::from_position(spec(10, 1), vec![0, 0], &pos);
    let full = TaskQueue::from_position(spec(10, 1), vec![0, 0], &before.0);
    assert_eq!(r.committed(), full.committed());
    assert_eq!(r.ledger().summary(0), full.ledger().summary(0));
    for p in 0..2 {
        assert_eq!(r.undealt(p, 200), full.undealt(p, 200), "partition {p}");
    }
    // A file queue keeps its tasks.
    let mut files = TaskQueue::new(spec(10, 1), vec![30]);
    drain(&mut files, 1);
    assert_eq!(files.compact(), 0);
}

#[test]
fn a_pinned_worker_takes_only_its_own_partitions_in_queue_order() {
    // Three partitions, two workers: slot 0 owns partitions 0 and 2, slot 1 owns 1.
    let mut q = TaskQueue::new_stream(spec(10, 1), vec![0, 0, 0]);
    for p in 0..3 {
        q.extend_stream(p, 20, false);
    }
    let first = Pin { slot: 0, slots: 2 };
    let second = Pin { slot: 1, slots: 2 };
    let mut seen = Vec::new();
    for _ in 0..4 {
        let Assignment::Task(t) = q.assign_pinned(1, false, Some(first)) else {
            panic!("slot 0 has tasks")
        };
        seen.push((t.file, t.start));
        q.report(1, t.id, t.len()).unwrap();
    }
    assert_eq!(seen, vec![(0, 0), (0, 10), (2, 0), (2, 10)]);
    assert_eq!(
        q.assign_pinned(1, false, Some(first)),
        Assignment::Wait,
        "partition 1's data is not slot 0's, however long it waits"
    );
    let Assignment::Task(t) = q.assign_pinned(2, false, Some(second)) else {
        panic!("slot 1 has tasks")
    };
    assert_eq!(t.file, 1);
    // With one worker left, it owns every partition.
    q.release(2);
    let Assignment::Task(t) = q.assign_pinned(1, false, Some(Pin { slot: 0, slots: 1 })) else {
        panic!("the released task")
    };
    assert_eq!((t.file, t.start), (1, 0));
}

#[test]
fn a_stream_queue_deals_arriving_offsets_and_never_finishes() {
    // Partition 0 starts at offset 100, partition 1 at 0.
    let mut q = TaskQueue::new_stream(spec(20, 1), vec![100, 0]);
    assert!(q.is_stream());
    assert_eq!(q.assign(1, false), Assignment::Wait, "nothing arrived yet");
    assert_eq!(q.extend_stream(0, 150, false), 40, "two whole shards");
    assert_eq!(q.undealt(0, 150), 10);
    assert_eq!(q.extend_stream(1, 5, false), 0);
    assert_eq!(
        q.extend_stream(1, 5, true),
        5,
        "a lingering remainder is flushed"
    );
    let Assignment::Task(t) = q.assign(1, false) else {
        panic!("a task")
    };
    assert_eq!((t.file, t.start, t.end), (0, 100, 120));
    q.report(1, t.id, 20).unwrap();
    let Assignment::Task(t) = q.assign(1, false) else {
        panic!("a task")
    };
    assert_eq!((t.file, t.start, t.end), (0, 120, 140));
    q.report(1, t.id, 8).unwrap();
    // The worker dies: its unreported remainder comes back first.
    q.release(1);
    let Assignment::Task(t) = q.assign(2, false) else {
        panic!("a task")
    };
    assert_eq!((t.file, t.start, t.end), (0, 128, 140));
    assert_eq!(q.committed(), vec![128, 0]);
    q.report(2, t.id, 12).unwrap();
    let Assignment::Task(t) = q.assign(2, false) else {
        panic!("a task")
    };
    assert_eq!((t.file, t.start, t.end), (1, 0, 5));
    let r = q.report(2, t.id, 5).unwrap();
    assert!(
        r.task_done && r.epoch_done.is_none(),
        "a stream's epoch never closes"
    );
    assert_eq!(
        q.assign(2, false),
        Assignment::Wait,
        "online: wait, never finished"
    );
    assert!(!q.is_finished());
    assert_eq!(q.committed(), vec![140, 5]);
    let s = q.ledger().summary(0);
    assert_eq!((s.consumed, s.duplicated, s.missing), (45, 0, 0));
    assert_eq!(q.total_rows(), 45);

    // A checkpointed position restores the partitions' starts and how far they were
    // dealt; the rest arrives afterwards.
    let pos = q.position();
    assert_eq!(pos.stream_starts, Some(vec![100, 0]));
    let mut r = TaskQueue::from_position(spec(20, 1), vec![0, 0], &pos);
    assert!(r.is_stream());
    assert_eq!(r.undealt(0, 150), 10);
    assert_eq!(r.committed(), vec![140, 5]);
    assert_eq!(r.extend_stream(0, 160, false), 20);
    let Assignment::Task(t) = r.assign(3, false) else {
        panic!("a task")
    };
    assert_eq!((t.file, t.start, t.end), (0, 140, 160));
    assert_eq!(r.ledger().summary(0).missing, 20, "dealt, not yet trained");
}

/// A mixture queue: the history's files first (sequential serving), then the stream;
/// a checkpointed position taken mid-history, with stream data waiting, rebuilds both
/// sources exactly, and the ledger counts each row once across them.
#[test]
fn a_mixture_queue_trains_the_history_then_the_stream_and_restores_both() {
    // Two history files (250 and 50 rows), two partitions starting at 100 and 0.
    let mut q = TaskQueue::new_mixed(spec(100, 1), vec![250, 50], vec![100, 0]);
    assert!(q.is_stream());
    assert_eq!(q.stream_from(), 2);
    assert_eq!(q.queued(), vec![4, 0], "history cut at once");
    assert_eq!(
        q.extend_stream(0, 5, false),
        0,
        "a history file is no partition"
    );
    assert_eq!(q.extend_stream(2, 300, false), 200);
    assert_eq!(q.extend_stream(3, 50, true), 50);
    assert_eq!(q.queued(), vec![4, 3]);
    let Assignment::Task(a) = q.assign(1, false) else {
        panic!("a task")
    };
    assert!(a.file < 2, "sequential: history first");
    q.report(1, a.id, a.len()).unwrap();
    let Assignment::Task(b) = q.assign(1, false) else {
        panic!("a task")
    };
    q.report(1, b.id, 7).unwrap();
    let pos = q.position();
    assert_eq!(pos.stream_from, 2);
    assert_eq!(pos.stream_starts, Some(vec![0, 0, 100, 0]));
    let json = serde_json::to_string(&pos).unwrap();
    let pos: DataPosition = serde_json::from_str(&json).unwrap();
    let mut r = TaskQueue::from_position(spec(100, 1), vec![250, 50, 0, 0], &pos);
    assert_eq!(r.stream_from(), 2);
    assert_eq!(r.undealt(2, 300), 0, "dealt offsets are restored");
    let mut order = Vec::new();
    while let Assignment::Task(t) = r.assign(2, false) {
        order.push(t.file);
        r.report(2, t.id, t.len()).unwrap();
    }
    let split = order.iter().position(|&f| f >= 2).expect("stream tasks");
    assert!(order[..split].iter().all(|&f| f < 2), "{order:?}");
    assert!(order[split..].iter().all(|&f| f >= 2), "{order:?}");
    assert_eq!(
        r.assign(2, false),
        Assignment::Wait,
        "the stream never ends"
    );
    let s = r.ledger().summary(0);
    assert_eq!((s.consumed, s.duplicated, s.missing), (300 + 250, 0, 0));
    assert_eq!(r.committed(), vec![250, 50, 300, 50]);
    assert_eq!(r.partitions_committed(), vec![300, 50]);
    // Before any checkpoint, a full recovery restores the start: the history again.
    let mut fresh =
        TaskQueue::from_position(spec(100, 1), vec![250, 50, 0, 0], &r.start_position());
    assert_eq!(fresh.queued(), vec![4, 0]);
    assert_eq!(
        fresh.extend_stream(2, 300, false),
        200,
        "from the start offset"
    );
}

/// Under a long history backlog, Eq. 4 serves stream data as it arrives (its weight
/// dominates once a few tasks wait), and the history fills the gaps.
#[test]
fn priority_serving_keeps_the_stream_fresh_behind_a_history_backlog() {
    let mut q = TaskQueue::new_mixed(spec(10, 1), vec![1000], vec![0]);
    q.set_serving(Serving::Priority {
        weights: vec![1.0, 4.0],
        target: 1.0,
    });
    let mut high = 0;
    let mut stream_waits = Vec::new();
    for _ in 0..50 {
        // Two stream tasks arrive per history task trained.
        high += 20;
        q.extend_stream(1, high, false);
        for _ in 0..3 {
            let Assignment::Task(t) = q.assign(1, false) else {
                panic!("a task")
            };
            q.report(1, t.id, t.len()).unwrap();
        }
        stream_waits.push(q.queued()[1]);
    }
    assert!(
        stream_waits.iter().all(|&w| w == 0),
        "never a stream task left behind: {stream_waits:?}"
    );
    let served = q.served();
    assert_eq!(served[1].rows, 1000);
    assert_eq!(served[HISTORY].rows, 500);
    // Sequential serving would have trained the whole history first.
    let mut seq = TaskQueue::new_mixed(spec(10, 1), vec![1000], vec![0]);
    seq.extend_stream(1, 100, false);
    let Assignment::Task(t) = seq.assign(1, false) else {
        panic!("a task")
    };
    assert_eq!(t.file, 0);
}

/// `[[data.source]]`: files 0 and 2 are source 0 (weight 3), file 1 source 1
/// (weight 1). Rows are served 3 : 1 while both have data; a queue restored at a
/// position mid-way, dealt into the same sources, serves the rest in the same order as
/// the original; every row trains once.
#[test]
fn sources_are_served_by_weight_and_survive_a_restore() {
    let mut q = TaskQueue::new(spec(10, 1), vec![100, 200, 100]);
    q.set_sources(2, vec![0, 1, 0]);
    q.set_serving(Serving::Weighted {
        weights: vec![3.0, 1.0, 1.0],
    });
    let mut files = Vec::new();
    let take = |q: &mut TaskQueue, n: usize, files: &mut Vec<u32>| {
        for _ in 0..n {
            let Assignment::Task(t) = q.assign(1, false) else {
                return;
            };
            files.push(t.file);
            q.report(1, t.id, t.len()).unwrap();
        }
    };
    take(&mut q, 16, &mut files);
    let source1 = files.iter().filter(|&&f| f == 1).count();
    assert_eq!(source1, 4, "3 : 1 by rows: {files:?}");
    assert_eq!(q.queued(), vec![8, 16, 0]);
    let pos = q.position();
    let mut restored = TaskQueue::from_position(spec(10, 1), vec![100, 200, 100], &pos);
    restored.set_sources(2, vec![0, 1, 0]);
    restored.set_serving(q.serving().clone());
    assert_eq!(restored.queued(), q.queued());
    let (mut rest, mut rest_restored) = (Vec::new(), Vec::new());
    take(&mut q, 100, &mut rest);
    take(&mut restored, 100, &mut rest_restored);
    assert_eq!(rest.len(), 24);
    assert_eq!(rest_restored, rest);
    // Source 0 runs dry first, then source 1 alone.
    assert_eq!(rest.iter().filter(|&&f| f == 1).count(), 16);
    assert_eq!(*rest.last().unwrap(), 1);
    let summary = restored.ledger().summary(0);
    assert_eq!((summary.consumed, summary.duplicated), (400, 0));
    assert_eq!(q.served()[0].rows + q.served()[1].rows, 400);
}
