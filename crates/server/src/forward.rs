//! Requests that change a run go to the node that owns it. On a store several nodes share,
//! only the owner of a run's shard runs it and writes it: a cancel, a message, a request,
//! an event, a decision, an alarm change or a pause that reaches another node is passed on
//! to the owner's advertised address, with the caller's headers and body, and the owner's
//! answer comes back as it is. Starts and reads are served where they arrive. Alone on its
//! store a server owns every run and this passes everything through.
//!
//! A request is passed on once: one that arrives already forwarded and finds this node not
//! the owner (ownership moved meanwhile) is answered 421, for the caller to send again. With
//! no owner (its node died and no node's tick took the shard yet) this node takes the shard
//! and serves the request; if it cannot (another node took it meanwhile, or the database
//! does not answer) the answer is 503 with `Retry-After`. An owner that cannot be reached,
//! or does not answer within the forward timeout (`--forward-timeout`, 5 s by default: a
//! stopped node), is 503 `OwnerUnreachable` with `Retry-After`: once its lease runs out
//! another node takes the run over, and the request may be sent again. A request that timed
//! out may have reached a stopped owner, which carries it out when it wakes if it still holds
//! the run (past its self-fence deadline it answers 421 instead): a decision, a cancel, an
//! alarm set or an event with an idempotency key apply once however often they are sent; a
//! message sent again may arrive twice.
//!
//! A reader following a run's output stream (server-sent events) on a node that does not
//! own the run is passed on too, its events relayed as the owner sends them: the partial
//! chunks and resets of a streaming effect's call exist only on the node that runs it, and
//! the event ids are the stream's own, so `Last-Event-ID` resumes on any node. When the owner
//! cannot be reached the stream is served where it arrived (durable chunks only, until a node
//! runs the run again).

use durafiber_api::ApiErrorKind;
use durafiber_runtime::RunId;

use axum::{
    body::{Body, to_bytes},
    extract::{Request, State},
    http::{HeaderValue, Method, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use durafiber_runtime::{RunOwner, limits};

use crate::state::{ApiError, AppState, Peers};

/// Marks a request one node passed to another.
const FORWARDED: &str = "x-durafiber-forwarded-by";

/// The run a request changes, if it is one that must reach the run's owner.
fn run_changed<'a>(method: &Method, path: &'a str) -> Option<&'a str> {
    if *method == Method::GET || *method == Method::HEAD {
        return None;
    }
    let rest = path.strip_prefix("/runs/")?;
    let (run_id, action) = rest.split_once('/')?;
    (!run_id.is_empty() && !action.is_empty()).then_some(run_id)
}

/// How long a caller is told to wait before sending again when the owner did not answer:
/// about the time a live node needs to take an unanswering node's shards over.
const RETRY_AFTER_SECS: &str = "1";

pub async fn to_owner(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let Some(run_id) = run_changed(req.method(), req.uri().path()).map(RunId::from) else {
        return next.run(req).await;
    };
    let owner = match app.runtime.owner_of(&run_id) {
        Ok(owner) => owner,
        Err(e) => return ApiError::from(e).into_response(),
    };
    match owner {
        RunOwner::Here => next.run(req).await,
        // Its node died and no node took the shard yet: take it, and serve the run here.
        RunOwner::Nobody { shard } => match app.runtime.take_over(&run_id).await {
            true => next.run(req).await,
            false => unowned(shard),
        },
        RunOwner::Node { node_id, http_addr, shard } => {
            if req.headers().contains_key(FORWARDED) {
                return ApiError(
                    StatusCode::MISDIRECTED_REQUEST,
                    format!("run {run_id} (shard {shard}) is owned by node {node_id} now: send it again"),
                    ApiErrorKind::NotOwner,
                )
                .into_response();
            }
            match http_addr {
                Some(addr) if !addr.is_empty() => pass_on(req, &app.peers, &addr, &node_id).await,
                _ => unowned(shard),
            }
        }
    }
}

fn unowned(shard: u32) -> Response {
    let mut response = ApiError(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("shard {shard} has no reachable owner at the moment; a node takes it over shortly"),
        ApiErrorKind::NoOwner,
    )
    .into_response();
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_SECS));
    response
}

async fn pass_on(req: Request, peers: &Peers, addr: &str, node_id: &str) -> Response {
    let timeout = peers.timeout;
    let (parts, body) = req.into_parts();
    let body = match to_bytes(body, limits::HTTP_BODY_BYTES_MAX).await {
        Ok(b) => b,
        Err(e) => {
            return ApiError(StatusCode::BAD_REQUEST, format!("body: {e}"), ApiErrorKind::BadRequest)
                .into_response();
        }
    };
    let path = parts.uri.path_and_query().map(axum::http::uri::PathAndQuery::as_str).unwrap_or("/");
    let url = format!("{}://{addr}{path}", peers.scheme());
    let mut out = peers.client.request(parts.method.clone(), &url).timeout(timeout).body(body);
    for (name, value) in &parts.headers {
        if name != header::HOST && name != header::CONTENT_LENGTH && name != header::CONNECTION {
            out = out.header(name, value);
        }
    }
    out = out.header(header::HOST, addr).header(FORWARDED, node_id);
    tracing::debug!(url, node_id, "request passed on to the run's owner");
    match out.send().await {
        Ok(answer) => {
            let status = answer.status();
            let content_type = answer.headers().get(header::CONTENT_TYPE).cloned();
            let bytes = answer.bytes().await.unwrap_or_default();
            let mut response = Response::new(Body::from(bytes));
            *response.status_mut() = status;
            if let Some(ct) = content_type {
                response.headers_mut().insert(header::CONTENT_TYPE, ct);
            }
            response
        }
        Err(e) => {
            let what =
                if e.is_timeout() { format!("did not answer within {timeout:?}") } else { e.to_string() };
            tracing::warn!(node_id, addr, error = %e, "the run's owner did not answer a request passed on");
            let mut response = ApiError(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the run's owner, node {node_id} at {addr}: {what}; send it again shortly"),
                ApiErrorKind::OwnerUnreachable,
            )
            .into_response();
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_SECS));
            response
        }
    }
}

/// The owner's answer to a reader of run `run_id`'s output stream (`path_and_query`, with
/// the reader's `headers`), relayed as it comes; `None` when this node should serve it
/// itself: it owns the run, the run has no owner, the request was passed on already, or the
/// owner did not answer it.
pub async fn stream_from_owner(
    app: &AppState,
    run_id: &RunId,
    headers: &axum::http::HeaderMap,
    path_and_query: &str,
) -> Option<Response> {
    if headers.contains_key(FORWARDED) {
        return None;
    }
    let Ok(RunOwner::Node { node_id, http_addr: Some(addr), .. }) = app.runtime.owner_of(run_id) else {
        return None;
    };
    let url = format!("{}://{addr}{path_and_query}", app.peers.scheme());
    let mut out = app.peers.client.get(&url);
    for (name, value) in headers {
        if name != header::HOST && name != header::CONNECTION {
            out = out.header(name, value);
        }
    }
    out = out.header(header::HOST, addr.as_str()).header(FORWARDED, node_id.as_str());
    // Only the answer's head is awaited within the forward timeout: the stream follows the
    // run for as long as the reader stays.
    let answer = match tokio::time::timeout(app.peers.timeout, out.send()).await {
        Ok(Ok(answer)) if answer.status().is_success() => answer,
        Ok(Ok(answer)) => {
            tracing::debug!(%run_id, node_id, status = %answer.status(), "the owner refused a stream; served here");
            return None;
        }
        Ok(Err(e)) => {
            tracing::debug!(%run_id, node_id, error = %e, "the owner did not answer a stream; served here");
            return None;
        }
        Err(_) => return None,
    };
    tracing::debug!(%run_id, node_id, "a reader's stream relayed from the run's owner");
    let kept: Vec<_> = [header::CONTENT_TYPE, header::CACHE_CONTROL]
        .into_iter()
        .filter_map(|name| answer.headers().get(&name).cloned().map(|value| (name, value)))
        .collect();
    let mut response = Response::new(Body::from_stream(answer.bytes_stream()));
    response.headers_mut().extend(kept);
    Some(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_changes_to_one_run_are_passed_on() {
        assert_eq!(run_changed(&Method::POST, "/runs/run_1/cancel"), Some("run_1"));
        assert_eq!(run_changed(&Method::PUT, "/runs/run_1/alarms/tick"), Some("run_1"));
        assert_eq!(run_changed(&Method::POST, "/runs"), None, "a start is served where it arrives");
        assert_eq!(run_changed(&Method::GET, "/runs/run_1/stream"), None);
        assert_eq!(run_changed(&Method::GET, "/runs/run_1"), None);
    }
}
