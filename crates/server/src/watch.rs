//! What operators watch through the API: Prometheus metrics and their JSON twin, the event
//! log as server-sent events, a run's output stream, a backup of the store, and health.

use durafiber_api::ApiErrorKind;
use durafiber_runtime::RunId;
use std::time::Duration;

use axum::{
    Json,
    extract::{Path, Query, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use durafiber_runtime::{Event, MetricsSnapshot, RunState, RuntimeError, StreamChunk, StreamItem};
use futures::StreamExt as _;

use crate::schema::{ErrorBody, Health};

use crate::state::{ApiError, ApiResult, AppState, Params, bad_request, ok};

/// Prometheus' text exposition format, for scrapers: the counters and histograms the
/// runtime records as it goes, and gauges read from the store now (runs by state, live and
/// hibernated actors, pending alarms, the store's bytes on disk and its checkpoint lag, each
/// named limit's calls waiting and in flight).
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text exposition format", body = String, content_type = "text/plain"), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn metrics(State(app): State<AppState>) -> ApiResult {
    let Some(handle) = &app.prometheus else {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            "no Prometheus recorder in this process".into(),
            ApiErrorKind::NotFound,
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
    ::metrics::gauge!("durafiber_store_bytes").set(gauges.store_bytes as f64);
    for (name, limit) in &gauges.limits {
        ::metrics::gauge!("durafiber_limit_waiting", "limit" => name.clone()).set(limit.waiting as f64);
        ::metrics::gauge!("durafiber_limit_in_flight", "limit" => name.clone()).set(limit.in_flight as f64);
    }
    if let Some(lag) = gauges.checkpoint_lag {
        ::metrics::gauge!("durafiber_checkpoint_lag_seconds").set(lag.as_secs_f64());
    }
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
        ("after" = Option<u64>, Query, description = "only events after this `seq` (or `Last-Event-ID`)", maximum = 9_223_372_036_854_775_807_u64),
        ("limit" = Option<u32>, Query, description = "page size of the JSON answer (default 100)", minimum = 1, maximum = 1000)),
    responses((status = 200, description = "a page of the event log, oldest first (when it is full, a `Link` header, `rel=\"next\"`, gives the next page's address); with `Accept: text/event-stream`, server-sent events (`event: run`, `id: seq`) that follow it",
        content((Vec<Event> = "application/json"), (String = "text/event-stream"))), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn events(State(app): State<AppState>, headers: HeaderMap, Query(q): Params) -> ApiResult {
    let run_id = q.get("run_id").map(|id| RunId::from(id.as_str()));
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
        let limit = crate::state::bounded(&q, "limit", 1, durafiber_runtime::limits::LIST_PAGE_MAX as u64)?
            .map_or(crate::state::PAGE_DEFAULT, |n| n as usize);
        let events = app.runtime.events_since(after, run_id.as_ref(), limit);
        let next = (events.len() == limit).then(|| events.last().map(|e| e.seq.to_string())).flatten();
        let keep: Vec<(&str, &str)> = run_id.as_ref().map(|id| ("run_id", id.as_str())).into_iter().collect();
        return crate::state::page_of(events, "/events", &keep, limit, next);
    }
    let stream = futures::stream::unfold((app, run_id, after), |(app, run_id, mut after)| async move {
        let mut stopping = app.stopping.clone();
        loop {
            if *stopping.borrow() {
                return None;
            }
            let batch = app.runtime.events_since(after, run_id.as_ref(), EVENT_BATCH);
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
/// Between them, a streaming effect's call running on this node sends `event: partial`
/// (`{"effect_id", "call", "index", "data"}`, no `id`: not durable) as it goes, and
/// `event: reset` (`{"effect_id", "reason"}`) when its chunks are taken back; a durable chunk
/// replaces every partial one shown before it.
#[utoipa::path(get, path = "/runs/{id}/stream", tag = "runs",
    params(("id" = String, Path, description = "the run id"),
        ("from" = Option<u64>, Query, description = "the first chunk wanted (default 0; `Last-Event-ID` + 1 when resuming)")),
    responses((status = 200, description = "the durable chunks, in order; with `Accept: text/event-stream`, server-sent events (`event: chunk`, `id: seq`; `event: partial` and `event: reset` for a streaming effect's call; `event: end` last) that follow the stream",
        content((Vec<StreamChunk> = "application/json"), (String = "text/event-stream"))), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn stream(
    State(app): State<AppState>,
    Path(run_id): Path<RunId>,
    headers: HeaderMap,
    uri: axum::http::Uri,
    Query(q): Params,
) -> ApiResult {
    type Sse = Result<axum::response::sse::Event, std::convert::Infallible>;
    let number = |name: &str, text: &str| {
        text.parse::<u64>().map_err(|_| bad_request(format!("{name} must be a number, not {text:?}")))
    };
    let from = match (q.get("from"), headers.get("last-event-id").and_then(|v| v.to_str().ok())) {
        (Some(from), _) => number("from", from)?,
        (None, Some(last)) => number("Last-Event-ID", last)?.saturating_add(1),
        (None, None) => 0,
    };
    let streams = headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    // A streaming effect's partial chunks are on the node that runs it: follow it there.
    let path = uri.path_and_query().map_or(uri.path(), |p| p.as_str());
    if streams && let Some(relayed) = crate::forward::stream_from_owner(&app, &run_id, &headers, path).await {
        return Ok(relayed);
    }
    let chunks = app.runtime.stream(&run_id, from)?;
    if !streams {
        app.runtime.store().settle_reads().await.map_err(RuntimeError::from)?;
        return ok(app.runtime.stream_chunks(&run_id, from, usize::MAX)?);
    }
    let mut stopping = app.stopping.clone();
    let until_stopping = async move {
        let _ = stopping.wait_for(|stop| *stop).await;
    };
    let events = chunks.map(|item| -> Sse {
        use axum::response::sse::Event;
        Ok(match item {
            Ok(StreamItem::Chunk(c)) => {
                Event::default().event("chunk").id(c.seq.to_string()).data(c.data_json)
            }
            Ok(StreamItem::Partial(p)) => Event::default().event("partial").data(partial_json(&p)),
            Ok(StreamItem::Reset(r)) => Event::default()
                .event("reset")
                .data(serde_json::json!({"effect_id": r.effect_id, "reason": r.reason}).to_string()),
            Err(e) => Event::default().event("error").data(e.to_string()),
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

/// A partial chunk's event data: `{"effect_id", "call", "index", "data"}`, the chunk as it
/// was sent.
fn partial_json(p: &durafiber_runtime::PartialChunk) -> String {
    let effect_id = serde_json::Value::from(p.effect_id.as_str());
    format!(r#"{{"effect_id":{effect_id},"call":{},"index":{},"data":{}}}"#, p.call, p.index, p.data_json)
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
