//! Where the brain's wire answers become the domain types the policies judge (the
//! requests go the other way through the brain crate's own conversions,
//! `elastrec_brain::service::{ask_to, profile_to}`), and where the master's own records
//! become the messages of its status and scale replies.

use elastrec_brain::service::alloc_from;
use elastrec_brain::PlanKind;
use elastrec_control::autoscale::Proposal;
use elastrec_control::progressive::WindowFigures;
use elastrec_proto::brain as pb;
use elastrec_proto::master as status;

use crate::reshard::ReshardRecord;

/// The part of a brain's plan the autoscaler judges; an error names what the brain sent
/// that no brain of this version sends.
pub fn proposal_from(p: &pb::PlanResponse) -> Result<Proposal, String> {
    let kind = PlanKind::from_name(&p.kind)
        .ok_or_else(|| format!("the brain's plan has an unknown kind `{}`", p.kind))?;
    // An allocation that is not one (NaN cores, absurd counts) is refused as missing.
    let allocation = alloc_from("allocation", p.allocation).map_err(|e| e.to_string())?;
    Ok(Proposal {
        kind,
        allocation,
        predicted_throughput: p.predicted_throughput,
        fit_mape_percent: p.fit.as_ref().map(|f| f.mape),
        reasons: p.reasons.clone(),
        for_memory: p.memory.iter().any(|m| m.step_at_limit > 0),
    })
}

/// A change of the PS count as the status and scale replies carry it.
pub fn reshard_message(r: &ReshardRecord) -> status::ReshardRecord {
    status::ReshardRecord {
        from: r.from,
        to: r.to,
        layout_version: r.layout_version,
        reason: r.reason.clone(),
        samples: r.samples,
        total_s: r.total_s,
        pause_ms: r.pause_ms,
        frozen_bytes: r.frozen_bytes,
        precopy_bytes: r.precopy_bytes,
        frozen_rows: r.frozen_rows,
        precopy_rows: r.precopy_rows,
        pause_ms_per_gb: r.pause_ms_per_gb,
    }
}

/// A progressive-validation window as the status reply carries it.
pub fn window_message(w: &WindowFigures) -> status::ProgressiveWindow {
    status::ProgressiveWindow {
        at_s: w.at_s,
        samples: w.samples,
        auc: w.auc,
        logloss: w.logloss,
        positive_rate: w.positive_rate,
        ne: w.ne,
        calibration: w.calibration,
        tasks: w
            .tasks
            .iter()
            .map(|t| status::TaskWindow {
                auc: t.auc,
                logloss: t.logloss,
                positive_rate: t.positive_rate,
            })
            .collect(),
    }
}

/// An online job's stream figures, latest window and last decision as the status reply
/// carries them.
pub fn stream_message(
    s: &crate::stream_stats::StreamStats,
    window: Option<&WindowFigures>,
    decision: Option<&crate::online_scale_loop::ScalingEvent>,
) -> status::StreamStatus {
    status::StreamStatus {
        slo_lag_s: s.slo_lag_s,
        partitions: s
            .partitions
            .iter()
            .map(|p| status::PartitionLag {
                partition: p.partition.clone(),
                high: p.high,
                trained: p.trained,
                backlog: p.backlog,
                lag_s: p.lag_s,
                peak_lag_s: p.peak_lag_s,
                rate: p.rate,
                accumulated_lag_s: p.accumulated_lag_s,
            })
            .collect(),
        arrival_rate: s.arrival_rate,
        lag_s: s.lag_s,
        observed_s: s.observed_s,
        violation_s: s.violation_s,
        slo_violation_rate: s.slo_violation_rate,
        accumulated_lag_s: s.accumulated_lag_s,
        downtime_s: s.downtime_s,
        worker_s: s.worker_s,
        source_stall_s: s.source_stall_s,
        progressive: window.map(window_message),
        last_decision: decision.map(|e| status::OnlineDecision {
            at_s: e.at_s,
            workers: e.decision.workers,
            raw: e.decision.raw,
            planned: e.decision.planned,
            target: e.decision.target,
            load: e.decision.load,
            reason: e.decision.reason.clone(),
        }),
    }
}

/// The autoscaler's state with the memory limits' changes as the status reply carries it
/// (and `result.json` records it).
pub fn autoscale_message(
    a: &elastrec_control::autoscale::AutoscaleState,
    memory: &[elastrec_control::memory_limits::LimitChange],
) -> status::AutoscaleStatus {
    status::AutoscaleStatus {
        bounds: Some(status::AutoscaleBounds {
            workers: a.workers.to_vec(),
            ps: a.ps.to_vec(),
        }),
        profile_samples: a.profile_samples,
        measured_samples_per_s: a.measured_samples_per_s,
        last_plan: a.last_plan.as_ref().map(|p| status::AutoscalePlan {
            kind: p.kind.as_str().to_string(),
            workers: p.allocation.map(|a| a.workers),
            ps: p.allocation.map(|a| a.ps),
            predicted_samples_per_s: p.predicted_throughput,
            fit_mape_percent: p.fit_mape_percent,
            reasons: p.reasons.clone(),
        }),
        last_verdict: a.last_verdict.clone(),
        limits: Some(status::AutoscaleLimits {
            max_workers: a.limits.max_workers,
            max_cpu: a.limits.max_cpu,
            max_ps_cpu: a.limits.max_ps_cpu,
            why: a.limits.why.clone(),
        }),
        brain_error: a.brain_error.clone(),
        scaling: a
            .scaling
            .iter()
            .map(|r| status::ScalingAction {
                at_s: r.at_s,
                before: vec![r.before.0, r.before.1],
                after: vec![r.after.0, r.after.1],
                worker_cpu: vec![r.worker_cpu.0, r.worker_cpu.1],
                ps_cpu: vec![r.ps_cpu.0, r.ps_cpu.1],
                source: r.source.clone(),
                measured_before: r.measured_before,
                predicted: r.predicted,
                measured_after: r.measured_after,
                reasons: r.reasons.clone(),
            })
            .collect(),
        memory_limits: memory
            .iter()
            .map(|c| status::MemoryLimitChange {
                at_s: c.at_s,
                node: c.node,
                role: c.role.clone(),
                index: c.index,
                from_gb: c.from_gb,
                to_gb: c.to_gb,
                reason: c.reason.clone(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(kind: &str) -> pb::PlanResponse {
        pb::PlanResponse {
            kind: kind.into(),
            allocation: Some(pb::Allocation {
                workers: 3,
                ps: 2,
                worker_cpu: 4.0,
                ps_cpu: 2.0,
                worker_mem_gb: 8.0,
                ps_mem_gb: 8.0,
            }),
            predicted_throughput: 1234.0,
            reasons: vec!["because".into()],
            ..Default::default()
        }
    }

    /// What the brain service sends reads back as the plan it made.
    #[test]
    fn a_wire_plan_reads_back_as_the_brains_plan() {
        let brain_plan = elastrec_brain::Plan {
            job_id: "j".into(),
            kind: PlanKind::Replan,
            allocation: alloc_from("a", plan("re-plan").allocation)
                .unwrap()
                .unwrap(),
            predicted_throughput: Some(1234.0),
            predicted_cost: 1.0,
            predicted_gain: None,
            reasons: vec!["because".into()],
            fit: None,
            memory: vec![elastrec_brain::oom::MemoryAction {
                ps_index: 1,
                predicted_peak_gb: 9.0,
                limit_gb: 8.0,
                step_at_limit: Some(700),
                new_mem_gb: 12.0,
                capped: false,
            }],
            front: Vec::new(),
        };
        let wire = elastrec_brain::service::plan_to(&brain_plan);
        assert_eq!(
            proposal_from(&wire).unwrap(),
            Proposal::from(&brain_plan),
            "the live master and the simulator judge the same plan"
        );
    }

    #[test]
    fn a_plan_no_brain_sends_is_refused_with_why() {
        let e = proposal_from(&plan("grow")).unwrap_err();
        assert!(e.contains("unknown kind `grow`"), "{e}");
        let mut p = plan("keep");
        p.allocation.as_mut().unwrap().worker_cpu = f64::NAN;
        let e = proposal_from(&p).unwrap_err();
        assert!(e.contains("allocation"), "{e}");
        assert!(proposal_from(&pb::PlanResponse {
            allocation: None,
            ..plan("keep")
        })
        .unwrap()
        .allocation
        .is_none());
    }
}
