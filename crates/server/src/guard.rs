//! What every request passes before a handler sees it: a browser-safe `Host`, `Origin` and
//! content type, a token whose role allows the request, an audit entry for anything that
//! changes state, and limits on its size. Every refusal is JSON, including the ones axum
//! writes itself (a body too large, a path that is not UTF-8).

use axum::{
    body::{Body, to_bytes},
    extract::{Request, State},
    http::{HeaderMap, Method, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use durafiber_api::ApiErrorKind;
use durafiber_runtime::limits;
use durafiber_store::access;
use serde_json::{Value, json};

#[cfg(test)]
use crate::state::Access;
use crate::state::{ApiError, AppState};
use crate::{
    auth::{self, Role},
    capacity::SignedInOnly,
};

fn refuse(status: StatusCode, kind: ApiErrorKind, message: impl Into<String>) -> Response {
    ApiError(status, message.into(), kind).into_response()
}

/// `Host` must be one the server answers to (no DNS rebinding); a request with an `Origin`
/// must come from one of those hosts. No CORS headers are ever sent.
pub async fn browser_safe(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let host = req.headers().get(header::HOST).and_then(|h| h.to_str().ok()).map(str::to_string);
    let host = host.or_else(|| req.uri().authority().map(std::string::ToString::to_string));
    match host {
        Some(host) if app.access.allows_host(&host) => {}
        Some(host) => {
            return refuse(
                StatusCode::MISDIRECTED_REQUEST,
                ApiErrorKind::HostNotAllowed,
                format!("this server does not answer to Host {host:?}; see --allowed-host"),
            );
        }
        None => {
            return refuse(
                StatusCode::BAD_REQUEST,
                ApiErrorKind::HostNotAllowed,
                "a Host header is required",
            );
        }
    }
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let authority = origin.to_str().ok().and_then(|o| o.split_once("://")).map(|(_, a)| a.to_string());
        if !authority.is_some_and(|a| app.access.allows_host(&a)) {
            return refuse(
                StatusCode::FORBIDDEN,
                ApiErrorKind::OriginNotAllowed,
                "a request from another site is refused",
            );
        }
    }
    next.run(req).await
}

/// A request that changes state and carries a body must be JSON (a cross-site form or a
/// `text/plain` POST is 415); one without a body must not claim another type. Checked after
/// the token (`authorize`) and only on routes that exist, so that a caller without a token
/// hears 401 and an undeclared method 405, whatever its body.
pub async fn json_bodies(req: Request, next: Next) -> Response {
    let declared = crate::openapi::declares(req.method().as_str(), req.uri().path());
    let changes_state = declared && matches!(*req.method(), Method::POST | Method::PUT | Method::PATCH);
    // The console's forms are not JSON: they carry a CSRF token, and its cookie is
    // SameSite=Strict, so another site can neither read nor send it.
    if changes_state && !is_console(req.uri().path()) {
        let declared = req.headers().contains_key(header::CONTENT_TYPE);
        let has_body = req.headers().get(header::CONTENT_LENGTH).is_some_and(|v| v.as_bytes() != b"0")
            || req.headers().contains_key(header::TRANSFER_ENCODING);
        if (has_body || declared) && !is_json(req.headers()) {
            return refuse(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                ApiErrorKind::UnsupportedMediaType,
                "a request that changes state must be Content-Type: application/json",
            );
        }
    }
    next.run(req).await
}

/// Whether `path` is the console's (`/ui` and below): it answers in HTML and checks its own
/// session.
pub fn is_console(path: &str) -> bool {
    path == "/ui" || path.starts_with("/ui/")
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"))
}

/// The role a request needs; `None` for what is open to anyone.
fn required_role(method: &Method, path: &str, open_metrics: bool) -> Option<Role> {
    let first = path.trim_start_matches('/').split('/').next().unwrap_or("");
    match (method, first) {
        (_, "health" | "openapi.json") => None,
        // The console signs its users in itself (session cookie and CSRF token).
        (_, "ui") => None,
        (&Method::GET, "metrics") if open_metrics && path == "/metrics" => None,
        (_, "tokens" | "audit" | "backup") => Some(Role::Admin),
        // Deleting a run removes its history for good.
        (&Method::DELETE, "runs") if path.trim_matches('/').split('/').count() == 2 => Some(Role::Admin),
        (&Method::GET | &Method::HEAD, _) => Some(Role::Reader),
        (&Method::POST, "runs") if path.contains("/approvals/") => Some(Role::Reviewer),
        _ => Some(Role::Operator),
    }
}

/// The caller's token must be valid (401) and its role enough for the request (403). A
/// request that changes state is marked [`AuditDue`]: [`audit`] records it under the
/// token's name before it is carried out, on the node that carries it out (a request
/// passed on to a run's owner is recorded there, once), so nothing changes without a
/// record of who asked.
///
/// A read may also present the console's session cookie instead of a token (the console's
/// live views read `/events`); a request that changes state never may, so a cookie a
/// browser sends on its own can change nothing outside the console's CSRF-checked forms.
pub async fn authorize(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    // A method the API does not declare on this path is the router's to refuse (405): it is
    // not authorized, checked or audited as if it were an action.
    if !is_console(&path) && !crate::openapi::declares(req.method().as_str(), &path) {
        return next.run(req).await;
    }
    let Some(needed) = required_role(req.method(), &path, app.access.open_metrics) else {
        return next.run(req).await;
    };
    let is_read = *req.method() == Method::GET || *req.method() == Method::HEAD;
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| t.trim().to_string());
    let store = app.runtime.store();
    let verified = match presented {
        Some(token) => auth::verify(store, &token),
        None if is_read => app
            .sessions
            .current(store, req.headers(), app.runtime.now())
            .map(|session| session.map(|s| s.caller)),
        None => {
            return refuse(
                StatusCode::UNAUTHORIZED,
                ApiErrorKind::Unauthorized,
                "an Authorization: Bearer <token> header is required",
            );
        }
    };
    let caller = match verified {
        Ok(Some(caller)) => caller,
        Ok(None) => {
            return refuse(
                StatusCode::UNAUTHORIZED,
                ApiErrorKind::Unauthorized,
                "an Authorization: Bearer <token> header with a valid token is required",
            );
        }
        Err(e) => return refuse(StatusCode::SERVICE_UNAVAILABLE, ApiErrorKind::StoreFailed, e.to_string()),
    };
    if caller.role < needed {
        return too_weak(&caller, needed);
    }
    let mut req = req;
    if !is_read {
        req.extensions_mut().insert(AuditDue);
    }
    req.extensions_mut().insert(caller);
    next.run(req).await
}

/// The outermost layer: on a connection taken from the share kept for callers who sign in
/// (`capacity.rs`), a request is served only for one that does, on its headers alone —
/// before its body is read — and `/health`; any other is answered 503 and its connection
/// closed.
pub async fn signed_in_only(State(app): State<AppState>, req: Request, next: Next) -> Response {
    if req.extensions().get::<SignedInOnly>().is_some() && !signs_in(&app, &req) {
        return busy();
    }
    next.run(req).await
}

/// Whether a request on a connection kept for the signed-in may be served: `/health`, or a
/// caller whose token or console session is valid. Only its headers are read.
fn signs_in(app: &AppState, req: &Request) -> bool {
    if req.uri().path() == "/health" {
        return true;
    }
    let store = app.runtime.store();
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match token {
        Some(token) => matches!(auth::verify(store, token.trim()), Ok(Some(_))),
        None => matches!(app.sessions.current(store, req.headers(), app.runtime.now()), Ok(Some(_))),
    }
}

/// The answer to a caller that does not sign in on a connection kept for those who do: the
/// server holds as many connections as it takes from everyone else.
fn busy() -> Response {
    let mut response = refuse(
        StatusCode::SERVICE_UNAVAILABLE,
        ApiErrorKind::Busy,
        "the server holds as many connections as it takes from callers who do not sign in; try again shortly",
    );
    let headers = response.headers_mut();
    headers.insert(header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
    headers.insert(header::CONNECTION, axum::http::HeaderValue::from_static("close"));
    response
}

/// 403: the caller's token is valid, its role not enough.
fn too_weak(caller: &auth::Caller, needed: Role) -> Response {
    let (has, needs) = (caller.role.with_article(), needed.with_article());
    refuse(
        StatusCode::FORBIDDEN,
        ApiErrorKind::Forbidden,
        format!("token {:?} is {has}; this needs {needs}", caller.name),
    )
}

/// Marks a request [`audit`] must record before it is carried out.
#[derive(Debug, Clone, Copy)]
pub struct AuditDue;

/// The innermost layer: records a request marked [`AuditDue`] in the audit trail, under
/// its caller, just before its handler carries it out. A request this node passes on to a
/// run's owner never gets here (the owner records it), nor does one this node may no
/// longer carry out (it lost the run's shard).
pub async fn audit(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let caller = match (req.extensions().get::<AuditDue>(), req.extensions().get::<auth::Caller>()) {
        (Some(_), Some(caller)) => caller.clone(),
        _ => return next.run(req).await,
    };
    let path = req.uri().path().to_string();
    let (parts, body) = req.into_parts();
    let Ok(bytes) = to_bytes(body, limits::HTTP_BODY_BYTES_MAX).await else {
        return refuse(StatusCode::PAYLOAD_TOO_LARGE, ApiErrorKind::PayloadTooLarge, "the body is too large");
    };
    if let Err(refusal) = record(&app, &caller, &parts.method, &path, &parts.headers, &bytes).await {
        return refusal;
    }
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}

/// Records a state-changing request in the audit trail under `caller`, before it is carried
/// out: the API's requests, and the console's forms in the API request they stand for.
pub async fn record(
    app: &AppState,
    caller: &auth::Caller,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(), Response> {
    // Below the disk's reserve nothing new is written, the audit entry included: refused at
    // once, instead of an entry that waits for space with the request behind it.
    if let Err(e) = app.runtime.store().check_room() {
        return Err(crate::state::ApiError::from(durafiber_runtime::RuntimeError::from(e)).into_response());
    }
    let (action, run_id, detail) = describe(method, path, headers, body);
    access::append(app.runtime.store(), &caller.name, &action, run_id.as_deref(), &detail, app.runtime.now())
        .await
        .map_err(|e| {
            refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                ApiErrorKind::StoreFailed,
                format!("the audit trail cannot be written: {e}"),
            )
        })?;
    tracing::info!(actor = %caller.name, action, run_id = run_id.as_deref().unwrap_or(""), "audited");
    Ok(())
}

/// The audit entry of a state-changing request: its action, its run, its particulars.
fn describe(
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> (String, Option<String>, String) {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let pick = |keys: &[&str]| -> String {
        keys.iter().filter_map(|k| body.get(*k).map(|v| format!("{k}={v}"))).collect::<Vec<_>>().join(" ")
    };
    match (method, parts.as_slice()) {
        (&Method::POST, ["runs"]) => {
            let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or("");
            ("start".into(), None, format!("{} key={key:?}", pick(&["kind"])))
        }
        (&Method::POST, ["runs", id, "approvals", approval]) => (
            "approve".into(),
            Some(id.to_string()),
            format!("approval={approval} {}", pick(&["approved", "comment", "payload_hash"])),
        ),
        (&Method::POST, ["runs", id, "cancel"]) => ("cancel".into(), Some(id.to_string()), pick(&["reason"])),
        (&Method::POST, ["runs", id, "messages"]) => ("message".into(), Some(id.to_string()), String::new()),
        (&Method::POST, ["runs", id, "requests"]) => ("request".into(), Some(id.to_string()), String::new()),
        (&Method::POST, ["runs", id, "events", name]) => {
            ("event".into(), Some(id.to_string()), format!("name={name} {}", pick(&["idempotency_key"])))
        }
        (&Method::PUT, ["runs", id, "alarms", name]) => (
            "set_alarm".into(),
            Some(id.to_string()),
            format!("name={name} {}", pick(&["delay_ms", "at_ms", "every_ms"])),
        ),
        (&Method::DELETE, ["runs", id]) => ("delete_run".into(), Some(id.to_string()), String::new()),
        (&Method::DELETE, ["runs", id, "alarms", name]) => {
            ("cancel_alarm".into(), Some(id.to_string()), format!("name={name}"))
        }
        (&Method::POST, ["tokens"]) => ("token_create".into(), None, pick(&["name", "role"])),
        (&Method::DELETE, ["tokens", name]) => ("token_revoke".into(), None, format!("name={name}")),
        _ => (format!("{method} {path}"), None, String::new()),
    }
}

/// Reads a request's whole body within `http_body_timeout` of its headers, before anything
/// else looks at it (the sign-in form included): a body that stalls is refused with 408 and
/// its connection closed, so it holds its slot for seconds, not for as long as the client
/// likes. A body over the size limit is 413, also with the connection closed.
pub async fn read_body(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let limit = app.runtime.config().http_body_timeout;
    let close = [(header::CONNECTION, "close")];
    let bytes = match tokio::time::timeout(limit, to_bytes(body, limits::HTTP_BODY_BYTES_MAX)).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) => {
            let message = format!("the body is over {} bytes or broke off: {e}", limits::HTTP_BODY_BYTES_MAX);
            let body = axum::Json(json!({"error": message, "kind": ApiErrorKind::PayloadTooLarge.name()}));
            return (StatusCode::PAYLOAD_TOO_LARGE, close, body).into_response();
        }
        Err(_) => {
            tracing::debug!(path = %parts.uri.path(), ?limit, "a request body did not arrive in time");
            let message =
                format!("the request body did not arrive within {}", humantime::format_duration(limit));
            let body = axum::Json(json!({"error": message, "kind": ApiErrorKind::RequestTimeout.name()}));
            return (StatusCode::REQUEST_TIMEOUT, close, body).into_response();
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}

/// Refuses a request target or headers larger than the limits, as JSON (414, 431).
pub async fn size_limits(req: Request, next: Next) -> Response {
    let target = req.uri().path_and_query().map(|p| p.as_str().len()).unwrap_or(0);
    if target > limits::HTTP_URI_BYTES_MAX {
        return refuse(
            StatusCode::URI_TOO_LONG,
            ApiErrorKind::UriTooLong,
            format!("the request target is over {} bytes", limits::HTTP_URI_BYTES_MAX),
        );
    }
    let header_bytes: usize = req.headers().iter().map(|(k, v)| k.as_str().len() + v.len() + 4).sum();
    if header_bytes > limits::HTTP_HEADER_BYTES_MAX {
        return refuse(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ApiErrorKind::HeadersTooLarge,
            format!("the request headers are over {} bytes", limits::HTTP_HEADER_BYTES_MAX),
        );
    }
    next.run(req).await
}

/// Turns a refusal that is not JSON (axum's own: a body over the limit, a path that does not
/// decode) into the API's `{"error", "kind"}` shape.
pub async fn json_errors(req: Request, next: Next) -> Response {
    let console = is_console(req.uri().path());
    let mut response = next.run(req).await;
    if console {
        return response;
    }
    let status = response.status();
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        // The rest of the body was never read: the connection cannot carry another request.
        response.headers_mut().insert(header::CONNECTION, header::HeaderValue::from_static("close"));
    }
    let is_json = is_json(response.headers());
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let text = to_bytes(response.into_body(), 64 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let kind = match status {
        StatusCode::PAYLOAD_TOO_LARGE => ApiErrorKind::PayloadTooLarge,
        StatusCode::URI_TOO_LONG => ApiErrorKind::UriTooLong,
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => ApiErrorKind::HeadersTooLarge,
        StatusCode::NOT_FOUND => ApiErrorKind::NotFound,
        StatusCode::METHOD_NOT_ALLOWED => ApiErrorKind::MethodNotAllowed,
        s if s.is_server_error() => ApiErrorKind::Internal,
        _ => ApiErrorKind::BadRequest,
    };
    let message =
        if text.is_empty() { status.canonical_reason().unwrap_or("refused").to_string() } else { text };
    let close = [(header::CONNECTION, "close")];
    match status {
        StatusCode::PAYLOAD_TOO_LARGE => {
            (status, close, axum::Json(json!({"error": message, "kind": kind}))).into_response()
        }
        _ => (status, axum::Json(json!({"error": message, "kind": kind}))).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_by_route() {
        let get = Method::GET;
        let post = Method::POST;
        assert_eq!(required_role(&get, "/health", false), None);
        assert_eq!(required_role(&get, "/metrics", true), None);
        assert_eq!(required_role(&get, "/metrics", false), Some(Role::Reader));
        assert_eq!(required_role(&get, "/runs/r1", false), Some(Role::Reader));
        assert_eq!(required_role(&post, "/runs/r1/approvals/a", false), Some(Role::Reviewer));
        assert_eq!(required_role(&post, "/runs", false), Some(Role::Operator));
        assert_eq!(required_role(&Method::DELETE, "/runs/r1/alarms/x", false), Some(Role::Operator));
        assert_eq!(required_role(&get, "/audit", false), Some(Role::Admin));
        assert_eq!(required_role(&Method::DELETE, "/runs/run_1", false), Some(Role::Admin));
        assert_eq!(required_role(&Method::DELETE, "/runs/run_1/alarms/a", false), Some(Role::Operator));
        assert_eq!(required_role(&get, "/backup", false), Some(Role::Admin));
        assert_eq!(required_role(&post, "/tokens", false), Some(Role::Admin));
        assert_eq!(required_role(&post, "/ui/runs/r1/cancel", false), None);
        assert_eq!(required_role(&get, "/openapi.json", false), None);
        assert_eq!(required_role(&get, "/uix", false), Some(Role::Reader));
    }

    #[test]
    fn hosts_by_name_and_port() {
        let access = Access::new("127.0.0.1:7878".parse().unwrap(), &["agents.example".into()], false);
        assert!(access.allows_host("127.0.0.1:7878") && access.allows_host("localhost:7878"));
        assert!(access.allows_host("agents.example") && access.allows_host("AGENTS.example:443"));
        assert!(!access.allows_host("evil.example:7878") && !access.allows_host("localhost:9999"));
    }
}
