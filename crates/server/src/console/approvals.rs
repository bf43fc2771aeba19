//! The reviewer's pages: pending approvals, and the decision page that shows a payload and
//! its hash and approves or declines it.

use axum::{
    body::Bytes,
    extract::{Path, Query, State},
    http::{HeaderMap, Method, StatusCode},
    response::Response,
};
use durafiber_runtime::RunId;
use durafiber_runtime::{Decision, PendingApproval, RuntimeError};
use serde_json::{Value, json};

use super::pages::{Notice, Section};
use crate::auth::Role;
use crate::{
    guard,
    session::Session,
    state::{AppState, Params},
    view,
};

use super::{PageResult, RECENT_EVENTS, failure, form_of, frame, page, pages, refusal, see_other, signed_in};

/// How many approvals one page of the inbox shows.
const INBOX_PAGE: usize = 50;

/// A page of the approvals waiting, runs in the order they were started; `?after=` (the
/// last one's `<run_id>/<approval_id>`, as the page's "next" link gives it) turns the page.
pub(super) async fn inbox(State(app): State<AppState>, headers: HeaderMap, Query(q): Params) -> PageResult {
    let session = signed_in(&app, &headers, "/ui/approvals")?;
    let after = q.get("after").and_then(|text| PendingApproval::split_cursor(text));
    let pending = match app.runtime.pending_approvals_page(after.as_ref().map(|(r, a)| (r, *a)), INBOX_PAGE) {
        Ok(p) => p,
        Err(e) => return Ok(failure(&app, Some(&session), &e.to_string())),
    };
    let next = (pending.len() == INBOX_PAGE)
        .then(|| pending.last().map(PendingApproval::cursor))
        .flatten()
        .map(|after| {
            let after: String = url::form_urlencoded::byte_serialize(after.as_bytes()).collect();
            format!("/ui/approvals?after={after}")
        });
    let rows: Vec<pages::InboxRow> = pending
        .into_iter()
        .map(|p| {
            let (kind, key) = match app.runtime.run(&p.run_id) {
                Ok(run) => (run.kind, run.key),
                Err(_) => (String::new(), String::new()),
            };
            let view = app.runtime.approval_view(&kind, &p.approval_id, &p.payload);
            pages::InboxRow {
                run_id: p.run_id,
                approval_id: p.approval_id,
                kind,
                key,
                view,
                age: p.age_ms,
                escalate_at: p.escalate_at_ms,
            }
        })
        .collect();
    Ok(page(
        StatusCode::OK,
        pages::inbox(&frame(&app, Some(&session), Section::Approvals), &rows, next.as_deref()),
    ))
}

pub(super) async fn decision_page(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path((run_id, approval_id)): Path<(RunId, String)>,
) -> PageResult {
    let here = pages::decision_url(&run_id, &approval_id);
    let session = signed_in(&app, &headers, &here)?;
    Ok(show_decision(&app, &session, &run_id, &approval_id, None, StatusCode::OK))
}

pub(super) fn show_decision(
    app: &AppState,
    session: &Session,
    run_id: &RunId,
    approval_id: &str,
    notice: Option<Notice>,
    status: StatusCode,
) -> Response {
    let run = match view::run(app, run_id) {
        Ok(run) => run,
        Err(e) => return refusal(app, session, e.0, &e.1, "/ui/approvals"),
    };
    let Some(approval) = find_approval(&run, approval_id) else {
        let why = format!("Run {run_id} has no approval {approval_id:?}.");
        return refusal(app, session, StatusCode::NOT_FOUND, &why, "/ui/approvals");
    };
    let mut events = app.runtime.events_since(0, Some(run_id), usize::MAX);
    let keep_from = events.len().saturating_sub(RECENT_EVENTS);
    events.drain(..keep_from);
    let kind = run["run"]["kind"].as_str().unwrap_or_default();
    let shown = app.runtime.approval_view(kind, approval_id, &approval["payload"]);
    let view = pages::DecisionView { run: &run, approval, shown: shown.as_ref(), events: &events, notice };
    page(status, pages::decision(&frame(app, Some(session), Section::Approvals), &view))
}

pub(super) fn find_approval<'a>(run: &'a Value, approval_id: &str) -> Option<&'a Value> {
    run["approvals"].as_array()?.iter().find(|a| a["approval_id"].as_str() == Some(approval_id))
}

pub(super) async fn decide(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path((run_id, approval_id)): Path<(RunId, String)>,
    body: Bytes,
) -> PageResult {
    let here = pages::decision_url(&run_id, &approval_id);
    let (session, form) = form_of(&app, &headers, &body, Role::Reviewer, &here)?;
    let approved = match form.get("decision") {
        Some("approve") => true,
        Some("decline") => false,
        _ => {
            let why = "Choose Approve or Decline.";
            return Ok(refusal(&app, &session, StatusCode::BAD_REQUEST, why, &here));
        }
    };
    let shown_hash = form.get("payload_hash").unwrap_or("").to_string();
    let comment = form.get("comment").unwrap_or("").to_string();
    // Someone else may have decided since this page was shown: say who, decide nothing.
    if let Some(answer) = already_decided(&app, &run_id, &approval_id) {
        let notice = Notice { good: false, text: answer };
        return Ok(show_decision(&app, &session, &run_id, &approval_id, Some(notice), StatusCode::CONFLICT));
    }
    let api_path = format!("/runs/{run_id}/approvals/{approval_id}");
    let api_body = json!({"payload_hash": shown_hash, "approved": approved, "comment": comment});
    let api_body = api_body.to_string();
    guard::record(&app, &session.caller, &Method::POST, &api_path, &headers, api_body.as_bytes()).await?;
    let decision = Decision { approved, comment };
    Ok(
        match app
            .runtime
            .approve_as(&run_id, &approval_id, &shown_hash, decision, &session.caller.decider())
            .await
        {
            // Recorded, and the rule waits for others: back to the approval, which says so.
            Ok(outcome) if !outcome.decided => see_other(&pages::decision_url(&run_id, &approval_id)),
            Ok(_) => see_other(&format!(
                "{}?decided={}",
                pages::run_url(&run_id),
                if approved { "approved" } else { "declined" }
            )),
            Err(RuntimeError::StaleApproval { .. }) => {
                let text = "The payload changed since this page was shown, so nothing was decided. \
                        Read what the run asks now, below, and decide again."
                    .to_string();
                let notice = Notice { good: false, text };
                show_decision(&app, &session, &run_id, &approval_id, Some(notice), StatusCode::CONFLICT)
            }
            Err(RuntimeError::AlreadyVoted { .. }) => {
                let notice = Notice {
                    good: false,
                    text: "You have already decided this; one person counts once.".into(),
                };
                show_decision(&app, &session, &run_id, &approval_id, Some(notice), StatusCode::CONFLICT)
            }
            Err(RuntimeError::AlreadyDecided { .. }) => {
                let text =
                    already_decided(&app, &run_id, &approval_id).unwrap_or_else(|| "Already decided.".into());
                let notice = Notice { good: false, text };
                show_decision(&app, &session, &run_id, &approval_id, Some(notice), StatusCode::CONFLICT)
            }
            Err(e) => {
                let refused = crate::state::ApiError::from(e);
                refusal(&app, &session, refused.0, &format!("The decision was refused: {}", refused.1), &here)
            }
        },
    )
}

/// "Already decided by NAME" when the approval has a decision.
pub(super) fn already_decided(app: &AppState, run_id: &RunId, approval_id: &str) -> Option<String> {
    let run = view::run(app, run_id).ok()?;
    let approval = find_approval(&run, approval_id)?;
    let approved = approval["decision"]["approved"].as_bool()?;
    let answer = if approved { "approved" } else { "declined" };
    Some(match approval["decided_by"].as_str() {
        Some(name) => format!("Already decided by {name}: {answer}. Nothing was changed."),
        None => format!("Already decided: {answer}. Nothing was changed."),
    })
}
