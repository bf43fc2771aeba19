//! The HTTP JSON API's handlers of runs, approvals, alarms and events over a
//! [`durafiber_runtime::Runtime`] (what operators watch is in `watch.rs`); `routes.rs` wires
//! them. Bodies are parsed by hand so that malformed JSON gets the same JSON error shape as
//! every other refusal; nothing a client sends can crash the server.

use durafiber_api::ApiErrorKind;
use durafiber_api::Timestamp;
use durafiber_runtime::RunId;
use durafiber_runtime::StartRequest;
use std::time::Duration;

use axum::{
    Json,
    body::Bytes,
    extract::{Path, Query, State},
    http::{HeaderMap, StatusCode},
    response::IntoResponse,
};
use durafiber_runtime::{
    Alarm, AlarmAt, AlarmSpec, ApproveOutcome, Budget, CronSchedule, Decision, DurabilityMode, ForkOptions,
    HistoryEntry, ListFilter, PendingApproval, RunDeleted, RunOptions, RunPage, RunState, RuntimeError,
    StartOutcome, canonical_json,
};

use crate::schema::{
    AlarmBody, AlarmCancelled, AlarmSet, ApproveBody, CancelBody, Cancelled, ErrorBody, EventBody, EventSent,
    ForkBody, Handled, PauseBody, PauseOutcome, Paused, PausedEntry, Reply, RunView, StartBody, StartOptions,
    StorageEntry, StoragePage,
};

use crate::{
    state::{ApiError, ApiResult, AppState, PageQuery, Params, bad_request, ok, page_of, parse, parse_value},
    view,
};
use serde_json::{Value, json};

#[utoipa::path(post, path = "/runs", tag = "runs",
    params(("Idempotency-Key" = String, Header, description = "a repeat with the same key returns the same run"),
        ("traceparent" = Option<String>, Header, description = "W3C Trace Context: the run's trace links to this span (a malformed one is ignored)")),
    request_body = StartBody,
    responses((status = 201, description = "accepted: the run is durable", body = StartOutcome),
        (status = 200, description = "the key was known: the same run", body = StartOutcome), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn start(State(app): State<AppState>, headers: HeaderMap, body: Bytes) -> ApiResult {
    let key = idempotency_key(&headers)?;
    let body: StartBody = parse(&body)?;
    let options = run_options(body.options.unwrap_or_default())?;
    // A caller in a trace links the run's trace to it; a malformed header is ignored.
    let traceparent = headers.get("traceparent").and_then(|v| v.to_str().ok());
    let input = integral_numbers(body.input);
    let request =
        StartRequest::new(&body.kind, &key, input).with_options(options).with_traceparent(traceparent);
    let out = app.runtime.start_run(request).await?;
    let status = if out.accepted { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(json!(out))).into_response())
}

/// `input` with every number that has no fraction (`3.0`, `1e3`) written as an integer, as
/// JSON Schema reads it: an agent's integer field takes what its schema in the document
/// says is an integer.
fn integral_numbers(input: Value) -> Value {
    match input {
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or(f64::NAN);
            let whole = f.fract() == 0.0 && f.abs() < 9.007_199_254_740_992e15;
            // Within 2^53 a whole f64 is exactly its integer.
            if whole { Value::from(f as i64) } else { Value::Number(n) }
        }
        Value::Array(items) => Value::Array(items.into_iter().map(integral_numbers).collect()),
        Value::Object(map) => Value::Object(map.into_iter().map(|(k, v)| (k, integral_numbers(v))).collect()),
        other => other,
    }
}

/// The `Idempotency-Key` header, as the document says: visible ASCII, spaces only within,
/// at most `ID_CHARS_MAX`.
fn idempotency_key(headers: &HeaderMap) -> Result<String, ApiError> {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| bad_request("an Idempotency-Key header is required"))?
        .to_string();
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
    Ok(key)
}

/// A new run's options as the API takes them.
fn run_options(options: StartOptions) -> Result<RunOptions, ApiError> {
    let durability =
        options.durability.as_deref().map(DurabilityMode::parse).transpose().map_err(RuntimeError::from)?;
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
    Ok(RunOptions { durability, fiber_keep_alive: options.fiber_keep_alive, budget })
}

#[utoipa::path(get, path = "/runs/{id}/history", tag = "runs", params(("id" = String, Path, description = "the run id")),
    responses((status = 200, description = "the boundaries the run's history keeps (the last `history_max`), oldest first: each stash as it was written", body = Vec<HistoryEntry>), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn history(State(app): State<AppState>, Path(run_id): Path<RunId>) -> ApiResult {
    ok(app.runtime.history(&run_id)?)
}

#[utoipa::path(post, path = "/runs/{id}/fork", tag = "runs",
    params(("id" = String, Path, description = "the run to fork"),
        ("Idempotency-Key" = String, Header, description = "the fork's key: a repeat returns the same fork")),
    request_body = ForkBody,
    responses((status = 201, description = "forked: a new run from that boundary, what came before it inherited", body = StartOutcome),
        (status = 200, description = "the key was known: the same run", body = StartOutcome), (status = "4XX", description = "refused: the JSON error shape (409 `ForkRefused` when what the fork needs cannot be known)", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn fork(
    State(app): State<AppState>,
    Path(run_id): Path<RunId>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult {
    let key = idempotency_key(&headers)?;
    let body: ForkBody = parse(&body)?;
    let input_json = body.input.as_ref().map(canonical_json).transpose().map_err(bad_request)?;
    let run = run_options(body.options.unwrap_or_default())?;
    let out = app.runtime.fork(&run_id, body.at, &key, ForkOptions { input_json, run }).await?;
    let status = if out.accepted { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(json!(out))).into_response())
}

#[utoipa::path(get, path = "/runs", tag = "runs",
    params(("state" = inline(Option<RunState>), Query, description = "only runs in this state"),
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
        state: q.get("state").map(|s| s.parse::<RunState>()).transpose().map_err(RuntimeError::from)?,
        kind: given("kind"),
        after: given("after").map(RunId::from),
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
pub(super) async fn show(State(app): State<AppState>, Path(run_id): Path<RunId>) -> ApiResult {
    Ok(Json(view::run(&app, &run_id)?).into_response())
}

/// Deletes a settled run and every record it owns (admin); the audit trail keeps its entries.
#[utoipa::path(delete, path = "/runs/{id}", tag = "runs", params(("id" = String, Path, description = "the run id")),
    responses((status = 200, description = "deleted, with how many records went", body = RunDeleted), (status = "4XX", description = "refused: the JSON error shape (409 `RunOpen` for a run that is not settled, `KeptWithParent` for a child of a run that exists)", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn delete(State(app): State<AppState>, Path(run_id): Path<RunId>) -> ApiResult {
    ok(app.runtime.delete_run(&run_id).await?)
}

#[utoipa::path(post, path = "/runs/{id}/cancel", tag = "runs", params(("id" = String, Path, description = "the run id")),
    request_body(content = Option<CancelBody>, description = "optional: the reason"),
    responses((status = 200, description = "cancellation recorded", body = Cancelled), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn cancel(State(app): State<AppState>, Path(run_id): Path<RunId>, body: Bytes) -> ApiResult {
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
    Path(run_id): Path<RunId>,
    body: Bytes,
) -> ApiResult {
    let body: PauseBody = parse(&body)?;
    app.runtime.pause_run(&run_id, &body.reason).await?;
    ok(PauseOutcome { target: run_id.into_string(), paused: true, changed: true })
}

#[utoipa::path(post, path = "/runs/{id}/resume", tag = "runs", params(("id" = String, Path, description = "the run id")),
    responses((status = 200, description = "resumed (or was not paused by itself)", body = PauseOutcome), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn resume_run(State(app): State<AppState>, Path(run_id): Path<RunId>) -> ApiResult {
    let changed = app.runtime.resume_run(&run_id).await?;
    ok(PauseOutcome { target: run_id.into_string(), paused: false, changed })
}

/// The paused kinds (every one: there are no more than the kinds hosted) and a page of the
/// runs paused one by one, in the order of their ids.
#[utoipa::path(get, path = "/paused", tag = "operations",
    params(("limit" = Option<u32>, Query, description = "page size of `runs` (default 100)", minimum = 1, maximum = 1000),
        ("after" = Option<String>, Query, description = "the previous page's `next`")),
    responses((status = 200, description = "the kinds and runs paused now; `next` (and a `Link` header, `rel=\"next\"`) when more runs are paused", body = Paused), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn paused(State(app): State<AppState>, Query(q): Params) -> ApiResult {
    let page = PageQuery::of(&q)?;
    let entry = |(target, p): (String, durafiber_runtime::PauseRecord)| PausedEntry {
        target,
        reason: p.reason,
        paused_at_ms: p.paused_at_ms,
    };
    let now = app.runtime.paused();
    let mut kinds: Vec<PausedEntry> = now.kinds.into_iter().map(entry).collect();
    kinds.sort_by(|a, b| a.target.cmp(&b.target));
    let mut runs: Vec<PausedEntry> = now
        .runs
        .into_iter()
        .filter(|(run_id, _)| page.after.as_deref().is_none_or(|after| run_id.as_str() > after))
        .map(entry)
        .collect();
    runs.sort_by(|a, b| a.target.cmp(&b.target));
    runs.truncate(page.limit);
    let next = (runs.len() == page.limit).then(|| runs.last().map(|r| r.target.clone())).flatten();
    let answer = Paused { kinds, runs, next: next.clone() };
    page_of(answer, "/paused", &[], page.limit, next)
}

#[utoipa::path(post, path = "/runs/{id}/messages", tag = "runs", params(("id" = String, Path, description = "the run id")),
    request_body(content = Value, description = "the agent's message type, as JSON"),
    responses((status = 200, description = "handled by `on_message`", body = Handled), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn message(
    State(app): State<AppState>,
    Path(run_id): Path<RunId>,
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
    Path(run_id): Path<RunId>,
    body: Bytes,
) -> ApiResult {
    let value: Value = parse_value(&body)?;
    let reply = app.runtime.request_json(&run_id, &value.to_string()).await?;
    let reply: Value = serde_json::from_str(&app.secrets.redact(&reply))
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string(), ApiErrorKind::Internal))?;
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
    Path(run_id): Path<RunId>,
    Query(q): Params,
) -> ApiResult {
    let max = durafiber_runtime::limits::STORAGE_LIST_MAX as u64;
    let limit = crate::state::bounded(&q, "limit", 1, max)?.unwrap_or(100) as usize;
    let prefix = q.get("prefix").map(String::as_str).unwrap_or("");
    let page = app.runtime.storage_list(&run_id, prefix, q.get("start_after").map(String::as_str), limit)?;
    let next = if page.len() == limit { page.last().map(|(k, _)| k.clone()) } else { None };
    let mut entries = Vec::with_capacity(page.len());
    for (key, text) in page {
        let value: Value = serde_json::from_str(&app.secrets.redact(&text)).map_err(|e| {
            ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string(), ApiErrorKind::Internal)
        })?;
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
    Path((run_id, name)): Path<(RunId, String)>,
    body: Bytes,
) -> ApiResult {
    let body: EventBody = parse(&body)?;
    let outcome = app
        .runtime
        .send_event_json(&run_id, &name, &body.payload.to_string(), body.idempotency_key.as_deref())
        .await?;
    ok(EventSent { run_id, name, outcome })
}

/// A page of the approvals waiting for a decision, runs in the order they were started.
#[utoipa::path(get, path = "/approvals", tag = "approvals",
    params(("limit" = Option<u32>, Query, description = "page size (default 100)", minimum = 1, maximum = 1000),
        ("after" = Option<String>, Query, description = "`<run_id>/<approval_id>` of the previous page's last approval", pattern = "^[^/]+/.+$")),
    responses((status = 200, description = "a page of the pending approvals across runs; when it is full, a `Link` header (`rel=\"next\"`) gives the next page's address", body = Vec<PendingApproval>), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn approvals(State(app): State<AppState>, Query(q): Params) -> ApiResult {
    let page = PageQuery::of(&q)?;
    let after = match page.after.as_deref() {
        None => None,
        Some(text) => match PendingApproval::split_cursor(text) {
            Some(after) => Some(after),
            None => return Err(bad_request(format!("after must be <run_id>/<approval_id>, not {text:?}"))),
        },
    };
    let pending =
        app.runtime.pending_approvals_page(after.as_ref().map(|(run_id, id)| (run_id, *id)), page.limit)?;
    let next = (pending.len() == page.limit).then(|| pending.last().map(PendingApproval::cursor)).flatten();
    page_of(pending, "/approvals", &[], page.limit, next)
}

#[utoipa::path(post, path = "/runs/{id}/approvals/{approval_id}", tag = "approvals",
    params(("id" = String, Path, description = "the run id"), ("approval_id" = String, Path, description = "the pause within the run")),
    request_body = ApproveBody,
    responses((status = 200, description = "the decision is recorded (or was, the same)", body = ApproveOutcome), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn approve(
    State(app): State<AppState>,
    Path((run_id, approval_id)): Path<(RunId, String)>,
    caller: Option<axum::Extension<crate::auth::Caller>>,
    body: Bytes,
) -> ApiResult {
    let body: ApproveBody = parse(&body)?;
    let decision = Decision { approved: body.approved, comment: body.comment };
    let hash = &body.payload_hash;
    ok(match caller {
        Some(axum::Extension(caller)) => {
            app.runtime.approve_as(&run_id, &approval_id, hash, decision, &caller.decider()).await?
        }
        None => app.runtime.approve(&run_id, &approval_id, hash, decision).await?,
    })
}

/// A page of the run's pending alarms, in the order of their names.
#[utoipa::path(get, path = "/runs/{id}/alarms", tag = "alarms",
    params(("id" = String, Path, description = "the run id"),
        ("limit" = Option<u32>, Query, description = "page size (default 100)", minimum = 1, maximum = 1000),
        ("after" = Option<String>, Query, description = "the name of the previous page's last alarm")),
    responses((status = 200, description = "a page of the run's pending alarms, the runtime's own marked; when it is full, a `Link` header (`rel=\"next\"`) gives the next page's address", body = Vec<Alarm>), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn alarms(
    State(app): State<AppState>,
    Path(run_id): Path<RunId>,
    Query(q): Params,
) -> ApiResult {
    let page = PageQuery::of(&q)?;
    let alarms = app.runtime.alarms_page(&run_id, page.after.as_deref(), page.limit)?;
    let next = (alarms.len() == page.limit).then(|| alarms.last().map(|a| a.name.clone())).flatten();
    page_of(alarms, &format!("/runs/{run_id}/alarms"), &[], page.limit, next)
}

#[utoipa::path(put, path = "/runs/{id}/alarms/{name}", tag = "alarms",
    params(("id" = String, Path, description = "the run id"), ("name" = String, Path, description = "the alarm's name")),
    request_body = AlarmBody,
    responses((status = 200, description = "set (or replaced)", body = AlarmSet), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub(super) async fn set_alarm(
    State(app): State<AppState>,
    Path((run_id, name)): Path<(RunId, String)>,
    body: Bytes,
) -> ApiResult {
    let body: AlarmBody = parse(&body)?;
    let at = match (body.delay_ms, body.at_ms, &body.cron) {
        (Some(d), None, None) => AlarmAt::In(Duration::from_millis(d)),
        (None, Some(t), None) => AlarmAt::At(Timestamp::from_millis(t)),
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
    Path((run_id, name)): Path<(RunId, String)>,
) -> ApiResult {
    let cancelled = app.runtime.cancel_alarm(&run_id, &name).await?;
    ok(AlarmCancelled { run_id, name, cancelled })
}
