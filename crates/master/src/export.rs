//! Servable models from a running job: a batch job's final model (`<output.dir>/model.bin`)
//! and an online job's periodic exports (`<output.dir>/export/model-<checkpoint>.bin`,
//! named by `export/latest.json`).
//!
//! An export converts a committed checkpoint (every PS part and its delta chain) with
//! `elastrec export`, run as a child process of the master: the conversion holds the whole
//! model in memory, which should not be the master's memory, and it may take a while on a
//! large model, which must not hold the control loop. Training never waits for an export;
//! it only reads checkpoints that are already committed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use elastrec_common::EvalResult;

use crate::events::event;

/// Name of the file naming the newest periodic export (written last, atomically).
pub const LATEST_FILE: &str = "latest.json";

/// What one export wrote: printed as JSON by `elastrec export --json`, kept in
/// `export/latest.json` and in the job's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExportRecord {
    /// The model file.
    pub path: PathBuf,
    /// The checkpoint it came from.
    pub checkpoint: u64,
    /// Checkpoints applied (the full one and its deltas).
    pub chain: Vec<u64>,
    /// Samples the model had trained on.
    pub samples: u64,
    /// When the checkpoint was taken (ms since the Unix epoch).
    pub checkpoint_ms: u64,
    /// Embedding rows in the file.
    pub rows: u64,
    /// The delta written beside the model, when one was asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<DeltaRecord>,
    /// Dense parameters in the file.
    pub dense_params: usize,
    /// Size of the file in bytes.
    pub bytes: u64,
    /// Seconds the export took.
    pub seconds: f64,
    /// The model's figures on the validation rows it was asked to judge (`--validate`),
    /// task 0 first; empty when none were given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validation: Vec<EvalResult>,
    /// The model's figures on the eval files it was asked to judge (`--eval-data`), task 0
    /// first; empty when none were given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub eval: Vec<EvalResult>,
}

/// What an export should also evaluate the model on (model selection in `elastrec run`).
#[derive(Debug, Clone, Default)]
pub struct Judge {
    /// The validation slice: `(file, start row, end row)` ranges.
    pub validation: Vec<(PathBuf, u64, u64)>,
    /// The job's eval files.
    pub eval: Vec<PathBuf>,
    /// Malformed rows in both (`data.on_bad_row` of the job).
    pub on_bad_row: elastrec_data::BadRowPolicy,
}

/// A model delta (`elastrec export --delta-from`): what changed between two exports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeltaRecord {
    /// The delta file.
    pub path: PathBuf,
    /// The checkpoint it applies to.
    pub from: u64,
    /// Embedding rows it changes.
    pub rows: u64,
    /// Size of the file in bytes.
    pub bytes: u64,
}

/// The exports of a job, for `result.json`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ExportReport {
    /// The final model of a finished job.
    pub model: Option<ExportRecord>,
    /// Periodic exports written.
    pub exports: u64,
    /// Periodic exports that failed (the job trains on; the next one is tried later).
    pub failures: u64,
    /// The newest periodic export.
    pub last: Option<ExportRecord>,
    /// Pushes to model servers (`output.push`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push: Option<crate::push::PushReport>,
}

/// How the master runs `elastrec export`.
#[derive(Debug, Clone)]
pub struct ExportCommand {
    /// The `elastrec` executable.
    pub program: PathBuf,
    /// The job's checkpoint storage.
    pub location: String,
}

impl ExportCommand {
    /// Exports checkpoint `id` to `out` and returns what was written; an error carries the
    /// child's last output lines.
    pub async fn run(&self, id: u64, out: &Path) -> anyhow::Result<ExportRecord> {
        self.run_with_delta(id, out, None).await
    }

    /// [`Self::run`], also writing the delta from the earlier export `delta.0` to `delta.1`.
    pub async fn run_with_delta(
        &self,
        id: u64,
        out: &Path,
        delta: Option<(&Path, &Path)>,
    ) -> anyhow::Result<ExportRecord> {
        self.run_judged(id, out, delta, None).await
    }

    /// [`Self::run_with_delta`], also evaluating the model as `judge` says (the record's
    /// `validation` and `eval`).
    pub async fn run_judged(
        &self,
        id: u64,
        out: &Path,
        delta: Option<(&Path, &Path)>,
        judge: Option<&Judge>,
    ) -> anyhow::Result<ExportRecord> {
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.arg("export")
            .arg("--checkpoint")
            .arg(&self.location)
            .arg("--id")
            .arg(id.to_string())
            .arg("--out")
            .arg(out)
            .arg("--json");
        if let Some((earlier, path)) = delta {
            cmd.arg("--delta-from")
                .arg(earlier)
                .arg("--delta-out")
                .arg(path);
        }
        if let Some(j) = judge {
            for (file, start, end) in &j.validation {
                cmd.arg("--validate")
                    .arg(format!("{start}:{end}:{}", file.display()));
            }
            for file in &j.eval {
                cmd.arg("--eval-data").arg(file);
            }
            cmd.arg("--on-bad-row").arg(j.on_bad_row.name());
        }
        let output = cmd
            .kill_on_drop(true)
            .output()
            .await
            .with_context(|| format!("starting {} export", self.program.display()))?;
        if !output.status.success() {
            let err = String::from_utf8_lossy(&output.stderr);
            let tail: Vec<&str> = err.lines().rev().take(5).collect();
            anyhow::bail!(
                "`elastrec export` of checkpoint {id} failed ({}): {}",
                output.status,
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            );
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        let line = stdout.lines().last().unwrap_or_default();
        serde_json::from_str(line)
            .with_context(|| format!("`elastrec export` printed `{line}`, not its JSON record"))
    }
}

/// Periodic exports of the newest checkpoint.
pub struct Exporter {
    command: ExportCommand,
    dir: PathBuf,
    every: Duration,
    keep: usize,
    push: Option<crate::push::Pusher>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    running: bool,
    last_at: Option<Instant>,
    last_checkpoint: u64,
    report: ExportReport,
}

impl Exporter {
    /// Exports into `<output_dir>/export` every `every`, keeping the newest `keep` files,
    /// and pushes each export through `push` when given.
    pub fn new(
        command: ExportCommand,
        output_dir: &Path,
        every: Duration,
        keep: usize,
        push: Option<crate::push::Pusher>,
    ) -> Self {
        Self {
            command,
            dir: output_dir.join("export"),
            every,
            keep: keep.max(1),
            push,
            state: Mutex::new(State::default()),
        }
    }

    /// Starts an export of checkpoint `newest` when the interval has passed since the last
    /// one, no export runs, and the checkpoint is newer than the last exported one.
    pub fn poll(self: &Arc<Self>, newest: u64) {
        {
            let mut st = self.state.lock();
            let waited = st.last_at.is_none_or(|t| t.elapsed() >= self.every);
            if st.running || !waited || newest == 0 || newest <= st.last_checkpoint {
                return;
            }
            st.running = true;
            st.last_at = Some(Instant::now());
        }
        let me = self.clone();
        tokio::spawn(async move {
            let r = me.export(newest).await;
            let mut st = me.state.lock();
            st.running = false;
            match r {
                Ok(rec) => {
                    st.last_checkpoint = rec.checkpoint;
                    st.report.exports += 1;
                    st.report.last = Some(rec);
                }
                Err(e) => {
                    st.report.failures += 1;
                    event!(warn, "export_failed", checkpoint = newest, error = %format!("{e:#}"),
                        "master: exporting checkpoint {newest} failed (training goes on; the next export is tried in {:.0} s): {e:#}",
                        me.every.as_secs_f64());
                }
            }
        });
    }

    /// One export: the model file (with a delta for the model servers), then
    /// `latest.json`, then the pushes, then the retention.
    async fn export(&self, id: u64) -> anyhow::Result<ExportRecord> {
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("creating {}", self.dir.display()))?;
        let out = self.dir.join(format!("model-{id}.bin"));
        let previous = self.state.lock().last_checkpoint;
        let base = self.push.as_ref().and_then(|p| p.delta_base(previous));
        let rec = match base {
            None => self.command.run(id, &out).await?,
            Some(since) => {
                let earlier = self.dir.join(format!("model-{since}.bin"));
                let delta = self.dir.join(format!("delta-{since}-{id}.bin"));
                match self
                    .command
                    .run_with_delta(id, &out, Some((&earlier, &delta)))
                    .await
                {
                    Ok(rec) => rec,
                    // E.g. the earlier export was removed by hand: the servers get the
                    // whole model.
                    Err(e) => {
                        event!("export_no_delta", checkpoint = id, error = %format!("{e:#}"),
                            "master: no delta from checkpoint {since} to {id} ({e:#}); the whole model is pushed");
                        self.command.run(id, &out).await?
                    }
                }
            }
        };
        let json = serde_json::to_vec_pretty(&rec)?;
        elastrec_job::fsio::write_atomic(&self.dir.join(LATEST_FILE), &json)?;
        if let Some(p) = &self.push {
            p.push(&rec).await;
        }
        let removed = retain(&self.dir, self.keep)?;
        event!(
            "export",
            checkpoint = id,
            samples = rec.samples,
            bytes = rec.bytes,
            seconds = rec.seconds,
            "master: exported checkpoint {id} ({} samples, {:.1} MB) to {} in {:.2} s{}",
            rec.samples,
            rec.bytes as f64 / 1e6,
            out.display(),
            rec.seconds,
            if removed.is_empty() {
                String::new()
            } else {
                format!("; removed {removed:?}")
            }
        );
        Ok(rec)
    }

    /// What was exported and pushed so far.
    pub fn report(&self) -> ExportReport {
        ExportReport {
            push: self.push.as_ref().map(|p| p.report()),
            ..self.state.lock().report.clone()
        }
    }
}

/// Keeps the `keep` exports of the newest checkpoints in `dir`, and the deltas to them;
/// returns the checkpoint ids of the models removed.
fn retain(dir: &Path, keep: usize) -> anyhow::Result<Vec<u64>> {
    let mut models: Vec<(u64, PathBuf)> = Vec::new();
    let mut deltas: Vec<(u64, PathBuf)> = Vec::new();
    for e in std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok())
    {
        let Ok(name) = e.file_name().into_string() else {
            continue;
        };
        let Some(stem) = name.strip_suffix(".bin") else {
            continue;
        };
        if let Some(id) = stem.strip_prefix("model-").and_then(|n| n.parse().ok()) {
            models.push((id, e.path()));
        } else if let Some(to) = stem
            .strip_prefix("delta-")
            .and_then(|n| n.split_once('-'))
            .and_then(|(_, to)| to.parse().ok())
        {
            deltas.push((to, e.path()));
        }
    }
    models.sort();
    let excess = models.len().saturating_sub(keep);
    let oldest_kept = models.get(excess).map_or(0, |m| m.0);
    let mut removed = Vec::with_capacity(excess);
    for (id, path) in models.into_iter().take(excess) {
        std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        removed.push(id);
    }
    // A delta is only of use beside the model it leads to.
    for (to, path) in deltas {
        if to < oldest_kept {
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_keeps_the_newest_checkpoints_and_ignores_other_files() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "model-3.bin",
            "model-12.bin",
            "model-7.bin",
            "latest.json",
            "model-x.bin",
            "delta-2-3.bin",
            "delta-3-7.bin",
        ] {
            std::fs::write(dir.path().join(name), b"m").unwrap();
        }
        assert_eq!(retain(dir.path(), 2).unwrap(), vec![3]);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "delta-3-7.bin",
                "latest.json",
                "model-12.bin",
                "model-7.bin",
                "model-x.bin"
            ]
        );
    }
}
