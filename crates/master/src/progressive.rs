//! Progressive validation of an online job: every sample is predicted by the model just
//! before it is trained on (the workers send those predictions with their progress), so
//! the AUC and logloss over the most recent samples measure the model on data it has not
//! seen, without holding any data out (`docs/online.md`). A batch job in `run` does the
//! same over every batch (`train.progressive_window`): its loss and AUC curves. A
//! multi-task model's workers send every task's predictions and labels, and each task has
//! a window of its own. With sample weights (`data.weight`) every figure is weighted, as
//! `eval`'s are: a sample of weight 2 counts as two of weight 1.

use std::sync::Arc;
use std::time::{Duration, Instant};

// The window math is `control`'s; here its figures are logged, exported and scheduled.
pub use elastrec_control::progressive::*;

use crate::core::MasterCore;
use crate::events::event;
use crate::job::Phase;

/// Records the progressive-validation figures (log line, `/metrics`, history).
pub fn record(core: &MasterCore, at_s: f64) {
    let figures = core
        .progressive
        .lock()
        .as_mut()
        .and_then(|p| Some((p.record(at_s)?, p.seen())));
    let Some((f, seen)) = figures else { return };
    core.metrics.observe_progressive(&f);
    let scalars = [
        ("progressive/auc", f.auc.unwrap_or(f64::NAN)),
        ("progressive/logloss", f.logloss),
        ("progressive/ne", f.ne.unwrap_or(f64::NAN)),
        ("progressive/calibration", f.calibration.unwrap_or(f64::NAN)),
    ];
    core.board_scalars(seen, &scalars);
    let auc = |a: Option<f64>| a.map_or("- (one class)".to_string(), |a| format!("{a:.4}"));
    let ne = |v: Option<f64>| v.map_or(String::new(), |v| format!(", NE {v:.4}"));
    let others: String = f
        .tasks
        .iter()
        .enumerate()
        .skip(1)
        .map(|(t, w)| {
            format!(
                "; task {t}: AUC {}, logloss {:.4}{}",
                auc(w.auc),
                w.logloss,
                ne(w.ne)
            )
        })
        .collect();
    event!(
        "progressive_eval",
        samples = f.samples,
        auc = f.auc,
        logloss = f.logloss,
        "master: progressive validation over the last {} samples: AUC {}, logloss {:.4}{}{others}",
        f.samples,
        auc(f.auc),
        f.logloss,
        ne(f.ne)
    );
}

/// A batch job's recorder: the figures every `every` while the job trains (an online
/// job's stream watcher records its own).
pub async fn run_batch(core: Arc<MasterCore>, every: Duration) {
    let started = Instant::now();
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tick.tick().await;
        record(&core, started.elapsed().as_secs_f64());
        if !matches!(core.job.lock().phase(), Phase::Training) {
            return;
        }
    }
}
