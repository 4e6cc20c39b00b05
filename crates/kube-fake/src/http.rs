//! The fake's HTTP endpoints: the Kubernetes REST paths of pods and Secrets, answering
//! with the API's objects, `Status` errors and watch event streams.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Pod, PodStatus, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::ByteString;
use serde_json::json;

use crate::store::{key_of, now, Key, PodEvent, Selector, Store};
use crate::{kill, kubelet, Cluster};

type Shared = State<Arc<Cluster>>;
type Params = Query<HashMap<String, String>>;

/// Every route the fake serves.
pub fn router(cluster: Arc<Cluster>) -> Router {
    Router::new()
        .route(
            "/api/v1/namespaces/{ns}/pods",
            get(list_pods).post(create_pod),
        )
        .route(
            "/api/v1/namespaces/{ns}/pods/{name}",
            get(get_pod).delete(delete_pod),
        )
        .route(
            "/api/v1/namespaces/{ns}/secrets",
            axum::routing::post(create_secret),
        )
        .route(
            "/api/v1/namespaces/{ns}/secrets/{name}",
            get(get_secret).delete(delete_secret),
        )
        .fallback(unknown)
        .with_state(cluster)
}

/// A `Status` answer, as the API server writes its errors.
fn status(code: StatusCode, reason: &str, message: String) -> Response {
    let body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    });
    (code, axum::Json(body)).into_response()
}

fn object<T: serde::Serialize>(code: StatusCode, value: &T) -> Response {
    (code, axum::Json(value)).into_response()
}

/// Authentication (the bearer token) and authorization (the 403 switch).
#[allow(clippy::result_large_err)]
fn guard(
    c: &Cluster,
    headers: &HeaderMap,
    verb: &str,
    resource: &str,
    ns: &str,
) -> Result<(), Response> {
    let expected = format!("Bearer {}", c.token);
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if given != Some(expected.as_str()) {
        return Err(status(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "Unauthorized".into(),
        ));
    }
    if c.forbidden.load(Ordering::Acquire) {
        return Err(status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            format!(
                "{resource} is forbidden: User \"system:serviceaccount:{ns}:default\" cannot \
                 {verb} resource \"{resource}\" in API group \"\" in the namespace \"{ns}\""
            ),
        ));
    }
    Ok(())
}

fn not_found(resource: &str, name: &str) -> Response {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("{resource} \"{name}\" not found"),
    )
}

fn is_dry_run(q: &HashMap<String, String>) -> bool {
    q.get("dryRun").is_some_and(|v| v == "All")
}

/// Parses a body and checks what the real API server would reject (name, namespace).
#[allow(clippy::result_large_err)]
fn parse<T: serde::de::DeserializeOwned>(
    body: &Bytes,
    kind: &str,
    ns: &str,
    meta: impl Fn(&mut T) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Result<T, Response> {
    let mut obj: T = serde_json::from_slice(body).map_err(|e| {
        status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!("decoding {kind}: {e}"),
        )
    })?;
    let m = meta(&mut obj);
    if m.name.as_deref().unwrap_or("").is_empty() {
        return Err(status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!("{kind} \"\" is invalid: metadata.name: Required value: name is required"),
        ));
    }
    match m.namespace.as_deref() {
        Some(given) if given != ns => return Err(status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the namespace of the provided object does not match the namespace sent on the request"
                .into(),
        )),
        _ => m.namespace = Some(ns.to_string()),
    }
    Ok(obj)
}

async fn create_pod(
    State(c): Shared,
    Path(ns): Path<String>,
    Query(q): Params,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(r) = guard(&c, &headers, "create", "pods", &ns) {
        return r;
    }
    let mut pod: Pod = match parse(&body, "Pod", &ns, |p: &mut Pod| &mut p.metadata) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let name = pod.metadata.name.clone().unwrap_or_default();
    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.clone())
        .unwrap_or_default();
    if containers.is_empty() {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!("Pod \"{name}\" is invalid: spec.containers: Required value"),
        );
    }
    if containers
        .iter()
        .any(|c| c.image.as_deref().unwrap_or("").is_empty())
    {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!("Pod \"{name}\" is invalid: spec.containers[0].image: Required value"),
        );
    }
    pod.status = Some(PodStatus {
        phase: Some("Pending".into()),
        ..Default::default()
    });
    let mut s = c.store.lock();
    let key = key_of(&pod.metadata);
    if s.pods.contains_key(&key) {
        return status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("pods \"{name}\" already exists"),
        );
    }
    if is_dry_run(&q) {
        // Validated and authorized, never stored.
        return object(StatusCode::CREATED, &pod);
    }
    s.stamp_new(&mut pod.metadata);
    s.created.push(pod.clone());
    let event = s.pod_changed("ADDED", pod.clone());
    let _ = c.events.send(event);
    collect_garbage(&c, &mut s);
    let stored = s.pods.get(&key).cloned();
    drop(s);
    match stored {
        Some(p) => {
            kubelet::start(c.clone(), p.clone());
            object(StatusCode::CREATED, &p)
        }
        // Owned by something that does not exist: collected at once.
        None => object(StatusCode::CREATED, &pod),
    }
}

async fn get_pod(
    State(c): Shared,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = guard(&c, &headers, "get", "pods", &ns) {
        return r;
    }
    match c.store.lock().pods.get(&(ns, name.clone())) {
        Some(p) => object(StatusCode::OK, p),
        None => not_found("pods", &name),
    }
}

async fn list_pods(
    State(c): Shared,
    Path(ns): Path<String>,
    Query(q): Params,
    headers: HeaderMap,
) -> Response {
    let watching = q.get("watch").is_some_and(|w| w == "true" || w == "1");
    if let Err(r) = guard(
        &c,
        &headers,
        if watching { "watch" } else { "list" },
        "pods",
        &ns,
    ) {
        return r;
    }
    let selector = match Selector::parse(q.get("labelSelector").map_or("", String::as_str)) {
        Ok(s) => s,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e),
    };
    if watching {
        return watch_pods(c, ns, selector, &q);
    }
    let s = c.store.lock();
    let mut items: Vec<&Pod> = s
        .pods
        .iter()
        .filter(|((n, _), p)| *n == ns && selector.matches(&p.metadata))
        .map(|(_, p)| p)
        .collect();
    if let Some(limit) = q
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|&l| l > 0)
    {
        items.truncate(limit);
    }
    let body = json!({
        "apiVersion": "v1",
        "kind": "PodList",
        "metadata": {"resourceVersion": s.version.to_string()},
        "items": items,
    });
    (StatusCode::OK, axum::Json(body)).into_response()
}

/// A watch: the changes after `resourceVersion` (or the current pods as ADDED when it is
/// empty or 0), then live changes, until `timeoutSeconds`.
fn watch_pods(
    c: Arc<Cluster>,
    ns: String,
    selector: Selector,
    q: &HashMap<String, String>,
) -> Response {
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .unwrap_or(1800);
    let since = q
        .get("resourceVersion")
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&v| v > 0);
    let wanted = {
        let ns = ns.clone();
        move |e: &PodEvent| {
            e.pod.metadata.namespace.as_deref() == Some(ns.as_str())
                && selector.matches(&e.pod.metadata)
        }
    };
    // Under the store's lock: events are sent under it too, so the replay and the live
    // stream meet exactly.
    let (replay, live) = {
        let s = c.store.lock();
        let live = c.events.subscribe();
        let replay: Vec<PodEvent> = match since {
            Some(v) => s
                .history
                .iter()
                .filter(|e| e.version > v)
                .cloned()
                .collect(),
            None => s
                .pods
                .values()
                .map(|p| PodEvent {
                    version: s.version,
                    kind: "ADDED",
                    pod: p.clone(),
                })
                .collect(),
        };
        (replay, live)
    };
    let replay = futures::stream::iter(replay.into_iter().map(Some));
    let live = futures::stream::unfold(live, |mut rx| async move {
        match rx.recv().await {
            Ok(e) => Some((Some(e), rx)),
            // Fell behind: end with an error event, as an API server does for an expired
            // version; the client lists again.
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => Some((None, rx)),
            Err(tokio::sync::broadcast::error::RecvError::Closed) => None,
        }
    });
    let mut failed = false;
    let lines = replay
        .chain(live)
        .take_while(move |e| {
            let go = !failed;
            failed |= e.is_none();
            futures::future::ready(go)
        })
        .filter_map(move |e| {
            let line = match e {
                Some(e) if wanted(&e) => Some(json!({"type": e.kind, "object": e.pod})),
                Some(_) => None,
                None => Some(json!({"type": "ERROR", "object": {
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": "too old resource version", "reason": "Expired", "code": 410}})),
            };
            futures::future::ready(line.map(|l| Ok::<_, Infallible>(format!("{l}\n"))))
        })
        .take_until(tokio::time::sleep(Duration::from_secs(timeout)));
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(lines))
        .expect("static response parts")
}

async fn delete_pod(
    State(c): Shared,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = guard(&c, &headers, "delete", "pods", &ns) {
        return r;
    }
    let mut s = c.store.lock();
    let key = (ns, name.clone());
    let Some(pod) = delete_pod_locked(&c, &mut s, &key) else {
        return not_found("pods", &name);
    };
    collect_garbage(&c, &mut s);
    object(StatusCode::OK, &pod)
}

/// Removes a pod, tells the watches, and kills its process (no grace period: the backend
/// stops nodes forcefully).
fn delete_pod_locked(c: &Cluster, s: &mut Store, key: &Key) -> Option<Pod> {
    let mut pod = s.pods.get(key).cloned()?;
    pod.metadata.deletion_timestamp = Some(Time(now()));
    pod.metadata.deletion_grace_period_seconds = Some(0);
    let event = s.pod_changed("DELETED", pod.clone());
    let _ = c.events.send(event);
    if let Some(p) = c.processes.lock().get(key) {
        kill(p.pid);
    }
    Some(pod)
}

/// Deletes pods whose owner is gone, as the cluster's garbage collector does (here at
/// once, there within seconds).
fn collect_garbage(c: &Cluster, s: &mut Store) {
    loop {
        let orphans = s.orphans();
        if orphans.is_empty() {
            return;
        }
        for key in orphans {
            delete_pod_locked(c, s, &key);
        }
    }
}

async fn create_secret(
    State(c): Shared,
    Path(ns): Path<String>,
    Query(q): Params,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(r) = guard(&c, &headers, "create", "secrets", &ns) {
        return r;
    }
    let mut secret: Secret = match parse(&body, "Secret", &ns, |s: &mut Secret| &mut s.metadata) {
        Ok(s) => s,
        Err(r) => return r,
    };
    // As the API server does: stringData is a write-only convenience merged into data.
    if let Some(strings) = secret.string_data.take() {
        let data = secret.data.get_or_insert_with(Default::default);
        for (k, v) in strings {
            data.insert(k, ByteString(v.into_bytes()));
        }
    }
    let name = secret.metadata.name.clone().unwrap_or_default();
    let mut s = c.store.lock();
    let key = key_of(&secret.metadata);
    if s.secrets.contains_key(&key) {
        return status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("secrets \"{name}\" already exists"),
        );
    }
    if is_dry_run(&q) {
        return object(StatusCode::CREATED, &secret);
    }
    s.stamp_new(&mut secret.metadata);
    s.secrets.insert(key, secret.clone());
    object(StatusCode::CREATED, &secret)
}

async fn get_secret(
    State(c): Shared,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = guard(&c, &headers, "get", "secrets", &ns) {
        return r;
    }
    match c.store.lock().secrets.get(&(ns, name.clone())) {
        Some(secret) => object(StatusCode::OK, secret),
        None => not_found("secrets", &name),
    }
}

async fn delete_secret(
    State(c): Shared,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = guard(&c, &headers, "delete", "secrets", &ns) {
        return r;
    }
    let mut s = c.store.lock();
    let Some(secret) = s.secrets.remove(&(ns, name.clone())) else {
        return not_found("secrets", &name);
    };
    s.version += 1;
    collect_garbage(&c, &mut s);
    object(StatusCode::OK, &secret)
}

async fn unknown(method: Method, uri: Uri) -> Response {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("the fake API server does not serve {method} {uri}"),
    )
}
