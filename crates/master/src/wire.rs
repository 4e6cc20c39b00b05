//! Where the brain's wire answers become the domain types the policies judge. The
//! requests go the other way through the brain crate's own conversions
//! (`elastrec_brain::service::{ask_to, profile_to}`).

use elastrec_brain::service::alloc_from;
use elastrec_brain::PlanKind;
use elastrec_control::autoscale::Proposal;
use elastrec_proto::brain as pb;

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
