//! The HTTP/JSON endpoint (docs/serving.md):
//! - `POST /v1/predict`: `{"rows": [{"I1": 3, ..., "C26": "0a1b2c3d"}]}` →
//!   `{"predictions": [0.12], "checkpoint": 7}`;
//! - `GET /v1/model`: what is served, with counters;
//! - `POST /v1/delta`: a delta file's bytes, applied in place (409 when it does not start
//!   from the served checkpoint);
//! - `PUT /v1/model`: a model file's bytes, which replace the served model;
//! - `GET /healthz`.
//!
//! Reads follow the metrics endpoints' rule: open on loopback, the token beyond it.
//! Updates always need the token: any local process must not be able to swap the model.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;
use elastrec_metrics::Access;
use serde_json::json;

use crate::served::{PredictError, Served, UpdateError};

/// What the handlers share.
#[derive(Clone)]
pub struct Http {
    /// The model.
    pub served: Arc<Served>,
    /// Who may predict and read `/v1/model`.
    pub read: Access,
    /// Who may push deltas and models (`None`: nobody, the server has no token).
    pub write: Option<Access>,
}

fn error(code: StatusCode, message: impl Into<String>) -> Response {
    (code, Json(json!({ "error": message.into() }))).into_response()
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        Json(json!({ "error": "missing or wrong token" })),
    )
        .into_response()
}

/// The router, with request bodies capped: a prediction request at what `max_batch`
/// rows can take, a push at `max_push_bytes`.
pub fn router(state: Http, max_push_bytes: usize) -> axum::Router {
    // A row of 39 features is about 700 bytes of JSON; twice that leaves room for spaces.
    let predict_limit = (state.served.max_batch() * 1536).max(64 << 10);
    axum::Router::new()
        .route(
            "/v1/predict",
            post(predict).layer(DefaultBodyLimit::max(predict_limit)),
        )
        .route(
            "/v1/model",
            get(info)
                .put(replace)
                .layer(DefaultBodyLimit::max(max_push_bytes)),
        )
        .route(
            "/v1/delta",
            post(delta).layer(DefaultBodyLimit::max(max_push_bytes)),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(state)
}

async fn predict(State(s): State<Http>, headers: HeaderMap, body: Bytes) -> Response {
    if !s.read.allows(&headers) {
        return unauthorized();
    }
    let predicted = match s.served.schema() {
        Some(schema) => match crate::named::batch_from_json(&body, &schema, s.served.max_batch()) {
            Ok(batch) => s.served.predict_named(&batch, &schema),
            Err(e) => {
                s.served.refused();
                return error(StatusCode::BAD_REQUEST, e);
            }
        },
        None => match crate::features::rows_from_json(&body, s.served.max_batch()) {
            Ok(rows) => s.served.predict_tasks(&rows),
            Err(e) => {
                s.served.refused();
                return error(StatusCode::BAD_REQUEST, e);
            }
        },
    };
    match predicted {
        Ok((probs, 1, checkpoint)) => {
            Json(json!({ "predictions": probs, "checkpoint": checkpoint })).into_response()
        }
        Ok((probs, tasks, checkpoint)) => {
            let first: Vec<f32> = probs.iter().copied().step_by(tasks).collect();
            let per_row: Vec<&[f32]> = probs.chunks_exact(tasks).collect();
            Json(json!({ "predictions": first, "tasks": per_row, "checkpoint": checkpoint }))
                .into_response()
        }
        Err(e @ PredictError::NoModel) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn info(State(s): State<Http>, headers: HeaderMap) -> Response {
    if !s.read.allows(&headers) {
        return unauthorized();
    }
    Json(s.served.info()).into_response()
}

/// Checks the token of an update; `Some` is the refusal.
fn refuse_update(s: &Http, headers: &HeaderMap) -> Option<Response> {
    match &s.write {
        None => Some(error(
            StatusCode::FORBIDDEN,
            "this server takes no pushes: start it with ELASTREC_TOKEN set, and push with that token",
        )),
        Some(a) if !a.allows(headers) => Some(unauthorized()),
        Some(_) => None,
    }
}

fn update_error(e: UpdateError) -> Response {
    match e {
        UpdateError::Invalid(r) => error(StatusCode::BAD_REQUEST, r),
        UpdateError::Conflict { reason, served } => (
            StatusCode::CONFLICT,
            Json(json!({ "error": reason, "checkpoint": served })),
        )
            .into_response(),
    }
}

/// Runs an update off the async threads: parsing a large model takes a while.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, UpdateError> + Send + 'static,
) -> Result<T, UpdateError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(UpdateError::Invalid(format!("the update panicked: {e}"))))
}

async fn delta(State(s): State<Http>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(refusal) = refuse_update(&s, &headers) {
        return refusal;
    }
    let served = s.served.clone();
    match blocking(move || served.apply_delta(&body)).await {
        Ok((checkpoint, rows)) => {
            tracing::info!("applied a delta: checkpoint {checkpoint}, {rows} rows changed");
            Json(json!({ "checkpoint": checkpoint, "rows": rows })).into_response()
        }
        Err(e) => {
            tracing::warn!("refused a delta: {e}");
            update_error(e)
        }
    }
}

async fn replace(State(s): State<Http>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(refusal) = refuse_update(&s, &headers) {
        return refusal;
    }
    let served = s.served.clone();
    match blocking(move || served.replace(&body)).await {
        Ok(checkpoint) => {
            tracing::info!("serving a pushed model (checkpoint {checkpoint:?})");
            Json(json!({ "checkpoint": checkpoint })).into_response()
        }
        Err(e) => {
            tracing::warn!("refused a pushed model: {e}");
            update_error(e)
        }
    }
}
