//! How the job master reaches the cluster brain: one trait, two implementations. The
//! in-process brain (the default: no server to start) runs the brain service's own
//! handlers on a database under the job directory; the remote brain is the gRPC
//! `elastrec brain` service, shared by every job that names it. Both answer with the same
//! wire messages, so the master validates a plan the same way whichever produced it.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use elastrec_brain::planner::BrainConfig;
use elastrec_brain::service::{BrainService, TOKEN_ENV};
use elastrec_proto::brain as pb;
use pb::brain_client::BrainClient;
use pb::brain_server::Brain as _;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Request, Status};

/// What the master asks of a brain.
#[tonic::async_trait]
pub trait BrainLink: Send + Sync {
    /// Where the brain is, for log lines and status (no secrets).
    fn describe(&self) -> String;
    /// Registers the job and returns its start-up plan (Algorithm 1).
    async fn warm_start(&self, req: pb::WarmStartRequest) -> Result<pb::PlanResponse, Status>;
    /// Appends profile samples and PS memory readings.
    async fn report_profile(
        &self,
        req: pb::ReportProfileRequest,
    ) -> Result<pb::ReportProfileResponse, Status>;
    /// Re-plans the running job from its profile.
    async fn plan(&self, req: pb::PlanRequest) -> Result<pb::PlanResponse, Status>;
    /// Records how the job ended and the allocation it ended on.
    async fn record_outcome(&self, req: pb::RecordOutcomeRequest) -> Result<(), Status>;
}

/// The brain's handlers in this process.
pub struct InProcessBrain {
    svc: BrainService,
    db: String,
}

impl InProcessBrain {
    /// Opens (or creates) the brain database `db_url` with policy settings `cfg`.
    pub async fn open(db_url: &str, cfg: BrainConfig) -> anyhow::Result<Self> {
        let svc = BrainService::open(db_url, cfg).await.with_context(|| {
            format!(
                "opening the brain database {}",
                elastrec_brain::db::redact_url(db_url)
            )
        })?;
        Ok(Self {
            svc,
            db: elastrec_brain::db::redact_url(db_url),
        })
    }
}

#[tonic::async_trait]
impl BrainLink for InProcessBrain {
    fn describe(&self) -> String {
        format!("in-process brain ({})", self.db)
    }
    async fn warm_start(&self, req: pb::WarmStartRequest) -> Result<pb::PlanResponse, Status> {
        Ok(self.svc.warm_start(Request::new(req)).await?.into_inner())
    }
    async fn report_profile(
        &self,
        req: pb::ReportProfileRequest,
    ) -> Result<pb::ReportProfileResponse, Status> {
        Ok(self
            .svc
            .report_profile(Request::new(req))
            .await?
            .into_inner())
    }
    async fn plan(&self, req: pb::PlanRequest) -> Result<pb::PlanResponse, Status> {
        Ok(self.svc.plan(Request::new(req)).await?.into_inner())
    }
    async fn record_outcome(&self, req: pb::RecordOutcomeRequest) -> Result<(), Status> {
        self.svc.record_outcome(Request::new(req)).await?;
        Ok(())
    }
}

/// Adds the brain's shared token to every request.
#[derive(Clone)]
pub struct BrainAuth(MetadataValue<Ascii>);

impl tonic::service::Interceptor for BrainAuth {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        req.metadata_mut().insert("authorization", self.0.clone());
        Ok(req)
    }
}

/// The `elastrec brain` service over gRPC. The channel reconnects by itself: while the
/// service is down calls fail (the master keeps its last plan) and succeed again once it
/// is back.
pub struct RemoteBrain {
    client: BrainClient<InterceptedService<Channel, BrainAuth>>,
    url: String,
}

/// Deadline of one call to a remote brain: planning runs NSGA-II, which takes well under a
/// second; a brain slower than this is treated as unreachable for this round.
const BRAIN_CALL_TIMEOUT: Duration = Duration::from_secs(20);

impl RemoteBrain {
    /// A client of the service at `url` (`http://HOST:PORT`) with `token`.
    pub fn new(url: &str, token: &str) -> anyhow::Result<Self> {
        anyhow::ensure!(
            !token.is_empty() && token.bytes().all(|b| b.is_ascii_graphic()),
            "{TOKEN_ENV}: the brain token must be printable ASCII without spaces"
        );
        let auth: MetadataValue<Ascii> = format!("Bearer {token}").parse()?;
        let channel = tonic::transport::Endpoint::from_shared(url.to_string())
            .with_context(|| format!("autoscale.brain: `{url}` is not a URL"))?
            .connect_timeout(Duration::from_secs(2))
            .timeout(BRAIN_CALL_TIMEOUT)
            .tcp_nodelay(true)
            .connect_lazy();
        Ok(Self {
            client: BrainClient::with_interceptor(channel, BrainAuth(auth)),
            url: url.to_string(),
        })
    }
}

#[tonic::async_trait]
impl BrainLink for RemoteBrain {
    fn describe(&self) -> String {
        format!("brain service {}", self.url)
    }
    async fn warm_start(&self, req: pb::WarmStartRequest) -> Result<pb::PlanResponse, Status> {
        Ok(self.client.clone().warm_start(req).await?.into_inner())
    }
    async fn report_profile(
        &self,
        req: pb::ReportProfileRequest,
    ) -> Result<pb::ReportProfileResponse, Status> {
        Ok(self.client.clone().report_profile(req).await?.into_inner())
    }
    async fn plan(&self, req: pb::PlanRequest) -> Result<pb::PlanResponse, Status> {
        Ok(self.client.clone().plan(req).await?.into_inner())
    }
    async fn record_outcome(&self, req: pb::RecordOutcomeRequest) -> Result<(), Status> {
        self.client.clone().record_outcome(req).await?;
        Ok(())
    }
}

/// The in-process brain's database when the job names none: the user's
/// ([`elastrec_job::autoscale::default_brain_db`]), created here; `<job_dir>/brain.db`
/// where there is no home directory.
pub fn default_brain_db(job_dir: &Path) -> anyhow::Result<std::path::PathBuf> {
    let Some(db) = elastrec_job::autoscale::default_brain_db() else {
        return Ok(job_dir.join("brain.db"));
    };
    if let Some(dir) = db.parent() {
        std::fs::create_dir_all(dir).with_context(|| {
            format!(
                "creating {} for the brain's database (or set autoscale.brain_db)",
                dir.display()
            )
        })?;
    }
    Ok(db)
}

/// The brain a job's `[autoscale]` section names: the service at `autoscale.brain` (token
/// from `ELASTREC_BRAIN_TOKEN`), or the in-process brain on `autoscale.brain_db` (default
/// [`default_brain_db`]) with `cfg`.
pub async fn connect(
    brain: &str,
    brain_db: &str,
    job_dir: &Path,
    cfg: BrainConfig,
) -> anyhow::Result<Arc<dyn BrainLink>> {
    if brain.is_empty() {
        let url = if brain_db.is_empty() {
            format!("sqlite://{}?mode=rwc", default_brain_db(job_dir)?.display())
        } else {
            brain_db.to_string()
        };
        return Ok(Arc::new(InProcessBrain::open(&url, cfg).await?));
    }
    let token = std::env::var(TOKEN_ENV).map_err(|_| {
        anyhow::anyhow!(
            "autoscale.brain is {brain}: set {TOKEN_ENV} to the brain service's token before `elastrec run`"
        )
    })?;
    Ok(Arc::new(RemoteBrain::new(brain, token.trim())?))
}
