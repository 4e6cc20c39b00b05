//! The master's side of an online job: it finds the topics' partitions and where to start,
//! then watches their watermarks and deals what arrives into tasks (`docs/online.md`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use elastrec_job::stream::StreamConfig;
use elastrec_stream::{PartitionId, TopicWatch};

use crate::core::MasterCore;
use crate::events::event;
use crate::job::Phase;
use crate::stream_stats::StreamStats;

/// How long one metadata or offset query may take.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);
/// A step of the watch slower than this is reported: the stream's lag grows meanwhile.
const SLOW_STEP: Duration = Duration::from_secs(1);
/// An unreachable broker is reported again after this long.
const REPORT_EVERY: Duration = Duration::from_secs(30);

/// The partitions of the job's topics and the offset each starts at (per `start`).
pub fn resolve(cfg: &StreamConfig, group: &str) -> anyhow::Result<(Vec<PartitionId>, Vec<u64>)> {
    let start = cfg
        .start_at()
        .map_err(|e| anyhow::anyhow!("stream.start: {e}"))?;
    let watch = TopicWatch::new(&cfg.connection(), group, QUERY_TIMEOUT)?;
    let partitions = watch.partitions(&cfg.topics)?;
    let starts = watch
        .start_offsets(&partitions, start)
        .context("reading the partitions' start offsets")?;
    Ok((partitions, starts))
}

/// Watches the partitions until the job leaves training: every `poll_ms` it reads their
/// high watermarks and deals the new messages (whole shards at once, a remainder once it
/// has lingered `linger_ms`). Broker outages are reported and waited out: training goes
/// on with what was dealt, and nothing is skipped when the broker comes back.
pub async fn run(
    core: Arc<MasterCore>,
    cfg: StreamConfig,
    partitions: Vec<PartitionId>,
    group: String,
) {
    let conn = cfg.connection();
    let watch = match tokio::task::spawn_blocking(move || {
        TopicWatch::new(&conn, &group, QUERY_TIMEOUT)
    })
    .await
    {
        Ok(Ok(w)) => Arc::new(w),
        Ok(Err(e)) => {
            event!(warn, "stream_unwatched", error = %e, "master: cannot watch the stream: {e}");
            return;
        }
        Err(_) => return,
    };
    let parts = Arc::new(partitions);
    let mut waiting_since: Vec<Option<Instant>> = vec![None; parts.len()];
    let linger = Duration::from_millis(cfg.linger_ms);
    let mut tick = tokio::time::interval(Duration::from_millis(cfg.poll_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let eval_every = Duration::from_secs_f64(cfg.eval_every_s);
    let mut last_eval = Instant::now();
    let mut last_report: Option<Instant> = None;
    // When the brokers stopped answering (a failed query), until one answers again.
    let mut outage_since: Option<Instant> = None;
    let started = Instant::now();
    let mut consumed_before = core.job.lock().tasks().ledger().consumed();
    // A mixture job's partitions follow its history files in the queue.
    let base = core.job.lock().tasks().stream_from();
    *core.stream_stats.lock() = Some(StreamStats::new(
        parts.iter().map(ToString::to_string).collect(),
        cfg.slo_lag_s,
    ));
    loop {
        tick.tick().await;
        if !matches!(core.job.lock().phase(), Phase::Training) {
            break;
        }
        let (w, p) = (watch.clone(), parts.clone());
        let asked = Instant::now();
        let (marks, stalled) = match tokio::task::spawn_blocking(move || w.watermarks(&p)).await {
            Ok(Ok(m)) => {
                if last_report.take().is_some() {
                    event!("brokers_back", "master: the stream's brokers answer again");
                }
                let slow = report_slow("the brokers' watermarks", asked.elapsed());
                (m, outage_since.take().map_or(slow, |t| t.elapsed()))
            }
            Ok(Err(e)) => {
                outage_since.get_or_insert(asked);
                if last_report.is_none_or(|t| t.elapsed() >= REPORT_EVERY) {
                    event!(
                        warn,
                        "brokers_unreachable",
                        error = %e,
                        "master: {e}; training goes on with what was dealt, and waits",
                    );
                    last_report = Some(Instant::now());
                }
                continue;
            }
            Err(_) => break,
        };
        let now = Instant::now();
        let plan: Vec<(u32, u64, bool)> = {
            let job = core.job.lock();
            marks
                .iter()
                .enumerate()
                .map(|(p, &(_, high))| {
                    let f = base + p as u32;
                    let undealt = job.tasks().undealt(f, high);
                    let since = &mut waiting_since[p];
                    if undealt == 0 {
                        *since = None;
                    } else if since.is_none() {
                        *since = Some(now);
                    }
                    let flush = since.is_some_and(|t| now.duration_since(t) >= linger);
                    (f, high, flush)
                })
                .collect()
        };
        let dealing = Instant::now();
        let Ok(left) = core
            .run(|job, cx| {
                plan.iter()
                    .map(|&(f, high, flush)| {
                        let dealt = job.extend_stream(f, high, flush, cx);
                        (dealt, job.tasks().undealt(f, high))
                    })
                    .collect::<Vec<_>>()
            })
            .await
        else {
            break;
        };
        report_slow(
            "dealing the new messages (the job's state and database)",
            dealing.elapsed(),
        );
        {
            let (trained, consumed) = {
                let job = core.job.lock();
                (
                    job.tasks().partitions_committed(),
                    job.tasks().ledger().consumed(),
                )
            };
            let highs: Vec<u64> = marks.iter().map(|m| m.1).collect();
            let at_ms = now.duration_since(started).as_millis() as u64;
            if let Some(st) = core.stream_stats.lock().as_mut() {
                st.source_stalled(stalled.as_secs_f64());
                st.observe(at_ms, &highs, &trained, consumed > consumed_before);
                core.metrics.observe_stream(st);
            }
            consumed_before = consumed;
        }
        for (since, (dealt, undealt)) in waiting_since.iter_mut().zip(left) {
            // What is left after whole shards were cut arrived after them.
            if undealt == 0 {
                *since = None;
            } else if dealt > 0 {
                *since = Some(now);
            }
        }
        if last_eval.elapsed() >= eval_every {
            last_eval = Instant::now();
            crate::progressive::record(&core, started.elapsed().as_secs_f64());
        }
    }
}

/// Says so when one step of the watch took a second or more: the lag and the SLO
/// violations of that stretch are then the source's or the master's, not the workers'.
/// Returns the time of a slow step (zero for one that was not).
fn report_slow(what: &str, took: Duration) -> Duration {
    if took < SLOW_STEP {
        return Duration::ZERO;
    }
    event!(
        warn,
        "stream_watch_slow",
        step = what,
        seconds = took.as_secs_f64(),
        "master: the stream watch waited {:.1} s for {what}",
        took.as_secs_f64()
    );
    took
}
