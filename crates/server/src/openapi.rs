//! The API's OpenAPI 3.1 document, served at `GET /openapi.json`. It is generated from the
//! handlers: each route is registered through its `#[utoipa::path]` annotation
//! (`routes::api`), so a route cannot exist without its entry, and the bodies' schemas are
//! derived from the types the handlers serialize. A test checks real answers against it.

use std::sync::OnceLock;

use axum::{
    http::header,
    response::{IntoResponse, Response},
};
use utoipa::{
    Modify, OpenApi,
    openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme},
};

/// The document's fixed parts: title, description, how to authenticate.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "durafiber",
        description = "The HTTP API of `durafiber serve`: start, inspect and steer durable agent runs; decide \
            approvals; manage alarms, tokens and the audit trail. Every request but `/health` and \
            `/openapi.json` presents a token (`Authorization: Bearer <token>`) whose role allows it \
            (reader < reviewer < operator < admin); a read may present the console's session cookie instead. \
            A request that changes state must be `application/json`, is audited under the token's name \
            before it is carried out, and is refused (415) otherwise. Every refusal is the JSON error \
            shape. The reviewer console under `/ui` is HTML and not part of this API."
    ),
    modifiers(&Security),
    security(("bearer" = [])),
    tags(
        (name = "runs", description = "start, list, inspect and steer runs"),
        (name = "approvals", description = "human decisions, bound to a payload hash"),
        (name = "alarms", description = "a run's alarms"),
        (name = "operations", description = "health, metrics, the event log, backups"),
        (name = "admin", description = "tokens and the audit trail (admin role)")
    )
)]
pub struct Base;

struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("an API token: `durafiber tokens create NAME --role ROLE`"))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "console_session",
            SecurityScheme::ApiKey(ApiKey::Cookie(ApiKeyValue::with_description(
                "durafiber_session",
                "the console's session cookie: reads only",
            ))),
        );
    }
}

/// The whole document as JSON text, published by `routes::router` from the routes it
/// registers.
static DOCUMENT: OnceLock<String> = OnceLock::new();

/// Serves `document` from now on (the first one published: every router makes the same).
pub fn publish(document: &utoipa::openapi::OpenApi) {
    if let Ok(text) = serde_json::to_string(document) {
        let _ = DOCUMENT.set(text);
    }
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "operations", security(()),
    responses((status = 200, description = "this API's OpenAPI 3.1 document", body = Object)))]
pub async fn document() -> Response {
    let text = DOCUMENT.get().map_or("{}", String::as_str);
    ([(header::CONTENT_TYPE, "application/json")], text).into_response()
}
