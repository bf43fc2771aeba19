//! The operator's pages of runs: the list, filtered and paged, and a run with its live
//! timeline, stash, effects and alarms, which it can cancel.

use axum::{
    body::Bytes,
    extract::{Path, Query, State},
    http::{HeaderMap, Method, StatusCode},
};
use durafiber_api::Timestamp;
use durafiber_runtime::RunId;
use durafiber_runtime::{ListFilter, RunState};
use serde_json::{Value, json};

use super::pages::{Notice, Section};
use crate::auth::Role;
use crate::{
    guard,
    state::{AppState, Params},
    view,
};

use super::{PageResult, RUNS_PER_PAGE, failure, form_of, frame, page, pages, refusal, see_other, signed_in};

pub(super) async fn runs(State(app): State<AppState>, headers: HeaderMap, Query(q): Params) -> PageResult {
    let session = signed_in(&app, &headers, "/ui/runs")?;
    let state_text = q.get("state").cloned().unwrap_or_default();
    let kind = q.get("kind").cloned().unwrap_or_default();
    let state = match state_text.as_str() {
        "" => None,
        s => match s.parse::<RunState>() {
            Ok(state) => Some(state),
            Err(e) => {
                return Ok(refusal(&app, &session, StatusCode::BAD_REQUEST, &e.to_string(), "/ui/runs"));
            }
        },
    };
    let filter = ListFilter {
        state,
        kind: Some(kind.clone()).filter(|k| !k.is_empty()),
        after: q.get("after").filter(|a| !a.is_empty()).map(|a| RunId::from(a.as_str())),
        limit: RUNS_PER_PAGE,
        stash_version_below: None,
    };
    let page_of_runs = match app.runtime.list(&filter) {
        Ok(p) => p,
        Err(e) => return Ok(failure(&app, Some(&session), &e.to_string())),
    };
    let rows: Vec<pages::RunRow> = page_of_runs.runs.iter().map(|run| pages::RunRow { run }).collect();
    let markup = pages::runs(
        &frame(&app, Some(&session), Section::Runs),
        &rows,
        &state_text,
        (&kind, &app.runtime.kinds()),
        page_of_runs.next.as_deref(),
        &store_line(&app),
    );
    Ok(page(StatusCode::OK, markup))
}

fn store_line(app: &AppState) -> pages::StoreLine {
    let gauges = app.runtime.store_gauges();
    pages::StoreLine {
        store_bytes: gauges.store_bytes,
        checkpoint_lag: gauges.checkpoint_lag,
        deleted_by_retention: app.runtime.metrics().runs_deleted_by_retention,
    }
}

pub(super) async fn run_page(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(run_id): Path<RunId>,
    Query(q): Params,
) -> PageResult {
    let session = signed_in(&app, &headers, &pages::run_url(&run_id))?;
    // The events before the run: a change made between the two reads then still reaches the
    // page live, after `last_seq`, instead of falling between the record and the stream.
    let events = app.runtime.events_since(0, Some(&run_id), usize::MAX);
    let last_seq = events.last().map_or(0, |e| e.seq);
    let run = match view::run(&app, &run_id) {
        Ok(run) => run,
        Err(e) => return Ok(refusal(&app, &session, e.0, &e.1, "/ui/runs")),
    };
    // The history's stashes join the timeline as durable facts; an unreadable history
    // leaves only the last stash there.
    let history = app.runtime.history(&run_id).unwrap_or_default();
    let timeline = timeline(&run, &history, &events);
    let notice = match q.get("decided").map(String::as_str) {
        Some(answer @ ("approved" | "declined")) => Some(Notice {
            good: true,
            text: format!("You {answer}. The run goes on from its last boundary."),
        }),
        _ => q.get("cancelled").map(|_| Notice { good: true, text: "Cancellation requested.".into() }),
    };
    let view = pages::RunView { run: &run, timeline: &timeline, last_seq, notice };
    Ok(page(StatusCode::OK, pages::run(&frame(&app, Some(&session), Section::Runs), &view)))
}

/// The run's durable facts (accepted, the last stash, each effect prepared and committed,
/// each approval asked and decided, each dead letter, each audited request) and this
/// process's events, by time. Events that only repeat a durable fact are left out; the log
/// is what shows activations, evictions, recoveries and every stash since the process began.
pub(super) fn timeline(
    run: &Value,
    history: &[durafiber_runtime::HistoryEntry],
    events: &[durafiber_runtime::Event],
) -> Vec<pages::TimelineEntry> {
    const DURABLE: [&str; 5] =
        ["accepted", "effect_prepared", "effect_committed", "approval_requested", "alarm_dead_lettered"];
    let at = pages::json_at;
    let entry =
        |at: Timestamp, what: &str, detail: String| pages::TimelineEntry { at, what: what.into(), detail };
    let mut out =
        vec![entry(at(&run["run"]["created_at_ms"]), "accepted", format!("key {}", run["run"]["key"]))];
    // Each stash the history keeps, and the last one in any case; the event log's own
    // lines for them are left out below.
    let logged = |detail: &str| events.iter().any(|e| e.kind == "stashed" && e.detail == detail);
    let mut stashes: Vec<(Timestamp, String)> =
        history.iter().map(|h| (h.written_at_ms, format!("step {}, seq {}", h.step, h.seq))).collect();
    let stash = &run["stash"];
    let stash_detail = format!("step {}, seq {}", stash["step"].as_str().unwrap_or(""), stash["seq"]);
    if !stash.is_null() && !stashes.iter().any(|(_, d)| *d == stash_detail) {
        stashes.push((at(&stash["written_at_ms"]), stash_detail));
    }
    for (at, detail) in stashes {
        if !logged(&detail) {
            out.push(entry(at, "stashed", detail));
        }
    }
    for e in run["ledger"].as_array().into_iter().flatten() {
        let id = e["effect_id"].as_str().unwrap_or("").to_string();
        out.push(entry(
            at(&e["prepared_at_ms"]),
            "effect_prepared",
            format!("{id} (key {})", e["idempotency_key"]),
        ));
        if !e["committed"].is_null() {
            out.push(entry(at(&e["committed"]["committed_at_ms"]), "effect_committed", id));
        }
    }
    for a in run["approvals"].as_array().into_iter().flatten() {
        let id = a["approval_id"].as_str().unwrap_or("");
        out.push(entry(at(&a["requested_at_ms"]), "approval_requested", id.to_string()));
    }
    for d in run["dead_letters"].as_array().into_iter().flatten() {
        let detail = format!(
            "{}: {}",
            d["alarm"]["name"].as_str().unwrap_or(""),
            d["last_error"].as_str().unwrap_or("")
        );
        out.push(entry(at(&d["dead_at_ms"]), "alarm_dead_lettered", detail));
    }
    for a in run["audit"].as_array().into_iter().flatten() {
        let detail =
            format!("by {}: {}", a["actor"].as_str().unwrap_or(""), a["detail"].as_str().unwrap_or(""));
        out.push(entry(at(&a["at_ms"]), a["action"].as_str().unwrap_or(""), detail));
    }
    for e in events.iter().filter(|e| !DURABLE.contains(&e.kind.as_str())) {
        out.push(entry(e.at_ms, &e.kind, e.detail.clone()));
    }
    out.sort_by_key(|e| e.at);
    out
}

pub(super) async fn cancel(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(run_id): Path<RunId>,
    body: Bytes,
) -> PageResult {
    let here = pages::run_url(&run_id);
    let (session, form) = form_of(&app, &headers, &body, Role::Operator, &here)?;
    let reason =
        form.get("reason").map(str::trim).filter(|r| !r.is_empty()).unwrap_or("cancelled in the console");
    let api_path = format!("/runs/{run_id}/cancel");
    let api_body = json!({"reason": reason}).to_string();
    guard::record(&app, &session.caller, &Method::POST, &api_path, &headers, api_body.as_bytes()).await?;
    Ok(match app.runtime.cancel(&run_id, reason).await {
        Ok(_) => see_other(&format!("{here}?cancelled=1")),
        Err(e) => {
            let why = format!("The run was not cancelled: {e}");
            refusal(&app, &session, crate::state::ApiError::from(e).0, &why, &here)
        }
    })
}
