//! `train`'s reader thread: parsed batches ahead of the step over a bounded channel, and
//! where the `[[preprocess]]` plan runs (reader or trainer threads).

use super::*;

/// A batch in flight between the reader thread and the trainer: with a `[[preprocess]]`
/// plan, its raw rows too, preprocessed by whichever side the placement says.
pub(super) struct Fetched {
    pub(super) batch: Batch,
    pub(super) raw: RawColumns,
    /// `batch` holds the rows (else `raw` does, for the trainer to preprocess).
    pub(super) ready: bool,
}

/// The reader thread's and the trainer's shared view of the plan's placement.
#[derive(Default)]
pub(super) struct PlacementState {
    /// The plan runs on the training threads.
    pub(super) on_trainer: AtomicBool,
    /// The reader's parse and plan time per batch, nanoseconds (its averages).
    pub(super) read_ns: AtomicU64,
    pub(super) plan_ns: AtomicU64,
}

/// What the trainer knows about the plan's placement (`[[preprocess]]` jobs only).
pub(super) struct Placer {
    pub(super) plan: Arc<Plan>,
    pub(super) state: Arc<PlacementState>,
    pub(super) mode: PreprocessOn,
    pub(super) threads: usize,
    /// The training step, as the trainer times it.
    pub(super) step: Ewma,
    /// The plan on the training threads, as one thread's time.
    pub(super) plan_inline: Ewma,
    pub(super) batches: u64,
    pub(super) switches: u32,
}

/// Batches between placement decisions.
pub(super) const DECIDE_EVERY: u64 = 16;

impl Placer {
    pub(super) fn placement(&self) -> Placement {
        if self.state.on_trainer.load(Ordering::Relaxed) {
            Placement::TrainingThreads
        } else {
            Placement::ReaderThread
        }
    }

    pub(super) fn costs(&self) -> Costs {
        let reader_plan = self.state.plan_ns.load(Ordering::Relaxed) as f64 / 1e9;
        Costs {
            read_s: self.state.read_ns.load(Ordering::Relaxed) as f64 / 1e9,
            // The newest measurement of the plan, wherever it ran.
            plan_s: match self.placement() {
                Placement::TrainingThreads if self.plan_inline.is_set() => self.plan_inline.get(),
                _ => reader_plan,
            },
            step_s: self.step.get(),
        }
    }

    /// A batch is wanted: every [`DECIDE_EVERY`] batches, the placement is reconsidered.
    pub(super) fn requested(&mut self) {
        self.batches += 1;
        if self.mode == PreprocessOn::Auto && self.batches.is_multiple_of(DECIDE_EVERY) {
            let now = self.placement();
            let next = self.costs().choose(now, self.threads);
            if next != now {
                self.switches += 1;
                self.state
                    .on_trainer
                    .store(next == Placement::TrainingThreads, Ordering::Relaxed);
            }
        }
    }

    /// Preprocesses `f` here, on the training threads.
    pub(super) fn run_inline(&mut self, f: &mut Fetched) {
        let t = Instant::now();
        self.plan.run_parallel(&f.raw, &mut f.batch, self.threads);
        self.plan_inline
            .add(t.elapsed().as_secs_f64() * self.threads as f64);
        f.ready = true;
    }

    pub(super) fn report(&self) -> PreprocessReport {
        PreprocessReport {
            placement: self.placement(),
            mode: self.mode,
            switches: self.switches,
            costs: self.costs(),
        }
    }
}

/// Where `train` ran the `[[preprocess]]` plan, and the costs it measured (`summary.json`).
#[derive(Debug, Clone, Serialize)]
pub struct PreprocessReport {
    /// Where the plan ran last.
    pub placement: Placement,
    /// `train.preprocess_on`.
    pub mode: PreprocessOn,
    /// Times the placement moved.
    pub switches: u32,
    /// Per batch: parse, plan (one thread) and step, seconds.
    pub costs: Costs,
}

/// Streams the training files in order on a background thread; with a `[[preprocess]]`
/// plan, runs it where [`crate::placement`] says.
pub(crate) struct Prefetcher {
    pub(super) full: Receiver<Result<Fetched>>,
    pub(super) empty: SyncSender<Fetched>,
    /// Raw buffers of batches handed out, until they are recycled with them.
    pub(super) raws: Mutex<Vec<RawColumns>>,
    pub(super) placer: Option<Mutex<Placer>>,
    pub(super) handle: Option<std::thread::JoinHandle<ReadStats>>,
}

impl Prefetcher {
    /// Reads `segments` in order.
    pub(crate) fn start(segments: Vec<Segment>, job: &JobConfig) -> Self {
        let (full_tx, full) = sync_channel::<Result<Fetched>>(PREFETCH);
        let (empty, empty_rx) = sync_channel::<Fetched>(PREFETCH + 2);
        let batch_size = job.train.batch_size;
        for _ in 0..PREFETCH + 2 {
            let f = Fetched {
                batch: Batch::default(),
                raw: RawColumns::default(),
                ready: false,
            };
            empty.send(f).expect("receiver alive");
        }
        let policy = job.data.on_bad_row;
        let tasks = job.model.tasks();
        // Validated when the job file was loaded.
        let plan = elastrec_job::prepare::feature_plan(job).unwrap_or(None);
        let schema = elastrec_job::prepare::job_schema(job);
        let state = Arc::new(PlacementState::default());
        state.on_trainer.store(
            job.train.preprocess_on == PreprocessOn::Trainer,
            Ordering::Relaxed,
        );
        let placer = plan.clone().map(|plan| {
            Mutex::new(Placer {
                plan,
                state: state.clone(),
                mode: job.train.preprocess_on,
                threads: rayon::current_num_threads(),
                step: Ewma::default(),
                plan_inline: Ewma::default(),
                batches: 0,
                switches: 0,
            })
        });
        let handle = std::thread::Builder::new()
            .name("elastrec-reader".into())
            .spawn(move || {
                let mut stats = ReadStats::default();
                let mut scratch = plan.as_ref().map(|p| p.scratch());
                let (mut read_avg, mut plan_avg) = (Ewma::default(), Ewma::default());
                // The buffer that found a file's end goes on to the next file: dropping it
                // would shrink the pool by one per file until reader and trainer both wait.
                let mut spare: Option<Fetched> = None;
                for Segment { path, start, end } in segments {
                    let range = (start != 0 || end != u64::MAX).then_some((start, end));
                    let opened = elastrec_data::open_source(&path, range, policy, schema.as_ref());
                    let mut reader = match opened {
                        Ok(r) => r,
                        Err(e) => {
                            let _ = full_tx.send(Err(e.into()));
                            return stats;
                        }
                    };
                    loop {
                        let mut b = match spare.take() {
                            Some(b) => b,
                            None => match empty_rx.recv() {
                                Ok(b) => b,
                                Err(_) => return stats,
                            },
                        };
                        let t = Instant::now();
                        let read = match &plan {
                            None => reader.next_batch(&mut b.batch, batch_size),
                            Some(_) => reader.next_raw(&mut b.raw, batch_size),
                        };
                        let read = read.and_then(|n| {
                            let (rows, got) = match &plan {
                                None => (b.batch.len(), b.batch.tasks),
                                Some(_) => (b.raw.len(), b.raw.tasks),
                            };
                            elastrec_data::check_tasks(rows, got, tasks, &path).map(|()| n)
                        });
                        match read {
                            Ok(0) => {
                                spare = Some(b);
                                break;
                            }
                            Ok(_) => {
                                b.ready = true;
                                if let (Some(plan), Some(scratch)) = (&plan, scratch.as_mut()) {
                                    read_avg.add(t.elapsed().as_secs_f64());
                                    state
                                        .read_ns
                                        .store((read_avg.get() * 1e9) as u64, Ordering::Relaxed);
                                    if state.on_trainer.load(Ordering::Relaxed) {
                                        b.ready = false;
                                    } else {
                                        // Preprocessing here, while the training threads
                                        // compute the previous batch.
                                        let t = Instant::now();
                                        plan.run(&b.raw, &mut b.batch, scratch);
                                        plan_avg.add(t.elapsed().as_secs_f64());
                                        state.plan_ns.store(
                                            (plan_avg.get() * 1e9) as u64,
                                            Ordering::Relaxed,
                                        );
                                    }
                                }
                                if full_tx.send(Ok(b)).is_err() {
                                    return stats;
                                }
                            }
                            Err(e) => {
                                let _ = full_tx.send(Err(e.into()));
                                return stats;
                            }
                        }
                    }
                    stats.merge(reader.stats());
                }
                stats
            })
            .expect("spawn reader thread");
        Self {
            full,
            empty,
            raws: Mutex::new(Vec::new()),
            placer,
            handle: Some(handle),
        }
    }

    /// The next batch, `None` at the end of the files.
    pub(crate) fn next(&self) -> Option<Result<Batch>> {
        if let Some(p) = &self.placer {
            p.lock().requested();
        }
        let mut f = match self.full.recv().ok()? {
            Ok(f) => f,
            Err(e) => return Some(Err(e)),
        };
        if let Some(p) = &self.placer {
            if !f.ready {
                p.lock().run_inline(&mut f);
            }
        }
        self.raws.lock().push(f.raw);
        Some(Ok(f.batch))
    }

    /// The trainer's time for one step (evaluations and checkpoints excluded), for the
    /// placement's cost model.
    pub(crate) fn record_step(&self, seconds: f64) {
        if let Some(p) = &self.placer {
            p.lock().step.add(seconds);
        }
    }

    /// Returns a consumed batch's buffers to the reader.
    pub(crate) fn recycle(&self, batch: Batch) {
        let raw = self.raws.lock().pop().unwrap_or_default();
        let _ = self.empty.send(Fetched {
            batch,
            raw,
            ready: false,
        });
    }

    /// Where the plan ran and what it cost, for a `[[preprocess]]` job.
    pub(crate) fn preprocess_report(&self) -> Option<PreprocessReport> {
        self.placer.as_ref().map(|p| p.lock().report())
    }

    /// Stops the reader (it may be blocked on either channel) and returns its counters.
    pub(crate) fn finish(self) -> ReadStats {
        let Prefetcher {
            full,
            empty,
            handle,
            ..
        } = self;
        drop(full);
        drop(empty);
        handle
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default()
    }
}
