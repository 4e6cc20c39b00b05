//! The gRPC endpoint (`elastrec.serve.v1.Predictor`): the same predictions as
//! `POST /v1/predict`, for clients that already speak gRPC.

use std::sync::Arc;

use elastrec_proto::serve::predictor_server::Predictor;
use elastrec_proto::serve::{InfoRequest, InfoResponse, PredictRequest, PredictResponse};
use tonic::{Request, Response, Status};

use crate::served::{PredictError, Served};

/// The service over the served model.
pub struct Grpc {
    /// The model.
    pub served: Arc<Served>,
}

#[tonic::async_trait]
impl Predictor for Grpc {
    async fn predict(
        &self,
        req: Request<PredictRequest>,
    ) -> Result<Response<PredictResponse>, Status> {
        let rows = crate::features::rows_from_proto(&req.get_ref().rows, self.served.max_batch())
            .map_err(|e| {
            self.served.refused();
            Status::invalid_argument(e)
        })?;
        let (probs, tasks, checkpoint) = self.served.predict_tasks(&rows).map_err(|e| match e {
            PredictError::NoModel => Status::unavailable(e.to_string()),
            PredictError::Failed(_) => Status::internal(e.to_string()),
        })?;
        let (probabilities, task_probabilities, tasks) = if tasks == 1 {
            (probs, Vec::new(), 0)
        } else {
            let first = probs.iter().copied().step_by(tasks).collect();
            (first, probs, tasks as u32)
        };
        Ok(Response::new(PredictResponse {
            probabilities,
            checkpoint: checkpoint.unwrap_or(0),
            task_probabilities,
            tasks,
        }))
    }

    async fn info(&self, _: Request<InfoRequest>) -> Result<Response<InfoResponse>, Status> {
        let json = serde_json::to_string(&self.served.info())
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(InfoResponse { json }))
    }
}
