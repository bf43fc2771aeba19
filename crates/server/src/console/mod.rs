//! The reviewer console under `/ui`: server-rendered pages that work with JavaScript off.
//!
//! | page | what |
//! |------|------|
//! | `/ui/sign-in` | sign in with a token; `POST /ui/sign-out` ends the session |
//! | `/ui/approvals` | pending approvals, oldest first |
//! | `/ui/runs/{id}/approvals/{approval}` | the payload, its hash, the run's context; approve or decline |
//! | `/ui/runs?state=&kind=&after=` | runs, filtered and paged |
//! | `/ui/runs/{id}` | a run: state, timeline (live), stash, effects, alarms, dead letters; cancel |
//! | `/ui/attention` | escalated runs and dead-lettered alarms |
//!
//! A form changes state only with the session's CSRF token and the role the API would ask
//! for the same request, and it is audited as that request (`guard::record`) before it is
//! carried out: a decision made here is the API's decision, under the reviewer's token.

mod pages;

use axum::{
    Router,
    body::Bytes,
    extract::{Path, Query, State},
    http::{HeaderMap, HeaderValue, Method, StatusCode, header},
    response::{IntoResponse, Redirect, Response},
    routing::{get, post},
};
use durafiber_runtime::{Decision, ListFilter, RunState, RuntimeError};
use maud::Markup;
use serde_json::{Value, json};

use self::pages::{Frame, Notice, Section};
use crate::auth::{self, Role};
use crate::{
    guard,
    session::{self, SESSION_COOKIE, SIGN_IN_COOKIE, Session},
    state::{AppState, Params},
    view,
};

/// How many recent events a decision page shows.
const RECENT_EVENTS: usize = 20;
/// Runs per page of the list.
const RUNS_PER_PAGE: usize = 50;
/// Escalated runs and dead letters shown on the attention page.
const ATTENTION_MAX: usize = 200;

/// The console's routes.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/ui", get(|| async { Redirect::to("/ui/approvals") }))
        .route("/ui/", get(|| async { Redirect::to("/ui/approvals") }))
        .route("/ui/sign-in", get(sign_in_page).post(sign_in))
        .route("/ui/sign-out", post(sign_out))
        .route("/ui/approvals", get(inbox))
        .route("/ui/runs", get(runs))
        .route("/ui/runs/{id}", get(run_page))
        .route("/ui/runs/{id}/cancel", post(cancel))
        .route("/ui/runs/{id}/approvals/{approval_id}", get(decision_page).post(decide))
        .route("/ui/attention", get(attention))
        .route(
            "/ui/static/console.css",
            get(|| asset("text/css; charset=utf-8", include_str!("console.css"))),
        )
        .route("/ui/static/live.js", get(|| asset("text/javascript; charset=utf-8", include_str!("live.js"))))
}

async fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "max-age=300")], body).into_response()
}

/// A page, with the headers every console page carries: no framing, no scripts or styles
/// from anywhere else, no caching of what a reviewer saw, no referrer leaving the site
/// (`same-origin`: with `no-referrer` a browser sends `Origin: null` on the forms, which the
/// origin check refuses).
fn page(status: StatusCode, markup: Markup) -> Response {
    let mut response = (status, axum::response::Html(markup.into_string())).into_response();
    let headers = response.headers_mut();
    let set = [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; \
             form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ];
    for (name, value) in set {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// A response that ends a handler early (sign in first, a refusal, a failure): boxed,
/// because a `Response` is large and most handlers return it only on the way out.
struct Refused(Box<Response>);

impl From<Response> for Refused {
    fn from(response: Response) -> Self {
        Refused(Box::new(response))
    }
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        *self.0
    }
}

/// What a console handler returns.
type PageResult = Result<Response, Refused>;

fn see_other(to: &str) -> Response {
    Redirect::to(to).into_response()
}

/// The request's session, or the response that sends the browser to sign in.
fn signed_in(app: &AppState, headers: &HeaderMap, back_to: &str) -> Result<Session, Refused> {
    match app.sessions.current(app.runtime.store(), headers, app.runtime.now_ms()) {
        Ok(Some(session)) => Ok(session),
        Ok(None) => {
            let next: String = url::form_urlencoded::byte_serialize(back_to.as_bytes()).collect();
            Err(see_other(&format!("/ui/sign-in?next={next}")).into())
        }
        Err(e) => Err(failure(app, None, &e.to_string()).into()),
    }
}

/// The frame of a page in `section`: the navigation counts what needs a human, read at
/// each page (a console page is not a hot path).
fn frame<'a>(app: &AppState, session: Option<&'a Session>, section: Section) -> Frame<'a> {
    let (mut waiting, mut attention) = (None, None);
    if session.is_some() {
        waiting = app.runtime.pending_approvals(None).ok().map(|p| p.len());
        let escalated =
            ListFilter { state: Some(RunState::Escalated), limit: ATTENTION_MAX, ..ListFilter::default() };
        let runs = app.runtime.list(&escalated).map(|p| p.runs.len());
        let letters = app.runtime.dead_letters(ATTENTION_MAX).map(|l| l.len());
        if let (Ok(runs), Ok(letters)) = (runs, letters) {
            attention = Some(runs + letters);
        }
    }
    Frame { session, now_ms: app.runtime.now_ms(), section, waiting, attention }
}

fn failure(app: &AppState, session: Option<&Session>, why: &str) -> Response {
    page(
        StatusCode::SERVICE_UNAVAILABLE,
        pages::message(&frame(app, session, Section::Other), "Something failed", why, "/ui/approvals"),
    )
}

fn refusal(app: &AppState, session: &Session, status: StatusCode, why: &str, back: &str) -> Response {
    page(status, pages::message(&frame(app, Some(session), Section::Other), "Not done", why, back))
}

/// A state-changing form: signed in, carrying the session's CSRF token, with the role the
/// API asks for the same request. Returns the session and the form's fields.
fn form_of(
    app: &AppState,
    headers: &HeaderMap,
    body: &Bytes,
    needs: Role,
    back: &str,
) -> Result<(Session, Form), Refused> {
    let session = signed_in(app, headers, back)?;
    let form = Form::parse(body);
    if !session::csrf_matches(&session.csrf, form.get("csrf")) {
        return Err(refusal(
            app,
            &session,
            StatusCode::FORBIDDEN,
            "This form is out of date or came from another page; nothing was done. Open the page again.",
            back,
        )
        .into());
    }
    if session.caller.role < needs {
        let why = format!(
            "Your token {:?} is a {}; this needs {}. Nothing was done.",
            session.caller.name, session.caller.role, needs
        );
        return Err(refusal(app, &session, StatusCode::FORBIDDEN, &why, back).into());
    }
    Ok((session, form))
}

/// A urlencoded form's fields.
struct Form(Vec<(String, String)>);

impl Form {
    fn parse(body: &[u8]) -> Self {
        Form(url::form_urlencoded::parse(body).into_owned().collect())
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// Only a console path may be a sign-in's destination: never another site.
fn safe_next(next: Option<&str>) -> &str {
    match next {
        Some(n) if guard::is_console(n) && !n.contains("//") && !n.contains('\\') => n,
        _ => "/ui/approvals",
    }
}

async fn sign_in_page(State(app): State<AppState>, headers: HeaderMap, Query(q): Params) -> Response {
    let next = safe_next(q.get("next").map(String::as_str)).to_string();
    if let Ok(Some(_)) = app.sessions.current(app.runtime.store(), &headers, app.runtime.now_ms()) {
        return see_other(&next);
    }
    sign_in_form(&app, &next, None, StatusCode::OK)
}

fn sign_in_form(app: &AppState, next: &str, refused: Option<&str>, status: StatusCode) -> Response {
    let csrf = match auth::random_hex() {
        Ok(csrf) => csrf,
        Err(e) => return failure(app, None, &e.to_string()),
    };
    let mut response = page(status, pages::sign_in(&frame(app, None, Section::Other), &csrf, next, refused));
    response.headers_mut().append(header::SET_COOKIE, app.sessions.set_cookie(SIGN_IN_COOKIE, &csrf));
    response
}

async fn sign_in(State(app): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let form = Form::parse(&body);
    let next = safe_next(form.get("next")).to_string();
    let expected = session::cookie(&headers, SIGN_IN_COOKIE).unwrap_or("");
    if expected.is_empty() || !session::csrf_matches(expected, form.get("csrf")) {
        let why = "The sign-in form was out of date; try again.";
        return sign_in_form(&app, &next, Some(why), StatusCode::FORBIDDEN);
    }
    let token = form.get("token").unwrap_or("").trim();
    match app.sessions.sign_in(app.runtime.store(), token, app.runtime.now_ms()) {
        Ok(Some((id, _))) => {
            let mut response = see_other(&next);
            let cookies = response.headers_mut();
            cookies.append(header::SET_COOKIE, app.sessions.set_cookie(SESSION_COOKIE, &id));
            cookies.append(header::SET_COOKIE, app.sessions.set_cookie(SIGN_IN_COOKIE, ""));
            response
        }
        Ok(None) => {
            tracing::warn!("console sign-in refused: the token is not valid");
            sign_in_form(&app, &next, Some("That token is not valid."), StatusCode::UNAUTHORIZED)
        }
        Err(e) => failure(&app, None, &e.to_string()),
    }
}

async fn sign_out(State(app): State<AppState>, headers: HeaderMap, body: Bytes) -> PageResult {
    form_of(&app, &headers, &body, Role::Reader, "/ui/approvals")?;
    app.sessions.sign_out(&headers);
    let mut response = see_other("/ui/sign-in");
    response.headers_mut().append(header::SET_COOKIE, app.sessions.set_cookie(SESSION_COOKIE, ""));
    Ok(response)
}

async fn inbox(State(app): State<AppState>, headers: HeaderMap) -> PageResult {
    let session = signed_in(&app, &headers, "/ui/approvals")?;
    let mut pending = match app.runtime.pending_approvals(None) {
        Ok(p) => p,
        Err(e) => return Ok(failure(&app, Some(&session), &e.to_string())),
    };
    pending.sort_by_key(|p| p.requested_at_ms);
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
                age_ms: p.age_ms,
                escalate_at_ms: p.escalate_at_ms,
            }
        })
        .collect();
    Ok(page(StatusCode::OK, pages::inbox(&frame(&app, Some(&session), Section::Approvals), &rows)))
}

async fn decision_page(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path((run_id, approval_id)): Path<(String, String)>,
) -> PageResult {
    let here = pages::decision_url(&run_id, &approval_id);
    let session = signed_in(&app, &headers, &here)?;
    Ok(show_decision(&app, &session, &run_id, &approval_id, None, StatusCode::OK))
}

fn show_decision(
    app: &AppState,
    session: &Session,
    run_id: &str,
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

fn find_approval<'a>(run: &'a Value, approval_id: &str) -> Option<&'a Value> {
    run["approvals"].as_array()?.iter().find(|a| a["approval_id"].as_str() == Some(approval_id))
}

async fn decide(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path((run_id, approval_id)): Path<(String, String)>,
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
    Ok(match app.runtime.approve(&run_id, &approval_id, &shown_hash, decision).await {
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
    })
}

/// "Already decided by NAME" when the approval has a decision.
fn already_decided(app: &AppState, run_id: &str, approval_id: &str) -> Option<String> {
    let run = view::run(app, run_id).ok()?;
    let approval = find_approval(&run, approval_id)?;
    let approved = approval["decision"]["approved"].as_bool()?;
    let answer = if approved { "approved" } else { "declined" };
    Some(match approval["decided_by"].as_str() {
        Some(name) => format!("Already decided by {name}: {answer}. Nothing was changed."),
        None => format!("Already decided: {answer}. Nothing was changed."),
    })
}

async fn runs(State(app): State<AppState>, headers: HeaderMap, Query(q): Params) -> PageResult {
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
        after: q.get("after").cloned().filter(|a| !a.is_empty()),
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
    );
    Ok(page(StatusCode::OK, markup))
}

async fn run_page(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(run_id): Path<String>,
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
    let timeline = timeline(&run, &events);
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
fn timeline(run: &Value, events: &[durafiber_runtime::Event]) -> Vec<pages::TimelineEntry> {
    let at = |v: &Value| v.as_u64().unwrap_or(0);
    let entry =
        |at_ms: u64, what: &str, detail: String| pages::TimelineEntry { at_ms, what: what.into(), detail };
    let mut out =
        vec![entry(at(&run["run"]["created_at_ms"]), "accepted", format!("key {}", run["run"]["key"]))];
    let stash = &run["stash"];
    let stash_detail = format!("step {}, seq {}", stash["step"].as_str().unwrap_or(""), stash["seq"]);
    if !stash.is_null() && !events.iter().any(|e| e.kind == "stashed" && e.detail == stash_detail) {
        out.push(entry(at(&stash["written_at_ms"]), "stashed", stash_detail));
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
    const DURABLE: [&str; 5] =
        ["accepted", "effect_prepared", "effect_committed", "approval_requested", "alarm_dead_lettered"];
    for e in events.iter().filter(|e| !DURABLE.contains(&e.kind.as_str())) {
        out.push(entry(e.at_ms, &e.kind, e.detail.clone()));
    }
    out.sort_by_key(|e| e.at_ms);
    out
}

async fn cancel(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(run_id): Path<String>,
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

async fn attention(State(app): State<AppState>, headers: HeaderMap) -> PageResult {
    let session = signed_in(&app, &headers, "/ui/attention")?;
    let filter =
        ListFilter { state: Some(RunState::Escalated), limit: ATTENTION_MAX, ..ListFilter::default() };
    let escalated = app.runtime.list(&filter).map(|p| p.runs);
    let letters = app.runtime.dead_letters(ATTENTION_MAX);
    Ok(match (escalated, letters) {
        (Ok(escalated), Ok(letters)) => page(
            StatusCode::OK,
            pages::attention(&frame(&app, Some(&session), Section::Attention), &escalated, &letters),
        ),
        (Err(e), _) | (_, Err(e)) => failure(&app, Some(&session), &e.to_string()),
    })
}
