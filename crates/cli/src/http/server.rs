//! The HTTP JSON API over a [`Runtime`]. Bodies are parsed by hand so that malformed JSON
//! gets the same JSON error shape as every other refusal; nothing a client sends can crash
//! the server.

use std::time::Duration;

use axum::{
    Json, Router,
    body::Bytes,
    extract::{Path, Query, Request, State},
    http::{HeaderMap, Method, StatusCode},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{delete, get, post, put},
};
use durafiber_runtime::{
    AlarmAt, AlarmSpec, Decision, DurabilityMode, ListFilter, RunOptions, RunState, Runtime, RuntimeError,
    Secrets, canonical_json,
};
use serde::Deserialize;

use super::{admin, guard, guard::Access};
use serde_json::{Value, json};

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// The runtime served.
    pub runtime: Runtime,
    /// Used to redact secret values from inspection output.
    pub secrets: Secrets,
    /// The process's Prometheus recorder, rendered by `GET /metrics`.
    pub prometheus: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// Which hosts and origins the server answers, and whether `/metrics` is open.
    pub access: Access,
}

/// The process's Prometheus recorder: installed as the `metrics` facade's global recorder
/// the first time it is asked for, so every runtime in the process reports through it.
/// `None` when another recorder was installed first.
pub fn prometheus() -> Option<metrics_exporter_prometheus::PrometheusHandle> {
    static HANDLE: std::sync::OnceLock<Option<metrics_exporter_prometheus::PrometheusHandle>> =
        std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| match metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder() {
            Ok(handle) => Some(handle),
            Err(e) => {
                tracing::warn!(error = %e, "no Prometheus recorder: another one is installed");
                None
            }
        })
        .clone()
}

/// An API error: a status and a JSON body.
pub struct ApiError(pub StatusCode, pub String, pub &'static str);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({"error": self.1, "kind": self.2}))).into_response()
    }
}

impl From<RuntimeError> for ApiError {
    fn from(e: RuntimeError) -> Self {
        use RuntimeError::*;
        let (status, kind) = match &e {
            UnknownRun { .. } => (StatusCode::NOT_FOUND, "UnknownRun"),
            UnknownKind { .. } => (StatusCode::BAD_REQUEST, "UnknownKind"),
            KeyConflict { .. } => (StatusCode::CONFLICT, "KeyConflict"),
            StaleApproval { .. } => (StatusCode::CONFLICT, "StaleApproval"),
            NotPending { .. } => (StatusCode::CONFLICT, "NotPending"),
            AlreadyDecided { .. } => (StatusCode::CONFLICT, "AlreadyDecided"),
            RunFinished { .. } => (StatusCode::CONFLICT, "RunFinished"),
            InvalidInput(_) | Config(_) => (StatusCode::BAD_REQUEST, "InvalidInput"),
            Agent(_) => (StatusCode::UNPROCESSABLE_ENTITY, "Agent"),
            ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, "ShuttingDown"),
            Evicted { .. } => (StatusCode::SERVICE_UNAVAILABLE, "Evicted"),
            Store(durafiber_store::StoreError::StorageFull { .. }) => {
                (StatusCode::INSUFFICIENT_STORAGE, "StorageFull")
            }
            Store(durafiber_store::StoreError::Failed { .. }) => {
                (StatusCode::SERVICE_UNAVAILABLE, "StoreFailed")
            }
            NotVirtual | Store(_) | LivenessViolation { .. } => {
                (StatusCode::INTERNAL_SERVER_ERROR, "Internal")
            }
        };
        ApiError(status, e.to_string(), kind)
    }
}

pub(super) fn bad_request(msg: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, msg.into(), "BadRequest")
}

pub(super) fn parse<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| bad_request(format!("malformed JSON body: {e}")))
}

pub(super) type ApiResult = Result<Response, ApiError>;

pub(super) fn ok(value: impl serde::Serialize) -> ApiResult {
    Ok(Json(
        serde_json::to_value(value)
            .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string(), "Internal"))?,
    )
    .into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StartBody {
    kind: String,
    input: Value,
    #[serde(default)]
    options: Option<StartOptions>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct StartOptions {
    durability: Option<String>,
    fiber_keep_alive: Option<bool>,
}

async fn start(State(app): State<AppState>, headers: HeaderMap, body: Bytes) -> ApiResult {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| bad_request("an Idempotency-Key header is required"))?
        .to_string();
    let body: StartBody = parse(&body)?;
    let options = body.options.unwrap_or_default();
    let input = canonical_json(&body.input).map_err(bad_request)?;
    let durability = options.durability.as_deref().map(DurabilityMode::parse).transpose()?;
    let out = app
        .runtime
        .start_json(
            &body.kind,
            &key,
            &input,
            RunOptions { durability, fiber_keep_alive: options.fiber_keep_alive },
        )
        .await?;
    let status = if out.accepted { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(json!(out))).into_response())
}

/// Query strings are read as plain pairs, so a malformed one gets the same JSON error shape.
pub(super) type Params = Query<std::collections::HashMap<String, String>>;

async fn list(State(app): State<AppState>, Query(q): Params) -> ApiResult {
    let limit = match q.get("limit") {
        None => 50,
        Some(text) => {
            text.parse().map_err(|_| bad_request(format!("limit must be a number, not {text:?}")))?
        }
    };
    let filter = ListFilter {
        state: q.get("state").map(|s| s.parse::<RunState>()).transpose()?,
        kind: q.get("kind").cloned(),
        after: q.get("after").cloned(),
        limit,
    };
    ok(app.runtime.list(&filter)?)
}

/// Everything about a run, with the audit entries about it (who decided, cancelled, set an
/// alarm), secrets redacted.
async fn show(State(app): State<AppState>, Path(run_id): Path<String>) -> ApiResult {
    let inspection = app.runtime.inspect(&run_id)?;
    let mut shown = serde_json::to_value(&inspection).map_err(|e| bad_request(e.to_string()))?;
    let audit = durafiber_store::access::of_run(app.runtime.store(), &run_id).map_err(RuntimeError::from)?;
    for approval in shown["approvals"].as_array_mut().into_iter().flatten() {
        if let Some(name) = decided_by(&audit, approval) {
            approval["decided_by"] = json!(name);
        }
    }
    shown["audit"] = json!(audit);
    let text = serde_json::to_string(&shown).map_err(|e| bad_request(e.to_string()))?;
    let redacted: Value =
        serde_json::from_str(&app.secrets.redact(&text)).map_err(|e| bad_request(e.to_string()))?;
    Ok(Json(redacted).into_response())
}

/// The token that recorded `approval`'s decision: the first audited request for it with
/// the same payload hash and answer (a repeat of it changes nothing; another answer is
/// refused as already decided).
fn decided_by<'a>(audit: &'a [durafiber_store::access::AuditRecord], approval: &Value) -> Option<&'a str> {
    let id = approval["approval_id"].as_str()?;
    let approved = approval["decision"]["approved"].as_bool()?;
    let hash = approval["payload_hash"].as_str()?;
    audit
        .iter()
        .find(|e| {
            e.action == "approve"
                && e.detail.starts_with(&format!("approval={id} "))
                && e.detail.contains(&format!("approved={approved}"))
                && e.detail.contains(&format!("payload_hash={}", json!(hash)))
        })
        .map(|e| e.actor.as_str())
}

#[derive(Deserialize, Default)]
struct CancelBody {
    #[serde(default)]
    reason: Option<String>,
}

async fn cancel(State(app): State<AppState>, Path(run_id): Path<String>, body: Bytes) -> ApiResult {
    let body: CancelBody = if body.is_empty() { CancelBody::default() } else { parse(&body)? };
    let reason = body.reason.unwrap_or_else(|| "cancelled through the API".into());
    ok(json!({"run_id": run_id, "status": app.runtime.cancel(&run_id, &reason).await?}))
}

async fn message(State(app): State<AppState>, Path(run_id): Path<String>, body: Bytes) -> ApiResult {
    let value: Value = parse(&body)?;
    app.runtime.send_json(&run_id, &value.to_string()).await?;
    ok(json!({"run_id": run_id, "handled": true}))
}

async fn request(State(app): State<AppState>, Path(run_id): Path<String>, body: Bytes) -> ApiResult {
    let value: Value = parse(&body)?;
    let reply = app.runtime.request_json(&run_id, &value.to_string()).await?;
    let reply: Value = serde_json::from_str(&app.secrets.redact(&reply))
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string(), "Internal"))?;
    ok(json!({"run_id": run_id, "reply": reply}))
}

/// A page of the run's storage, secrets redacted; `next` is the `start_after` of the next
/// page, present when this one is full.
async fn storage(State(app): State<AppState>, Path(run_id): Path<String>, Query(q): Params) -> ApiResult {
    let limit: usize = match q.get("limit") {
        None => 100,
        Some(text) => {
            text.parse().map_err(|_| bad_request(format!("limit must be a number, not {text:?}")))?
        }
    };
    let limit = limit.clamp(1, durafiber_runtime::limits::STORAGE_LIST_MAX);
    let prefix = q.get("prefix").map(String::as_str).unwrap_or("");
    let page = app.runtime.storage_list(&run_id, prefix, q.get("start_after").map(String::as_str), limit)?;
    let next = if page.len() == limit { page.last().map(|(k, _)| k.clone()) } else { None };
    let mut entries = Vec::with_capacity(page.len());
    for (key, text) in page {
        let value: Value = serde_json::from_str(&app.secrets.redact(&text))
            .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string(), "Internal"))?;
        entries.push(json!({"key": key, "value": value}));
    }
    ok(json!({"run_id": run_id, "entries": entries, "next": next}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EventBody {
    #[serde(default)]
    payload: Value,
    idempotency_key: Option<String>,
}

async fn send_event(
    State(app): State<AppState>,
    Path((run_id, name)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult {
    let body: EventBody = parse(&body)?;
    let outcome = app
        .runtime
        .send_event_json(&run_id, &name, &body.payload.to_string(), body.idempotency_key.as_deref())
        .await?;
    ok(json!({"run_id": run_id, "name": name, "outcome": outcome}))
}

async fn approvals(State(app): State<AppState>) -> ApiResult {
    ok(app.runtime.pending_approvals(None)?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApproveBody {
    payload_hash: String,
    approved: bool,
    #[serde(default)]
    comment: String,
}

async fn approve(
    State(app): State<AppState>,
    Path((run_id, approval_id)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult {
    let body: ApproveBody = parse(&body)?;
    let decision = Decision { approved: body.approved, comment: body.comment };
    ok(app.runtime.approve(&run_id, &approval_id, &body.payload_hash, decision).await?)
}

async fn alarms(State(app): State<AppState>, Path(run_id): Path<String>) -> ApiResult {
    ok(app.runtime.alarms(&run_id)?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AlarmBody {
    delay_ms: Option<u64>,
    at_ms: Option<u64>,
    #[serde(default)]
    payload: Value,
    every_ms: Option<u64>,
}

async fn set_alarm(
    State(app): State<AppState>,
    Path((run_id, name)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult {
    let body: AlarmBody = parse(&body)?;
    let at = match (body.delay_ms, body.at_ms) {
        (Some(d), None) => AlarmAt::In(Duration::from_millis(d)),
        (None, Some(t)) => AlarmAt::AtMs(t),
        _ => return Err(bad_request("give exactly one of delay_ms and at_ms")),
    };
    let spec = AlarmSpec {
        at,
        payload_json: body.payload.to_string(),
        every: body.every_ms.map(Duration::from_millis),
    };
    app.runtime.set_alarm(&run_id, &name, spec).await?;
    ok(json!({"run_id": run_id, "name": name, "set": true}))
}

async fn cancel_alarm(
    State(app): State<AppState>,
    Path((run_id, name)): Path<(String, String)>,
) -> ApiResult {
    ok(json!({"run_id": run_id, "name": name, "cancelled": app.runtime.cancel_alarm(&run_id, &name).await?}))
}

/// Prometheus' text exposition format, for scrapers.
async fn metrics(State(app): State<AppState>) -> ApiResult {
    let Some(handle) = &app.prometheus else {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            "no Prometheus recorder in this process".into(),
            "NotFound",
        ));
    };
    let text = handle.render();
    Ok(([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

/// This runtime's counters and histogram summaries as JSON.
async fn metrics_json(State(app): State<AppState>) -> ApiResult {
    ok(app.runtime.metrics())
}

#[derive(Deserialize)]
struct EventsQuery {
    run_id: Option<String>,
}

async fn events(State(app): State<AppState>, Query(q): Query<EventsQuery>) -> ApiResult {
    let events: Vec<_> = app
        .runtime
        .events()
        .into_iter()
        .filter(|e| q.run_id.as_ref().is_none_or(|r| *r == e.run_id))
        .collect();
    ok(events)
}

/// A consistent backup of the store, taken while it serves (`durafiber backup --server`).
async fn backup(State(s): State<AppState>) -> ApiResult {
    let bytes = durafiber_store::repair::backup_bytes(s.runtime.store()).await.map_err(RuntimeError::from)?;
    Ok(([(axum::http::header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}

/// 200 while the store takes writes (saying when space is low); 503 once it has failed.
async fn health(State(s): State<AppState>) -> Response {
    let h = s.runtime.store().health();
    let body = json!({
        "ok": h.failed.is_none(), "failed": h.failed, "parked": h.parked,
        "low_on_space": h.low_on_space, "free_bytes": h.free_bytes,
    });
    let status = if h.failed.is_none() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(body)).into_response()
}

/// A read of runs, approvals or alarms answers only once what it read is durable: the
/// runtime shows a boundary as soon as it is applied, before its group commit is on disk, and
/// a client or a human must never act on a state that a crash right after the answer takes
/// back (a pending approval that is gone after a restart, say). Free when no write is in
/// flight; the process views (/health, /metrics, /events) and /backup do not wait.
async fn durable_reads(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let reads_runs = req.method() == Method::GET
        && (req.uri().path().starts_with("/runs") || req.uri().path() == "/approvals");
    let response = next.run(req).await;
    if reads_runs
        && response.status().is_success()
        && let Err(e) = app.runtime.store().settle_reads().await
    {
        return ApiError::from(RuntimeError::from(e)).into_response();
    }
    response
}

async fn not_found() -> ApiError {
    ApiError(StatusCode::NOT_FOUND, "no such endpoint".into(), "NotFound")
}

/// The API's routes.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/runs", post(start).get(list))
        .route("/runs/{id}", get(show))
        .route("/runs/{id}/cancel", post(cancel))
        .route("/runs/{id}/messages", post(message))
        .route("/runs/{id}/requests", post(request))
        .route("/runs/{id}/storage", get(storage))
        .route("/runs/{id}/events/{name}", post(send_event))
        .route("/runs/{id}/approvals/{approval_id}", post(approve))
        .route("/runs/{id}/alarms", get(alarms))
        .route("/runs/{id}/alarms/{name}", put(set_alarm).delete(cancel_alarm))
        .route("/approvals", get(approvals))
        .route("/metrics", get(metrics))
        .route("/metrics/json", get(metrics_json))
        .route("/backup", get(backup))
        .route("/events", get(events))
        .route("/tokens", post(admin::create_token).get(admin::list_tokens))
        .route("/tokens/{name}", delete(admin::revoke_token))
        .route("/audit", get(admin::audit))
        .fallback(not_found)
        .method_not_allowed_fallback(|| async {
            ApiError(StatusCode::METHOD_NOT_ALLOWED, "method not allowed here".into(), "MethodNotAllowed")
        })
        .layer(middleware::from_fn_with_state(state.clone(), durable_reads))
        .layer(middleware::from_fn_with_state(state.clone(), guard::authorize))
        .layer(middleware::from_fn_with_state(state.clone(), guard::browser_safe))
        .layer(middleware::from_fn(guard::size_limits))
        .layer(axum::extract::DefaultBodyLimit::max(durafiber_runtime::limits::HTTP_BODY_BYTES_MAX))
        .layer(middleware::from_fn(guard::json_errors))
        .with_state(state)
}
