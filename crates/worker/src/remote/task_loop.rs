//! The worker's loop over its tasks: ask the master, read the split, train each batch
//! through the parameter servers, report the progress offset.

use super::*;

/// Reports progress, retrying while the master is unreachable (e.g. restarting).
/// Returns `(task_done, stop, lr_scale)` (`lr_scale` 0: no schedule).
async fn report(
    master: &mut Master,
    id: u32,
    task: u64,
    offset: u64,
    predicted: Predictions,
    metrics: &WorkerMetrics,
) -> anyhow::Result<(bool, bool, f32)> {
    let req = ReportProgressRequest {
        version: rpc::version(),
        node_id: id,
        task_id: task,
        offset,
        predicted: predicted.probs,
        labels: predicted.labels,
        tasks: predicted.tasks,
        weights: predicted.weights,
    };
    let r = rpc::retry_transient(Some(Duration::from_secs(300)), || {
        let (mut m, req) = (master.clone(), req.clone());
        async move { m.report_progress(req).await }
    })
    .await;
    match r {
        Ok(r) => {
            let r = r.into_inner();
            Ok((r.task_done, r.stop, r.lr_scale))
        }
        Err(s) if s.code() == Code::NotFound || s.code() == Code::FailedPrecondition => {
            if let Some(line) = metrics.how_pulls_went(id) {
                eprintln!("{line}");
            }
            eprintln!("worker {id}: master refused progress ({s}); exiting");
            std::process::exit(3);
        }
        Err(s) => bail!("report progress: {s}"),
    }
}

/// The evaluation the master asked for at the job's end: the model as the PS hold it,
/// judged on the job's evaluation files, reported per task.
async fn evaluate_and_report(
    job: &JobConfig,
    model: &mut RemoteModel,
    master: &Master,
    id: u32,
) -> anyhow::Result<()> {
    let mut stats = elastrec_data::ReadStats::default();
    let batches = crate::trainer::load_eval_set(&job.eval_files(), job, &mut stats)?;
    let accs = model.evaluate(&batches, job.data.user_slot()).await?;
    let results: Vec<_> = accs.iter().map(EvalAccumulator::result).collect();
    let (first, rest) = (results[0], &results[1..]);
    let nan = |v: Option<f64>| v.unwrap_or(f64::NAN);
    let req = ReportEvalRequest {
        version: rpc::version(),
        node_id: id,
        auc: first.auc,
        logloss: first.logloss,
        samples: first.samples,
        ne: nan(first.ne),
        calibration: nan(first.calibration),
        task_auc: rest.iter().map(|r| r.auc).collect(),
        task_logloss: rest.iter().map(|r| r.logloss).collect(),
        task_ne: rest.iter().map(|r| nan(r.ne)).collect(),
        task_calibration: rest.iter().map(|r| nan(r.calibration)).collect(),
        gauc: nan(first.gauc),
        task_gauc: rest.iter().map(|r| nan(r.gauc)).collect(),
    };
    rpc::retry_transient(None, || {
        let (mut m, req) = (master.clone(), req.clone());
        async move { m.report_eval(req).await }
    })
    .await
    .map_err(|s| anyhow::anyhow!("report eval: {s}"))?;
    Ok(())
}

/// The worker process.
pub async fn run_worker(args: WorkerArgs) -> anyhow::Result<()> {
    let token = rpc::token_from_env()?;
    elastrec_rpc::tls::install_from_env()?;
    let id = args.node_id;
    let mut master = rpc::master_client(&args.master, &token, 64 << 20)?;
    // The job says where to bind; registering again with the endpoint's address also
    // waits for the parameter servers.
    let (job, _, _, _) = register(&mut master, Role::Worker, id, "", "", false).await?;
    let metrics = Arc::new(WorkerMetrics::new(id));
    let (_endpoint, metrics_addr) = serve_metrics(&job, id, &token, &metrics).await?;
    eprintln!("worker {id}: metrics on http://{metrics_addr}/metrics");
    let reg = register_node(&mut master, Role::Worker, id, "", &metrics_addr, true).await?;
    let hb_ms = reg.heartbeat_ms;
    let layout = PsLayout {
        version: reg.layout_version,
        addrs: reg.ps_addrs,
    };
    let max = job.cluster.max_message_bytes;
    let master = rpc::master_client(&args.master, &token, max)?;
    let shared = Arc::new(Shared::default());
    shared.executors.set_credentials(&token, max);
    *shared.ps_layout.lock() = layout.clone();
    *shared.last_ack.lock() = Some(Instant::now());
    // On a thread of their own (`rpc::beats`): training, reading and pushing keep this
    // runtime busy, and the master must hear from the worker all the same.
    let beat_shared = shared.clone();
    let _beats = rpc::beats::spawn(
        "heartbeats",
        &args.master,
        &token,
        Duration::from_millis(hb_ms),
        move |mut m, seq| {
            let req = heartbeat_request(id, &beat_shared);
            let shared = beat_shared.clone();
            async move {
                let r = m.heartbeat(req).await;
                apply_heartbeat_reply(r, seq, id, &shared);
            }
        },
    )?;
    let model = RemoteModel::new(&job, layout, token.clone(), shared.clone(), id)?;
    let files = TaskFiles::of_blocking(&job).await?;
    // Compiled once: every task's reader runs it.
    let plan = elastrec_job::prepare::feature_plan(&job)?;
    shared
        .active_workers
        .store(job.cluster.workers, Ordering::Relaxed);
    let mut worker = TaskLoop {
        // The master declares a node dead after `dead_after_ms` of silence; stop pushing
        // well before that so a worker it gave up on never trains reassigned samples.
        lease: job.cluster.lease(hb_ms),
        batch: Batch::default(),
        exit_after_push: fail_point_exit_after_push(id),
        slow_batch: fail_point_slow_batch(id),
        trace: RowTrace::open(id)?,
        // Online jobs judge the stream (`stream.eval_window`); batch jobs every batch
        // (`train.progressive_window`).
        progressive: match &job.stream {
            Some(s) => s.eval_window > 0,
            None => job.train.progressive_window > 0,
        },
        predicted: Predictions::default(),
        stream: None,
        job,
        id,
        master,
        model,
        files,
        plan,
        shared,
        metrics,
    };
    let trained = worker.train_tasks().await;
    if trained.is_err() {
        worker.say_how_data_came();
    }
    trained
}

/// Serves the worker's `/metrics` where the job says; returns the endpoint (serving
/// until dropped) and the address the master is told.
async fn serve_metrics(
    job: &JobConfig,
    id: u32,
    token: &str,
    metrics: &Arc<WorkerMetrics>,
) -> anyhow::Result<(elastrec_metrics::Endpoint, String)> {
    let ip = elastrec_job::resources::bind_address(job)?;
    let port = job
        .cluster
        .node_metrics_port(id)
        .map_err(anyhow::Error::msg)?;
    let m = metrics.clone();
    let endpoint = elastrec_metrics::serve(std::net::SocketAddr::new(ip, port), token, move || {
        m.render()
    })
    .await
    .with_context(|| format!("binding the metrics endpoint (port {port})"))?;
    let addr = elastrec_job::resources::advertise_for(&job.engine, endpoint.addr())?;
    Ok((endpoint, addr))
}

/// Whether the worker goes on after a task.
#[derive(Debug, PartialEq, Eq)]
enum Continue {
    NextTask,
    /// The master scaled this worker away.
    Exit,
}

/// A registered worker's state while it trains its tasks.
struct TaskLoop {
    job: JobConfig,
    id: u32,
    master: Master,
    model: RemoteModel,
    files: TaskFiles,
    plan: Option<Arc<elastrec_preprocess::Plan>>,
    /// An online job's consumer, made on its first task.
    stream: Option<elastrec_stream::StreamInput>,
    batch: Batch,
    shared: Arc<Shared>,
    metrics: Arc<WorkerMetrics>,
    lease: Duration,
    /// Progressive validation is on: each batch is predicted before it is trained.
    progressive: bool,
    predicted: Predictions,
    exit_after_push: Option<u64>,
    slow_batch: Option<Duration>,
    trace: Option<RowTrace>,
}

impl TaskLoop {
    /// The next task from the master, waiting while it has none yet; `None` when the
    /// job is over for this worker (finished, after the final evaluation it asked for,
    /// stopped, or refused).
    async fn next_task(&mut self) -> anyhow::Result<Option<elastrec_proto::master::Task>> {
        let id = self.id;
        loop {
            let req = GetTaskRequest {
                version: rpc::version(),
                node_id: id,
            };
            let t_ask = Instant::now();
            let reply = match rpc::retry_transient(None, || {
                let mut m = self.master.clone();
                async move { m.get_task(req).await }
            })
            .await
            {
                Ok(r) => r.into_inner().reply,
                Err(s) => {
                    self.say_how_data_came();
                    eprintln!("worker {id}: get-task refused: {s}; exiting");
                    return Ok(None);
                }
            };
            match reply {
                Some(Reply::Task(t)) => {
                    TimeSplit::add(&self.shared.profile.master_us, t_ask);
                    return Ok(Some(t));
                }
                Some(Reply::WaitMs(ms)) => {
                    self.metrics.get_task_waits.inc();
                    tokio::time::sleep(Duration::from_millis(ms.clamp(10, 2000) as u64)).await;
                    TimeSplit::add(&self.shared.profile.master_us, t_ask);
                }
                Some(Reply::Finished(f)) => {
                    self.say_how_data_came();
                    if f.evaluate {
                        evaluate_and_report(&self.job, &mut self.model, &self.master, id).await?;
                    }
                    return Ok(None);
                }
                Some(Reply::Stop(_)) | None => {
                    self.say_how_data_came();
                    return Ok(None);
                }
            }
        }
    }

    /// Trains task after task until the master has none left for this worker.
    async fn train_tasks(&mut self) -> anyhow::Result<()> {
        while let Some(task) = self.next_task().await? {
            if self.train_task(&task).await? == Continue::Exit {
                self.say_how_data_came();
                return Ok(());
            }
        }
        Ok(())
    }

    /// Says, once training is over for this worker (before a final evaluation, which the
    /// master may end the job after; or as it fails), how its batches came: through data
    /// executors, and by pulls prefetched within the staleness bound.
    fn say_how_data_came(&self) {
        let id = self.id;
        let served = self.shared.executors.served.load(Ordering::Relaxed);
        if served > 0 {
            eprintln!("worker {id}: {served} samples came through the data executors");
        }
        if let Some(line) = self.metrics.how_pulls_went(id) {
            eprintln!("{line}");
        }
    }

    /// Trains `task`'s split from the offset the master holds for it, batch by batch,
    /// reporting the offset after each.
    async fn train_task(
        &mut self,
        task: &elastrec_proto::master::Task,
    ) -> anyhow::Result<Continue> {
        let split = task_split(task)?;
        let from = split.range.start + task.offset;
        let (file_index, reader) = open_split(
            &self.job,
            &self.files,
            self.plan.as_ref(),
            &self.shared.executors,
            &mut self.stream,
            &split,
            task.source_index,
            from,
            self.id,
        )
        .with_context(|| format!("task {}", task.task_id))?;
        self.shared.task.store(task.task_id, Ordering::Relaxed);
        self.metrics.task.set(task.task_id as i64);
        self.shared.offset.store(task.offset, Ordering::Relaxed);
        let mut ahead = ReadAhead::start(
            reader,
            from,
            split.source.to_string(),
            self.job.model.tasks(),
            local_batch_size(&self.job, &self.shared),
        );
        let trained = self.train_split(task, &split, file_index, &mut ahead).await;
        ahead.finish().await;
        if trained? == Continue::Exit {
            return Ok(Continue::Exit);
        }
        self.shared.task.store(0, Ordering::Relaxed);
        self.metrics.task.set(0);
        Ok(Continue::NextTask)
    }

    /// Trains the batches `ahead` reads of `split` (source `file_index` of the job), from
    /// the task's offset to the split's end. Within the staleness the mode allows, each
    /// batch's pull is started before the previous batch is computed and pushed.
    async fn train_split(
        &mut self,
        task: &elastrec_proto::master::Task,
        split: &Split,
        file_index: u32,
        ahead: &mut ReadAhead,
    ) -> anyhow::Result<Continue> {
        let (held, start) = (split.len(), split.range.start);
        let from_stream = split.is_stream();
        // Progressive validation judges the model on the stream only, not on the history
        // a mixture job also trains.
        let validate = self.progressive && (from_stream || self.job.stream.is_none());
        let mut offset = task.offset;
        // The next batch, read (and its pull started) ahead of this one's compute. A read
        // that failed fails the task only when its turn comes, after this batch.
        let mut next: Option<(anyhow::Result<ReadBatch>, Option<Prefetch>)> = None;
        // The last batch's progress report, answered while this batch is computed; this
        // batch is pushed only once it is (the master may have said to stop).
        let mut reported: Option<PendingReport> = None;
        while offset < held {
            let (read, prefetched) = match next.take() {
                Some(next) => next,
                None => (self.wait_read(ahead).await, None),
            };
            let read = read?;
            let (n, consumed) = (read.rows, read.consumed);
            if n == 0 && consumed == 0 {
                bail!("{} ended before row {}", split.source, start + offset);
            }
            let previous = std::mem::replace(&mut self.batch, read.batch);
            match reported.as_mut() {
                // The row trace records the reported batch once the master took it.
                Some(r) => r.batch = Some(previous),
                None => ahead.recycle(previous),
            }
            let routing = if n > 0 {
                let routing = self.pull_batch(prefetched).await?;
                if offset + consumed < held && self.model.can_prefetch() {
                    let read = self.wait_read(ahead).await;
                    // A batch that cannot be routed is not prefetched: its own turn
                    // routes it again and reports why.
                    let prefetch = match &read {
                        Ok(r) if r.rows > 0 => self.model.route(&r.batch).ok(),
                        _ => None,
                    };
                    next = Some((read, prefetch.map(|r| self.model.prefetch(r))));
                }
                self.compute_batch(n, from_stream, validate).await?;
                Some(routing)
            } else {
                None
            };
            if let Some(r) = reported.take() {
                if self.answered(task, r, ahead).await? == Continue::Exit {
                    return Ok(Continue::Exit);
                }
            }
            if let Some(routing) = routing {
                let key = BatchKey {
                    epoch: task.epoch,
                    file: file_index,
                    start_row: start + offset,
                };
                self.push_batch(&routing, key, n).await?;
            }
            offset += consumed;
            reported = Some(self.report_batch(task, offset, n));
        }
        match reported {
            Some(r) => self.answered(task, r, ahead).await,
            None => Ok(Continue::NextTask),
        }
    }

    /// The next batch of the split. What the step waits for it is its read time: the read
    /// itself runs ahead, on the reader's thread.
    async fn wait_read(&self, ahead: &mut ReadAhead) -> anyhow::Result<ReadBatch> {
        let t0 = Instant::now();
        let read = ahead.next().await;
        TimeSplit::add(&self.shared.profile.read_us, t0);
        read
    }

    /// The rows of `self.batch` (and the dense parameters when due) in place: from its
    /// prefetched pull when that still serves, else pulled now. Returns the routing.
    async fn pull_batch(&mut self, prefetched: Option<Prefetch>) -> anyhow::Result<Routing> {
        let t0 = Instant::now();
        let routing = match prefetched {
            Some(p) => match self.model.take_prefetch(p).await? {
                (routing, true) => {
                    self.metrics.prefetched.inc();
                    routing
                }
                (routing, false) => {
                    self.metrics.prefetches_discarded.inc();
                    self.model.pull(&routing).await?;
                    routing
                }
            },
            None => {
                let routing = self.model.route(&self.batch)?;
                self.model.pull(&routing).await?;
                routing
            }
        };
        self.metrics
            .pull_latency
            .observe(t0.elapsed().as_secs_f64());
        TimeSplit::add(&self.shared.profile.pull_us, t0);
        Ok(routing)
    }

    /// Forward and backward on the `n` rows in `self.batch`, whose parameters are pulled.
    async fn compute_batch(
        &mut self,
        n: usize,
        from_stream: bool,
        validate: bool,
    ) -> anyhow::Result<()> {
        let shared = &self.shared;
        if let Some(pause) = self.slow_batch {
            // A slow machine: every sample takes longer, counted as compute (the master
            // measures capacity from busy time). Per sample, so that the small tasks of a
            // quiet stream are not charged a whole batch.
            let t0 = Instant::now();
            let full = self.job.train.batch_size.max(1) as f64;
            tokio::time::sleep(pause.mul_f64(n as f64 / full)).await;
            TimeSplit::add(&shared.profile.compute_us, t0);
        }
        let t0 = Instant::now();
        let (model, batch) = (&mut self.model, &self.batch);
        let loss = tokio::task::block_in_place(|| model.compute(batch, from_stream))?;
        if validate {
            self.predicted = self.model.predictions(&self.batch);
        }
        TimeSplit::add(&shared.profile.compute_us, t0);
        if !loss.is_finite() {
            bail!("training diverged (loss {loss})");
        }
        Ok(())
    }

    /// Pushes the gradients of the `n` rows just computed under `key`, to the servers
    /// `routing` pulled them from, only while the master's lease holds.
    async fn push_batch(
        &mut self,
        routing: &Routing,
        key: BatchKey,
        n: usize,
    ) -> anyhow::Result<()> {
        let shared = &self.shared;
        while !shared.lease_ok(self.lease) {
            // No recent word from the master: it may have given our task away.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let contributors = shared.active_workers.load(Ordering::Relaxed).max(1);
        let t0 = Instant::now();
        self.model
            .push(routing, contributors, key, n as u32)
            .await?;
        self.metrics
            .push_latency
            .observe(t0.elapsed().as_secs_f64());
        TimeSplit::add(&shared.profile.push_us, t0);
        if let Some(left) = self.exit_after_push.as_mut() {
            *left -= 1;
            if *left == 0 {
                eprintln!(
                    "worker {}: fail point: exiting after a push, before its report",
                    self.id
                );
                std::process::exit(86);
            }
        }
        Ok(())
    }

    /// Sends the master `task`'s new `offset` after the batch of `n` rows in `self.batch`
    /// (trained and pushed, or all skipped), with its predictions; the reply is awaited by
    /// [`Self::answered`], while the next batch is pulled and computed.
    fn report_batch(
        &mut self,
        task: &elastrec_proto::master::Task,
        offset: u64,
        n: usize,
    ) -> PendingReport {
        let predictions = std::mem::take(&mut self.predicted);
        let (mut master, id, task_id) = (self.master.clone(), self.id, task.task_id);
        let metrics = self.metrics.clone();
        let call = tokio::spawn(async move {
            report(&mut master, id, task_id, offset, predictions, &metrics).await
        });
        PendingReport {
            call,
            offset,
            n,
            batch: None,
        }
    }

    /// Waits for the master's answer to a report and counts its batch; the batch (when
    /// the step moved on from it) goes back to the reader.
    async fn answered(
        &mut self,
        task: &elastrec_proto::master::Task,
        r: PendingReport,
        ahead: &ReadAhead,
    ) -> anyhow::Result<Continue> {
        let t0 = Instant::now();
        let (_, stop, lr_scale) = r.call.await.context("a progress report")??;
        if lr_scale > 0.0 {
            self.model.lr_scale = lr_scale;
        }
        let shared = &self.shared;
        // What the step waited for the master, not the round trip it overlapped.
        TimeSplit::add(&shared.profile.master_us, t0);
        let batch = r.batch.as_ref().unwrap_or(&self.batch);
        if let Some(trace) = self.trace.as_mut() {
            trace.record(task, batch)?;
        }
        let n = r.n;
        if n > 0 {
            shared.profile.batches.fetch_add(1, Ordering::Relaxed);
            shared
                .profile
                .samples
                .fetch_add(n as u64, Ordering::Relaxed);
            self.metrics.samples.inc_by(n as u64);
            self.metrics.batches.inc();
        }
        shared.offset.store(r.offset, Ordering::Relaxed);
        shared.samples.fetch_add(n as u64, Ordering::Relaxed);
        shared.steps.fetch_add(1, Ordering::Relaxed);
        if let Some(batch) = r.batch {
            ahead.recycle(batch);
        }
        if stop {
            let (id, offset) = (self.id, r.offset);
            eprintln!("worker {id}: scaled away after reporting offset {offset}; exiting");
            return Ok(Continue::Exit);
        }
        Ok(Continue::NextTask)
    }
}

/// A progress report on its way to the master.
struct PendingReport {
    call: tokio::task::JoinHandle<anyhow::Result<(bool, bool, f32)>>,
    offset: u64,
    /// Rows of the reported batch.
    n: usize,
    /// The reported batch, once `TaskLoop::batch` holds the next one.
    batch: Option<Batch>,
}

/// Rows of this worker's next batch, asked for by its reader before each read.
/// Asynchronous: `train.batch_size`. Synchronous: the job's batch is the global one,
/// shared by the workers that train this step, so a step applies the mean gradient of
/// `batch_size` samples, as the single-process trainer does.
fn local_batch_size(job: &JobConfig, shared: &Arc<Shared>) -> impl Fn() -> usize + Send + 'static {
    let (batch, mode, shared) = (job.train.batch_size, job.cluster.mode, shared.clone());
    move || match mode {
        SyncMode::Async => batch,
        SyncMode::Sync => {
            let workers = shared.active_workers.load(Ordering::Relaxed).max(1) as usize;
            batch.div_ceil(workers)
        }
    }
}
