//! Synthetic Criteo-shaped data with a hidden teacher model, so that models have real
//! signal to learn.
//!
//! Files are in the exact Criteo raw layout (`label \t I1..I13 \t C1..C26`, see
//! [`crate::tsv`]) or the canonical Parquet schema ([`crate::parquet_io`]), split into
//! `days` files `day_0.tsv`... Cardinalities are the published Criteo Kaggle counts times
//! `scale` (at least 2); ids are Zipf-distributed (exponent 1.05..1.2 per feature) and
//! written as a bijective 32-bit scramble of (feature, rank). Integers are heavy-tailed
//! (Lomax) counts with Criteo-like missing rates; `I2` is sometimes -1/-2.
//!
//! Labels are Bernoulli draws from a teacher:
//! `logit = b + s1·Σ w·z + s2·Σ c·tanh(A z / 2) + s3·Σ_f amp_f·d_f(id)·u_f(id)
//!  + s4·Σ_pairs d_a·d_b·<v_a(id_a), v_b(id_b)>`, where `z` are the standardized
//! `ln(1+x)` integers, `u`, `v` are hash-derived per-id values and `d(rank) = 40/(40+rank)`
//! concentrates per-id signal on frequent ids (rare ids cannot be learned by any model).
//! The scales give a logit standard deviation of [`TARGET_LOGIT_STD`] split 30/10/42/18 %
//! between the four parts, and `b` is bisected for a 25 % click rate, both on a
//! calibration sample. The exact teacher AUC is written to `report.json`.
//!
//! Generation is deterministic for a seed whatever the thread count: each chunk of
//! [`CHUNK_ROWS`] rows of a day has its own seeded RNG; chunks are generated in parallel
//! with rayon (in the current pool) and written in order by a writer thread.

mod drift;
mod model;
pub mod named;
pub mod partition;
mod rng;

pub use model::CRITEO_KAGGLE_CARDINALITIES;

use crate::criteo;
use crate::error::{DataError, Result};
use crate::parquet_io::{ParquetOptions, ParquetWriter};
use crate::raw::{RawBatch, RawRow};
use model::{sigmoid, Features, Teacher};
use rayon::prelude::*;
use rng::{splitmix64, Rng};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Exact AUC of `scores` against binary `labels` (1 = positive). `None` if one class is
/// absent.
pub fn exact_auc(scores: &[f32], labels: &[u8]) -> Option<f64> {
    elastrec_common::exact_auc(scores, labels, |l| l != 0)
}

/// Rows per independently seeded chunk.
pub const CHUNK_ROWS: usize = 16 * 1024;
/// Standard deviation of the teacher logit (before the bias).
pub const TARGET_LOGIT_STD: f64 = 1.6;
/// Target click rate.
pub const TARGET_CTR: f64 = 0.25;
/// Rows of the calibration sample.
const CALIBRATION_ROWS: usize = 20_000;
/// Most rows kept for the exact teacher AUC (beyond that, a fixed stride subsample).
const AUC_MAX_ROWS: u64 = 4_000_000;

/// Output file format of the generator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputFormat {
    /// Plain Criteo TSV, `day_N.tsv`.
    #[default]
    Tsv,
    /// Parquet with the canonical schema, `day_N.parquet`.
    Parquet,
}

impl OutputFormat {
    /// File extension (without dot).
    pub fn extension(self) -> &'static str {
        match self {
            OutputFormat::Tsv => "tsv",
            OutputFormat::Parquet => "parquet",
        }
    }
}

impl std::str::FromStr for OutputFormat {
    type Err = DataError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "tsv" => Ok(OutputFormat::Tsv),
            "parquet" => Ok(OutputFormat::Parquet),
            _ => Err(DataError::InvalidSpec(format!(
                "unknown format {s:?} (tsv|parquet)"
            ))),
        }
    }
}

/// What to generate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenSpec {
    /// Output directory (created if missing).
    pub out: PathBuf,
    /// Total rows over all days.
    pub rows: u64,
    /// File format.
    #[serde(default)]
    pub format: OutputFormat,
    /// Seed of the teacher and of the rows.
    #[serde(default)]
    pub seed: u64,
    /// Number of day files (rows are split as evenly as possible).
    #[serde(default = "default_days")]
    pub days: u32,
    /// Multiplier of the Criteo Kaggle cardinalities (each at least 2).
    #[serde(default = "default_scale")]
    pub scale: f64,
    /// How fast click behaviour drifts: each day the click model turns `drift` of a
    /// quarter turn away from day 0's, towards another one (0: no drift; 0.25: day 4
    /// shares nothing with day 0). See `gen/drift.rs`.
    #[serde(default)]
    pub drift: f64,
    /// A second label per row, a conversion after the click (`11` clicked and converted,
    /// `10` clicked only, `00`): the data of a two-task model (`model.type = "mmoe"`).
    /// A conversion's probability given a click mixes the click teacher's signal with a
    /// teacher of its own ([`CONVERSION_CORRELATION`]), calibrated to
    /// [`TARGET_CVR`] of the clicks; the second label is click × conversion (a
    /// post-view conversion, the CTCVR task).
    #[serde(default)]
    pub conversions: bool,
}

/// Correlation of the conversion logit with the click logit's signal.
pub const CONVERSION_CORRELATION: f64 = 0.5;
/// Mean conversion probability of a click.
pub const TARGET_CVR: f64 = 0.25;
/// Mixed into the seed for the conversion teacher and the conversion draws (streams of
/// their own, so the rows and clicks match the same seed's data without conversions).
const CONVERSION_STREAM: u64 = 0xC04E_2510;

fn default_days() -> u32 {
    1
}
fn default_scale() -> f64 {
    1.0
}

impl GenSpec {
    /// A spec with defaults: TSV, seed 0, 1 day, scale 1.
    pub fn new(out: impl Into<PathBuf>, rows: u64) -> Self {
        Self {
            out: out.into(),
            rows,
            format: OutputFormat::Tsv,
            seed: 0,
            days: 1,
            scale: 1.0,
            drift: 0.0,
            conversions: false,
        }
    }

    fn validate(&self) -> Result<()> {
        if self.days == 0 {
            return Err(DataError::InvalidSpec("days must be at least 1".into()));
        }
        if !(self.scale.is_finite() && self.scale > 0.0) {
            return Err(DataError::InvalidSpec(format!(
                "scale must be > 0, got {}",
                self.scale
            )));
        }
        if !(self.drift.is_finite() && (0.0..=1.0).contains(&self.drift)) {
            return Err(DataError::InvalidSpec(format!(
                "drift must be in [0, 1] (a share of a quarter turn per day), got {}",
                self.drift
            )));
        }
        let max = CRITEO_KAGGLE_CARDINALITIES
            .iter()
            .max()
            .copied()
            .unwrap_or(0) as f64;
        if max * self.scale >= u32::MAX as f64 {
            return Err(DataError::InvalidSpec(format!(
                "scale {} makes a cardinality exceed 2^32",
                self.scale
            )));
        }
        Ok(())
    }

    /// Rows of day `d`.
    pub fn day_rows(&self, d: u32) -> u64 {
        let days = self.days as u64;
        self.rows / days + u64::from((d as u64) < self.rows % days)
    }
}

/// One generated file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenFile {
    /// File name inside the output directory.
    pub name: String,
    /// Rows in the file.
    pub rows: u64,
    /// Size in bytes.
    pub bytes: u64,
}

/// Summary of a generation run, also written as `report.json` in the output directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenReport {
    /// Total rows.
    pub rows: u64,
    /// Files in day order.
    pub files: Vec<GenFile>,
    /// Seed used.
    pub seed: u64,
    /// Cardinality scale used.
    pub scale: f64,
    /// Output format.
    pub format: OutputFormat,
    /// Drift of the click model per day (0: none).
    #[serde(default)]
    pub drift: f64,
    /// Fraction of rows with label 1.
    pub click_rate: f64,
    /// Exact AUC of the teacher probabilities against the sampled labels.
    pub teacher_auc: f64,
    /// Rows the teacher AUC was computed on (all rows up to 4M, else a stride sample).
    pub teacher_auc_rows: u64,
    /// Teacher log loss on the same rows (the best any model can expect, in expectation).
    pub teacher_logloss: f64,
    /// Teacher bias found by calibration.
    pub teacher_bias: f64,
    /// With `conversions`: the second label's rate and the teacher's figures on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversion: Option<TaskReport>,
    /// Per-feature cardinality (number of possible ids) of `C1..C26`.
    pub cardinalities: Vec<u64>,
    /// Wall time of the whole run, seconds.
    pub generation_secs: f64,
    /// Rows per second over the whole run.
    pub rows_per_sec: f64,
    /// Rayon threads used.
    pub threads: usize,
}

/// The generator's figures on one label beyond the click.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TaskReport {
    /// Fraction of rows with this label 1.
    pub rate: f64,
    /// Exact AUC of the teacher's probability of this label against it.
    pub teacher_auc: f64,
    /// The teacher's log loss on it.
    pub teacher_logloss: f64,
}

/// Generates the data set described by `spec` (no progress reporting).
pub fn generate(spec: &GenSpec) -> Result<GenReport> {
    generate_with_progress(spec, &|_| {})
}

struct ChunkJob {
    day: u32,
    index: u64,
    rows: usize,
}

enum Payload {
    Tsv(Vec<u8>),
    Parquet(RawBatch),
}

struct ChunkOut {
    day: u32,
    rows: usize,
    payload: Payload,
    clicks: u64,
    auc_probs: Vec<f32>,
    auc_labels: Vec<u8>,
    conversions: u64,
    conv_probs: Vec<f32>,
    conv_labels: Vec<u8>,
}

/// The conversion model: a teacher of its own, mixed with the click teacher's signal.
struct Conversion {
    teacher: Teacher,
    bias: f64,
}

impl Conversion {
    fn new(click: &Teacher, features: &Features, seed: u64) -> Self {
        let mut teacher = Teacher::new(seed ^ CONVERSION_STREAM);
        teacher.calibrate(
            features,
            seed ^ CONVERSION_STREAM,
            CALIBRATION_ROWS,
            TARGET_LOGIT_STD,
            TARGET_CVR,
        );
        let mut c = Self { teacher, bias: 0.0 };
        let signals: Vec<f64> = model::calibration_rows(features, seed, CALIBRATION_ROWS)
            .iter()
            .map(|(r, k)| c.signal(click, r, k))
            .collect();
        c.bias = model::bias_for_ctr(&signals, TARGET_CVR);
        c
    }

    fn signal(&self, click: &Teacher, row: &RawRow, ranks: &[u32; criteo::CATEGORICAL]) -> f64 {
        let rho = CONVERSION_CORRELATION;
        rho * click.signal(row, ranks) + (1.0 - rho * rho).sqrt() * self.teacher.signal(row, ranks)
    }

    /// Probability that a click converts.
    fn probability(
        &self,
        click: &Teacher,
        row: &RawRow,
        ranks: &[u32; criteo::CATEGORICAL],
    ) -> f64 {
        sigmoid(self.bias + self.signal(click, row, ranks))
    }
}

struct World {
    features: Features,
    teacher: Teacher,
    /// Per-day click models when the behaviour drifts.
    drift: Option<drift::Drift>,
    conversion: Option<Conversion>,
    seed: u64,
    format: OutputFormat,
    auc_stride: u64,
}

impl World {
    fn chunk(&self, job: &ChunkJob) -> ChunkOut {
        let mut rng = Rng::new(splitmix64(
            self.seed ^ splitmix64(((job.day as u64) << 40) ^ job.index),
        ));
        let mut row = RawRow::default();
        let mut ranks = [0u32; criteo::CATEGORICAL];
        let mut payload = match self.format {
            OutputFormat::Tsv => Payload::Tsv(Vec::with_capacity(job.rows * 280)),
            OutputFormat::Parquet => Payload::Parquet(RawBatch::with_capacity(job.rows)),
        };
        let mut clicks = 0;
        let keep = job.rows.div_ceil(self.auc_stride as usize);
        let mut auc_probs = Vec::with_capacity(keep);
        let mut auc_labels = Vec::with_capacity(keep);
        // Conversions draw from a generator of their own, so the rows and clicks are
        // those of the same seed without them.
        let mut conv_rng = Rng::new(splitmix64(
            self.seed ^ CONVERSION_STREAM ^ splitmix64(((job.day as u64) << 40) ^ job.index),
        ));
        let (mut conversions, mut conv_probs, mut conv_labels) = (0, Vec::new(), Vec::new());
        for i in 0..job.rows {
            self.features.sample(&mut rng, &mut row, &mut ranks);
            let logit = match &self.drift {
                Some(d) => d.logit(&self.teacher, job.day, &row, &ranks),
                None => self.teacher.logit(&row, &ranks),
            };
            let p = sigmoid(logit);
            row.label = u8::from(rng.f64() < p);
            clicks += row.label as u64;
            if (i as u64).is_multiple_of(self.auc_stride) {
                auc_probs.push(p as f32);
                auc_labels.push(row.label);
            }
            if let Some(c) = &self.conversion {
                let q = c.probability(&self.teacher, &row, &ranks);
                let converted = conv_rng.f64() < q;
                row.extra_tasks = 1;
                row.extra_labels = u8::from(converted) & row.label;
                conversions += u64::from(row.extra_labels);
                if (i as u64).is_multiple_of(self.auc_stride) {
                    conv_probs.push((p * q) as f32);
                    conv_labels.push(row.extra_labels);
                }
            }
            match &mut payload {
                Payload::Tsv(buf) => crate::tsv::write_row(&row, buf),
                Payload::Parquet(raw) => raw.push(&row),
            }
        }
        ChunkOut {
            day: job.day,
            rows: job.rows,
            payload,
            clicks,
            auc_probs,
            auc_labels,
            conversions,
            conv_probs,
            conv_labels,
        }
    }
}

enum DayWriter {
    Tsv(BufWriter<File>, PathBuf),
    Parquet(Box<ParquetWriter>),
}

impl DayWriter {
    fn write(&mut self, payload: &Payload) -> Result<()> {
        match (self, payload) {
            (DayWriter::Tsv(w, path), Payload::Tsv(buf)) => {
                w.write_all(buf).map_err(|e| DataError::io(path, e))
            }
            (DayWriter::Parquet(w), Payload::Parquet(raw)) => w.write(raw),
            _ => unreachable!("payload matches the output format"),
        }
    }

    fn finish(self) -> Result<()> {
        match self {
            DayWriter::Tsv(mut w, path) => w.flush().map_err(|e| DataError::io(&path, e)),
            DayWriter::Parquet(w) => w.finish().map(|_| ()),
        }
    }
}

fn day_path(spec: &GenSpec, d: u32) -> PathBuf {
    spec.out
        .join(format!("day_{d}.{}", spec.format.extension()))
}

fn open_day(spec: &GenSpec, d: u32) -> Result<DayWriter> {
    let path = day_path(spec, d);
    Ok(match spec.format {
        OutputFormat::Tsv => {
            let f = File::create(&path).map_err(|e| DataError::io(&path, e))?;
            DayWriter::Tsv(BufWriter::with_capacity(1 << 20, f), path)
        }
        OutputFormat::Parquet => DayWriter::Parquet(Box::new(ParquetWriter::create(
            &path,
            ParquetOptions::default(),
        )?)),
    })
}

/// Writes chunk outputs, in order, to the day files.
fn writer_loop(spec: &GenSpec, rx: std::sync::mpsc::Receiver<Vec<ChunkOut>>) -> Result<()> {
    let mut current: Option<(u32, DayWriter)> = None;
    let mut next_day = 0u32;
    // Days with no rows still get an (empty) file.
    let mut advance_to = |day: u32, current: &mut Option<(u32, DayWriter)>| -> Result<()> {
        while current.as_ref().is_none_or(|(d, _)| *d < day) {
            if let Some((_, w)) = current.take() {
                w.finish()?;
            }
            *current = Some((next_day, open_day(spec, next_day)?));
            next_day += 1;
        }
        Ok(())
    };
    for wave in rx {
        for out in wave {
            advance_to(out.day, &mut current)?;
            current.as_mut().expect("open day").1.write(&out.payload)?;
        }
    }
    advance_to(spec.days - 1, &mut current)?;
    if let Some((_, w)) = current.take() {
        w.finish()?;
    }
    Ok(())
}

/// Generates the data set described by `spec`, calling `progress(rows_done)` on the
/// calling thread as chunks are produced (for a progress bar).
pub fn generate_with_progress(spec: &GenSpec, progress: &dyn Fn(u64)) -> Result<GenReport> {
    spec.validate()?;
    let start = Instant::now();
    std::fs::create_dir_all(&spec.out).map_err(|e| DataError::io(&spec.out, e))?;
    let features = Features::new(spec.scale);
    let mut teacher = Teacher::new(spec.seed);
    teacher.calibrate(
        &features,
        spec.seed,
        CALIBRATION_ROWS,
        TARGET_LOGIT_STD,
        TARGET_CTR,
    );
    let drift = (spec.drift > 0.0).then(|| {
        drift::Drift::new(
            &teacher,
            &features,
            spec.seed,
            spec.days,
            spec.drift,
            (CALIBRATION_ROWS, TARGET_LOGIT_STD, TARGET_CTR),
        )
    });
    let conversion = spec
        .conversions
        .then(|| Conversion::new(&teacher, &features, spec.seed));
    let world = World {
        features,
        teacher,
        drift,
        conversion,
        seed: spec.seed,
        format: spec.format,
        auc_stride: spec.rows.div_ceil(AUC_MAX_ROWS).max(1),
    };

    let mut jobs = Vec::new();
    for day in 0..spec.days {
        let rows = spec.day_rows(day);
        for index in 0..rows.div_ceil(CHUNK_ROWS as u64) {
            let n = (rows - index * CHUNK_ROWS as u64).min(CHUNK_ROWS as u64) as usize;
            jobs.push(ChunkJob {
                day,
                index,
                rows: n,
            });
        }
    }
    let threads = rayon::current_num_threads();
    let wave = (4 * threads).max(4);
    let mut clicks = 0u64;
    let mut probs = Vec::new();
    let mut labels = Vec::new();
    let (mut conversions, mut conv_probs, mut conv_labels) = (0u64, Vec::new(), Vec::new());
    let mut done = 0u64;
    std::thread::scope(|scope| -> Result<()> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<ChunkOut>>(1);
        let writer = scope.spawn(move || writer_loop(spec, rx));
        let mut send_failed = false;
        for batch in jobs.chunks(wave) {
            let mut outs: Vec<ChunkOut> = batch.par_iter().map(|j| world.chunk(j)).collect();
            for o in &mut outs {
                clicks += o.clicks;
                done += o.rows as u64;
                probs.append(&mut o.auc_probs);
                labels.append(&mut o.auc_labels);
                conversions += o.conversions;
                conv_probs.append(&mut o.conv_probs);
                conv_labels.append(&mut o.conv_labels);
            }
            if tx.send(outs).is_err() {
                send_failed = true; // the writer stopped on an error; join reports it
                break;
            }
            progress(done);
        }
        drop(tx);
        let result = writer.join().expect("writer thread panicked");
        result?;
        debug_assert!(!send_failed);
        Ok(())
    })?;

    let (teacher_auc, teacher_logloss) = teacher_figures(&probs, &labels);
    let rate = |n: u64| {
        if spec.rows > 0 {
            n as f64 / spec.rows as f64
        } else {
            0.0
        }
    };
    let conversion = spec.conversions.then(|| {
        let (teacher_auc, teacher_logloss) = teacher_figures(&conv_probs, &conv_labels);
        TaskReport {
            rate: rate(conversions),
            teacher_auc,
            teacher_logloss,
        }
    });
    let mut files = Vec::new();
    for d in 0..spec.days {
        let path = day_path(spec, d);
        let bytes = std::fs::metadata(&path)
            .map_err(|e| DataError::io(&path, e))?
            .len();
        files.push(GenFile {
            name: path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
            rows: spec.day_rows(d),
            bytes,
        });
    }
    let secs = start.elapsed().as_secs_f64();
    let report = GenReport {
        rows: spec.rows,
        files,
        seed: spec.seed,
        scale: spec.scale,
        format: spec.format,
        drift: spec.drift,
        click_rate: rate(clicks),
        teacher_auc,
        teacher_auc_rows: probs.len() as u64,
        teacher_logloss,
        teacher_bias: world.teacher.bias,
        conversion,
        cardinalities: world.features.cards.to_vec(),
        generation_secs: secs,
        rows_per_sec: spec.rows as f64 / secs.max(1e-9),
        threads,
    };
    write_report(&spec.out, &report)?;
    Ok(report)
}

/// The teacher's exact AUC and mean log loss on sampled labels.
fn teacher_figures(probs: &[f32], labels: &[u8]) -> (f64, f64) {
    let auc = exact_auc(probs, labels).unwrap_or(0.5);
    if probs.is_empty() {
        return (auc, 0.0);
    }
    let logloss = probs
        .iter()
        .zip(labels)
        .map(|(&p, &l)| {
            let p = (p as f64).clamp(1e-7, 1.0 - 1e-7);
            if l == 1 {
                -p.ln()
            } else {
                -(1.0 - p).ln()
            }
        })
        .sum::<f64>()
        / probs.len() as f64;
    (auc, logloss)
}

fn write_report(out: &Path, report: &GenReport) -> Result<()> {
    let path = out.join("report.json");
    let text = serde_json::to_string_pretty(report)
        .map_err(|e| DataError::InvalidSpec(format!("report serialization: {e}")))?;
    std::fs::write(&path, text + "\n").map_err(|e| DataError::io(&path, e))
}

/// Reads a `report.json` written by [`generate`].
pub fn read_report(out: &Path) -> Result<GenReport> {
    let path = out.join("report.json");
    let text = std::fs::read_to_string(&path).map_err(|e| DataError::io(&path, e))?;
    serde_json::from_str(&text)
        .map_err(|e| DataError::InvalidSpec(format!("{}: {e}", path.display())))
}
