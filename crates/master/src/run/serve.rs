//! A running job: the gRPC and metrics endpoints, the background loops, the control loop
//! (node exits, the state machine's tick, PS recovery, checkpoints, progress) and the
//! wind-down that writes the result.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use elastrec_job::config::JobConfig;
use elastrec_job::split::Source;
use elastrec_proto::master::master_server::MasterServer;
use elastrec_rpc::ServerAuth;
use tonic::service::interceptor::InterceptedService;

use super::job_dir::JobDir;
use super::result::{announce, job_result, JobResult, Resources};
use super::setup::AutoscaleStart;
use crate::checkpoint::Coordinator;
use crate::core::MasterCore;
use crate::events::event;
use crate::export::{ExportCommand, ExportRecord, ExportReport, Exporter};
use crate::job::{Job, Phase, Role};
use crate::service::MasterService;
use crate::validation::Validator;

/// How often the control loop runs.
const TICK: Duration = Duration::from_millis(100);

/// How often the progress line is printed.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// Serves the job until it finishes, fails or is stopped by a signal; writes
/// `result.json` (unless stopped) and returns the result.
pub(super) async fn serve(
    core: Arc<MasterCore>,
    listener: tokio::net::TcpListener,
    token: String,
    cfg: &JobConfig,
    dir: &JobDir,
    autoscale: Option<AutoscaleStart>,
) -> anyhow::Result<JobResult> {
    let endpoints = Endpoints::start(&core, listener, &token, cfg, dir).await?;
    match elastrec_metrics::tensorboard::EventWriter::create(&dir.0) {
        Ok(w) => {
            let _ = core.board.set(parking_lot::Mutex::new(w));
        }
        Err(e) => eprintln!(
            "master: no TensorBoard events ({}: {e}); the job runs without them",
            dir.0.display()
        ),
    }
    let brain = autoscale
        .as_ref()
        .map(|a| (a.brain.clone(), a.brain_job_id.clone()));
    let autoscaler = spawn_loops(&core, cfg, autoscale)?;
    let mut used = Resources::default();
    let command = export_command(&core);
    let exporter = periodic_exporter(command.clone(), cfg)?;
    let validator = validator(&core, cfg, command.clone())?;
    let saves_model = (cfg.output.save_model || validator.is_some()) && command.is_some();
    core.keep_ps.store(saves_model, Ordering::Release);
    let mut targets = crate::prometheus_sd::TargetsFile::new(&dir.0);
    let loops = Loops {
        exporter: exporter.as_ref(),
        validator: validator.as_ref(),
        targets: (&mut targets, endpoints.metrics.addr().to_string()),
    };
    let phase = control_loop(&core, cfg, dir, &mut used, loops).await?;
    let model = match phase {
        Phase::Finished => final_model(&core, cfg, command.as_ref(), validator.as_deref()).await,
        _ => None,
    };
    core.keep_ps.store(false, Ordering::Release);
    wind_down(&core, cfg).await;
    if let Some(h) = autoscaler {
        // It stops once the job leaves training, with its final state written.
        let _ = tokio::time::timeout(Duration::from_secs(2), h).await;
    }
    let export = ExportReport {
        model,
        ..exporter.map(|x| x.report()).unwrap_or_default()
    };
    let mut result = job_result(&core, dir, &phase, used, export);
    result.validation = validator.map(|v| v.report());
    // The job's own figures at its end: a job shorter than a progress line has these.
    let mut scalars = vec![("job/samples_per_s".to_string(), result.samples_per_s)];
    if let Some(e) = &result.eval {
        scalars.extend(e.scalars("eval"));
    }
    let values: Vec<(&str, f64)> = scalars.iter().map(|(t, v)| (t.as_str(), *v)).collect();
    core.board_scalars(result.ledger.consumed, &values);
    if let Some((brain, brain_job_id)) = brain {
        record_outcome(&core, &*brain, brain_job_id, &result).await;
    }
    announce(&result);
    if let (Some(c), Phase::Finished) = (core.checkpoints(), &phase) {
        c.remove_shm();
    }
    // Readers poll for it: they see the whole file or none (temp + fsync + rename).
    elastrec_job::fsio::write_atomic(
        &dir.result(),
        serde_json::to_string_pretty(&result)?.as_bytes(),
    )?;
    endpoints.stop().await;
    if let Phase::Failed(m) = phase {
        bail!("job failed: {m}");
    }
    Ok(result)
}

/// Tells the brain how the job ended and the allocation it ended on, which later jobs
/// warm-start from (a failed one is left out). A brain that does not answer only costs
/// the record: the job's result stands.
async fn record_outcome(
    core: &MasterCore,
    brain: &dyn crate::brain_link::BrainLink,
    brain_job_id: String,
    result: &JobResult,
) {
    let status = match (
        result.error.is_some(),
        core.memory_kills.load(Ordering::Relaxed),
    ) {
        (false, _) => "succeeded",
        (true, 0) => "failed",
        (true, _) => "oom",
    };
    let final_allocation = final_allocation(core);
    let req = elastrec_proto::brain::RecordOutcomeRequest {
        job_id: brain_job_id,
        status: status.into(),
        final_allocation,
        throughput: result.samples_per_s,
        duration_s: result.wall_s,
    };
    match tokio::time::timeout(Duration::from_secs(10), brain.record_outcome(req)).await {
        Ok(Ok(())) => event!(
            "outcome_recorded",
            status,
            "autoscale: the {} recorded the job as {status}",
            brain.describe()
        ),
        Ok(Err(s)) => event!(warn, "outcome_unrecorded", error = %s.message(),
            "autoscale: the {} did not record the job's outcome: {}", brain.describe(), s.message()),
        Err(_) => event!(
            warn,
            "outcome_unrecorded",
            error = "timed out",
            "autoscale: the {} did not record the job's outcome in 10 s",
            brain.describe()
        ),
    }
}

/// The allocation the job ran with at its end: its worker and PS counts and the cores and
/// memory its nodes were launched with. None where one of them is not a size the brain
/// takes (no worker left, no memory limit): the outcome is then recorded without it.
fn final_allocation(core: &MasterCore) -> Option<elastrec_proto::brain::Allocation> {
    let launch = core.launch.get()?;
    let (workers, ps) = {
        let job = core.job.lock();
        (job.target_workers(), job.policy().num_ps)
    };
    let gb = |role| launch.memory_mib(role) as f64 / 1024.0;
    let a = elastrec_proto::brain::Allocation {
        workers,
        ps,
        worker_cpu: launch.cpu(Role::Worker),
        ps_cpu: launch.cpu(Role::Ps),
        worker_mem_gb: gb(Role::Worker),
        ps_mem_gb: gb(Role::Ps),
    };
    let sizes = [a.worker_cpu, a.ps_cpu, a.worker_mem_gb, a.ps_mem_gb];
    (a.workers > 0 && a.ps > 0 && sizes.iter().all(|v| v.is_finite() && *v > 0.0)).then_some(a)
}

/// The job's gRPC server and its Prometheus endpoint.
struct Endpoints {
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    metrics: elastrec_metrics::Endpoint,
}

impl Endpoints {
    /// Serves the master service on `listener` (token-authenticated) and `/metrics` (open
    /// on loopback, the job token elsewhere); the metrics address goes to the job dir.
    async fn start(
        core: &Arc<MasterCore>,
        listener: tokio::net::TcpListener,
        token: &str,
        cfg: &JobConfig,
        dir: &JobDir,
    ) -> anyhow::Result<Self> {
        let max = cfg.cluster.max_message_bytes;
        let svc = MasterServer::new(MasterService(core.clone()))
            .max_decoding_message_size(max)
            .max_encoding_message_size(max);
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(
            elastrec_rpc::server()?
                .add_service(InterceptedService::new(svc, ServerAuth::for_job(token)))
                .serve_with_incoming_shutdown(elastrec_rpc::incoming(listener), async {
                    let _ = stop_rx.await;
                }),
        );
        let ip: std::net::IpAddr = cfg.cluster.bind.parse()?;
        let mcore = core.clone();
        let metrics = elastrec_metrics::serve(
            SocketAddr::new(ip, cfg.cluster.metrics_port),
            token,
            move || mcore.scrape(),
        )
        .await
        .context("binding the metrics endpoint")?;
        std::fs::write(dir.metrics_addr(), metrics.addr().to_string())?;
        Ok(Self {
            stop,
            server,
            metrics,
        })
    }

    /// Stops both, letting calls in flight finish (up to 2 s).
    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(2), self.server).await;
        drop(self.metrics);
    }
}

/// Starts the loops a job's configuration asks for beside the control loop: the
/// autoscaler (returned, to be awaited at the end), the dataset watcher of a following
/// job, and an online job's stream watcher and traffic-driven scaler.
fn spawn_loops(
    core: &Arc<MasterCore>,
    cfg: &JobConfig,
    autoscale: Option<AutoscaleStart>,
) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    let autoscaler = autoscale.map(|a| {
        tokio::spawn(crate::autoscale_loop::run(
            core.clone(),
            a.brain,
            cfg.clone(),
            a.brain_job_id,
            a.samples_total,
            a.registered,
            a.explore,
        ))
    });
    if cfg.data.follow {
        tokio::spawn(crate::dataset_watch::run(core.clone(), cfg.clone()));
    }
    if cfg.cluster.max_executors > 0 {
        tokio::spawn(scale_executors(core.clone(), cfg.cluster.clone()));
    }
    if cfg.stream.is_none() && !cfg.optimizer.schedule.is_constant() {
        let _ = core
            .lr_schedule
            .set((cfg.optimizer.schedule, cfg.train.epochs));
    }
    if cfg.stream.is_none() && cfg.train.progressive_window > 0 {
        *core.progressive.lock() = Some(crate::progressive::ProgressiveEval::new(
            cfg.train.progressive_window as usize,
            cfg.model.tasks(),
        ));
        tokio::spawn(crate::progressive::run_batch(
            core.clone(),
            Duration::from_secs_f64(cfg.train.progressive_every_s),
        ));
    }
    if let Some(s) = &cfg.stream {
        if s.eval_window > 0 {
            *core.progressive.lock() = Some(crate::progressive::ProgressiveEval::new(
                s.eval_window as usize,
                cfg.model.tasks(),
            ));
        }
        let partitions = core
            .sources
            .read()
            .iter()
            .filter_map(Source::partition)
            .cloned()
            .collect();
        tokio::spawn(crate::stream_watch::run(
            core.clone(),
            s.clone(),
            partitions,
            s.group_for(&core.job_id),
        ));
        if s.autoscale != elastrec_job::stream::StreamScaling::Off {
            tokio::spawn(crate::online_scale_loop::run(
                core.clone(),
                s.clone(),
                cfg.cluster.mode == elastrec_job::distributed::SyncMode::Sync,
            ));
        }
    }
    Ok(autoscaler)
}

/// Scales the data executors by Primus Eq. 1 (`elastrec_control::executor_scale`) every
/// `executor_interval_s` while the job trains.
async fn scale_executors(core: Arc<MasterCore>, c: elastrec_job::distributed::ClusterConfig) {
    use elastrec_control::executor_scale::{ExecutorPolicy, ExecutorSample, ExecutorScaler};
    let (cores, memory_bytes) = core.launch.get().map_or((1.0, 0.0), |t| {
        (
            t.cpu(Role::Executor),
            t.memory_mib(Role::Executor) as f64 * 1048576.0,
        )
    });
    let policy = ExecutorPolicy {
        weights: c.executor_weights,
        threshold: c.executor_threshold,
        band: c.executor_band,
        min: 1,
        max: c.max_executors,
        cores: if cores > 0.0 { cores } else { 1.0 },
        // No memory allotment known: the memory term reads as a full one.
        memory_bytes: if memory_bytes > 0.0 {
            memory_bytes
        } else {
            1.0
        },
    };
    let mut scaler = ExecutorScaler::default();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(c.executor_interval_s));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut last = std::time::Instant::now();
    loop {
        tick.tick().await;
        let (training, current, ids) = {
            let job = core.job.lock();
            (
                matches!(job.phase(), Phase::Training),
                job.executors(),
                job.running_executor_ids(),
            )
        };
        if !training {
            break;
        }
        let samples: Vec<(u32, ExecutorSample)> = {
            let profiles = core.profiles.lock();
            ids.iter()
                .filter_map(|id| {
                    let p = profiles.get(id)?;
                    Some((
                        *id,
                        ExecutorSample {
                            reads: p.requests,
                            hits: p.prefetch_hits,
                            cpu_s: p.cpu_s,
                            rss_bytes: p.rss_bytes,
                        },
                    ))
                })
                .collect()
        };
        let dt = last.elapsed().as_secs_f64();
        last = std::time::Instant::now();
        let Some(d) = scaler.decide(&policy, current, &samples, dt) else {
            continue;
        };
        if d.to == d.from {
            continue;
        }
        event!(
            "executors_scaled",
            from = d.from,
            to = d.to,
            load = d.load,
            buffer = d.utilization[0],
            cpu = d.utilization[1],
            memory = d.utilization[2],
            "master: data executors {} -> {} ({})",
            d.from,
            d.to,
            d.reason
        );
        if core
            .run(|job, cx| job.set_executors(d.to, cx))
            .await
            .is_err()
        {
            break;
        }
    }
}

/// How this job runs `elastrec export`: with checkpoints only (an export converts one).
fn export_command(core: &MasterCore) -> Option<ExportCommand> {
    Some(ExportCommand {
        program: core.launch.get()?.program.clone(),
        location: core.checkpoints()?.location().to_string(),
    })
}

/// The periodic exporter, when `output.export_every_s` asks for one.
/// Refuses `output.push` without the token of the servers.
fn periodic_exporter(
    command: Option<ExportCommand>,
    cfg: &JobConfig,
) -> anyhow::Result<Option<Arc<Exporter>>> {
    let every = cfg.output.export_every_s;
    if every <= 0.0 {
        return Ok(None);
    }
    let Some(command) = command else {
        event!(warn, "export_off", "master: output.export_every_s = {every} needs checkpoints (an export converts one); set checkpoint.enabled = true");
        return Ok(None);
    };
    let push = match cfg.output.push.is_empty() {
        true => None,
        false => Some(crate::push::Pusher::new(&cfg.output.push)?),
    };
    Ok(Some(Arc::new(Exporter::new(
        command,
        &cfg.output.dir,
        Duration::from_secs_f64(every),
        cfg.output.export_keep,
        push,
    ))))
}

/// Model selection, when the job asks for it (`train.validation`,
/// `train.early_stopping`; `start_job` refused the jobs it cannot serve).
fn validator(
    core: &MasterCore,
    cfg: &JobConfig,
    command: Option<ExportCommand>,
) -> anyhow::Result<Option<Arc<Validator>>> {
    if !crate::validation::wanted(cfg) {
        return Ok(None);
    }
    let Some(command) = command else {
        bail!("train.validation and train.early_stopping judge checkpoints; set checkpoint.enabled = true");
    };
    let epoch_rows = core.job.lock().tasks().rows_per_epoch();
    Validator::open(cfg, command, epoch_rows).map(Some)
}

/// A finished job's model: a final checkpoint of the trained parameters, exported to
/// `<output.dir>/model.bin` (`output.save_model`); with model selection, the best model
/// its evaluations saw, the final checkpoint judged too. Failing to write it is reported,
/// not fatal: the job's training is done and its checkpoints remain.
async fn final_model(
    core: &Arc<MasterCore>,
    cfg: &JobConfig,
    command: Option<&ExportCommand>,
    validator: Option<&Validator>,
) -> Option<ExportRecord> {
    if !cfg.output.save_model && validator.is_none() {
        return None;
    }
    let (Some(c), Some(command)) = (core.checkpoints(), command) else {
        event!(warn, "model_not_saved", "master: no model.bin: it is exported from a final checkpoint and checkpoint.enabled = false (or set output.save_model = false)");
        return None;
    };
    let out = cfg.output.dir.join("model.bin");
    let saved = async {
        std::fs::create_dir_all(&cfg.output.dir)
            .with_context(|| format!("creating {}", cfg.output.dir.display()))?;
        if let Some(v) = validator {
            let save = cfg.output.save_model.then_some(out.as_path());
            return v.finish(core, c, save).await;
        }
        // `checkpoint` gives up by itself after `checkpoint.timeout_s`.
        let m = c.checkpoint(core, "final").await?;
        command.run(m.id, &out).await.map(Some)
    };
    match saved.await {
        Ok(None) => None,
        Ok(Some(rec)) => {
            event!("model_saved", checkpoint = rec.checkpoint, samples = rec.samples, bytes = rec.bytes,
                "master: model saved to {} (checkpoint {}, {} samples, {:.1} MB, {:.2} s); evaluate it with `elastrec eval --model {} --data FILES`",
                out.display(), rec.checkpoint, rec.samples, rec.bytes as f64 / 1e6, rec.seconds, out.display());
            Some(rec)
        }
        Err(e) => {
            event!(warn, "model_not_saved", error = %format!("{e:#}"),
                "master: the model was not saved to {} ({e:#}); its checkpoints remain: `elastrec export --checkpoint {} --out FILE`",
                out.display(), command.location);
            None
        }
    }
}

/// What the control loop drives beside checkpoints.
struct Loops<'a> {
    /// Periodic exports (`output.export_every_s`).
    exporter: Option<&'a Arc<Exporter>>,
    /// Model selection (`train.validation`, `train.early_stopping`).
    validator: Option<&'a Arc<Validator>>,
    /// Prometheus's discovery file, and the master's own `/metrics` address.
    targets: (&'a mut crate::prometheus_sd::TargetsFile, String),
}

/// Runs the job until it finishes or fails (returns its phase), or until SIGINT/SIGTERM
/// (an error, after an optional checkpoint and stopping every node).
async fn control_loop(
    core: &Arc<MasterCore>,
    cfg: &JobConfig,
    dir: &JobDir,
    used: &mut Resources,
    loops: Loops<'_>,
) -> anyhow::Result<Phase> {
    let (targets, master_metrics) = loops.targets;
    let mut targets_failed = false;
    let mut progress = Progress::new(dir);
    let mut last_tick = Instant::now();
    let mut tick = tokio::time::interval(TICK);
    // Both streams are made once, before the loop: a stream keeps a signal that arrives
    // while the loop is busy (advancing the job, driving a checkpoint) for its next
    // `recv`. A `ctrl_c()` future made in each turn listens only from its first poll, so
    // a Ctrl-C during the work between two turns was lost and the master kept running
    // (a Slurm test saw it once in four full runs).
    use tokio::signal::unix::{signal, SignalKind};
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    loop {
        let interrupted = tokio::select! {
            _ = tick.tick() => None,
            _ = sigint.recv() => Some("interrupted"),
            _ = sigterm.recv() => Some("terminated"),
        };
        if let Some(how) = interrupted {
            stop_on_signal(core, cfg, dir, how).await;
            bail!("{how}");
        }
        account_live_nodes(&core.job.lock(), last_tick.elapsed(), used);
        last_tick = Instant::now();
        let written = targets.update(&core.job_id, &master_metrics, &core.job.lock());
        if let (Err(e), false) = (written, targets_failed) {
            targets_failed = true;
            eprintln!(
                "master: writing Prometheus's targets to {} failed: {e}",
                targets.path().display()
            );
        }
        let phase = advance(core).await?;
        if matches!(phase, Phase::Finished | Phase::Failed(_)) {
            return Ok(phase);
        }
        if let Some(c) = core.checkpoints().cloned() {
            if !drive_checkpoints(core, &c).await? {
                continue;
            }
            if let Some(x) = loops.exporter {
                x.poll(c.last_id());
            }
            if let Some(v) = loops.validator {
                v.poll(core, &c);
            }
        }
        progress.maybe_print(core);
    }
}

/// A signal stops the job: a checkpoint first when `checkpoint.on_sigterm` (and no
/// recovery runs), then every node; the job can be resumed later.
async fn stop_on_signal(core: &Arc<MasterCore>, cfg: &JobConfig, dir: &JobDir, how: &str) {
    let ckpt = match core.checkpoints() {
        Some(c) if cfg.checkpoint.on_sigterm && !core.job.lock().recovering() => {
            match tokio::time::timeout(Duration::from_secs(120), c.checkpoint(core, how)).await {
                Ok(Ok(m)) => format!("checkpoint {} written; ", m.id),
                Ok(Err(e)) => format!("no checkpoint ({e:#}); "),
                Err(_) => "no checkpoint (timed out); ".to_string(),
            }
        }
        _ => String::new(),
    };
    event!(
        "stopped_by_signal",
        signal = how,
        "master: {how}; {ckpt}stopping every node (resume later with `elastrec run --resume {}`)",
        dir.0.display()
    );
    let nodes = core.job.lock().leftover_nodes();
    for n in nodes {
        core.backend().stop(&n);
    }
    core.backend().finish();
}

/// Adds `dt` of live time for every live node to the job's resource use.
fn account_live_nodes(job: &Job, dt: Duration, used: &mut Resources) {
    let dt = dt.as_secs_f64();
    for n in job.nodes().filter(|n| n.state.is_live()) {
        match n.role {
            Role::Worker | Role::Executor => used.worker_node_s += dt,
            Role::Ps => used.ps_node_s += dt,
        }
    }
}

/// Feeds the backend's news (queued nodes, ended processes, failed launches) to the state
/// machine, ticks it and returns its phase.
async fn advance(core: &Arc<MasterCore>) -> anyhow::Result<Phase> {
    let exited: Vec<(u32, String)> = core
        .backend()
        .exited()
        .into_iter()
        .map(|e| {
            tracing::info!(node = e.id, reason = %e.reason, oom = e.oom, "node process ended");
            if e.oom {
                out_of_memory(core, e.id, &e.reason);
            }
            (e.id, e.reason)
        })
        .collect();
    let failed = core.take_failed_launches();
    let queued = core.backend().queued();
    core.run(|job, cx| {
        for id in queued {
            job.queued(id, cx);
        }
        for (id, reason) in exited {
            let reason = if reason.is_empty() {
                "process exited".to_string()
            } else {
                format!("process exited: {reason}")
            };
            job.process_ended(id, &reason, cx);
        }
        for id in failed {
            job.process_exited(id, cx);
        }
        job.tick(cx);
        job.phase().clone()
    })
    .await
    .context("master state")
    .inspect(|_| crate::probe::start_due(core))
}

/// Recovers failed parameter servers, closes a finished recovery and starts a checkpoint
/// when one is due. Returns false when a recovery failed (the job is failed: the loop
/// goes straight to its next tick, which ends it).
async fn drive_checkpoints(core: &Arc<MasterCore>, c: &Arc<Coordinator>) -> anyhow::Result<bool> {
    let failures = core.job.lock().take_ps_failures();
    if !failures.is_empty() {
        if let Err(e) = c.recover(core, failures).await {
            let msg = format!("recovering a parameter server failed: {e:#}");
            core.run(|job, cx| job.fail(msg, cx))
                .await
                .context("master state")?;
            return Ok(false);
        }
    }
    c.observe(core).await;
    let (training, recovering, samples) = {
        let job = core.job.lock();
        (
            *job.phase() == Phase::Training,
            job.recovering(),
            job.samples_done(),
        )
    };
    if training && !recovering && c.due(samples) {
        let task = c.spawn_checkpoint(core.clone(), "interval");
        tokio::spawn(async move {
            if let Ok(Err(e)) = task.await {
                event!(
                    warn,
                    "checkpoint_failed",
                    error = %format!("{e:#}"),
                    "master: checkpoint failed (training goes on): {e:#}",
                );
            }
        });
    }
    Ok(true)
}

/// The progress line, printed every [`PROGRESS_EVERY`], with a point of the job's
/// history (`crate::history`) for the dashboard's charts.
struct Progress {
    started: Instant,
    last: Instant,
    /// Samples done at the last line: the rate shown is the job's own since then (the
    /// workers' reported rates are 0 until their first heartbeat with one).
    last_samples: u64,
    /// Where the history goes; `None` once writing it failed (said once).
    history_dir: Option<std::path::PathBuf>,
}

impl Progress {
    fn new(dir: &JobDir) -> Self {
        let now = Instant::now();
        Self {
            started: now,
            last: now,
            last_samples: 0,
            history_dir: Some(dir.0.clone()),
        }
    }

    /// Appends the job's status `s` to its history.
    fn record_history(&mut self, s: &elastrec_proto::master::StatusResponse) {
        let Some(dir) = &self.history_dir else { return };
        let status = elastrec_client::status::status_value(s);
        let point =
            elastrec_client::history::point_of(&status, elastrec_client::history::unix_now_s());
        if let Err(e) = elastrec_client::history::append(dir, &point) {
            eprintln!(
                "master: not writing the job's history any more ({}: {e:#}); the dashboard's charts start when it opens",
                elastrec_client::history::path(dir).display()
            );
            self.history_dir = None;
        }
    }

    fn maybe_print(&mut self, core: &MasterCore) {
        let since = self.last.elapsed();
        if since <= PROGRESS_EVERY {
            return;
        }
        self.last = Instant::now();
        let s = core.status();
        self.record_history(&s);
        let rate = s.samples_done.saturating_sub(self.last_samples) as f64 / since.as_secs_f64();
        self.last_samples = s.samples_done;
        let workers = s
            .nodes
            .iter()
            .filter(|n| {
                n.role == elastrec_proto::master::Role::Worker as i32 && n.state == "running"
            })
            .count();
        let ps = s
            .nodes
            .iter()
            .filter(|n| n.role == elastrec_proto::master::Role::Ps as i32 && n.state == "running")
            .count();
        let lag = core.stream_stats.lock().as_ref().map(|st| st.lag_s);
        core.board_scalars(
            s.samples_done,
            &[
                ("job/samples_per_s", rate),
                ("job/workers", workers as f64),
                ("job/ps", ps as f64),
                ("stream/lag_s", lag.unwrap_or(f64::NAN)),
            ],
        );
        eprintln!(
            "[{:>6.1}s] epoch {}/{} samples {}/{} ({:.0}/s) shards todo {} doing {} done {} workers {} ({})",
            self.started.elapsed().as_secs_f64(),
            s.epoch + 1,
            s.epochs,
            s.samples_done,
            s.samples_total,
            rate,
            s.shards_todo,
            s.shards_doing,
            s.shards_done,
            workers,
            s.phase
        );
    }
}

/// After the job ended: workers leave by themselves (they poll the master) within 3 s;
/// then every node left is stopped.
async fn wind_down(core: &MasterCore, cfg: &JobConfig) {
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        let left = core
            .job
            .lock()
            .leftover_nodes()
            .iter()
            .filter(|n| n.role == Role::Worker)
            .count();
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(2 * cfg.cluster.heartbeat_ms)).await;
    let leftovers = core.job.lock().leftover_nodes();
    for n in &leftovers {
        core.backend().stop(n);
    }
    core.backend().finish();
}

/// The engine killed node `id` for exceeding its memory: its role's next nodes (the
/// relaunch included) ask for more, up to the role's `memory_gb_max`.
fn out_of_memory(core: &MasterCore, id: u32, reason: &str) {
    core.memory_kills.fetch_add(1, Ordering::Relaxed);
    let Some(role) = core.job.lock().node(id).map(|n| n.role) else {
        return;
    };
    let Some(launch) = core.launch.get() else {
        return;
    };
    let (before, after) = launch.grow_memory(role);
    let role = crate::launch::role_name(role);
    if after > before {
        event!("out_of_memory", node = id, role, reason, mem_gb = after as f64 / 1024.0,
            "master: {role} node {id} was killed for its memory ({reason}); {role}s start with {:.2} GiB instead of {:.2} GiB from now on",
            after as f64 / 1024.0,
            before as f64 / 1024.0
        );
    } else {
        event!(
            warn,
            "out_of_memory",
            node = id,
            role,
            reason,
            mem_gb = before as f64 / 1024.0,
            at_max = true,
            "master: {role} node {id} was killed for its memory ({reason}) at its role's maximum of {:.2} GiB; raise resources.{role}.memory_gb_max (autoscale.{role}_mem_gb_max in an autoscaled job)",
            before as f64 / 1024.0
        );
    }
}
