//! The API's OpenAPI 3.1 document, served at `GET /openapi.json`. It is generated from the
//! handlers: each route is registered through its `#[utoipa::path]` annotation
//! (`routes::api`), so a route cannot exist without its entry, and the bodies' schemas are
//! derived from the types the handlers serialize. A test checks real answers against it.

use std::sync::OnceLock;

use durafiber_runtime::Runtime;
use serde_json::{Value, json};

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

/// Serves `document` from now on, with the start body of each kind `runtime` hosts that gives
/// its input's schema (the first one published: a process serves one runtime).
pub fn publish(document: &utoipa::openapi::OpenApi, runtime: &Runtime) {
    let Ok(mut document) = serde_json::to_value(document) else { return };
    with_start_bodies(&mut document, runtime);
    let _ = ROUTES.set(routes_of(&document));
    if let Ok(text) = serde_json::to_string(&document) {
        let _ = DOCUMENT.set(text);
    }
}

/// Each path of the document, split into segments (`{id}` matches any one), with the
/// methods it declares, upper case.
type Routes = Vec<(Vec<String>, Vec<String>)>;

/// The routes of the published document.
static ROUTES: OnceLock<Routes> = OnceLock::new();

fn routes_of(document: &Value) -> Routes {
    let Some(paths) = document["paths"].as_object() else { return Vec::new() };
    paths
        .iter()
        .map(|(path, item)| {
            let segments = path.trim_start_matches('/').split('/').map(str::to_string).collect();
            let methods = item
                .as_object()
                .map_or_else(Vec::new, |m| m.keys().map(|k| k.to_ascii_uppercase()).collect());
            (segments, methods)
        })
        .collect()
}

/// Whether the API document declares `method` on `path` (a path of no route is `false`):
/// what is not declared is answered 405 or 404 without a token being looked at or an audit
/// entry written.
pub fn declares(method: &str, path: &str) -> bool {
    let Some(routes) = ROUTES.get() else { return true };
    // The router answers HEAD wherever it answers GET.
    let method = if method == "HEAD" { "GET" } else { method };
    let asked: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    routes.iter().any(|(segments, methods)| {
        segments.len() == asked.len()
            && segments.iter().zip(&asked).all(|(s, a)| s.starts_with('{') || s == a)
            && methods.iter().any(|m| m == method)
    })
}

/// A component name from a kind: OpenAPI allows letters, digits, `.`, `-` and `_`.
fn component_name(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') { c } else { '_' })
        .collect()
}

/// Points every `#/$defs/NAME` reference in `value` at the component `PREFIXNAME`.
fn rewrite_refs(value: &mut Value, prefix: &str) {
    match value {
        Value::Object(map) => {
            for (key, field) in map.iter_mut() {
                match field {
                    Value::String(target) if key == "$ref" => {
                        if let Some(name) = target.strip_prefix("#/$defs/") {
                            *target = format!("#/components/schemas/{prefix}{}", component_name(name));
                        }
                    }
                    other => rewrite_refs(other, prefix),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| rewrite_refs(item, prefix)),
        _ => {}
    }
}

/// `POST /runs` takes, for each kind whose agent gives its input's schema
/// (`Agent::input_schema`), a start body of its own (`StartBody_KIND`); a kind without one
/// keeps the free-JSON `StartBody`.
fn with_start_bodies(document: &mut Value, runtime: &Runtime) {
    let kinds = runtime.kinds();
    let mut bodies = Vec::new();
    let mut components = serde_json::Map::new();
    for kind in &kinds {
        let Some(mut input) = runtime.input_schema(kind) else { continue };
        let prefix = format!("{}_", component_name(kind));
        if let Some(input) = input.as_object_mut() {
            input.remove("$schema");
            if let Some(Value::Object(defs)) = input.remove("$defs") {
                for (name, mut def) in defs {
                    rewrite_refs(&mut def, &prefix);
                    components.insert(format!("{prefix}{}", component_name(&name)), def);
                }
            }
        }
        rewrite_refs(&mut input, &prefix);
        let name = format!("StartBody_{}", component_name(kind));
        components.insert(
            name.clone(),
            json!({
                "type": "object",
                "description": format!("starts a run of `{kind}`"),
                "required": ["kind", "input"],
                "properties": {
                    "kind": {"type": "string", "const": kind},
                    "input": input,
                    "options": {"$ref": "#/components/schemas/StartOptions"},
                },
            }),
        );
        bodies.push(json!({"$ref": format!("#/components/schemas/{name}")}));
    }
    if bodies.is_empty() {
        return;
    }
    // A kind without a schema may still be started, with any input.
    let choice = if bodies.len() < kinds.len() {
        bodies.push(json!({"$ref": "#/components/schemas/StartBody"}));
        "anyOf"
    } else {
        "oneOf"
    };
    if let Some(Value::Object(schemas)) = document.pointer_mut("/components/schemas") {
        schemas.extend(components);
    }
    if let Some(body) =
        document.pointer_mut("/paths/~1runs/post/requestBody/content/application~1json/schema")
    {
        *body = json!({ choice: bodies });
    }
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "operations", security(()),
    responses((status = 200, description = "this API's OpenAPI 3.1 document", body = Object)))]
pub async fn document() -> Response {
    let text = DOCUMENT.get().map_or("{}", String::as_str);
    ([(header::CONTENT_TYPE, "application/json")], text).into_response()
}
