//! Checks made when the Slurm backend opens, before any node is submitted: Slurm is
//! installed, its controller answers, the partition exists, and every role's request can
//! be granted. A job that would wait forever in the queue or fail node by node is refused
//! up front with the cause and what to do, and leaves nothing in Slurm.

use anyhow::{bail, Context};
use elastrec_job::resources::{RoleResources, SlurmConfig};

use super::commands::{text, SlurmTools, ToolError, QUERY_LIMIT};
use super::Allocation;

/// Runs every check; the error names the setting at fault.
pub fn check(
    tools: &SlurmTools,
    cfg: &SlurmConfig,
    allocation: Option<&Allocation>,
    roles: &[(&str, &RoleResources)],
) -> anyhow::Result<()> {
    controller_answers(tools)?;
    if !cfg.partition.is_empty() {
        partition_exists(tools, &cfg.partition)?;
    }
    for (role, r) in roles {
        match allocation {
            Some(a) => fits_allocation(a, role, r)?,
            None => grantable(tools, cfg, role, r)?,
        }
    }
    Ok(())
}

/// `scontrol ping` says the controller is up.
fn controller_answers(tools: &SlurmTools) -> anyhow::Result<()> {
    let out = match tools.run("scontrol", &["ping"], QUERY_LIMIT) {
        Ok(o) => o,
        Err(ToolError::NotFound(p)) => bail!(
            "Slurm is not installed here: {p} was not found. Install Slurm's client commands \
             (e.g. `apt-get install slurm-client`), or set engine.slurm.bin_dir to the \
             directory holding srun/squeue/scancel"
        ),
        Err(e) => bail!(
            "the Slurm controller did not answer ({e}); check that slurmctld runs and that \
             SLURM_CONF names this cluster's slurm.conf"
        ),
    };
    let said = first_words(&out);
    if !out.status.success() || !said.contains(" is UP") {
        bail!(
            "the Slurm controller does not answer (`scontrol ping`: {said}); start slurmctld, \
             or point SLURM_CONF at this cluster's slurm.conf"
        );
    }
    Ok(())
}

/// The first line a command said (stderr before stdout): Slurm's errors come on either,
/// followed by banners not worth repeating.
fn first_words(out: &std::process::Output) -> String {
    [&out.stderr, &out.stdout]
        .iter()
        .map(|b| text(b))
        .find(|t| !t.is_empty())
        .and_then(|t| t.lines().next().map(str::to_string))
        .unwrap_or_else(|| format!("no output, {}", out.status))
}

/// `scontrol show partition NAME` knows the partition.
fn partition_exists(tools: &SlurmTools, name: &str) -> anyhow::Result<()> {
    let out = tools
        .run("scontrol", &["show", "partition", name], QUERY_LIMIT)
        .context("engine.slurm.partition")?;
    if out.status.success() {
        return Ok(());
    }
    let known = tools
        .run("sinfo", &["-h", "-o", "%R"], QUERY_LIMIT)
        .map(|o| text(&o.stdout).lines().collect::<Vec<_>>().join(", "))
        .unwrap_or_default();
    bail!(
        "engine.slurm.partition: Slurm has no partition `{name}` (scontrol: {}); partitions \
         here: {}",
        first_words(&out),
        if known.is_empty() {
            "(none listed)"
        } else {
            known.as_str()
        }
    )
}

/// `srun --test-only` with the role's request: Slurm answers whether and when it could
/// start such a job, without submitting one.
fn grantable(
    tools: &SlurmTools,
    cfg: &SlurmConfig,
    role: &str,
    r: &RoleResources,
) -> anyhow::Result<()> {
    let mut args = vec!["--test-only".to_string()];
    args.extend(super::request_args(cfg, r.whole_cpus(), r.memory_mib()));
    args.push("true".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = tools
        .run("srun", &args, QUERY_LIMIT)
        .with_context(|| format!("asking Slurm whether it can grant resources.{role}"))?;
    if !out.status.success() {
        bail!(
            "resources.{role}: Slurm cannot grant {} CPU(s) and {} MiB per {role} ({}); \
             lower [resources.{role}] cpu / memory_gb, or choose another \
             engine.slurm.partition",
            r.whole_cpus(),
            r.memory_mib(),
            text(&out.stderr).replace('\n', "; ")
        );
    }
    Ok(())
}

/// Inside an allocation, a step can only use what the allocation holds on a node.
fn fits_allocation(a: &Allocation, role: &str, r: &RoleResources) -> anyhow::Result<()> {
    if let Some(cpus) = a.cpus_per_node {
        if r.whole_cpus() > cpus {
            bail!(
                "resources.{role}: a {role} asks for {} CPU(s) but allocation {} has {cpus} \
                 per node; ask sbatch for more (--cpus-per-task / --ntasks) or lower cpu",
                r.whole_cpus(),
                a.job_id
            );
        }
    }
    if let Some(mib) = a.memory_mib_per_node {
        if r.memory_mib() > mib {
            bail!(
                "resources.{role}: a {role} asks for {} MiB but allocation {} has {mib} MiB \
                 per node; ask sbatch for more (--mem) or lower memory_gb",
                r.memory_mib(),
                a.job_id
            );
        }
    }
    Ok(())
}
