//! The HTTP JSON API's handlers over a [`durafiber_runtime::Runtime`]; `routes.rs` wires them. Bodies are parsed by hand so that malformed JSON
//! gets the same JSON error shape as every other refusal; nothing a client sends can crash
//! the server.

use std::time::Duration;

use axum::{
    Json,
    body::Bytes,
    extract::{Path, Query, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use durafiber_runtime::{
    Alarm, AlarmAt, AlarmSpec, ApproveOutcome, Budget, CronSchedule, Decision, DurabilityMode, Event,
    ListFilter, MetricsSnapshot, PendingApproval, RunOptions, RunPage, RunState, RuntimeError, StartOutcome,
    StreamChunk, canonical_json,
};
use futures::StreamExt as _;

use crate::schema::{
    AlarmBody, AlarmCancelled, AlarmSet, ApproveBody, CancelBody, Cancelled, ErrorBody, EventBody, EventSent,
    Handled, Health, PauseBody, PauseOutcome, Paused, PausedEntry, Reply, RunView, StartBody, StorageEntry,
    StoragePage,
};

use crate::{
    state::{ApiError, ApiResult, AppState, Params, bad_request, ok, parse, parse_value},
    view,
};
use serde_json::{Value, json};

#[utoipa::path(post, path = "/runs", tag = "runs",
    params(("Idempotency-Key" = String, Header, description = "a repeat with the same key returns the same run")),
    request_body = StartBody,
    responses((status = 201, description = "accepted: the run is durable", body = StartOutcome),
        (status = 200, description = "the key was known: the same run", body = StartOutcome), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn start(State(app): State<AppState>, headers: HeaderMap, body: Bytes) -> ApiResult {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| bad_request("an Idempotency-Key header is required"))?
        .to_string();
    // As the document says: visible ASCII, spaces only within, at most ID_CHARS_MAX.
    let printable = |b: &u8| (0x21..=0x7e).contains(b);
    let bytes = key.as_bytes();
    let shaped = bytes.first().is_some_and(printable)
        && bytes.last().is_some_and(printable)
        && bytes.iter().all(|b| *b == b' ' || printable(b))
        && bytes.len() <= durafiber_store::tables::ID_CHARS_MAX;
    if !shaped {
        return Err(bad_request(format!(
            "an Idempotency-Key is 1 to {} visible ASCII characters, spaces only within",
            durafiber_store::tables::ID_CHARS_MAX
        )));
    }
    let body: StartBody = parse(&body)?;
    let options = body.options.unwrap_or_default();
    let input = canonical_json(&body.input).map_err(bad_request)?;
    let durability = options.durability.as_deref().map(DurabilityMode::parse).transpose()?;
    let budget = match options.budget {
        None => Budget::default(),
        Some(b) => Budget {
            effects_max: b.effects_max,
            cost_units_max: b.cost_units_max,
            wall_time_max: b
                .wall_time_max
                .map(|text| {
                    humantime::parse_duration(&text)
                        .map_err(|e| bad_request(format!("budget.wall_time_max {text:?}: {e}")))
                })
                .transpose()?,
            recoveries_max: b.recoveries_max,
        },
    };
    let out = app
        .runtime
        .start_json(
            &body.kind,
            &key,
            &input,
            RunOptions { durability, fiber_keep_alive: options.fiber_keep_alive, budget },
        )
        .await?;
    let status = if out.accepted { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(json!(out))).into_response())
}

#[utoipa::path(get, path = "/runs", tag = "runs",
    params(("state" = Option<RunState>, Query, description = "only runs in this state"),
        ("kind" = Option<String>, Query, description = "only runs of this kind"),
        ("after" = Option<String>, Query, description = "the previous page's `next`"),
        ("limit" = Option<u32>, Query, description = "page size (default 50)", minimum = 1, maximum = 1000),
        ("stash_version_below" = Option<u32>, Query, description = "only open runs whose last stash is older than this STASH_VERSION")),
    responses((status = 200, description = "a page of runs, in run-id order", body = RunPage), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn list(State(app): State<AppState>, Query(q): Params) -> ApiResult {
    let max = durafiber_runtime::limits::LIST_PAGE_MAX as u64;
    let limit = crate::state::bounded(&q, "limit", 1, max)?.unwrap_or(50) as usize;
    // An empty kind or `after` is no filter; a state is one of the document's names.
    let given = |name: &str| q.get(name).filter(|v| !v.is_empty()).cloned();
    let filter = ListFilter {
        state: q.get("state").map(|s| s.parse::<RunState>()).transpose()?,
        kind: given("kind"),
        after: given("after"),
        limit,
        stash_version_below: crate::state::bounded(&q, "stash_version_below", 0, i32::MAX as u64)?
            .map(|v| v as u32),
    };
    ok(app.runtime.list(&filter)?)
}

/// Everything about a run, with the audit entries about it (who decided, cancelled, set an
/// alarm), secrets redacted.
#[utoipa::path(get, path = "/runs/{id}", tag = "runs", params(("id" = String, Path, description = "the run id")),
    responses((status = 200, description = "everything stored about the run", body = RunView), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn show(State(app): State<AppState>, Path(run_id): Path<String>) -> ApiResult {
    Ok(Json(view::run(&app, &run_id)?).into_response())
}

#[utoipa::path(post, path = "/runs/{id}/cancel", tag = "runs", params(("id" = String, Path, description = "the run id")),
    request_body(content = Option<CancelBody>, description = "optional: the reason"),
    responses((status = 200, description = "cancellation recorded", body = Cancelled), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn cancel(
    State(app): State<AppState>,
    Path(run_id): Path<String>,
    body: Bytes,
) -> ApiResult {
    // No body, or `null`, is a cancel without a reason.
    let body: CancelBody = if body.is_empty() {
        CancelBody::default()
    } else {
        parse::<Option<CancelBody>>(&body)?.unwrap_or_default()
    };
    let reason = body.reason.unwrap_or_else(|| "cancelled through the API".into());
    ok(Cancelled { status: app.runtime.cancel(&run_id, &reason).await?, run_id })
}

#[utoipa::path(post, path = "/kinds/{kind}/pause", tag = "operations", params(("kind" = String, Path, description = "the agent kind")),
    request_body = PauseBody,
    responses((status = 200, description = "paused: its runs park at their next effect or start, new starts park, alarms are held", body = PauseOutcome), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn pause_kind(
    State(app): State<AppState>,
    Path(kind): Path<String>,
    body: Bytes,
) -> ApiResult {
    let body: PauseBody = parse(&body)?;
    app.runtime.pause_kind(&kind, &body.reason).await?;
    ok(PauseOutcome { target: kind, paused: true, changed: true })
}

#[utoipa::path(post, path = "/kinds/{kind}/resume", tag = "operations", params(("kind" = String, Path, description = "the agent kind")),
    responses((status = 200, description = "resumed (or was not paused): its runs continue in the order they were paused", body = PauseOutcome), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn resume_kind(State(app): State<AppState>, Path(kind): Path<String>) -> ApiResult {
    if !app.runtime.kinds().contains(&kind) {
        return Err(RuntimeError::UnknownKind { kind }.into());
    }
    let changed = app.runtime.resume_kind(&kind).await?;
    ok(PauseOutcome { target: kind, paused: false, changed })
}

#[utoipa::path(post, path = "/runs/{id}/pause", tag = "runs", params(("id" = String, Path, description = "the run id")),
    request_body = PauseBody,
    responses((status = 200, description = "paused: it parks at its next effect", body = PauseOutcome), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn pause_run(
    State(app): State<AppState>,
    Path(run_id): Path<String>,
    body: Bytes,
) -> ApiResult {
    let body: PauseBody = parse(&body)?;
    app.runtime.pause_run(&run_id, &body.reason).await?;
    ok(PauseOutcome { target: run_id, paused: true, changed: true })
}

#[utoipa::path(post, path = "/runs/{id}/resume", tag = "runs", params(("id" = String, Path, description = "the run id")),
    responses((status = 200, description = "resumed (or was not paused by itself)", body = PauseOutcome), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn resume_run(State(app): State<AppState>, Path(run_id): Path<String>) -> ApiResult {
    let changed = app.runtime.resume_run(&run_id).await?;
    ok(PauseOutcome { target: run_id, paused: false, changed })
}

#[utoipa::path(get, path = "/paused", tag = "operations",
    responses((status = 200, description = "the kinds and runs paused now", body = Paused), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn paused(State(app): State<AppState>) -> ApiResult {
    let entry = |(target, p): (String, durafiber_runtime::PauseRecord)| PausedEntry {
        target,
        reason: p.reason,
        paused_at_ms: p.paused_at_ms,
    };
    let now = app.runtime.paused();
    ok(Paused {
        kinds: now.kinds.into_iter().map(entry).collect(),
        runs: now.runs.into_iter().map(entry).collect(),
    })
}

#[utoipa::path(post, path = "/runs/{id}/messages", tag = "runs", params(("id" = String, Path, description = "the run id")),
    request_body(content = Value, description = "the agent's message type, as JSON"),
    responses((status = 200, description = "handled by `on_message`", body = Handled), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn message(
    State(app): State<AppState>,
    Path(run_id): Path<String>,
    body: Bytes,
) -> ApiResult {
    let value: Value = parse_value(&body)?;
    app.runtime.send_json(&run_id, &value.to_string()).await?;
    ok(Handled { run_id, handled: true })
}

#[utoipa::path(post, path = "/runs/{id}/requests", tag = "runs", params(("id" = String, Path, description = "the run id")),
    request_body(content = Value, description = "the agent's message type, as JSON"),
    responses((status = 200, description = "`on_request`'s reply", body = Reply), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn request(
    State(app): State<AppState>,
    Path(run_id): Path<String>,
    body: Bytes,
) -> ApiResult {
    let value: Value = parse_value(&body)?;
    let reply = app.runtime.request_json(&run_id, &value.to_string()).await?;
    let reply: Value = serde_json::from_str(&app.secrets.redact(&reply))
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string(), "Internal"))?;
    ok(Reply { run_id, reply })
}

/// A page of the run's storage, secrets redacted; `next` is the `start_after` of the next
/// page, present when this one is full.
#[utoipa::path(get, path = "/runs/{id}/storage", tag = "runs",
    params(("id" = String, Path, description = "the run id"), ("prefix" = Option<String>, Query, description = "only keys with this prefix"),
        ("start_after" = Option<String>, Query, description = "the previous page's `next`"),
        ("limit" = Option<u32>, Query, description = "page size (default 100)", minimum = 1, maximum = 10000)),
    responses((status = 200, description = "a page of the run's storage", body = StoragePage), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn storage(
    State(app): State<AppState>,
    Path(run_id): Path<String>,
    Query(q): Params,
) -> ApiResult {
    let max = durafiber_runtime::limits::STORAGE_LIST_MAX as u64;
    let limit = crate::state::bounded(&q, "limit", 1, max)?.unwrap_or(100) as usize;
    let prefix = q.get("prefix").map(String::as_str).unwrap_or("");
    let page = app.runtime.storage_list(&run_id, prefix, q.get("start_after").map(String::as_str), limit)?;
    let next = if page.len() == limit { page.last().map(|(k, _)| k.clone()) } else { None };
    let mut entries = Vec::with_capacity(page.len());
    for (key, text) in page {
        let value: Value = serde_json::from_str(&app.secrets.redact(&text))
            .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string(), "Internal"))?;
        entries.push(StorageEntry { key, value });
    }
    ok(StoragePage { run_id, entries, next })
}

#[utoipa::path(post, path = "/runs/{id}/events/{name}", tag = "runs",
    params(("id" = String, Path, description = "the run id"), ("name" = String, Path, description = "the event's name")),
    request_body = EventBody,
    responses((status = 200, description = "delivered, buffered or a duplicate", body = EventSent), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn send_event(
    State(app): State<AppState>,
    Path((run_id, name)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult {
    let body: EventBody = parse(&body)?;
    let outcome = app
        .runtime
        .send_event_json(&run_id, &name, &body.payload.to_string(), body.idempotency_key.as_deref())
        .await?;
    ok(EventSent { run_id, name, outcome })
}

#[utoipa::path(get, path = "/approvals", tag = "approvals",
    responses((status = 200, description = "pending approvals across runs", body = Vec<PendingApproval>), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn approvals(State(app): State<AppState>) -> ApiResult {
    ok(app.runtime.pending_approvals(None)?)
}

#[utoipa::path(post, path = "/runs/{id}/approvals/{approval_id}", tag = "approvals",
    params(("id" = String, Path, description = "the run id"), ("approval_id" = String, Path, description = "the pause within the run")),
    request_body = ApproveBody,
    responses((status = 200, description = "the decision is recorded (or was, the same)", body = ApproveOutcome), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn approve(
    State(app): State<AppState>,
    Path((run_id, approval_id)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult {
    let body: ApproveBody = parse(&body)?;
    let decision = Decision { approved: body.approved, comment: body.comment };
    ok(app.runtime.approve(&run_id, &approval_id, &body.payload_hash, decision).await?)
}

#[utoipa::path(get, path = "/runs/{id}/alarms", tag = "alarms", params(("id" = String, Path, description = "the run id")),
    responses((status = 200, description = "the run's pending alarms, the runtime's own marked", body = Vec<Alarm>), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn alarms(State(app): State<AppState>, Path(run_id): Path<String>) -> ApiResult {
    ok(app.runtime.alarms(&run_id)?)
}

#[utoipa::path(put, path = "/runs/{id}/alarms/{name}", tag = "alarms",
    params(("id" = String, Path, description = "the run id"), ("name" = String, Path, description = "the alarm's name")),
    request_body = AlarmBody,
    responses((status = 200, description = "set (or replaced)", body = AlarmSet), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn set_alarm(
    State(app): State<AppState>,
    Path((run_id, name)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult {
    let body: AlarmBody = parse(&body)?;
    let at = match (body.delay_ms, body.at_ms, &body.cron) {
        (Some(d), None, None) => AlarmAt::In(Duration::from_millis(d)),
        (None, Some(t), None) => AlarmAt::AtMs(t),
        (None, None, Some(_)) if body.every_ms.is_none() => AlarmAt::In(Duration::ZERO),
        _ => {
            return Err(bad_request(
                "give exactly one of delay_ms, at_ms and cron (and no every_ms with cron)",
            ));
        }
    };
    let cron = match (&body.cron, &body.time_zone) {
        (Some(expr), zone) => {
            let cron = CronSchedule::parse(expr)?;
            Some(match zone {
                Some(zone) => cron.in_time_zone(zone)?,
                None => cron,
            })
        }
        (None, Some(_)) => return Err(bad_request("time_zone is for a cron alarm")),
        (None, None) => None,
    };
    let spec = AlarmSpec {
        at,
        payload_json: body.payload.to_string(),
        every: body.every_ms.map(Duration::from_millis),
        cron,
    };
    app.runtime.set_alarm(&run_id, &name, spec).await?;
    ok(AlarmSet { run_id, name, set: true })
}

#[utoipa::path(delete, path = "/runs/{id}/alarms/{name}", tag = "alarms",
    params(("id" = String, Path, description = "the run id"), ("name" = String, Path, description = "the alarm's name")),
    responses((status = 200, description = "cancelled, or there was none", body = AlarmCancelled), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn cancel_alarm(
    State(app): State<AppState>,
    Path((run_id, name)): Path<(String, String)>,
) -> ApiResult {
    let cancelled = app.runtime.cancel_alarm(&run_id, &name).await?;
    ok(AlarmCancelled { run_id, name, cancelled })
}

/// Prometheus' text exposition format, for scrapers: the counters and histograms the
/// runtime records as it goes, and gauges read from the store now (runs by state, live and
/// hibernated actors, pending alarms).
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text exposition format", body = String, content_type = "text/plain"), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn metrics(State(app): State<AppState>) -> ApiResult {
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
#[utoipa::path(get, path = "/metrics.json", tag = "operations",
    responses((status = 200, description = "this runtime's counters and latency summaries", body = MetricsSnapshot), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn metrics_json(State(app): State<AppState>) -> ApiResult {
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
#[utoipa::path(get, path = "/events", tag = "operations",
    params(("run_id" = Option<String>, Query, description = "only this run's events"),
        ("after" = Option<u64>, Query, description = "only events after this `seq` (or `Last-Event-ID`)", maximum = 9223372036854775807_u64)),
    responses((status = 200, description = "the event log, oldest first; with `Accept: text/event-stream`, server-sent events (`event: run`, `id: seq`) that follow it",
        content((Vec<Event> = "application/json"), (String = "text/event-stream"))), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn events(State(app): State<AppState>, headers: HeaderMap, Query(q): Params) -> ApiResult {
    let run_id = q.get("run_id").cloned();
    let resume = headers.get("last-event-id").and_then(|v| v.to_str().ok()).map(str::to_string);
    let after = match (crate::state::bounded(&q, "after", 0, i64::MAX as u64)?, resume) {
        (Some(after), _) => after,
        (None, Some(text)) => text
            .parse::<u64>()
            .map_err(|_| bad_request(format!("Last-Event-ID must be a number, not {text:?}")))?,
        (None, None) => 0,
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

/// A run's output stream from chunk `from` (or after `Last-Event-ID`). As JSON, the durable
/// chunks so far; with `Accept: text/event-stream`, server-sent events that follow the stream:
/// each chunk an `event: chunk` with its `id` (its `seq`) and its data as JSON, and, once the
/// run has ended and every chunk is sent, one `event: end` whose data is the run's state.
#[utoipa::path(get, path = "/runs/{id}/stream", tag = "runs",
    params(("id" = String, Path, description = "the run id"),
        ("from" = Option<u64>, Query, description = "the first chunk wanted (default 0; `Last-Event-ID` + 1 when resuming)")),
    responses((status = 200, description = "the durable chunks, in order; with `Accept: text/event-stream`, server-sent events (`event: chunk`, `id: seq`; `event: end` last) that follow the stream",
        content((Vec<StreamChunk> = "application/json"), (String = "text/event-stream"))), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn stream(
    State(app): State<AppState>,
    Path(run_id): Path<String>,
    headers: HeaderMap,
    Query(q): Params,
) -> ApiResult {
    let number = |name: &str, text: &str| {
        text.parse::<u64>().map_err(|_| bad_request(format!("{name} must be a number, not {text:?}")))
    };
    let from = match (q.get("from"), headers.get("last-event-id").and_then(|v| v.to_str().ok())) {
        (Some(from), _) => number("from", from)?,
        (None, Some(last)) => number("Last-Event-ID", last)?.saturating_add(1),
        (None, None) => 0,
    };
    let chunks = app.runtime.stream(&run_id, from)?;
    let streams = headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    if !streams {
        app.runtime.store().settle_reads().await.map_err(RuntimeError::from)?;
        return ok(app.runtime.stream_chunks(&run_id, from, usize::MAX)?);
    }
    type Sse = Result<axum::response::sse::Event, std::convert::Infallible>;
    let mut stopping = app.stopping.clone();
    let until_stopping = async move {
        let _ = stopping.wait_for(|stop| *stop).await;
    };
    let events = chunks.map(|chunk| -> Sse {
        Ok(match chunk {
            Ok(c) => {
                axum::response::sse::Event::default().event("chunk").id(c.seq.to_string()).data(c.data_json)
            }
            Err(e) => axum::response::sse::Event::default().event("error").data(e.to_string()),
        })
    });
    let runtime = app.runtime.clone();
    let end = futures::stream::once(async move {
        let state = runtime.status(&run_id).map(|s| s.name().to_string()).unwrap_or_default();
        Ok::<_, std::convert::Infallible>(axum::response::sse::Event::default().event("end").data(state))
    });
    let stream = events.chain(end).take_until(until_stopping);
    Ok(axum::response::sse::Sse::new(stream)
        .keep_alive(axum::response::sse::KeepAlive::default())
        .into_response())
}

/// A consistent backup of the store, taken while it serves (`durafiber backup --server`).
#[utoipa::path(get, path = "/backup", tag = "operations",
    responses((status = 200, description = "a consistent backup of the store", body = Vec<u8>, content_type = "application/octet-stream"), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn backup(State(s): State<AppState>) -> ApiResult {
    let bytes = durafiber_store::repair::backup_bytes(s.runtime.store()).await.map_err(RuntimeError::from)?;
    Ok(([(axum::http::header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}

/// 200 while the store takes writes (saying when space is low); 503 while its writes wait
/// for disk space (`parked`) and once it has failed.
#[utoipa::path(get, path = "/health", tag = "operations", security(()),
    responses((status = 200, description = "the store takes writes", body = Health),
        (status = 503, description = "the store has failed, or its writes wait for disk space (`parked`)", body = Health)))]
pub(super) async fn health(State(s): State<AppState>) -> Response {
    let h = s.runtime.store().health();
    let body = Health {
        // Parked for space, the store takes no write: not healthy, though nothing is lost.
        ok: h.failed.is_none() && !h.parked,
        failed: h.failed,
        parked: h.parked,
        low_on_space: h.low_on_space,
        free_bytes: h.free_bytes,
        node_id: s.runtime.node_id(),
        shards: s.runtime.node_id().map(|_| s.runtime.owned_shards().len()),
    };
    let status = if body.ok { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(body)).into_response()
}
