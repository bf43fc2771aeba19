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
    AlarmAt, AlarmSpec, Decision, DurabilityMode, ListFilter, RunOptions, RunState, RuntimeError,
    canonical_json,
};
use futures::StreamExt as _;
use serde::Deserialize;

pub use super::state::{ApiError, AppState, prometheus};
use super::{admin, console, guard, view};
use serde_json::{Value, json};

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
    Ok(Json(view::run(&app, &run_id)?).into_response())
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

/// Prometheus' text exposition format, for scrapers: the counters and histograms the
/// runtime records as it goes, and gauges read from the store now (runs by state, live and
/// hibernated actors, pending alarms).
async fn metrics(State(app): State<AppState>) -> ApiResult {
    let Some(handle) = &app.prometheus else {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            "no Prometheus recorder in this process".into(),
            "NotFound",
        ));
    };
    let gauges = app.runtime.gauges()?;
    for state in RunState::ALL {
        let count = gauges.runs_by_state.get(state.name()).copied().unwrap_or(0);
        ::metrics::gauge!("durafiber_runs", "state" => state.name()).set(count as f64);
    }
    ::metrics::gauge!("durafiber_live_actors").set(gauges.live_actors as f64);
    ::metrics::gauge!("durafiber_hibernated_runs").set(gauges.hibernated_runs as f64);
    ::metrics::gauge!("durafiber_pending_alarms").set(gauges.pending_alarms as f64);
    let text = handle.render();
    Ok(([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text)
        .into_response())
}

/// This runtime's counters and histogram summaries as JSON.
async fn metrics_json(State(app): State<AppState>) -> ApiResult {
    ok(app.runtime.metrics())
}

/// How often an event stream looks for new events.
const EVENT_POLL: Duration = Duration::from_millis(200);
/// Most events one read of the log hands an event stream.
const EVENT_BATCH: usize = 256;

/// The event log after `after` (or `Last-Event-ID`), of one run or all. As JSON, or, when
/// the client accepts `text/event-stream`, as server-sent events that follow the log until
/// the client leaves or the server stops: each an `event: run` with its `id` (its `seq`)
/// and the event as JSON.
async fn events(State(app): State<AppState>, headers: HeaderMap, Query(q): Params) -> ApiResult {
    let run_id = q.get("run_id").cloned();
    let resume = headers.get("last-event-id").and_then(|v| v.to_str().ok()).map(str::to_string);
    let after = match q.get("after").or(resume.as_ref()) {
        None => 0,
        Some(text) => {
            text.parse::<u64>().map_err(|_| bad_request(format!("after must be a number, not {text:?}")))?
        }
    };
    let streams = headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    if !streams {
        return ok(app.runtime.events_since(after, run_id.as_deref(), usize::MAX));
    }
    let stream = futures::stream::unfold((app, run_id, after), |(app, run_id, mut after)| async move {
        let mut stopping = app.stopping.clone();
        loop {
            if *stopping.borrow() {
                return None;
            }
            let batch = app.runtime.events_since(after, run_id.as_deref(), EVENT_BATCH);
            if let Some(last) = batch.last() {
                after = last.seq;
                return Some((batch, (app, run_id, after)));
            }
            tokio::select! {
                () = tokio::time::sleep(EVENT_POLL) => {}
                _ = stopping.changed() => {}
            }
        }
    })
    .flat_map(|batch| {
        futures::stream::iter(batch.into_iter().map(|e| {
            let json = serde_json::to_string(&e).unwrap_or_default();
            Ok::<_, std::convert::Infallible>(
                axum::response::sse::Event::default().event("run").id(e.seq.to_string()).data(json),
            )
        }))
    });
    Ok(axum::response::sse::Sse::new(stream)
        .keep_alive(axum::response::sse::KeepAlive::default())
        .into_response())
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
/// flight; the process views (/health, /metrics, /events) and /backup do not wait. The
/// console's pages wait too: a reviewer decides on what they show.
async fn durable_reads(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let console_page = guard::is_console(path) && !path.starts_with("/ui/static/");
    let reads_runs =
        req.method() == Method::GET && (path.starts_with("/runs") || path == "/approvals" || console_page);
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
        .route("/metrics.json", get(metrics_json))
        .route("/backup", get(backup))
        .route("/events", get(events))
        .route("/tokens", post(admin::create_token).get(admin::list_tokens))
        .route("/tokens/{name}", delete(admin::revoke_token))
        .route("/audit", get(admin::audit))
        .merge(console::router())
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
