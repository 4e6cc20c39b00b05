//! Pushing exports to running model servers (`output.push`): an online job's newest
//! model reaches `elastrec serve` without a restart.
//!
//! Each export is pushed to every server as a delta (the rows changed since the export
//! that server holds, `POST /v1/delta`) when the server is known to hold the previous
//! export, else as the whole model (`PUT /v1/model`). A server that answers 409 (it holds
//! another checkpoint, e.g. it was restarted from an older file) gets the whole model at
//! once. A server that cannot be reached is tried again at the next export, with the whole
//! model; training never waits for it.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::events::event;
use crate::export::ExportRecord;

/// The environment variable holding the token the servers were started with.
pub const PUSH_TOKEN_ENV: &str = "ELASTREC_SERVE_TOKEN";

/// Pushes so far, for `result.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PushReport {
    /// Deltas applied by a server.
    pub deltas: u64,
    /// Whole models loaded by a server.
    pub models: u64,
    /// Pushes that failed (the server is tried again at the next export).
    pub failures: u64,
}

/// The model servers of a job.
pub struct Pusher {
    targets: Vec<String>,
    token: String,
    client: reqwest::Client,
    /// The checkpoint each server is known to hold.
    held: Mutex<Vec<Option<u64>>>,
    report: Mutex<PushReport>,
}

impl Pusher {
    /// Pushes to `targets` (base URLs such as `http://127.0.0.1:8500`) with the token of
    /// [`PUSH_TOKEN_ENV`].
    pub fn new(targets: &[String]) -> anyhow::Result<Self> {
        let token = std::env::var(PUSH_TOKEN_ENV).map_err(|_| {
            anyhow::anyhow!(
                "output.push names model servers, but {PUSH_TOKEN_ENV} is not set: set it to the ELASTREC_TOKEN the servers were started with"
            )
        })?;
        elastrec_rpc::check_token(&token).context(PUSH_TOKEN_ENV)?;
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(300))
            .build()
            .context("building the HTTP client for output.push")?;
        Ok(Self {
            targets: targets
                .iter()
                .map(|t| t.trim_end_matches('/').to_string())
                .collect(),
            token,
            client,
            held: Mutex::new(vec![None; targets.len()]),
            report: Mutex::new(PushReport::default()),
        })
    }

    /// The checkpoint to export a delta from: `previous` when some server holds it.
    pub fn delta_base(&self, previous: u64) -> Option<u64> {
        (previous > 0 && self.held.lock().contains(&Some(previous))).then_some(previous)
    }

    /// Pushes export `rec` to every server.
    pub async fn push(&self, rec: &ExportRecord) {
        let delta = match &rec.delta {
            Some(d) => read(&d.path).await.map(|b| (d.from, b)),
            None => None,
        };
        let mut model: Option<Vec<u8>> = None;
        for (i, target) in self.targets.iter().enumerate() {
            let held = self.held.lock()[i];
            let mut outcome = Err(anyhow::anyhow!("not pushed"));
            if let Some((from, bytes)) = delta.as_ref().filter(|(from, _)| held == Some(*from)) {
                outcome = self
                    .send(reqwest::Method::POST, target, "/v1/delta", bytes.clone())
                    .await
                    .map(|()| "delta");
                if let Err(e) = &outcome {
                    event!(warn, "push_delta_refused", server = %target, error = %format!("{e:#}"),
                        "master: {target} did not apply the delta {from} → {} ({e:#}); pushing the whole model", rec.checkpoint);
                }
            }
            if outcome.is_err() {
                if model.is_none() {
                    model = read(&rec.path).await;
                }
                outcome = match &model {
                    Some(bytes) => self
                        .send(reqwest::Method::PUT, target, "/v1/model", bytes.clone())
                        .await
                        .map(|()| "model"),
                    None => Err(anyhow::anyhow!("{} could not be read", rec.path.display())),
                };
            }
            let mut report = self.report.lock();
            match outcome {
                Ok(kind) => {
                    self.held.lock()[i] = Some(rec.checkpoint);
                    if kind == "delta" {
                        report.deltas += 1;
                    } else {
                        report.models += 1;
                    }
                    event!("pushed", server = %target, checkpoint = rec.checkpoint, what = kind,
                        "master: pushed the {kind} of checkpoint {} to {target}", rec.checkpoint);
                }
                Err(e) => {
                    self.held.lock()[i] = None;
                    report.failures += 1;
                    event!(warn, "push_failed", server = %target, error = %format!("{e:#}"),
                        "master: pushing checkpoint {} to {target} failed (tried again at the next export): {e:#}", rec.checkpoint);
                }
            }
        }
    }

    async fn send(
        &self,
        method: reqwest::Method,
        target: &str,
        path: &str,
        body: Vec<u8>,
    ) -> anyhow::Result<()> {
        let url = format!("{target}{path}");
        let reply = self
            .client
            .request(method, &url)
            .bearer_auth(&self.token)
            .header("content-type", "application/octet-stream")
            .body(body)
            .send()
            .await
            .with_context(|| format!("sending to {url}"))?;
        let status = reply.status();
        if status.is_success() {
            return Ok(());
        }
        let text = reply.text().await.unwrap_or_default();
        anyhow::bail!("{url} answered {status}: {}", text.trim())
    }

    /// What was pushed so far.
    pub fn report(&self) -> PushReport {
        self.report.lock().clone()
    }
}

async fn read(path: &Path) -> Option<Vec<u8>> {
    match tokio::fs::read(path).await {
        Ok(b) => Some(b),
        Err(e) => {
            event!(warn, "push_read_failed", path = %path.display(), error = %e,
                "master: cannot read {} to push it: {e}", path.display());
            None
        }
    }
}
