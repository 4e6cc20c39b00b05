//! Dataset definitions as a job file states them (`[[data.dataset]]`), and their compiled form.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{OrchestrateError, Result};
use crate::listing::{Lister, LocalLister, NameFilter, ObjectStoreLister};
use crate::template::PartitionTemplate;
use crate::window::WindowSpec;

/// What a dataset's samples are used for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DatasetRole {
    /// Training samples (the default).
    #[default]
    Train,
    /// Held-out samples for the final evaluation.
    Eval,
}

/// One `[[data.dataset]]`: files partitioned by time.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DatasetConfig {
    /// Name used in messages and status (unique in the job).
    pub name: String,
    /// Root and partition template, e.g. `logs/clicks/dt={date}/hour={hour}` or
    /// `s3://bucket/clicks/dt={date}?endpoint=http://127.0.0.1:9000&region=us-east-1`.
    /// Relative paths are relative to the job file. Placeholders: `{date}` (YYYYMMDD),
    /// `{hour}` (HH), `{time:FMT}` (strftime); hourly partitions when the template names
    /// the hour, else daily.
    pub path: String,
    /// File-name pattern inside a partition (`*`, `?`); hidden files and `_` markers never match.
    pub files: String,
    /// A partition is ready when this marker file exists; empty: when it holds a matching file.
    pub ready: String,
    /// How long a needed partition may stay not ready before the job fails.
    pub ready_timeout: String,
    /// Window start (inclusive), a UTC time like `2026-11-01` or `2026-11-01T06`.
    pub from: Option<String>,
    /// Window end (exclusive); without it the window grows with the clock.
    pub to: Option<String>,
    /// Sliding window: the last `3d`, `36h`... before now (instead of `from`/`to`).
    pub last: Option<String>,
    /// `train` or `eval`.
    pub role: DatasetRole,
}

impl Default for DatasetConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            path: String::new(),
            files: "*".into(),
            ready: "_SUCCESS".into(),
            ready_timeout: "10m".into(),
            from: None,
            to: None,
            last: None,
            role: DatasetRole::Train,
        }
    }
}

/// A checked dataset, ready to plan.
pub struct Dataset {
    /// The dataset's name.
    pub name: String,
    /// Partition directories under the root.
    pub template: PartitionTemplate,
    /// Data files inside a partition.
    pub filter: NameFilter,
    /// Ready marker (empty: none).
    pub marker: String,
    /// Window of partitions.
    pub window: WindowSpec,
    /// How long to wait for a needed partition.
    pub ready_timeout: Duration,
    /// Train or eval.
    pub role: DatasetRole,
    /// Lists the root.
    pub lister: Arc<dyn Lister>,
}

impl std::fmt::Debug for Dataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dataset")
            .field("name", &self.name)
            .field("root", &self.lister.root())
            .field("template", &self.template.text())
            .finish()
    }
}

/// A definition checked without touching storage.
struct Checked {
    name: String,
    root: String,
    template: PartitionTemplate,
    filter: NameFilter,
    window: WindowSpec,
    ready_timeout: Duration,
}

impl DatasetConfig {
    /// The name used in messages: `name`, or `#N` for the `index`-th unnamed dataset.
    pub fn display_name(&self, index: usize) -> String {
        if self.name.is_empty() {
            format!("#{}", index + 1)
        } else {
            self.name.clone()
        }
    }

    /// Checks the definition (the `index`-th of the job) without touching storage: the
    /// path, template, file pattern, marker, window and timeout.
    pub fn check(&self, index: usize) -> Result<()> {
        self.checked(index).map(|_| ())
    }

    /// Makes a relative local root absolute against `base` (the job file's directory);
    /// object-store URLs and absolute paths are left alone.
    pub fn resolve_root(&mut self, base: &Path) {
        if !self.path.contains("://")
            && !Path::new(&self.path).is_absolute()
            && !self.path.is_empty()
        {
            self.path = base.join(&self.path).display().to_string();
        }
    }

    fn checked(&self, index: usize) -> Result<Checked> {
        let name = self.display_name(index);
        let bad = |field: &'static str, reason: String| OrchestrateError::Definition {
            dataset: name.clone(),
            field,
            reason,
        };
        let (root, template) = split_path(&self.path).map_err(|r| bad("path", r))?;
        let template = PartitionTemplate::parse(&template).map_err(|r| bad("path", r))?;
        let filter = NameFilter::new(&self.files).map_err(|r| bad("files", r))?;
        if self.ready.contains('/') {
            return Err(bad(
                "ready",
                format!("`{}` must be a file name", self.ready),
            ));
        }
        let window = WindowSpec::parse(
            self.from.as_deref(),
            self.to.as_deref(),
            self.last.as_deref(),
        )
        .map_err(|(field, reason)| bad(field, reason))?;
        let ready_timeout = humantime::parse_duration(&self.ready_timeout)
            .map_err(|e| bad("ready_timeout", format!("`{}`: {e}", self.ready_timeout)))?;
        Ok(Checked {
            name,
            root,
            template,
            filter,
            window,
            ready_timeout,
        })
    }
}

impl Dataset {
    /// Checks `cfg` (the `index`-th dataset of the job) and opens its storage. Relative
    /// local roots are taken from `base` (the job file's directory).
    pub fn compile(cfg: &DatasetConfig, index: usize, base: &Path) -> Result<Self> {
        let c = cfg.checked(index)?;
        let lister: Arc<dyn Lister> = if c.root.contains("://") {
            Arc::new(ObjectStoreLister::open(&c.root).map_err(|e| {
                OrchestrateError::Definition {
                    dataset: c.name.clone(),
                    field: "path",
                    reason: e.to_string(),
                }
            })?)
        } else {
            Arc::new(LocalLister::new(base.join(&c.root)))
        };
        Ok(Self {
            name: c.name,
            template: c.template,
            filter: c.filter,
            marker: cfg.ready.clone(),
            window: c.window,
            ready_timeout: c.ready_timeout,
            role: cfg.role,
            lister,
        })
    }

    /// A dataset over an arbitrary lister (benchmarks, tests).
    pub fn with_lister(
        name: &str,
        template: &str,
        window: WindowSpec,
        lister: Arc<dyn Lister>,
    ) -> Result<Self> {
        let template =
            PartitionTemplate::parse(template).map_err(|reason| OrchestrateError::Definition {
                dataset: name.into(),
                field: "path",
                reason,
            })?;
        Ok(Self {
            name: name.into(),
            template,
            filter: NameFilter::new("*").expect("valid pattern"),
            marker: String::new(),
            window,
            ready_timeout: Duration::ZERO,
            role: DatasetRole::Train,
            lister,
        })
    }
}

/// Splits `path` into its root (up to the directory before the first placeholder, with an
/// URL's query kept on the root) and the partition template.
fn split_path(path: &str) -> std::result::Result<(String, String), String> {
    if path.trim().is_empty() {
        return Err("empty path: name the partitions, e.g. \"logs/dt={date}/hour={hour}\"".into());
    }
    let (body, query) = match path.split_once('?') {
        Some((b, q)) if path.contains("://") => (b, Some(q)),
        _ => (path, None),
    };
    let Some(open) = body.find('{') else {
        return Err(format!(
            "`{path}` has no time placeholder: name the partitions with {{date}} (and {{hour}})"
        ));
    };
    let head = &body[..open];
    // An URL needs a bucket (or host) before its partitions: `s3://bucket/dt={date}`.
    let after_scheme = head.find("://").map_or(0, |i| i + 3);
    let (root, template) = match head[after_scheme..].rfind('/').map(|i| i + after_scheme) {
        Some(slash) => (&body[..slash], &body[slash + 1..]),
        None if after_scheme == 0 => (".", body),
        None => ("", body),
    };
    if root.is_empty() {
        return Err(format!(
            "`{path}`: the partitions need a root directory (e.g. s3://bucket/data/dt={{date}})"
        ));
    }
    let template = template.trim_end_matches('/');
    let root = match query {
        Some(q) => format!("{root}?{q}"),
        None => root.to_string(),
    };
    Ok((root, template.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_splits_into_root_and_template_and_keeps_an_urls_query_on_the_root() {
        let cases = [
            (
                "logs/clicks/dt={date}/hour={hour}",
                "logs/clicks",
                "dt={date}/hour={hour}",
            ),
            ("dt={date}", ".", "dt={date}"),
            ("/abs/day={time:%Y-%m-%d}/", "/abs", "day={time:%Y-%m-%d}"),
            (
                "s3://b/p/dt={date}?endpoint=http://h:1&region=r",
                "s3://b/p?endpoint=http://h:1&region=r",
                "dt={date}",
            ),
        ];
        for (path, root, template) in cases {
            assert_eq!(
                split_path(path).unwrap(),
                (root.into(), template.into()),
                "{path}"
            );
        }
        assert!(split_path("s3://{date}")
            .unwrap_err()
            .contains("root directory"));
    }

    #[test]
    fn a_bad_definition_names_the_dataset_and_the_field() {
        let base = Path::new(".");
        let cases = [
            (
                DatasetConfig {
                    name: "clicks".into(),
                    path: "logs/all".into(),
                    ..Default::default()
                },
                "path",
            ),
            (
                DatasetConfig {
                    name: "clicks".into(),
                    path: "logs/dt={date}".into(),
                    from: Some("2026-11-04".into()),
                    to: Some("2026-11-01".into()),
                    ..Default::default()
                },
                "to",
            ),
            (
                DatasetConfig {
                    name: "clicks".into(),
                    path: "logs/dt={date}".into(),
                    last: Some("3d".into()),
                    files: "a/b".into(),
                    ..Default::default()
                },
                "files",
            ),
            (
                DatasetConfig {
                    name: "clicks".into(),
                    path: "logs/dt={date}".into(),
                    last: Some("3d".into()),
                    ready_timeout: "ever".into(),
                    ..Default::default()
                },
                "ready_timeout",
            ),
        ];
        for (cfg, field) in cases {
            let e = Dataset::compile(&cfg, 0, base).unwrap_err();
            let text = e.to_string();
            assert!(
                text.starts_with(&format!("dataset `clicks`, field `{field}`")),
                "{text}"
            );
        }
    }
}
