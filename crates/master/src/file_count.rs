//! A long training list counted while the job trains. The task queue cuts shards from each
//! file's rows, and counting a plain text file is a full read: a job of many files would
//! wait for all of them before its first step. Instead `run` counts the first
//! [`FIRST_FILES`] (more while they hold no row), starts, and counts the rest here in
//! batches that double up to [`MAX_BATCH`], appending each to the queue's first epoch
//! (`TaskQueue::count_later`); the next epoch is cut once the list is complete.
//!
//! Each batch is made durable in `master.db` (`files`) before its tasks exist, as a
//! following job's partitions are ([`append`]); a resumed master counts on from the end of
//! what was recorded (`files_counting` marks a list not yet complete).

use std::path::PathBuf;
use std::sync::Arc;

use elastrec_job::config::JobConfig;
use elastrec_job::split::Source;

use crate::core::MasterCore;
use crate::events::event;
use crate::job::{Change, Phase};
use crate::run::FileRows;

/// Files a new job counts before it starts; a list this long or shorter is counted whole,
/// so its shards and their order are those of a queue cut at once.
pub const FIRST_FILES: usize = 256;

/// The largest batch counted at once: each batch rewrites the recorded file list.
const MAX_BATCH: usize = 16_384;

/// The `master.db` key that says the list is still being counted ("1") or complete ("0").
pub const COUNTING_KEY: &str = "files_counting";

/// The part of a job's list not counted yet: files (in job order) and their sources.
#[derive(Debug, Default)]
pub struct Rest {
    files: Vec<PathBuf>,
    sources: Vec<u32>,
}

impl Rest {
    /// The files of the job's list (`listed`, its `train_files`) after the first
    /// `counted`, with their `[[data.source]]`.
    pub fn after(cfg: &JobConfig, mut files: Vec<PathBuf>, counted: usize) -> Self {
        let mut sources = elastrec_job::mix::train_file_sources(cfg);
        files.drain(..counted.min(files.len()));
        sources.drain(..counted.min(sources.len()));
        Self { files, sources }
    }

    /// Files left to count.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// True when every file is counted.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }
}

/// Whether a new job may start before its whole list is counted: a job over a fixed list
/// of more than [`FIRST_FILES`] files. A following job counts partitions as they land; an
/// online job has a stream; a validation slice is carved off the end of the list, and a
/// start from a checkpoint checks its file list, so those count everything first.
pub fn may_count_later(cfg: &JobConfig, from_checkpoint: bool) -> bool {
    !cfg.data.follow
        && cfg.stream.is_none()
        && !from_checkpoint
        && !crate::validation::wanted(cfg)
        && cfg.data.train.len() > FIRST_FILES
}

/// Counts the first files of a job's list: [`FIRST_FILES`], then batches twice as large
/// while everything counted holds no row. Returns the counted files (with rows) and what
/// is left; fails naming the files when the whole list holds no row.
pub fn count_first(cfg: &JobConfig) -> anyhow::Result<(Vec<(PathBuf, u64)>, Rest)> {
    let files = cfg.train_files();
    let mut counted = Vec::new();
    let mut batch = FIRST_FILES;
    while counted.len() < files.len() {
        let end = (counted.len() + batch).min(files.len());
        counted.extend(elastrec_job::prepare::row_counts(
            cfg,
            &files[counted.len()..end],
        )?);
        if counted.iter().any(|&(_, rows)| rows > 0) {
            break;
        }
        batch = (batch * 2).min(MAX_BATCH);
    }
    let rest = Rest::after(cfg, files.clone(), counted.len());
    elastrec_job::prepare::some_rows(files, &counted)?;
    Ok((counted, rest))
}

/// Rows one epoch of the whole list is expected to hold: the counted files' mean over
/// every listed file.
pub fn expected_rows(counted: &[FileRows], rest: &Rest) -> u64 {
    let rows: u64 = counted.iter().map(|f| f.rows).sum();
    if counted.is_empty() {
        return rows;
    }
    let listed = (counted.len() + rest.len()) as u128;
    (u128::from(rows) * listed / counted.len() as u128).min(u128::from(u64::MAX)) as u64
}

/// The training rows as the start reports them: counted, or (a list still being counted)
/// the estimate and how many files it rests on.
pub fn describe(counted: &[FileRows], rest: &Rest) -> String {
    if rest.is_empty() {
        return format!("{} rows", counted.iter().map(|f| f.rows).sum::<u64>());
    }
    format!(
        "about {} rows ({} of {} files counted; the rest while training)",
        expected_rows(counted, rest),
        counted.len(),
        counted.len() + rest.len()
    )
}

/// Starts counting `rest` beside the job (nothing to do when it is empty).
pub fn spawn(core: &Arc<MasterCore>, cfg: &JobConfig, rest: Rest) {
    if !rest.is_empty() {
        tokio::spawn(run(core.clone(), cfg.clone(), rest));
    }
}

/// Counts the rest of the list in doubling batches and appends each to the queue, then
/// closes the list. A file that cannot be counted fails the job, naming it. Ends early
/// when the job leaves training.
pub async fn run(core: Arc<MasterCore>, cfg: JobConfig, rest: Rest) {
    let total = core.sources.read().len() + rest.len();
    hold_for_test().await;
    let mut next = 0;
    let mut batch = FIRST_FILES;
    while next < rest.len() {
        if !matches!(core.job.lock().phase(), Phase::Training) {
            return;
        }
        let end = (next + batch).min(rest.len());
        let (job, files) = (cfg.clone(), rest.files[next..end].to_vec());
        let counted =
            tokio::task::spawn_blocking(move || elastrec_job::prepare::row_counts(&job, &files))
                .await;
        let counted = match counted {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                let message = format!(
                    "counting the rows of the training files: {e}; fix or remove the file and \
                     resume with `elastrec run --resume {}`",
                    cfg.output.dir.display()
                );
                event!(warn, "files_uncounted", error = %e, "master: {message}");
                let _ = core.run(|job, cx| job.fail(message, cx)).await;
                return;
            }
            Err(_) => return,
        };
        let pairs: Vec<(String, u64)> = counted
            .into_iter()
            .map(|(p, rows)| (p.to_string_lossy().into_owned(), rows))
            .collect();
        if append(&core, &pairs, &rest.sources[next..end])
            .await
            .is_err()
        {
            return;
        }
        next = end;
        batch = (batch * 2).min(MAX_BATCH);
        let known = core.sources.read().len();
        event!(
            "files_counted",
            files = known,
            of = total,
            "master: counted the rows of {known} of {total} training files"
        );
    }
    if core
        .persist(vec![Change::Meta(COUNTING_KEY, "0".into())])
        .await
        .is_err()
    {
        return;
    }
    let _ = core.run(|job, cx| job.stop_growing(cx)).await;
}

/// Makes new files durable (the whole list in `master.db`'s `files`), then queues their
/// tasks and names them in later checkpoints. Errs when the master's state cannot be
/// written or the job left training.
pub(crate) async fn append(
    core: &MasterCore,
    files: &[(String, u64)],
    sources: &[u32],
) -> Result<(), ()> {
    let known: Vec<FileRows> = {
        let sources = core.job.lock().tasks().file_sources().to_vec();
        crate::run::core_file_pairs(core)
            .into_iter()
            .enumerate()
            .map(|(i, (path, rows))| FileRows {
                path,
                rows,
                source: sources.get(i).copied().unwrap_or(0),
            })
            .collect()
    };
    let all: Vec<FileRows> = known
        .into_iter()
        .chain(files.iter().enumerate().map(|(i, (path, rows))| FileRows {
            path: path.clone(),
            rows: *rows,
            source: sources.get(i).copied().unwrap_or(0),
        }))
        .collect();
    let text = serde_json::to_string(&all).expect("file rows serialize");
    if let Err(e) = core.persist(vec![Change::Meta("files", text)]).await {
        event!(warn, "files_unrecorded", error = %e, "master: cannot record new files: {e}");
        return Err(());
    }
    // Paths first: a task handed out names a file the service can resolve.
    core.sources
        .write()
        .extend(files.iter().map(|(p, _)| Source::File(p.clone())));
    let rows: Vec<u64> = files.iter().map(|f| f.1).collect();
    match core
        .run(|job, cx| job.append_files(&rows, sources, cx))
        .await
    {
        Ok(Some(_)) => {}
        _ => return Err(()),
    }
    if let Some(c) = core.checkpoints() {
        c.add_files(files);
    }
    Ok(())
}

/// Fail point `ELASTREC_FAIL_HOLD_COUNTING`: the master counts nothing after the files it
/// started with; a test sees the job train them and wait, then kills and resumes it.
async fn hold_for_test() {
    if elastrec_common::fail_points::is_set("ELASTREC_FAIL_HOLD_COUNTING") {
        event!(
            "fail_point",
            name = "counting",
            "fail point: holding the count of the rest of the training files"
        );
        std::future::pending::<()>().await;
    }
}
