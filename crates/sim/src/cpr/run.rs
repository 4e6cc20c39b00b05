//! One emulated training run: train, save on schedule, fail on schedule, recover.

use std::time::Instant;

use elastrec_checkpoint::priority::{clear_counts, mfu_memory_bytes, select_mfu, SsuList};
use elastrec_control::cpr::{
    expected_pls, overhead_full, overhead_partial, PlsTracker, RecoveryMode,
};
use elastrec_data::{criteo, Batch};
use elastrec_embedding::EmbeddingStore;
use elastrec_worker::step::Predictor;
use elastrec_worker::trainer::evaluate;
use elastrec_worker::WorkerError;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::config::{CprEmulationConfig, Strategy};
use super::report::{InjectedFailure, Overhead, StrategyResult};
use super::state::{restore_shard, save_rows, save_table, FullImage, Trainee};
use crate::error::Result;

/// How CPR-MFU/SSU pick the rows of the large tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Priority {
    /// Access counters, top `r·N`.
    Mfu,
    /// Sub-sampled list of used rows, at most `r·N`.
    Ssu,
}

/// What one run does.
pub(crate) struct Plan {
    pub(crate) recovery: RecoveryMode,
    /// `T_save`, emulated seconds; `None`: no saves.
    pub(crate) t_save_s: Option<f64>,
    /// Prioritized saves of the large tables every `r·T_save` (partial recovery only).
    pub(crate) priority: Option<Priority>,
    /// Whether the failures strike.
    pub(crate) inject: bool,
}

/// What every run shares: data, table sizes, the emulated clock.
pub(crate) struct Setup<'a> {
    cfg: &'a CprEmulationConfig,
    train: Vec<Batch>,
    /// `ends[b]`: samples trained after the first `b` batches.
    ends: Vec<u64>,
    pub(crate) eval: Vec<Batch>,
    table_rows: Vec<u64>,
    pub(crate) large: Vec<usize>,
    small: Vec<usize>,
    total_rows: u64,
    pub(crate) s_total: u64,
    pub(crate) s_per_sample: f64,
}

impl<'a> Setup<'a> {
    pub(crate) fn new(
        cfg: &'a CprEmulationConfig,
        train: Vec<Batch>,
        eval: Vec<Batch>,
        table_rows: Vec<u64>,
    ) -> Self {
        let mut ends = Vec::with_capacity(train.len() + 1);
        ends.push(0u64);
        for b in &train {
            ends.push(ends.last().copied().unwrap_or(0) + b.len() as u64);
        }
        let s_total = ends.last().copied().unwrap_or(0);
        let large =
            elastrec_checkpoint::priority::large_tables(&table_rows, cfg.large_table_coverage);
        let small = (0..table_rows.len())
            .filter(|t| !large.contains(t))
            .collect();
        Self {
            cfg,
            train,
            ends,
            eval,
            total_rows: table_rows.iter().sum(),
            table_rows,
            large,
            small,
            s_total,
            s_per_sample: cfg.job_s() / s_total.max(1) as f64,
        }
    }

    /// `⌊r·N_t⌋` rows per prioritized save of large table `t`.
    fn budget(&self, t: usize) -> usize {
        (self.cfg.priority_ratio * self.table_rows[t] as f64).floor() as usize
    }

    /// Trains one pass under `plan` and evaluates the final model.
    pub(crate) fn run(
        &self,
        strategy: Strategy,
        plan: &Plan,
        failures: &[InjectedFailure],
    ) -> Result<StrategyResult> {
        let started = Instant::now();
        let cfg = self.cfg;
        let mut run = Run::new(self, plan)?;
        let pb = progress_bar(cfg.progress, self.s_total, strategy.label());
        let mut b = 0usize;
        let mut next_failure = 0usize;
        let failures = if plan.inject { failures } else { &[] };
        while b < self.train.len() {
            let batch = &self.train[b];
            let loss = run.trainee.train_batch(batch)?;
            if !loss.is_finite() {
                return Err(WorkerError::Diverged {
                    step: run.steps,
                    loss,
                }
                .into());
            }
            run.observe(self, batch)?;
            run.steps += 1;
            run.samples_trained += batch.len() as u64;
            run.loss_sum += f64::from(loss) * batch.len() as f64;
            pb.inc(batch.len() as u64);
            b += 1;
            let pos = self.ends[b];
            loop {
                let tick_at = run.tick_at(run.next_tick);
                let fail_at = failures.get(next_failure).map_or(u64::MAX, |f| f.at_sample);
                if tick_at.min(fail_at) > pos {
                    break;
                }
                if tick_at <= fail_at {
                    run.save(self, b, pos)?;
                    run.next_tick += 1;
                } else {
                    let f = &failures[next_failure];
                    next_failure += 1;
                    if let Some(rewound_to) = run.fail(self, f, pos)? {
                        pb.inc_length(pos - self.ends[rewound_to]);
                        b = rewound_to;
                        break;
                    }
                }
            }
        }
        pb.finish_and_clear();
        let wall_s = started.elapsed().as_secs_f64();
        let mut predictor = Predictor::new(run.trainee.model(), cfg.job.train.batch_size);
        let eval = evaluate(run.trainee.model(), &self.eval, &mut predictor)?;
        Ok(run.finish(self, strategy, plan, eval, wall_s))
    }
}

/// The mutable state of one run.
struct Run<'p> {
    plan: &'p Plan,
    trainee: Trainee,
    /// Prioritized saves per `T_save` (1 without priority).
    ticks_per_period: u64,
    /// Samples between saves (`T_save / ticks_per_period`), `None` without saves.
    tick_samples: Option<f64>,
    next_tick: u64,
    full_image: Option<FullImage>,
    partial_image: Option<EmbeddingStore>,
    ssu: Vec<(usize, SsuList)>,
    pls: PlsTracker,
    steps: u64,
    samples_trained: u64,
    samples_retrained: u64,
    loss_sum: f64,
    checkpoints: u64,
    rows_saved: u64,
    failures: u32,
    stale_rows: u64,
    max_prioritized_rows: u64,
}

impl<'p> Run<'p> {
    fn new(setup: &Setup<'_>, plan: &'p Plan) -> Result<Self> {
        let cfg = setup.cfg;
        let mut trainee = Trainee::new(&cfg.job, setup.table_rows.clone())?;
        let ticks_per_period = if plan.priority.is_some() {
            cfg.priority_ticks()
        } else {
            1
        };
        let tick_samples = plan
            .t_save_s
            .map(|t| t / cfg.job_s() * setup.s_total as f64 / ticks_per_period as f64);
        // The initial model is the first checkpoint.
        let full_image = (plan.inject && plan.recovery == RecoveryMode::Full)
            .then(|| FullImage::capture(&trainee, 0, 0));
        let partial_image = (plan.inject && plan.recovery == RecoveryMode::Partial)
            .then(|| trainee.model().embeddings.clone());
        let mut ssu = Vec::new();
        match plan.priority {
            Some(Priority::Mfu) => {
                for &t in &setup.large {
                    trainee
                        .step
                        .model
                        .embeddings
                        .table_mut(t)?
                        .enable_access_counters();
                }
            }
            Some(Priority::Ssu) => {
                for &t in &setup.large {
                    let list = SsuList::new(
                        setup.budget(t),
                        cfg.ssu_sample_period,
                        cfg.seed ^ ((t as u64) << 32),
                    );
                    ssu.push((t, list));
                }
            }
            None => {}
        }
        Ok(Self {
            plan,
            trainee,
            ticks_per_period,
            tick_samples,
            next_tick: 1,
            full_image,
            partial_image,
            ssu,
            pls: PlsTracker::new(setup.s_total, cfg.n_emb),
            steps: 0,
            samples_trained: 0,
            samples_retrained: 0,
            loss_sum: 0.0,
            checkpoints: 0,
            rows_saved: 0,
            failures: 0,
            stale_rows: 0,
            max_prioritized_rows: 0,
        })
    }

    /// Sample position of save `k` (1-based); `u64::MAX` without saves.
    fn tick_at(&self, k: u64) -> u64 {
        match self.tick_samples {
            // `as` saturates: an interval longer than the job never fires.
            Some(s) => (k as f64 * s).round().max(1.0) as u64,
            None => u64::MAX,
        }
    }

    /// Feeds the SSU lists with the rows a step touched.
    fn observe(&mut self, setup: &Setup<'_>, batch: &Batch) -> Result<()> {
        if self.ssu.is_empty() {
            return Ok(());
        }
        let rows = self.trainee.batch_rows(batch)?;
        let mut col = Vec::with_capacity(batch.len());
        for (t, list) in &mut self.ssu {
            col.clear();
            col.extend(
                rows.iter()
                    .skip(*t)
                    .step_by(criteo::CATEGORICAL)
                    .map(|&r| r as usize),
            );
            list.observe(&col);
        }
        debug_assert!(setup.large.len() == self.ssu.len());
        Ok(())
    }

    /// Save number `self.next_tick`, taken after `batches` batches (`pos` samples).
    fn save(&mut self, setup: &Setup<'_>, batches: usize, pos: u64) -> Result<()> {
        if !self.plan.inject {
            return Ok(());
        }
        let period_end = self.next_tick.is_multiple_of(self.ticks_per_period);
        self.checkpoints += 1;
        if let Some(img) = &mut self.full_image {
            img.update(&self.trainee, batches, pos);
            self.rows_saved += setup.total_rows;
        } else if let Some(img) = &mut self.partial_image {
            let live = &mut self.trainee.step.model.embeddings;
            match self.plan.priority {
                None => {
                    img.clone_from(live);
                    self.rows_saved += setup.total_rows;
                }
                Some(priority) => {
                    let mut written = 0u64;
                    for (i, &t) in setup.large.iter().enumerate() {
                        let rows: Vec<usize> = match priority {
                            Priority::Mfu => {
                                let table = live.table_mut(t)?;
                                let counts =
                                    table.access_counts_mut().expect("MFU counters enabled");
                                let picked = select_mfu(counts, setup.budget(t));
                                clear_counts(counts, &picked);
                                picked
                            }
                            Priority::Ssu => self.ssu[i].1.take(),
                        };
                        let rows: Vec<u64> = rows.into_iter().map(|r| r as u64).collect();
                        save_rows(&*live, img, t, &rows)?;
                        written += rows.len() as u64;
                    }
                    self.max_prioritized_rows = self.max_prioritized_rows.max(written);
                    if period_end {
                        for &t in &setup.small {
                            save_table(&*live, img, t)?;
                            written += setup.table_rows[t];
                        }
                    }
                    self.rows_saved += written;
                }
            }
        }
        if period_end {
            self.pls.on_checkpoint(pos);
        }
        Ok(())
    }

    /// Failure `f` strikes at `pos`. Full recovery returns the batch index it rewound to.
    fn fail(&mut self, setup: &Setup<'_>, f: &InjectedFailure, pos: u64) -> Result<Option<usize>> {
        self.failures += 1;
        match self.plan.recovery {
            RecoveryMode::Full => {
                let img = self.full_image.as_ref().expect("full image kept");
                img.restore(&mut self.trainee);
                self.samples_retrained += pos - img.samples;
                Ok(Some(img.batch))
            }
            RecoveryMode::Partial => {
                let img = self.partial_image.as_ref().expect("partial image kept");
                for &s in &f.servers {
                    self.stale_rows += restore_shard(
                        &mut self.trainee.step.model.embeddings,
                        img,
                        s,
                        setup.cfg.n_emb,
                    )?;
                }
                self.pls.on_failure(pos, f.servers.len() as u32);
                Ok(None)
            }
        }
    }

    fn finish(
        self,
        setup: &Setup<'_>,
        strategy: Strategy,
        plan: &Plan,
        eval: elastrec_worker::EvalResult,
        wall_s: f64,
    ) -> StrategyResult {
        let cfg = setup.cfg;
        let costs = cfg.costs();
        let job_s = cfg.job_s();
        let failures = f64::from(self.failures);
        let volume = self.rows_saved as f64 / setup.total_rows.max(1) as f64;
        let overhead = Overhead {
            save_s: cfg.o_save_s * volume,
            load_s: cfg.o_load_s * failures,
            lost_s: self.samples_retrained as f64 * setup.s_per_sample,
            res_s: cfg.o_res_s * failures,
        };
        let (predicted, expected) = match (plan.inject, plan.t_save_s, plan.recovery) {
            (true, Some(t), RecoveryMode::Full) => (overhead_full(&costs, job_s, t), 0.0),
            (true, Some(t), RecoveryMode::Partial) => (
                overhead_partial(&costs, job_s, t),
                f64::from(cfg.failed_ps) * expected_pls(t, costs.t_fail_s, cfg.n_emb),
            ),
            _ => (0.0, 0.0),
        };
        let prioritized = plan.priority.is_some();
        let budget: u64 = setup.large.iter().map(|&t| setup.budget(t) as u64).sum();
        let tracking_bytes = match plan.priority {
            Some(Priority::Mfu) => Some(
                setup
                    .large
                    .iter()
                    .map(|&t| mfu_memory_bytes(setup.table_rows[t]))
                    .sum(),
            ),
            Some(Priority::Ssu) => {
                Some(self.ssu.iter().map(|(_, l)| l.memory_bytes() as u64).sum())
            }
            None => None,
        };
        StrategyResult {
            strategy,
            recovery: plan.recovery,
            t_save_s: plan.t_save_s.filter(|_| plan.inject),
            t_save_samples: self
                .tick_samples
                .filter(|_| plan.inject)
                .map(|s| (s * self.ticks_per_period as f64).round() as u64),
            checkpoints: self.checkpoints,
            checkpoint_volume: volume,
            failures: self.failures,
            samples_trained: self.samples_trained,
            samples_retrained: self.samples_retrained,
            pls: self.pls.pls(),
            expected_pls: expected,
            stale_rows_restored: self.stale_rows,
            max_prioritized_rows: prioritized.then_some(self.max_prioritized_rows),
            prioritized_row_budget: prioritized.then_some(budget),
            tracking_bytes,
            overhead_pct: 100.0 * overhead.total_s() / job_s,
            overhead,
            predicted_overhead_pct: 100.0 * predicted / job_s,
            auc: eval.auc,
            logloss: eval.logloss,
            train_loss: self.loss_sum / self.samples_trained.max(1) as f64,
            wall_s,
        }
    }
}

fn progress_bar(enabled: bool, total: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(
        Some(total),
        if enabled {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        },
    );
    pb.set_style(
        ProgressStyle::with_template(&format!(
            "{what:>16} [{{elapsed_precise}}] {{wide_bar}} {{pos}}/{{len}} ({{per_sec}}, eta {{eta}})"
        ))
        .expect("valid template"),
    );
    pb
}
