//! The `[autoscale]` section of a job file: bounds and settings of the closed loop in which
//! the job master profiles the job, asks the brain for a plan and executes it. Read by
//! `elastrec run`, ignored by `elastrec train`; unknown keys are errors naming the key.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::{ConfigError, JobConfig};

/// The `[autoscale]` section.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AutoscaleConfig {
    /// Let the master change the job's resources by itself. Default: on for a batch job
    /// whose file leaves its worker count to the system (no `cluster.workers`, no
    /// `resources.worker.count`); a file that pins the count keeps it (and `elastrec
    /// scale` still changes it). Online jobs scale through `stream.autoscale` instead.
    pub enabled: bool,
    /// Hold each node to its allotment on the local backend (a worker's cores as its
    /// compute threads, a PS's as a CPU quota, memory limits). Default: on when the file
    /// turns the autoscaler on, off when the job is autoscaled by default, whose nodes
    /// share the machine as a pinned job's do (held to one core each, the quickstart ran
    /// 1.6 times longer). Other backends always size nodes by their allotment.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enforce: Option<bool>,
    /// Smallest and largest number of workers the master may run.
    pub workers: [u32; 2],
    /// Smallest and largest number of parameter servers (default: `cluster.ps` for both,
    /// i.e. a fixed PS count).
    pub ps: [u32; 2],
    /// Seconds between two plans.
    pub interval_s: f64,
    /// Length of one profile window, seconds: a window at a steady allocation becomes one
    /// profile sample (allocation, iteration time) of the throughput model.
    pub sample_s: f64,
    /// Where the brain is: empty for the in-process brain (no server to start; its
    /// database is `brain_db`), or `http://HOST:PORT` of an `elastrec brain` service
    /// (token from `ELASTREC_BRAIN_TOKEN`).
    pub brain: String,
    /// Database of the in-process brain: empty for the user's SQLite file
    /// (`$XDG_DATA_HOME/elastrec/brain.db`, else `~/.local/share/elastrec/brain.db`), or a
    /// `sqlite://` / `postgres://` URL (shared by a team's jobs).
    pub brain_db: String,
    /// Start from the brain's warm-start plan (Algorithm 1 over similar past jobs: their
    /// worker and PS counts, cores and memory, within this section's bounds) instead of
    /// `cluster.workers` / `cluster.ps`. Default: on when there is a config database to
    /// learn from (`brain` or `brain_db` is set, or the user's default database exists).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warm_start: Option<bool>,
    /// Business scenario of the job (e.g. `"feed-ctr"`): warm start counts jobs of one
    /// scenario as alike. Empty: `ELASTREC_SCENARIO` from the environment, else none.
    pub scenario: String,
    /// Who submits the job, for the same similarity. Empty: `ELASTREC_USER`, else `USER`.
    pub user: String,
    /// A plan is executed only when it changes the predicted throughput by at least this
    /// fraction of the measured one (hysteresis against flapping).
    pub min_gain: f64,
    /// CPU cores the job may use in all (0: this machine's cores).
    pub cluster_cpu: f64,
    /// Memory the job may use in all, GiB (0: this machine's memory).
    pub cluster_mem_gb: f64,
    /// Cores of one worker. On the local backend they are its compute threads.
    pub worker_cpu: f64,
    /// Most cores a plan may give one worker (vertical scaling: every worker is replaced
    /// by one with the new cores); 0: `worker_cpu`, i.e. fixed.
    pub worker_cpu_max: f64,
    /// Cores of one PS (its CPU quota where the engine enforces one: a control group on
    /// the local backend).
    pub ps_cpu: f64,
    /// Most cores a plan may give one PS (vertical scaling, changed in place: the local
    /// backend with control groups only); 0: `ps_cpu`, i.e. fixed.
    pub ps_cpu_max: f64,
    /// Memory limit of one worker and of one PS, GiB (0 for the PS: the model state it
    /// holds with headroom).
    pub worker_mem_gb: f64,
    /// See `worker_mem_gb`.
    pub ps_mem_gb: f64,
    /// Highest memory limit of one worker / one PS, GiB (vertical scaling, Primus Eq.
    /// 2-3: each node's limit follows its use, between the limit above and this); 0: the
    /// limit is fixed.
    pub worker_mem_gb_max: f64,
    /// See `worker_mem_gb_max`.
    pub ps_mem_gb_max: f64,
    /// Seconds a new worker needs before it trains (the scaling overhead of Eq. 8).
    pub worker_start_s: f64,
    /// Seconds a change of the PS set pauses training (Eq. 8).
    pub ps_migration_s: f64,
    /// A PS whose mean time per pull/push is above this multiple of its peers' median, in
    /// two checks in a row, is hot: one more PS (within `ps`) takes rows off it.
    pub hot_ps_ratio: f64,
    /// A job that starts without a plan (no warm start, or none found) explores: it grows
    /// its workers again after each profile window while the last growth raised
    /// throughput by at least this share of proportional (0.75: twice the workers gave
    /// 1.5 times the samples/s or more). `0` turns exploration off: the brain plans from
    /// the first profile on.
    pub explore_efficiency: f64,
    /// While the last growth reached this share of proportional, exploring quadruples the
    /// workers instead of doubling them (scaling that is still linear is far from its
    /// knee); above 1, it only doubles.
    pub explore_linear: f64,
    /// A plan that adds cores is kept only if the first profile window after it raised
    /// throughput by at least this share of the cores it added (0.3: twice the cores gave
    /// 1.3 times the samples/s or more); otherwise the job goes back and its plans stay
    /// within the workers (or, when it added none, the cores) it had. On a shared brain
    /// the first probe's quarter of the workers given back is judged the same way. `0`
    /// keeps every growth.
    pub growth_efficiency: f64,
}

impl Default for AutoscaleConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            enforce: None,
            workers: [1, 8],
            ps: [0, 0],
            interval_s: 5.0,
            sample_s: 1.0,
            brain: String::new(),
            brain_db: String::new(),
            warm_start: None,
            scenario: String::new(),
            user: String::new(),
            min_gain: 0.05,
            cluster_cpu: 0.0,
            cluster_mem_gb: 0.0,
            worker_cpu: 1.0,
            worker_cpu_max: 0.0,
            ps_cpu: 1.0,
            ps_cpu_max: 0.0,
            worker_mem_gb: 2.0,
            ps_mem_gb: 0.0,
            worker_mem_gb_max: 0.0,
            ps_mem_gb_max: 0.0,
            worker_start_s: 2.0,
            ps_migration_s: 1.0,
            hot_ps_ratio: 3.0,
            explore_efficiency: 0.75,
            explore_linear: 0.9,
            growth_efficiency: 0.3,
        }
    }
}

impl AutoscaleConfig {
    /// Whether the local backend holds this job's nodes to their allotment.
    pub fn holds_nodes(&self) -> bool {
        self.enabled && self.enforce.unwrap_or(true)
    }

    /// Whether the job starts from the brain's warm-start plan: as the file says, else
    /// when a config database exists for the brain to find similar jobs in.
    pub fn wants_warm_start(&self) -> bool {
        self.warm_start.unwrap_or_else(|| {
            !self.brain.is_empty()
                || !self.brain_db.is_empty()
                || default_brain_db().is_some_and(|db| db.exists())
        })
    }

    /// `scenario`, or the environment's when the file leaves it empty.
    pub fn scenario(&self) -> String {
        first_set(&self.scenario, &["ELASTREC_SCENARIO"])
    }

    /// `user`, or the environment's when the file leaves it empty.
    pub fn user(&self) -> String {
        first_set(&self.user, &["ELASTREC_USER", "USER"])
    }

    /// PS bounds with the default (`[0, 0]`: the job's fixed `cluster.ps`) resolved.
    pub fn ps_bounds(&self, cluster_ps: u32) -> [u32; 2] {
        if self.ps == [0, 0] {
            [cluster_ps, cluster_ps]
        } else {
            self.ps
        }
    }
}

/// The in-process brain's database when the job names none: one SQLite file per user,
/// `$XDG_DATA_HOME/elastrec/brain.db` (else `~/.local/share/elastrec/brain.db`), so that
/// each job warm-starts from the user's earlier ones. `None` without a home directory.
pub fn default_brain_db() -> Option<PathBuf> {
    let data_home = std::env::var_os("XDG_DATA_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| Path::new(&h).join(".local/share"))
        })?;
    Some(data_home.join("elastrec").join("brain.db"))
}

/// Elastic by default: a batch job whose file does not say whether the master may size it
/// is autoscaled unless the file pins its worker count; the autoscaler's allotment of a
/// role defaults to what `[resources]` asks for it. `given` is the file's own table.
pub(crate) fn resolve_autoscale(job: &mut JobConfig, given: &toml::Table) {
    let has = |section: &str, key: &str| {
        given
            .get(section)
            .and_then(|s| s.as_table())
            .is_some_and(|s| s.contains_key(key))
    };
    // One place per setting: what `[resources]` asks of a role is also where the
    // autoscaler starts it, unless `[autoscale]` gives its own allotment.
    let resources = given.get("resources").and_then(|r| r.as_table());
    let from_resources = |role: &str, key: &str| {
        resources
            .and_then(|r| r.get(role))
            .and_then(|r| r.get(key))
            .is_some()
    };
    let r = job.resources.clone();
    let a = &mut job.autoscale;
    for (field, role, key, value, slot) in [
        (
            "worker_cpu",
            "worker",
            "cpu",
            r.worker.cpu,
            &mut a.worker_cpu,
        ),
        ("ps_cpu", "ps", "cpu", r.ps.cpu, &mut a.ps_cpu),
        (
            "worker_mem_gb",
            "worker",
            "memory_gb",
            r.worker.memory_gb,
            &mut a.worker_mem_gb,
        ),
        (
            "ps_mem_gb",
            "ps",
            "memory_gb",
            r.ps.memory_gb,
            &mut a.ps_mem_gb,
        ),
        (
            "worker_mem_gb_max",
            "worker",
            "memory_gb_max",
            r.worker.memory_gb_max,
            &mut a.worker_mem_gb_max,
        ),
        (
            "ps_mem_gb_max",
            "ps",
            "memory_gb_max",
            r.ps.memory_gb_max,
            &mut a.ps_mem_gb_max,
        ),
    ] {
        if !has("autoscale", field) && from_resources(role, key) {
            *slot = value;
        }
    }
    if has("autoscale", "enabled") {
        a.enforce.get_or_insert(true);
        return;
    }
    let worker_count_given = has("cluster", "workers") || from_resources("worker", "count");
    job.autoscale.enabled = job.stream.is_none() && !worker_count_given;
    job.autoscale.enforce.get_or_insert(false);
}

/// `value` when set, else the first of the environment variables `vars` that is.
fn first_set(value: &str, vars: &[&str]) -> String {
    if !value.is_empty() {
        return value.to_string();
    }
    vars.iter()
        .filter_map(|v| std::env::var(v).ok())
        .find(|v| !v.trim().is_empty())
        .map(|v| v.trim().to_string())
        .unwrap_or_default()
}

/// Range checks of `[autoscale]` (part of [`JobConfig::validate`]).
pub(crate) fn validate_autoscale(job: &JobConfig, path: &Path) -> Result<(), ConfigError> {
    let bad = |field: &'static str, reason: String| ConfigError::Invalid {
        path: path.to_path_buf(),
        field,
        reason,
    };
    let a = &job.autoscale;
    let [wmin, wmax] = a.workers;
    if wmin == 0 || wmin > wmax || wmax > 256 {
        return Err(bad(
            "autoscale.workers",
            format!("[{wmin}, {wmax}] must satisfy 1 <= min <= max <= 256"),
        ));
    }
    let [pmin, pmax] = a.ps_bounds(job.cluster.ps);
    if pmin == 0 || pmin > pmax || pmax > 64 {
        return Err(bad(
            "autoscale.ps",
            format!("[{pmin}, {pmax}] must satisfy 1 <= min <= max <= 64"),
        ));
    }
    if a.enabled && a.warm_start != Some(true) && !(wmin..=wmax).contains(&job.cluster.workers) {
        return Err(bad(
            "cluster.workers",
            format!(
                "{} is outside autoscale.workers [{wmin}, {wmax}]",
                job.cluster.workers
            ),
        ));
    }
    if a.enabled && !(pmin..=pmax).contains(&job.cluster.ps) {
        return Err(bad(
            "cluster.ps",
            format!(
                "{} is outside autoscale.ps [{pmin}, {pmax}]",
                job.cluster.ps
            ),
        ));
    }
    let positive = |v: f64| v.is_finite() && v > 0.0;
    let non_negative = |v: f64| v.is_finite() && v >= 0.0;
    for (field, v) in [
        ("autoscale.interval_s", a.interval_s),
        ("autoscale.sample_s", a.sample_s),
        ("autoscale.worker_mem_gb", a.worker_mem_gb),
        ("autoscale.hot_ps_ratio", a.hot_ps_ratio),
        ("autoscale.worker_cpu", a.worker_cpu),
        ("autoscale.ps_cpu", a.ps_cpu),
    ] {
        if !positive(v) {
            return Err(bad(field, format!("must be a positive number, got {v}")));
        }
    }
    for (field, v) in [
        ("autoscale.min_gain", a.min_gain),
        ("autoscale.cluster_cpu", a.cluster_cpu),
        ("autoscale.cluster_mem_gb", a.cluster_mem_gb),
        ("autoscale.ps_mem_gb", a.ps_mem_gb),
        ("autoscale.worker_start_s", a.worker_start_s),
        ("autoscale.ps_migration_s", a.ps_migration_s),
        ("autoscale.worker_cpu_max", a.worker_cpu_max),
        ("autoscale.ps_cpu_max", a.ps_cpu_max),
        ("autoscale.worker_mem_gb_max", a.worker_mem_gb_max),
        ("autoscale.ps_mem_gb_max", a.ps_mem_gb_max),
    ] {
        if !non_negative(v) {
            return Err(bad(field, format!("must be a number >= 0, got {v}")));
        }
    }
    if !(0.0..=1.0).contains(&a.explore_efficiency) {
        return Err(bad(
            "autoscale.explore_efficiency",
            format!(
                "must be in [0, 1] (a share of proportional speed-up; 0: no exploration), got {}",
                a.explore_efficiency
            ),
        ));
    }
    if !(0.0..=1.0).contains(&a.growth_efficiency) {
        return Err(bad(
            "autoscale.growth_efficiency",
            format!(
                "must be in [0, 1] (a share of proportional speed-up; 0: keep every growth), got {}",
                a.growth_efficiency
            ),
        ));
    }
    if !(a.explore_linear.is_finite() && a.explore_linear >= a.explore_efficiency) {
        return Err(bad(
            "autoscale.explore_linear",
            format!(
                "must be at least autoscale.explore_efficiency ({}), got {}",
                a.explore_efficiency, a.explore_linear
            ),
        ));
    }
    if a.sample_s > a.interval_s {
        return Err(bad(
            "autoscale.sample_s",
            format!(
                "{} is longer than autoscale.interval_s ({})",
                a.sample_s, a.interval_s
            ),
        ));
    }
    let is_url = a.brain.starts_with("http://") || a.brain.starts_with("https://");
    if !(a.brain.is_empty() || is_url) {
        return Err(bad(
            "autoscale.brain",
            format!(
                "`{}` must be empty (in-process brain) or http://HOST:PORT",
                a.brain
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(extra: &str) -> Result<JobConfig, ConfigError> {
        JobConfig::from_toml(extra, Path::new("job.toml"))
    }

    #[test]
    fn a_batch_job_is_elastic_unless_its_file_pins_the_workers() {
        let j = job("").unwrap();
        assert!(
            j.autoscale.enabled,
            "a file that leaves the workers out is sized by the master"
        );
        assert_eq!(j.autoscale.ps_bounds(j.cluster.ps), [j.cluster.ps; 2]);
        for pinned in [
            "[cluster]\nworkers = 2\n",
            "[resources.worker]\ncount = 2\n",
        ] {
            assert!(!job(pinned).unwrap().autoscale.enabled, "{pinned}");
        }
        let j = job("[cluster]\nworkers = 2\n[autoscale]\nenabled = true\n").unwrap();
        assert!(
            j.autoscale.enabled,
            "a file that says so is autoscaled from its count"
        );
        assert!(
            !job("[autoscale]\nenabled = false\n")
                .unwrap()
                .autoscale
                .enabled
        );
        let back = job(&toml::to_string(&j).unwrap()).unwrap();
        assert_eq!(
            back.autoscale, j.autoscale,
            "the resolved section survives the job file"
        );
    }

    #[test]
    fn the_autoscaler_starts_a_role_on_what_resources_asks_for_it() {
        let j = job(
            "[resources.worker]\ncpu = 4.0\nmemory_gb = 6.0\n[resources.ps]\nmemory_gb = 3.0\n",
        )
        .unwrap();
        assert_eq!(j.autoscale.worker_cpu, 4.0);
        assert_eq!(j.autoscale.worker_mem_gb, 6.0);
        assert_eq!(j.autoscale.ps_mem_gb, 3.0);
        assert_eq!(j.autoscale.ps_cpu, 1.0, "not given anywhere: the default");
        let j = job("[resources.worker]\ncpu = 4.0\n[autoscale]\nworker_cpu = 2.0\n").unwrap();
        assert_eq!(
            j.autoscale.worker_cpu, 2.0,
            "[autoscale]'s own allotment wins"
        );
    }

    #[test]
    fn warm_start_is_on_where_a_config_database_is_named() {
        let j = job("[autoscale]\nbrain_db = \"sqlite:///tmp/x.db\"\n").unwrap();
        assert!(j.autoscale.wants_warm_start());
        let j =
            job("[autoscale]\nbrain_db = \"sqlite:///tmp/x.db\"\nwarm_start = false\n").unwrap();
        assert!(!j.autoscale.wants_warm_start(), "the file's word wins");
        let j = job("[autoscale]\nbrain = \"http://127.0.0.1:50070\"\n").unwrap();
        assert!(j.autoscale.wants_warm_start());
    }

    #[test]
    fn bad_bounds_and_urls_name_the_field() {
        let e = job("[autoscale]\nworkers = [3, 2]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("autoscale.workers"), "{e}");
        let e = job("[autoscale]\nenabled = true\nworkers = [2, 4]\n[cluster]\nworkers = 1\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("cluster.workers") && e.contains("[2, 4]"), "{e}");
        let e = job("[autoscale]\nbrain = \"brain:50070\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("autoscale.brain"), "{e}");
        let e = job("[autoscale]\ninterval_s = -1.0\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("autoscale.interval_s"), "{e}");
        let e = job("[autoscale]\nbounds = 1\n").unwrap_err().to_string();
        assert!(e.contains("bounds"), "{e}");
        let e = job("[autoscale]\nexplore_efficiency = 1.5\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("autoscale.explore_efficiency"), "{e}");
        let e = job("[autoscale]\nexplore_efficiency = 0.8\nexplore_linear = 0.7\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("autoscale.explore_linear") && e.contains("0.8"),
            "{e}"
        );
        let j = job("[autoscale]\nexplore_efficiency = 0.0\n").unwrap();
        assert_eq!(
            j.autoscale.explore_efficiency, 0.0,
            "0 turns exploration off"
        );
        let e = job("[autoscale]\ngrowth_efficiency = -0.1\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("autoscale.growth_efficiency"), "{e}");
        let j = job("[autoscale]\ngrowth_efficiency = 0.0\n").unwrap();
        assert_eq!(j.autoscale.growth_efficiency, 0.0, "0 keeps every growth");
    }
}
