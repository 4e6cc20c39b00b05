//! The config database (sqlx): jobs, their configurations over time, runtime profiles,
//! memory readings and outcomes. SQLite by default (`sqlite://path?mode=rwc`), PostgreSQL
//! by URL (`postgres://...`); one portable schema in `migrations/`, applied at connect.
//!
//! Uses `sqlx::Any` with the runtime query API (`$N` placeholders work on both drivers).

use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Row};

use crate::alloc::Allocation;
use crate::error::{BrainError, Result};
use crate::job::JobSpec;
use crate::oom::MemorySample;
use crate::throughput::ProfileSample;
use crate::warm_start::{HistoricalJob, JobFeatures};

/// A migrator over SQL files compiled into the binary: `(version, description, sql)`.
///
/// This is what `sqlx::migrate!` builds, without the macro: the macro needs sqlx's
/// `macros` feature, which compiles a second sqlx, both database drivers and SQLite's C
/// source once more for the build host. The checksum of each migration is the same
/// (SHA-384 of its text), so databases migrated by either open with the other.
pub fn embedded_migrator(files: &[(i64, &'static str, &'static str)]) -> sqlx::migrate::Migrator {
    use sqlx::migrate::{Migration, MigrationType, Migrator};
    Migrator::with_migrations(
        files
            .iter()
            .map(|&(version, description, sql)| {
                Migration::new(
                    version,
                    description.into(),
                    MigrationType::Simple,
                    sqlx::SqlStr::from_static(sql),
                    false,
                )
            })
            .collect(),
    )
}

fn migrator() -> sqlx::migrate::Migrator {
    embedded_migrator(&[(1, "init", include_str!("../../migrations/0001_init.sql"))])
}

/// Which database a [`ConfigDb`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// SQLite file.
    Sqlite,
    /// PostgreSQL server.
    Postgres,
}

/// How a job ended.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Outcome {
    /// "succeeded", "failed", "oom", ...
    pub status: String,
    /// Mean throughput, samples/s.
    pub throughput: f64,
    /// Wall time, seconds.
    pub duration_s: f64,
}

/// Outcome statuses whose last configuration warm start does not learn from.
pub const FAILED_STATUSES: &[&str] = &["failed", "oom"];

/// One job of the database, as `elastrec brain history` lists it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct JobRecord {
    /// Job id.
    pub job_id: String,
    /// What warm start compares.
    pub features: JobFeatures,
    /// Its latest configuration (the allocation it ended on, once it reported its end).
    pub config: Option<Allocation>,
    /// How it ended; none while it runs (or when its master died before telling).
    pub outcome: Option<Outcome>,
    /// When the brain last heard of it (ms since the epoch): its registration, newest
    /// configuration, profile or memory sample, or outcome. A job with no outcome that
    /// has been silent for long lost its master.
    pub last_report_ms: i64,
}

/// Every status an outcome may have: a finished job, and one stopped by a failure or by
/// a node killed for its memory.
pub const OUTCOME_STATUSES: &[&str] = &["succeeded", "failed", "oom"];

#[derive(Clone, Copy)]
enum SeqTable {
    Configs,
    Samples,
}

/// Handle on the config database.
#[derive(Debug, Clone)]
pub struct ConfigDb {
    pool: AnyPool,
    backend: Backend,
}

/// The wall clock in ms since the epoch, as the database stamps its rows.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn i64_of(field: &str, v: u64) -> Result<i64> {
    i64::try_from(v)
        .map_err(|_| BrainError::invalid(field, format!("{v} does not fit the database")))
}

fn alloc_of(r: &AnyRow) -> Result<Allocation> {
    let u = |name: &str| -> Result<u32> {
        let v: i64 = r.try_get(name)?;
        u32::try_from(v)
            .map_err(|_| BrainError::Internal(format!("stored {name} = {v} out of range")))
    };
    Ok(Allocation {
        workers: u("workers")?,
        ps: u("ps")?,
        worker_cpu: r.try_get("worker_cpu")?,
        ps_cpu: r.try_get("ps_cpu")?,
        worker_mem_gb: r.try_get("worker_mem_gb")?,
        ps_mem_gb: r.try_get("ps_mem_gb")?,
    })
}

/// What a redacted secret reads as.
const REDACTED: &str = "***";

/// `url` with its password hidden, for logs and error messages: the userinfo password
/// (`postgres://user:PASSWORD@host/db`) and a `password=` query parameter, which sqlx also
/// accepts, both read `***`; everything else (user, host, database) stays, since that is
/// what one needs to debug a connection. A URL that does not parse keeps only its scheme
/// and what follows the last `@` (a password can only come before it).
pub fn redact_url(url: &str) -> String {
    let Ok(mut parsed) = url::Url::parse(url) else {
        return match (url.find("://"), url.rfind('@')) {
            (Some(s), Some(at)) if s < at => format!("{}://{REDACTED}{}", &url[..s], &url[at..]),
            (Some(s), _) => format!("{}://{REDACTED}", &url[..s]),
            _ => REDACTED.to_string(),
        };
    };
    if parsed.password().is_some() {
        // Only fails for URLs that cannot have a userinfo, which have no password either.
        let _ = parsed.set_password(Some(REDACTED));
    }
    let secret = |k: &str| k.eq_ignore_ascii_case("password");
    if parsed.query_pairs().any(|(k, _)| secret(&k)) {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(k, v)| {
                let v = if secret(&k) {
                    REDACTED.into()
                } else {
                    v.into_owned()
                };
                (k.into_owned(), v)
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.to_string()
}

impl ConfigDb {
    /// Opens the database at `url` and applies pending migrations.
    pub async fn connect(url: &str) -> Result<Self> {
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Backend::Postgres
        } else {
            return Err(BrainError::Config(format!(
                "database URL must start with sqlite: or postgres://, got `{}`",
                redact_url(url)
            )));
        };
        // `sqlite://brain.db` creates the file when missing (as `?mode=rwc` does).
        let url =
            if backend == Backend::Sqlite && !url.contains("mode=") && !url.contains(":memory:") {
                let sep = if url.contains('?') { '&' } else { '?' };
                format!("{url}{sep}mode=rwc")
            } else {
                url.to_string()
            };
        let url = url.as_str();
        sqlx::any::install_default_drivers();
        // One writer for SQLite avoids "database is locked" between pooled connections.
        let max = if backend == Backend::Sqlite { 1 } else { 8 };
        let pool = AnyPoolOptions::new()
            .max_connections(max)
            .connect(url)
            .await?;
        migrator().run(&pool).await?;
        Ok(Self { pool, backend })
    }

    /// Which database this is.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Inserts or replaces a job's description.
    pub async fn upsert_job(&self, spec: &JobSpec) -> Result<()> {
        spec.validate()?;
        let f = JobFeatures::of(spec);
        let json = serde_json::to_string(spec).map_err(|e| BrainError::Internal(e.to_string()))?;
        sqlx::query(
            "INSERT INTO brain_jobs (job_id, model_type, table_count, total_rows, emb_dim_total, dense_params, \
             dataset_samples, batch_size, scenario, user_tag, spec_json, created_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) \
             ON CONFLICT (job_id) DO UPDATE SET model_type = excluded.model_type, table_count = excluded.table_count, \
             total_rows = excluded.total_rows, emb_dim_total = excluded.emb_dim_total, dense_params = excluded.dense_params, \
             dataset_samples = excluded.dataset_samples, batch_size = excluded.batch_size, scenario = excluded.scenario, \
             user_tag = excluded.user_tag, spec_json = excluded.spec_json",
        )
        .bind(spec.job_id.clone())
        .bind(f.model_type.clone())
        .bind(i64_of("tables", f.table_count)?)
        .bind(i64_of("total_rows", f.total_rows)?)
        .bind(i64_of("emb_dim_total", f.emb_dim_total)?)
        .bind(i64_of("dense_params", f.dense_params)?)
        .bind(i64_of("dataset_samples", f.dataset_samples)?)
        .bind(i64::from(spec.batch_size))
        .bind(f.scenario.clone())
        .bind(f.user.clone())
        .bind(json)
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// A job's description, if known.
    pub async fn job(&self, job_id: &str) -> Result<Option<JobSpec>> {
        let row = sqlx::query("SELECT spec_json FROM brain_jobs WHERE job_id = $1")
            .bind(job_id.to_string())
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| {
            let s: String = r.try_get("spec_json")?;
            serde_json::from_str(&s)
                .map_err(|e| BrainError::Internal(format!("stored spec of {job_id}: {e}")))
        })
        .transpose()
    }

    /// Like [`ConfigDb::job`] but fails with [`BrainError::UnknownJob`].
    pub async fn require_job(&self, job_id: &str) -> Result<JobSpec> {
        self.job(job_id)
            .await?
            .ok_or_else(|| BrainError::UnknownJob(job_id.to_string()))
    }

    async fn next_seq(
        &self,
        tx: &mut sqlx::AnyConnection,
        table: SeqTable,
        job_id: &str,
    ) -> Result<i64> {
        let sql = match table {
            SeqTable::Configs => {
                "SELECT COALESCE(MAX(seq), 0) AS s FROM brain_job_configs WHERE job_id = $1"
            }
            SeqTable::Samples => {
                "SELECT COALESCE(MAX(seq), 0) AS s FROM brain_profile_samples WHERE job_id = $1"
            }
        };
        let r = sqlx::query(sql)
            .bind(job_id.to_string())
            .fetch_one(&mut *tx)
            .await?;
        Ok(r.try_get::<i64, _>("s")? + 1)
    }

    /// Appends a configuration of a job (`source`: "warm-start", "re-plan", "reported"...).
    pub async fn record_config(&self, job_id: &str, a: &Allocation, source: &str) -> Result<()> {
        a.validate("allocation")?;
        let mut tx = self.pool.begin().await?;
        let seq = self.next_seq(&mut tx, SeqTable::Configs, job_id).await?;
        sqlx::query(
            "INSERT INTO brain_job_configs (job_id, seq, ts_ms, workers, ps, worker_cpu, ps_cpu, worker_mem_gb, ps_mem_gb, source) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(job_id.to_string())
        .bind(seq)
        .bind(now_ms())
        .bind(i64::from(a.workers))
        .bind(i64::from(a.ps))
        .bind(a.worker_cpu)
        .bind(a.ps_cpu)
        .bind(a.worker_mem_gb)
        .bind(a.ps_mem_gb)
        .bind(source.to_string())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// A job's configurations, oldest first, with their source.
    pub async fn configs(&self, job_id: &str) -> Result<Vec<(Allocation, String)>> {
        let rows = sqlx::query("SELECT * FROM brain_job_configs WHERE job_id = $1 ORDER BY seq")
            .bind(job_id.to_string())
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| Ok((alloc_of(r)?, r.try_get::<String, _>("source")?)))
            .collect()
    }

    /// A job's latest configuration, if any.
    pub async fn latest_config(&self, job_id: &str) -> Result<Option<Allocation>> {
        let row = sqlx::query(
            "SELECT * FROM brain_job_configs WHERE job_id = $1 ORDER BY seq DESC LIMIT 1",
        )
        .bind(job_id.to_string())
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(alloc_of).transpose()
    }

    /// Appends runtime profile samples (validated first); returns how many were stored.
    pub async fn add_samples(&self, job_id: &str, samples: &[ProfileSample]) -> Result<u64> {
        for (i, s) in samples.iter().enumerate() {
            s.validate(i)?;
        }
        let mut tx = self.pool.begin().await?;
        let mut seq = self.next_seq(&mut tx, SeqTable::Samples, job_id).await?;
        let ts = now_ms();
        for s in samples {
            let a = &s.alloc;
            sqlx::query(
                "INSERT INTO brain_profile_samples (job_id, seq, ts_ms, workers, ps, worker_cpu, ps_cpu, worker_mem_gb, \
                 ps_mem_gb, batch_size, iter_time_s) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            )
            .bind(job_id.to_string())
            .bind(seq)
            .bind(ts)
            .bind(i64::from(a.workers))
            .bind(i64::from(a.ps))
            .bind(a.worker_cpu)
            .bind(a.ps_cpu)
            .bind(a.worker_mem_gb)
            .bind(a.ps_mem_gb)
            .bind(i64::from(s.batch_size))
            .bind(s.iter_time_s)
            .execute(&mut *tx)
            .await?;
            seq += 1;
        }
        tx.commit().await?;
        Ok(samples.len() as u64)
    }

    /// The latest `limit` profile samples of a job, oldest first.
    pub async fn samples(&self, job_id: &str, limit: usize) -> Result<Vec<ProfileSample>> {
        let rows = sqlx::query(
            "SELECT * FROM brain_profile_samples WHERE job_id = $1 ORDER BY seq DESC LIMIT $2",
        )
        .bind(job_id.to_string())
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await?;
        let mut out = rows
            .iter()
            .map(|r| {
                let b: i64 = r.try_get("batch_size")?;
                Ok(ProfileSample {
                    alloc: alloc_of(r)?,
                    batch_size: u32::try_from(b)
                        .map_err(|_| BrainError::Internal(format!("stored batch {b}")))?,
                    iter_time_s: r.try_get("iter_time_s")?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        out.reverse();
        Ok(out)
    }

    /// Appends PS memory readings.
    pub async fn add_memory(&self, job_id: &str, samples: &[MemorySample]) -> Result<u64> {
        for (i, s) in samples.iter().enumerate() {
            crate::error::check_non_negative(&format!("memory[{i}].mem_gb"), s.mem_gb)?;
            i64_of(&format!("memory[{i}].step"), s.step)?;
        }
        let mut tx = self.pool.begin().await?;
        let ts = now_ms();
        for s in samples {
            sqlx::query("INSERT INTO brain_memory_samples (job_id, ps_index, step, mem_gb, ts_ms) VALUES ($1, $2, $3, $4, $5)")
                .bind(job_id.to_string())
                .bind(i64::from(s.ps_index))
                .bind(i64_of("step", s.step)?)
                .bind(s.mem_gb)
                .bind(ts)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(samples.len() as u64)
    }

    /// A job's PS memory readings, by PS then step.
    pub async fn memory(&self, job_id: &str) -> Result<Vec<MemorySample>> {
        let rows = sqlx::query("SELECT ps_index, step, mem_gb FROM brain_memory_samples WHERE job_id = $1 ORDER BY ps_index, step")
            .bind(job_id.to_string())
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                let ps: i64 = r.try_get("ps_index")?;
                let step: i64 = r.try_get("step")?;
                Ok(MemorySample {
                    ps_index: u32::try_from(ps)
                        .map_err(|_| BrainError::Internal(format!("stored ps_index {ps}")))?,
                    step: u64::try_from(step)
                        .map_err(|_| BrainError::Internal(format!("stored step {step}")))?,
                    mem_gb: r.try_get("mem_gb")?,
                })
            })
            .collect()
    }

    /// Records how a job ended.
    pub async fn record_outcome(&self, job_id: &str, o: &Outcome) -> Result<()> {
        if !OUTCOME_STATUSES.contains(&o.status.as_str()) {
            return Err(BrainError::invalid(
                "status",
                format!("`{}` is none of {}", o.status, OUTCOME_STATUSES.join(", ")),
            ));
        }
        crate::error::check_non_negative("throughput", o.throughput)?;
        crate::error::check_non_negative("duration_s", o.duration_s)?;
        sqlx::query(
            "INSERT INTO brain_outcomes (job_id, status, throughput, duration_s, ts_ms) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (job_id) DO UPDATE SET status = excluded.status, throughput = excluded.throughput, \
             duration_s = excluded.duration_s, ts_ms = excluded.ts_ms",
        )
        .bind(job_id.to_string())
        .bind(o.status.clone())
        .bind(o.throughput)
        .bind(o.duration_s)
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// How a job ended, if it reported it.
    pub async fn outcome(&self, job_id: &str) -> Result<Option<Outcome>> {
        let row = sqlx::query(
            "SELECT status, throughput, duration_s FROM brain_outcomes WHERE job_id = $1",
        )
        .bind(job_id.to_string())
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| {
            Ok(Outcome {
                status: r.try_get("status")?,
                throughput: r.try_get("throughput")?,
                duration_s: r.try_get("duration_s")?,
            })
        })
        .transpose()
    }

    /// The `limit` most recently registered jobs, oldest first.
    pub async fn jobs(&self, limit: usize) -> Result<Vec<JobRecord>> {
        let rows = sqlx::query(
            "SELECT spec_json FROM brain_jobs ORDER BY created_ms DESC, job_id DESC LIMIT $1",
        )
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows.iter().rev() {
            let json: String = r.try_get("spec_json")?;
            let spec: JobSpec = serde_json::from_str(&json)
                .map_err(|e| BrainError::Internal(format!("stored spec: {e}")))?;
            out.push(JobRecord {
                config: self.latest_config(&spec.job_id).await?,
                outcome: self.outcome(&spec.job_id).await?,
                last_report_ms: self.last_report_ms(&spec.job_id).await?,
                features: JobFeatures::of(&spec),
                job_id: spec.job_id,
            });
        }
        Ok(out)
    }

    /// When the brain last heard of `job_id` ([`JobRecord::last_report_ms`]).
    async fn last_report_ms(&self, job_id: &str) -> Result<i64> {
        let mut last = 0i64;
        // One query per table: the same SQL on SQLite and PostgreSQL.
        for sql in [
            "SELECT MAX(created_ms) AS ts FROM brain_jobs WHERE job_id = $1",
            "SELECT MAX(ts_ms) AS ts FROM brain_job_configs WHERE job_id = $1",
            "SELECT MAX(ts_ms) AS ts FROM brain_profile_samples WHERE job_id = $1",
            "SELECT MAX(ts_ms) AS ts FROM brain_memory_samples WHERE job_id = $1",
            "SELECT MAX(ts_ms) AS ts FROM brain_outcomes WHERE job_id = $1",
        ] {
            let row = sqlx::query(sql)
                .bind(job_id.to_string())
                .fetch_one(&self.pool)
                .await?;
            if let Some(ts) = row.try_get::<Option<i64>, _>("ts")? {
                last = last.max(ts);
            }
        }
        Ok(last)
    }

    /// Warm-start history as of `now_ms`: every job with at least one configuration, with
    /// its latest one, except jobs whose outcome is in [`FAILED_STATUSES`] and jobs with no
    /// outcome the brain has not heard of for `silent_after_ms`. Such a job's master died
    /// without saying how it ended (as when it is killed for its memory), so its last
    /// configuration may be the one that failed. A job with no outcome that still reports
    /// is running, and its configuration stands.
    pub async fn history(&self, now_ms: i64, silent_after_ms: i64) -> Result<Vec<HistoricalJob>> {
        let rows = sqlx::query(
            "SELECT j.spec_json, c.workers, c.ps, c.worker_cpu, c.ps_cpu, c.worker_mem_gb, c.ps_mem_gb, \
             COALESCE(o.status, '') AS status \
             FROM brain_jobs j \
             JOIN brain_job_configs c ON c.job_id = j.job_id \
             LEFT JOIN brain_outcomes o ON o.job_id = j.job_id \
             WHERE c.seq = (SELECT MAX(seq) FROM brain_job_configs c2 WHERE c2.job_id = j.job_id) \
             ORDER BY j.job_id",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let status: String = r.try_get("status")?;
            if FAILED_STATUSES.contains(&status.as_str()) {
                continue;
            }
            let json: String = r.try_get("spec_json")?;
            let spec: JobSpec = serde_json::from_str(&json)
                .map_err(|e| BrainError::Internal(format!("stored spec: {e}")))?;
            if status.is_empty()
                && now_ms.saturating_sub(self.last_report_ms(&spec.job_id).await?) > silent_after_ms
            {
                continue;
            }
            out.push(HistoricalJob {
                job_id: spec.job_id.clone(),
                features: JobFeatures::of(&spec),
                config: alloc_of(r)?,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn redact_url_hides_passwords_and_keeps_the_rest() {
        let cases = [
            ("postgres://u:pw@h:5/db", "postgres://u:***@h:5/db"),
            (
                "postgresql://u:p%40ss@h/db?sslmode=require",
                "postgresql://u:***@h/db?sslmode=require",
            ),
            (
                "postgres://u@h/db?sslmode=disable&Password=pw",
                "postgres://u@h/db?sslmode=disable&Password=***",
            ),
            ("postgres://u@h/db", "postgres://u@h/db"),
            ("sqlite://brain.db?mode=rwc", "sqlite://brain.db?mode=rwc"),
            ("sqlite::memory:", "sqlite::memory:"),
            // Unparsable (port out of range): only the scheme and what follows the last `@`.
            ("postgres://u:p@ss@h:99999/db", "postgres://***@h:99999/db"),
            ("postgres://u:pw:99999", "postgres://***"),
            ("no url at all: pw", "***"),
        ];
        for (url, want) in cases {
            assert_eq!(redact_url(url), want, "{url}");
        }
    }
}
