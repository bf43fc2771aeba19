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

mod approvals;
mod pages;
mod runs;

use axum::{
    Router,
    body::Bytes,
    extract::{Query, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Redirect, Response},
    routing::{get, post},
};
use durafiber_runtime::{ListFilter, RunState};
use maud::Markup;

use self::pages::{Frame, Section};
use crate::auth::{self, Role};
use crate::{
    guard,
    session::{self, SESSION_COOKIE, SIGN_IN_COOKIE, Session},
    state::{AppState, Params},
};

/// How many recent events a decision page shows.
const RECENT_EVENTS: usize = 20;
/// Runs per page of the list.
const RUNS_PER_PAGE: usize = 50;
/// Escalated runs and dead letters shown on the attention page.
const ATTENTION_MAX: usize = pages::COUNT_SHOWN_MAX;

/// The console's routes.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/ui", get(|| async { Redirect::to("/ui/approvals") }))
        .route("/ui/", get(|| async { Redirect::to("/ui/approvals") }))
        .route("/ui/sign-in", get(sign_in_page).post(sign_in))
        .route("/ui/sign-out", post(sign_out))
        .route("/ui/approvals", get(approvals::inbox))
        .route("/ui/runs", get(runs::runs))
        .route("/ui/runs/{id}", get(runs::run_page))
        .route("/ui/runs/{id}/cancel", post(runs::cancel))
        .route("/ui/runs/{id}/approvals/{approval_id}", get(approvals::decision_page).post(approvals::decide))
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
    match app.sessions.current(app.runtime.store(), headers, app.runtime.now()) {
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
        waiting = app.runtime.pending_approvals_page(None, ATTENTION_MAX + 1).ok().map(|p| p.len());
        let escalated =
            ListFilter { state: Some(RunState::Escalated), limit: ATTENTION_MAX, ..ListFilter::default() };
        let runs = app.runtime.list(&escalated).map(|p| p.runs.len());
        let letters = app.runtime.dead_letters(ATTENTION_MAX).map(|l| l.len());
        if let (Ok(runs), Ok(letters)) = (runs, letters) {
            attention = Some(runs + letters);
        }
    }
    Frame { session, now: app.runtime.now(), section, waiting, attention }
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
            "Your token {:?} is {}; this needs {}. Nothing was done.",
            session.caller.name,
            session.caller.role.with_article(),
            needs.with_article()
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
    if let Ok(Some(_)) = app.sessions.current(app.runtime.store(), &headers, app.runtime.now()) {
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
    match app.sessions.sign_in(app.runtime.store(), token, app.runtime.now()) {
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
