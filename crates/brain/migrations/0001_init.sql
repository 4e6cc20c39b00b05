-- Config database of the cluster brain. Portable SQL: runs on SQLite and PostgreSQL.

-- One row per job: model metadata, data size and tags (the warm-start features).
CREATE TABLE brain_jobs (
    job_id          TEXT PRIMARY KEY,
    model_type      TEXT NOT NULL,
    table_count     BIGINT NOT NULL,
    total_rows      BIGINT NOT NULL,
    emb_dim_total   BIGINT NOT NULL,
    dense_params    BIGINT NOT NULL,
    dataset_samples BIGINT NOT NULL,
    batch_size      BIGINT NOT NULL,
    scenario        TEXT NOT NULL,
    user_tag        TEXT NOT NULL,
    -- The full job spec (tables, bounds) as JSON.
    spec_json       TEXT NOT NULL,
    created_ms      BIGINT NOT NULL
);

-- Resource configurations of a job over time (warm start, re-plans, what masters report).
CREATE TABLE brain_job_configs (
    job_id        TEXT NOT NULL REFERENCES brain_jobs (job_id),
    seq           BIGINT NOT NULL,
    ts_ms         BIGINT NOT NULL,
    workers       BIGINT NOT NULL,
    ps            BIGINT NOT NULL,
    worker_cpu    DOUBLE PRECISION NOT NULL,
    ps_cpu        DOUBLE PRECISION NOT NULL,
    worker_mem_gb DOUBLE PRECISION NOT NULL,
    ps_mem_gb     DOUBLE PRECISION NOT NULL,
    source        TEXT NOT NULL,
    PRIMARY KEY (job_id, seq)
);

-- Runtime profile: iteration time under an allocation.
CREATE TABLE brain_profile_samples (
    job_id        TEXT NOT NULL REFERENCES brain_jobs (job_id),
    seq           BIGINT NOT NULL,
    ts_ms         BIGINT NOT NULL,
    workers       BIGINT NOT NULL,
    ps            BIGINT NOT NULL,
    worker_cpu    DOUBLE PRECISION NOT NULL,
    ps_cpu        DOUBLE PRECISION NOT NULL,
    worker_mem_gb DOUBLE PRECISION NOT NULL,
    ps_mem_gb     DOUBLE PRECISION NOT NULL,
    batch_size    BIGINT NOT NULL,
    iter_time_s   DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (job_id, seq)
);

-- PS memory readings for OOM prediction.
CREATE TABLE brain_memory_samples (
    job_id   TEXT NOT NULL REFERENCES brain_jobs (job_id),
    ps_index BIGINT NOT NULL,
    step     BIGINT NOT NULL,
    mem_gb   DOUBLE PRECISION NOT NULL,
    ts_ms    BIGINT NOT NULL
);
CREATE INDEX brain_memory_by_job ON brain_memory_samples (job_id, ps_index, step);

-- How a job ended.
CREATE TABLE brain_outcomes (
    job_id     TEXT PRIMARY KEY REFERENCES brain_jobs (job_id),
    status     TEXT NOT NULL,
    throughput DOUBLE PRECISION NOT NULL,
    duration_s DOUBLE PRECISION NOT NULL,
    ts_ms      BIGINT NOT NULL
);
