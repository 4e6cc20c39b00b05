//! The job's result (`result.json`) and the summary printed as the job ends.

use serde::{Deserialize, Serialize};

use super::job_dir::JobDir;
use crate::checkpoint::CheckpointReport;
use crate::core::{now_ms, MasterCore};
use crate::events::event;
use crate::export::ExportReport;
use crate::job::{EvalResult, NodeState, Phase, Role};
use crate::ledger::LedgerSummary;

/// The job's result JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobResult {
    /// Job id.
    pub job_id: String,
    /// `finished` or `failed`.
    pub status: String,
    /// Failure message.
    pub error: Option<String>,
    /// Ledger verdict per epoch.
    pub epochs: Vec<EpochLedger>,
    /// Ledger verdict over the job.
    pub ledger: LedgerSummary,
    /// Final evaluation (task 0's of a multi-task model).
    pub eval: Option<EvalResult>,
    /// A multi-task model's final evaluation of every task, task 0 first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub task_evals: Vec<EvalResult>,
    /// With `[optimizer.schedule]`: the last learning-rate multiplier the master sent the
    /// workers (at the end, the schedule's value for the samples trained).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr_scale: Option<f32>,
    /// Samples trained per second of wall time since the job started.
    pub samples_per_s: f64,
    /// Wall time from job start (including master downtime), seconds.
    pub wall_s: f64,
    /// Worker processes launched over the job.
    pub workers_launched: u32,
    /// Workers declared dead.
    pub workers_dead: u32,
    /// Parameter-server processes launched over the job (a recovery or a re-sharding
    /// launches more).
    #[serde(default)]
    pub ps_launched: u32,
    /// Checkpoints, recoveries and the portion of lost samples (when enabled).
    pub checkpoint: Option<CheckpointReport>,
    /// The autoscaler: bounds, last plan and every scaling action (when enabled).
    #[serde(default)]
    pub autoscale: Option<serde_json::Value>,
    /// What the job used (this master's lifetime).
    #[serde(default)]
    pub resources: Resources,
    /// Changes of the PS count while the job trained.
    #[serde(default)]
    pub reshards: Vec<crate::reshard::ReshardRecord>,
    /// An online job's stream: lag per partition, SLO violations, accumulated lag,
    /// downtime, worker-hours and every scaling decision (KALE Table 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub online: Option<serde_json::Value>,
    /// A batch job's progressive validation (`train.progressive_window`): the windows'
    /// AUC and logloss over the run (an online job's are under `online`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progressive: Option<serde_json::Value>,
    /// The serving buffers of a job with several sources (`[[data.source]]`, or a batch +
    /// stream mixture): the policy, and per source the tasks and rows handed out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mix: Option<serde_json::Value>,
    /// Servable models written: the final `model.bin` and the periodic exports.
    #[serde(default)]
    pub export: ExportReport,
    /// Model selection and early stopping (`train.validation`, `train.early_stopping`):
    /// every evaluation of a checkpoint, the best (the model in `model.bin`), and whether
    /// training stopped early.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation: Option<crate::validation::ValidationReport>,
}

/// Resources a job used: node-seconds (the time each node process was live, summed; on
/// the local backend every node is allotted one core, so these are the allotted
/// core-seconds) and the CPU time the processes reported.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Resources {
    /// Worker processes' live seconds, summed.
    pub worker_node_s: f64,
    /// Parameter servers' live seconds, summed.
    pub ps_node_s: f64,
    /// CPU seconds (user + system) of every node process, from their last heartbeats.
    pub cpu_s: f64,
}

/// The `online` part of an online job's result.
pub(super) fn online_result(core: &MasterCore, worker_node_s: f64) -> Option<serde_json::Value> {
    let stats = core.stream_stats.lock().clone()?;
    let decisions = core.online_scaling.lock().clone();
    let raw_changes = decisions
        .windows(2)
        .filter(|w| w[0].decision.raw != w[1].decision.raw)
        .count();
    let planned_changes = decisions
        .windows(2)
        .filter(|w| w[0].decision.planned != w[1].decision.planned)
        .count();
    let changes = decisions
        .iter()
        .filter(|d| d.decision.target != d.decision.workers)
        .count();
    // The figures as the job ends, after the last periodic record.
    let progressive = core.progressive.lock().as_mut().map(|p| {
        p.record(stats.observed_s);
        p.summary()
    });
    Some(serde_json::json!({
        "stream": stats,
        "progressive": progressive,
        "worker_hours": worker_node_s / 3600.0,
        "raw_plan_changes": raw_changes,
        "planned_changes": planned_changes,
        "scaling_changes": changes,
        "decisions": decisions,
    }))
}

/// A batch job's progressive validation as it ends, `at_s` into the job: the window then
/// is recorded last (a job shorter than `train.progressive_every_s` has no other). Read
/// before the job's lock.
fn batch_progressive(core: &MasterCore, at_s: f64) -> Option<serde_json::Value> {
    if core.stream_stats.lock().is_some() {
        return None;
    }
    core.progressive.lock().as_mut().map(|p| {
        p.record(at_s);
        p.summary()
    })
}

/// One epoch's ledger line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EpochLedger {
    /// Epoch.
    pub epoch: u32,
    /// Verdict.
    #[serde(flatten)]
    pub summary: LedgerSummary,
}

/// The result of a job that ended in `phase`, having used `used` in this master's lifetime.
pub(super) fn job_result(
    core: &MasterCore,
    dir: &JobDir,
    phase: &Phase,
    used: Resources,
    export: ExportReport,
) -> JobResult {
    let started: u64 = dir.started_ms().unwrap_or(now_ms());
    let wall_s = now_ms().saturating_sub(started) as f64 / 1000.0;
    let progressive = batch_progressive(core, wall_s);
    let job = core.job.lock();
    let epochs = job.tasks().spec().epochs;
    let per_epoch: Vec<EpochLedger> = (0..epochs)
        .map(|e| EpochLedger {
            epoch: e,
            summary: job.tasks().ledger().summary(e),
        })
        .collect();
    let total = job.tasks().ledger().total(epochs);
    let workers: Vec<_> = job.nodes().filter(|n| n.role == Role::Worker).collect();
    JobResult {
        job_id: core.job_id.clone(),
        status: match phase {
            Phase::Finished => "finished".into(),
            _ => "failed".into(),
        },
        error: match phase {
            Phase::Failed(m) => Some(m.clone()),
            _ => None,
        },
        epochs: per_epoch,
        ledger: total,
        eval: job.eval(),
        task_evals: job.task_evals().to_vec(),
        lr_scale: core.lr_schedule.get().map(|_| {
            f32::from_bits(
                core.lr_scale_sent
                    .load(std::sync::atomic::Ordering::Relaxed),
            )
        }),
        samples_per_s: total.consumed as f64 / wall_s.max(1e-9),
        wall_s,
        workers_launched: workers.len() as u32,
        workers_dead: workers
            .iter()
            .filter(|n| n.state == NodeState::Dead)
            .count() as u32,
        ps_launched: job.nodes().filter(|n| n.role == Role::Ps).count() as u32,
        checkpoint: core.checkpoints().map(|c| c.report(total.consumed)),
        autoscale: core
            .autoscale_status
            .lock()
            .as_ref()
            .map(|a| serde_json::to_value(a).expect("plain data")),
        resources: Resources {
            cpu_s: core.profiles.lock().values().map(|p| p.cpu_s).sum(),
            ..used
        },
        reshards: core.reshards.lock().clone(),
        online: online_result(core, used.worker_node_s),
        progressive,
        mix: core
            .mix_status(job.tasks())
            .map(|m| serde_json::to_value(m).expect("plain data")),
        export,
        validation: None,
    }
}

/// Prints the closing lines: checkpoints, the ledger verdict, the final evaluation.
pub(super) fn announce(result: &JobResult) {
    if let Some(r) = &result.checkpoint {
        event!(
            "checkpoints_summary",
            count = r.stats.count,
            recoveries = r.stats.recoveries.len(),
            pls = r.pls,
            "job {}: {} checkpoints (mean stall {:.2} ms vs memory copy {:.2} ms, persisted at {:.0} MB/s), {} PS recoveries, PLS {:.4}",
            result.job_id,
            r.stats.count,
            r.stall_ms,
            r.memcpy_ms,
            r.persist_mb_s,
            r.stats.recoveries.len(),
            r.pls
        );
    }
    event!(
        "job_ledger",
        job = %result.job_id,
        consumed = result.ledger.consumed,
        duplicated = result.ledger.duplicated,
        missing = result.ledger.missing,
        "job {}: {}",
        result.job_id,
        result.ledger,
    );
    if let Some(e) = result.eval {
        event!(
            "job_eval",
            auc = e.auc,
            logloss = e.logloss,
            samples = e.samples,
            "job {}: final eval {e} on {} samples",
            result.job_id,
            e.samples
        );
    }
}
