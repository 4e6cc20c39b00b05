//! What must match between a checkpoint and the job restoring it.

use elastrec_job::config::JobConfig;
use serde::{Deserialize, Serialize};

/// What must match between a checkpoint and the job restoring it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// Model shape (tables, dimensions, MLPs, seed).
    pub model: serde_json::Value,
    /// Dense and sparse optimizers (their state layout is in the checkpoint).
    pub optimizer: serde_json::Value,
    /// Training files (names) and their rows: the data position refers to them.
    pub files: Vec<(String, u64)>,
    /// The job's files grow (a following job's partitions land; a long list is counted
    /// while it trains): a checkpoint of it restores into the same job with more files
    /// (its own are a prefix of the job's).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub following: bool,
    /// The `[[preprocess]]` graph: it decides the model's inputs (and what a row means to
    /// it). Null for the default graph, so earlier checkpoints keep their digest.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub preprocess: serde_json::Value,
    /// The named features (labels, features, tables): they decide the model's inputs
    /// and tables like a graph. Absent for the Criteo layout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<elastrec_data::Schema>,
}

impl Fingerprint {
    /// The fingerprint of `job` over training files with the given rows.
    pub fn of(job: &JobConfig, files: &[(String, u64)]) -> Self {
        Self {
            model: serde_json::to_value(&job.model).expect("model serializes"),
            optimizer: serde_json::to_value(&job.optimizer).expect("optimizer serializes"),
            files: file_names(files),
            following: job.data.follow,
            preprocess: if job.preprocess.is_empty() {
                serde_json::Value::Null
            } else {
                serde_json::to_value(&job.preprocess).expect("graph serializes")
            },
            schema: job.data.schema(),
        }
    }

    /// This fingerprint, marked as a job whose files grow when `grows` (see
    /// [`Fingerprint::following`]).
    pub fn growing(self, grows: bool) -> Self {
        Self {
            following: self.following || grows,
            ..self
        }
    }

    /// A short stable digest (the manifest's `fingerprint`).
    pub fn digest(&self) -> String {
        let text = serde_json::to_string(self).expect("serializes");
        format!("{:016x}", xxhash_rust::xxh3::xxh3_64(text.as_bytes()))
    }

    /// Why a checkpoint with fingerprint `other` cannot be restored into this job, naming
    /// the section that differs.
    pub fn mismatch(&self, other: &Fingerprint) -> Option<String> {
        if self.model != other.model {
            return Some(format!(
                "[model] differs: checkpoint {} vs job {}",
                other.model, self.model
            ));
        }
        if self.optimizer != other.optimizer {
            return Some(format!(
                "[optimizer] differs: checkpoint {} vs job {}",
                other.optimizer, self.optimizer
            ));
        }
        if self.preprocess != other.preprocess {
            return Some(format!(
                "[[preprocess]] differs: checkpoint {} vs job {}",
                other.preprocess, self.preprocess
            ));
        }
        if self.schema != other.schema {
            return Some(format!(
                "the named features (data.label, [[data.feature]], [[data.table]]) differ: \
                 checkpoint {:?} vs job {:?}",
                other.schema, self.schema
            ));
        }
        // A checkpoint taken while the files grew restores into the same list, longer.
        let grown = (self.following || other.following) && self.files.starts_with(&other.files);
        if self.files != other.files && !grown {
            return Some(format!(
                "training files differ: checkpoint {:?} vs job {:?}",
                other.files, self.files
            ));
        }
        None
    }
}

/// Files as a fingerprint names them: by file name (the job directory may move), with rows.
pub(super) fn file_names(files: &[(String, u64)]) -> Vec<(String, u64)> {
    files
        .iter()
        .map(|(p, r)| {
            let name = std::path::Path::new(p)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| p.clone());
            (name, *r)
        })
        .collect()
}
