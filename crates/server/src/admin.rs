//! The admin endpoints: API tokens (`/tokens`) and the audit trail (`/audit`).

use crate::auth::{self, AccessError, Role};
use crate::{
    schema::{AuditPage, ErrorBody, TokenBody, TokenCreated, TokenRevoked, TokenShown},
    state::{ApiError, ApiResult, AppState, Params, ok, parse},
};
use axum::{
    Json,
    body::Bytes,
    extract::{Path, Query, State},
    http::StatusCode,
    response::IntoResponse,
};
use durafiber_api::ApiErrorKind;
use durafiber_store::access;

impl From<AccessError> for ApiError {
    fn from(e: AccessError) -> Self {
        match e {
            AccessError::Invalid(m) => ApiError(StatusCode::BAD_REQUEST, m, ApiErrorKind::InvalidInput),
            e @ AccessError::NameTaken(_) => {
                ApiError(StatusCode::CONFLICT, e.to_string(), ApiErrorKind::NameTaken)
            }
            e @ AccessError::LastAdmin(_) => {
                ApiError(StatusCode::CONFLICT, e.to_string(), ApiErrorKind::LastAdmin)
            }
            e => ApiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string(), ApiErrorKind::StoreFailed),
        }
    }
}

/// Creates a token; the answer is the only place it is ever shown.
#[utoipa::path(post, path = "/tokens", tag = "admin", request_body = TokenBody,
    responses((status = 201, description = "the token, shown this once", body = TokenCreated), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub async fn create_token(State(app): State<AppState>, body: Bytes) -> ApiResult {
    let body: TokenBody = parse(&body)?;
    let role: Role = body.role.parse()?;
    let token = auth::create(app.runtime.store(), &body.name, role, app.runtime.now()).await?;
    Ok((StatusCode::CREATED, Json(TokenCreated { name: body.name, role, token })).into_response())
}

/// Every token: name, role, creation time (never the token or its hash).
#[utoipa::path(get, path = "/tokens", tag = "admin",
    responses((status = 200, description = "every token, by name", body = Vec<TokenShown>), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub async fn list_tokens(State(app): State<AppState>) -> ApiResult {
    ok(auth::shown(app.runtime.store())?)
}

/// Revokes a token at once: its next request is refused.
#[utoipa::path(delete, path = "/tokens/{name}", tag = "admin",
    params(("name" = String, Path, description = "the token's name")),
    responses((status = 200, description = "revoked, or there was none", body = TokenRevoked), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub async fn revoke_token(State(app): State<AppState>, Path(name): Path<String>) -> ApiResult {
    let revoked = auth::revoke(app.runtime.store(), &name).await?;
    ok(TokenRevoked { name, revoked })
}

/// The largest page of the audit trail.
const AUDIT_PAGE_MAX: u64 = 1_000;

/// A page of the audit trail, oldest first: `?after=SEQ&limit=N`; `next` is the `after` of
/// the next page, present when this one is full.
#[utoipa::path(get, path = "/audit", tag = "admin",
    params(("after" = Option<u64>, Query, description = "the previous page's `next`", maximum = 9_223_372_036_854_775_807_u64),
        ("limit" = Option<u32>, Query, description = "page size, 1 to 1,000 (default 100)", minimum = 1, maximum = 1000)),
    responses((status = 200, description = "a page of the audit trail", body = AuditPage), (status = "4XX", description = "refused: the JSON error shape", body = ErrorBody), (status = "5XX", description = "the server's own failure", body = ErrorBody)))]
pub async fn audit(State(app): State<AppState>, Query(q): Params) -> ApiResult {
    let limit = crate::state::bounded(&q, "limit", 1, AUDIT_PAGE_MAX)?.unwrap_or(100) as usize;
    let after = crate::state::bounded(&q, "after", 0, i64::MAX as u64)?;
    let entries = access::page(app.runtime.store(), after, limit).map_err(AccessError::from)?;
    let next = if entries.len() == limit { entries.last().map(|e| e.seq) } else { None };
    ok(AuditPage { entries, next })
}
