//! The server's routes: every API route registered through its `#[utoipa::path]`
//! annotation (so the OpenAPI document cannot miss one), the console, and the layers every
//! request passes, outermost last.

use axum::{
    Router,
    extract::{Request, State},
    http::{Method, StatusCode},
    middleware::{self, Next},
    response::{IntoResponse, Response},
};
use durafiber_api::ApiErrorKind;
use durafiber_runtime::RuntimeError;

use crate::{
    admin, console, forward, guard, handlers, openapi,
    state::{ApiError, AppState},
    watch,
};

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

/// A request that changes state is answered within the store's `barrier_timeout` while the
/// disk is full: once it has waited that long with the store's writes parked for space, the
/// answer is `507 StorageFull` (what it asked may still be carried out when space returns,
/// so a client retries with the same idempotency key). A slow handler on a disk with room is
/// not cut short.
async fn bounded_writes(State(app): State<AppState>, req: Request, next: Next) -> Response {
    if req.method() == Method::GET || req.method() == Method::HEAD {
        return next.run(req).await;
    }
    let limit = app.runtime.config().barrier_timeout;
    let handled = next.run(req);
    tokio::pin!(handled);
    tokio::select! {
        response = &mut handled => return response,
        () = tokio::time::sleep(limit) => {}
    }
    loop {
        if app.runtime.store().health().parked {
            tracing::warn!(waited = ?limit, "a write waited for disk space past barrier_timeout; answered 507");
            return ApiError(
                StatusCode::INSUFFICIENT_STORAGE,
                format!(
                    "the disk is full: the request waited {} for space; it may still be carried out when space returns",
                    humantime::format_duration(limit)
                ),
                ApiErrorKind::StorageFull,
            )
            .into_response();
        }
        tokio::select! {
            response = &mut handled => return response,
            () = tokio::time::sleep(PARKED_POLL) => {}
        }
    }
}

/// How often a write past `barrier_timeout` looks whether the store is parked for space.
const PARKED_POLL: std::time::Duration = std::time::Duration::from_millis(100);

async fn not_found() -> ApiError {
    ApiError(StatusCode::NOT_FOUND, "no such endpoint".into(), ApiErrorKind::NotFound)
}

/// The API's routes, each registered through its `#[utoipa::path]` annotation, and the
/// OpenAPI document they make.
pub fn api() -> (Router<AppState>, utoipa::openapi::OpenApi) {
    use utoipa::OpenApi as _;
    use utoipa_axum::{router::OpenApiRouter, routes};
    OpenApiRouter::with_openapi(openapi::Base::openapi())
        .routes(routes!(watch::health))
        .routes(routes!(handlers::start, handlers::list))
        .routes(routes!(handlers::show, handlers::delete))
        .routes(routes!(handlers::cancel))
        .routes(routes!(handlers::history))
        .routes(routes!(handlers::fork))
        .routes(routes!(handlers::message))
        .routes(routes!(handlers::request))
        .routes(routes!(handlers::storage))
        .routes(routes!(handlers::send_event))
        .routes(routes!(handlers::approve))
        .routes(routes!(handlers::alarms))
        .routes(routes!(watch::stream))
        .routes(routes!(handlers::pause_kind))
        .routes(routes!(handlers::resume_kind))
        .routes(routes!(handlers::pause_run))
        .routes(routes!(handlers::resume_run))
        .routes(routes!(handlers::paused))
        .routes(routes!(handlers::set_alarm, handlers::cancel_alarm))
        .routes(routes!(handlers::approvals))
        .routes(routes!(watch::metrics))
        .routes(routes!(watch::metrics_json))
        .routes(routes!(watch::backup))
        .routes(routes!(watch::events))
        .routes(routes!(admin::create_token, admin::list_tokens))
        .routes(routes!(admin::revoke_token))
        .routes(routes!(admin::audit))
        .routes(routes!(openapi::document))
        .split_for_parts()
}

/// The server's routes: the API, the console, and the layers every request passes.
pub fn router(state: AppState) -> Router {
    let (api, document) = api();
    openapi::publish(&document, &state.runtime);
    api.merge(console::router())
        .fallback(not_found)
        .method_not_allowed_fallback(|| async {
            ApiError(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed here".into(),
                ApiErrorKind::MethodNotAllowed,
            )
        })
        // Route layers run only for a route that exists: an undeclared method is 405 and a
        // path of no route 404, before any token is looked at, any body checked or any
        // audit entry written. The audit entry is written innermost, where the request is
        // carried out: after the run's owner was found to be this node.
        .route_layer(middleware::from_fn_with_state(state.clone(), guard::audit))
        .route_layer(middleware::from_fn_with_state(state.clone(), forward::to_owner))
        .route_layer(middleware::from_fn_with_state(state.clone(), durable_reads))
        .route_layer(middleware::from_fn(guard::json_bodies))
        .route_layer(middleware::from_fn_with_state(state.clone(), guard::authorize))
        .layer(middleware::from_fn_with_state(state.clone(), bounded_writes))
        .layer(middleware::from_fn_with_state(state.clone(), guard::browser_safe))
        .layer(middleware::from_fn(guard::size_limits))
        .layer(axum::extract::DefaultBodyLimit::max(durafiber_runtime::limits::HTTP_BODY_BYTES_MAX))
        .layer(middleware::from_fn(guard::json_errors))
        .layer(middleware::from_fn_with_state(state.clone(), guard::read_body))
        .layer(middleware::from_fn_with_state(state.clone(), guard::signed_in_only))
        .with_state(state)
}
