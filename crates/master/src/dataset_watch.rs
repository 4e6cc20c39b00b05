//! The master's side of a following job (`data.follow`): it lists the training datasets'
//! windows again every `data.follow_every` and queues the partitions that landed since,
//! in time order (`docs/data.md`, "Following datasets").
//!
//! New files are made durable in `master.db` before their tasks exist, so a master that
//! stops in between finds them at resume and cuts them then ([`TaskQueue::follow`]).
//!
//! [`TaskQueue::follow`]: crate::tasks::TaskQueue::follow

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use elastrec_job::config::JobConfig;
use elastrec_job::datasets::{Follower, Landed};
use elastrec_job::split::Source;
use elastrec_proto::master::{DatasetsStatus, PendingPartition};

use crate::core::MasterCore;
use crate::events::event;
use crate::job::Phase;

/// A failing listing is reported again after this long.
const REPORT_EVERY: Duration = Duration::from_secs(30);

/// Follows the datasets until the job leaves training.
pub async fn run(core: Arc<MasterCore>, cfg: JobConfig) {
    let known: Vec<String> = core.sources.read().iter().map(Source::to_string).collect();
    let job = cfg.clone();
    let mut follower = match tokio::task::spawn_blocking(move || Follower::new(&job, known)).await {
        Ok(Ok(f)) => f,
        Ok(Err(e)) => {
            event!(warn, "follow_failed", error = %e, "master: cannot follow the datasets: {e}");
            return;
        }
        Err(_) => return,
    };
    let mut tick = tokio::time::interval(cfg.follow_every());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_report: Option<Instant> = None;
    let mut late = LateWatch::default();
    let mut announced_end = false;
    let mut total_landed = 0;
    loop {
        tick.tick().await;
        if !matches!(core.job.lock().phase(), Phase::Training) {
            break;
        }
        // Listing and counting rows block: off the runtime.
        let polled = tokio::task::spawn_blocking(move || {
            let r = follower.poll();
            (follower, r)
        })
        .await;
        let Ok((f, result)) = polled else { break };
        follower = f;
        let landed = match result {
            Ok(l) => {
                if last_report.take().is_some() {
                    event!("datasets_listed_again", "master: the datasets list again");
                }
                l
            }
            Err(e) => {
                if last_report.is_none_or(|t| t.elapsed() >= REPORT_EVERY) {
                    event!(
                        warn,
                        "datasets_unlisted",
                        error = %e,
                        "master: following the datasets: {e}; training goes on with what was queued, and the next look retries",
                    );
                    last_report = Some(Instant::now());
                }
                continue;
            }
        };
        if !landed.files.is_empty() && queue_files(&core, &landed).await.is_err() {
            break;
        }
        total_landed += landed.partitions.len();
        for line in late.check(&landed, &follower, &cfg) {
            event!("dataset_late", %line, "master: {line}");
        }
        if landed.exhausted {
            // Idempotent: a full recovery may have reopened the queue.
            if core.run(|job, cx| job.stop_growing(cx)).await.is_err() {
                break;
            }
            if !std::mem::replace(&mut announced_end, true) {
                event!(
                    "datasets_closed",
                    "master: every dataset window is closed and read; training ends with the queue"
                );
            }
        }
        let (files, growing) = {
            let job = core.job.lock();
            (job.tasks().file_rows().len(), job.tasks().is_growing())
        };
        *core.follow_status.lock() =
            Some(late.status(&landed, &follower, files, total_landed, growing));
    }
}

/// Makes the new files durable, then queues their tasks. Errs when the master's state
/// cannot be written.
async fn queue_files(core: &MasterCore, landed: &Landed) -> Result<(), ()> {
    crate::file_count::append(core, &landed.files, &landed.sources).await?;
    let rows: Vec<u64> = landed.files.iter().map(|f| f.1).collect();
    event!(
        "partitions_landed",
        partitions = landed.partitions.len(),
        names = %landed.partitions.join(","),
        files = landed.files.len(),
        rows = rows.iter().sum::<u64>(),
        "master: {} partition(s) landed ({}): {} files, {} rows queued",
        landed.partitions.len(),
        landed.partitions.join(", "),
        landed.files.len(),
        rows.iter().sum::<u64>()
    );
    Ok(())
}

/// Partitions that stay unready past their dataset's `ready_timeout` hold back every
/// newer one (tasks leave in time order): each is reported once, with what to do.
#[derive(Default)]
struct LateWatch {
    /// (dataset, dir) → when it was first seen pending, and whether it was reported.
    since: HashMap<(usize, String), (Instant, bool)>,
}

impl LateWatch {
    /// Notes this look's pending partitions; returns the reports due.
    fn check(&mut self, landed: &Landed, follower: &Follower, cfg: &JobConfig) -> Vec<String> {
        let now = Instant::now();
        self.since.retain(|(d, dir), _| {
            landed
                .pending
                .iter()
                .any(|p| p.dataset == *d && &p.dir == dir)
        });
        let mut out = Vec::new();
        for p in &landed.pending {
            let timeout = follower.ready_timeout(p.dataset);
            let (t, reported) = self
                .since
                .entry((p.dataset, p.dir.clone()))
                .or_insert((now, false));
            if !*reported && now.duration_since(*t) >= timeout {
                *reported = true;
                out.push(format!(
                    "dataset `{}`: partition {} is not ready after {} ({}); newer partitions wait behind it. \
                     Add its marker once it is complete, or stop the job with `elastrec stop {}`",
                    follower.dataset_name(p.dataset),
                    p.dir,
                    humantime::format_duration(timeout),
                    if p.exists { "no marker" } else { "it does not exist" },
                    cfg.output.dir.display()
                ));
            }
        }
        out
    }

    /// The `datasets` part of `elastrec status`.
    fn status(
        &self,
        landed: &Landed,
        follower: &Follower,
        files: usize,
        total_landed: usize,
        growing: bool,
    ) -> DatasetsStatus {
        let now = Instant::now();
        let pending = landed
            .pending
            .iter()
            .map(|p| PendingPartition {
                dataset: follower.dataset_name(p.dataset).to_string(),
                dir: p.dir.clone(),
                exists: p.exists,
                waiting_s: self
                    .since
                    .get(&(p.dataset, p.dir.clone()))
                    .map_or(0.0, |(t, _)| now.duration_since(*t).as_secs_f64()),
            })
            .collect();
        DatasetsStatus {
            files: files as u64,
            landed: total_landed as u64,
            growing,
            pending,
        }
    }
}
