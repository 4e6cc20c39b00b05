//! Where Prometheus finds a job's `/metrics` endpoints: a file of its file-based service
//! discovery (`file_sd_configs`), `<job dir>/prometheus-targets.json`, which the master
//! rewrites whenever a node's endpoint appears or goes (a worker added by `scale`, a PS
//! replaced after a failure), so a Prometheus pointed at it scrapes every node.
//!
//! One target group per endpoint, labelled with the job, the role and the node id:
//! ```json
//! [{"targets": ["127.0.0.1:41234"], "labels": {"elastrec_job": "job-1", "role": "worker", "node": "3"}}]
//! ```

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::job::{Job, NodeState, Role};

/// The file's name in the job directory.
pub const FILE_NAME: &str = "prometheus-targets.json";

#[derive(Serialize, PartialEq)]
struct TargetGroup {
    targets: [String; 1],
    labels: Labels,
}

#[derive(Serialize, PartialEq)]
struct Labels {
    elastrec_job: String,
    role: &'static str,
    node: String,
}

/// The discovery file of one job, rewritten when its targets change.
pub struct TargetsFile {
    path: PathBuf,
    /// What the file holds now.
    written: Option<Vec<TargetGroup>>,
}

impl TargetsFile {
    /// The file in `dir` (written at the first [`TargetsFile::update`]).
    pub fn new(dir: &Path) -> Self {
        Self {
            path: dir.join(FILE_NAME),
            written: None,
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the master's endpoint (`master`) and every running node's that has one,
    /// when they differ from what the file holds. The file is replaced whole (temp,
    /// fsync, rename), so Prometheus never reads half of it.
    pub fn update(&mut self, job_id: &str, master: &str, job: &Job) -> elastrec_job::Result<()> {
        let groups = targets(job_id, master, job);
        if self.written.as_ref() == Some(&groups) {
            return Ok(());
        }
        let text = serde_json::to_string_pretty(&groups).expect("targets serialize");
        elastrec_job::fsio::write_atomic(&self.path, text.as_bytes())?;
        self.written = Some(groups);
        Ok(())
    }
}

fn targets(job_id: &str, master: &str, job: &Job) -> Vec<TargetGroup> {
    let group = |addr: &str, role, node: u32| TargetGroup {
        targets: [addr.to_string()],
        labels: Labels {
            elastrec_job: job_id.to_string(),
            role,
            node: node.to_string(),
        },
    };
    let mut out = vec![group(master, "master", 0)];
    let mut nodes: Vec<_> = job
        .nodes()
        .filter(|n| n.state == NodeState::Running && !n.metrics_addr.is_empty())
        .collect();
    nodes.sort_by_key(|n| n.id);
    out.extend(nodes.iter().map(|n| {
        let role = match n.role {
            Role::Ps => "ps",
            Role::Worker => "worker",
            Role::Executor => "executor",
        };
        group(&n.metrics_addr, role, n.id)
    }));
    out
}
