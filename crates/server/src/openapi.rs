//! The API's OpenAPI 3.1 document, served at `GET /openapi.json`. It is generated from the
//! handlers: each route is registered through its `#[utoipa::path]` annotation
//! (`routes::api`), so a route cannot exist without its entry, and the bodies' schemas are
//! derived from the types the handlers serialize. A test checks real answers against it.

use std::sync::OnceLock;

use durafiber_runtime::{Runtime, limits};
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
            shape. On several nodes sharing a database, a request that changes a run and reaches a \
            node that does not run it is passed on to the node that does and audited there; when that \
            node cannot be reached or does not answer within the forward timeout (5 s by default), or \
            no node holds the run yet, the answer is 503 (`OwnerUnreachable`, `NoOwner`) with \
            `Retry-After`: send it again. The reviewer console under `/ui` is HTML and not part of \
            this API."
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
    make_precise(&mut document, runtime);
    let _ = ROUTES.set(routes_of(&document));
    if let Ok(text) = serde_json::to_string(&document) {
        let _ = DOCUMENT.set(text);
    }
}

/// An id as every table takes it (`tables::check_id`): 1 to 512 characters, no NUL.
fn id_schema() -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": durafiber_store::tables::ID_CHARS_MAX, "pattern": "^[^\\u0000]*$"})
}

/// The cron expressions the document promises the server takes (what `ctx.set_alarm` takes
/// is wider: lists, ranges, `L`, `#`, `W`): five fields, or six with seconds first; each `*`,
/// `*/step` (1–9) or a number within its range (days of the month up to 28, so every
/// expression has a next time); months and weekdays also by name, weekdays also `MON-FRI`
/// or `SAT-SUN`.
const CRON_PATTERN: &str = concat!(
    "^((\\*(/[1-9])?|[1-5]?[0-9]) )?",
    "(\\*(/[1-9])?|[1-5]?[0-9]) ",
    "(\\*(/[1-9])?|1?[0-9]|2[0-3]) ",
    "(\\*|[1-9]|1[0-9]|2[0-8]) ",
    "(\\*|[1-9]|1[0-2]|JAN|FEB|MAR|APR|MAY|JUN|JUL|AUG|SEP|OCT|NOV|DEC) ",
    "(\\*|[0-6]|MON|TUE|WED|THU|FRI|SAT|SUN|MON-FRI|SAT-SUN)$"
);

/// The path and header parameters as the server takes them: a kind among those hosted, ids
/// and token names by their characters, an `Idempotency-Key` as a header may carry it.
fn precise_parameters(document: &mut Value, kinds: &[String]) {
    if let Some(Value::Object(paths)) = document.get_mut("paths") {
        for (path, item) in paths.iter_mut() {
            let tokens = path.starts_with("/tokens/");
            let Some(item) = item.as_object_mut() else { continue };
            for operation in item.values_mut() {
                let Some(Value::Array(params)) = operation.get_mut("parameters") else { continue };
                for param in params {
                    let name = param["name"].as_str().unwrap_or_default().to_string();
                    let place = param["in"].as_str().unwrap_or_default().to_string();
                    match (place.as_str(), name.as_str()) {
                        ("path", "kind") => param["schema"] = json!({"type": "string", "enum": kinds}),
                        ("path", "name") if tokens => {
                            param["schema"] = json!({"type": "string", "pattern": "^[A-Za-z0-9._-]{1,64}$"});
                        }
                        ("path", "name" | "approval_id") => param["schema"] = id_schema(),
                        // A header's value is visible ASCII, spaces within, none around it.
                        ("header", "Idempotency-Key") => {
                            param["schema"] = json!({"type": "string", "maxLength": durafiber_store::tables::ID_CHARS_MAX,
                                "pattern": "^[\\x21-\\x7e]([\\x20-\\x7e]*[\\x21-\\x7e])?$"});
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}

/// An alarm's body: a delay, a due time or a cron schedule, exactly one.
fn alarm_body() -> Value {
    let horizon_ms = limits::ALARM_HORIZON_MAX.as_millis() as u64;
    let period_ms = limits::ALARM_PERIOD_MIN.as_millis() as u64;
    // Due times an alarm may name: from the epoch to the start of 2100, always within the
    // horizon from now.
    let latest_at_ms = 4_102_444_800_000_u64;
    let every = json!({"type": ["integer", "null"], "minimum": period_ms, "maximum": horizon_ms});
    let payload = json!({"description": "given to `on_alarm`"});
    let zones: Vec<&str> = durafiber_runtime::CronSchedule::time_zone_names().collect();
    let none = json!({"type": "null"});
    json!({
        "description": "exactly one of `delay_ms`, `at_ms` and `cron`; `every_ms` repeats a `delay_ms` or `at_ms` alarm; an absent field may also be `null`",
        "oneOf": [
            {"type": "object", "additionalProperties": false, "required": ["delay_ms"], "properties": {
                "delay_ms": {"type": "integer", "minimum": 0, "maximum": horizon_ms},
                "every_ms": every, "payload": payload, "at_ms": none, "cron": none, "time_zone": none}},
            {"type": "object", "additionalProperties": false, "required": ["at_ms"], "properties": {
                "at_ms": {"type": "integer", "minimum": 0, "maximum": latest_at_ms},
                "every_ms": every, "payload": payload, "delay_ms": none, "cron": none, "time_zone": none}},
            {"type": "object", "additionalProperties": false, "required": ["cron"], "properties": {
                "cron": {"type": "string", "pattern": CRON_PATTERN},
                "time_zone": {"type": ["string", "null"], "enum": zones.iter().map(|z| json!(z)).chain([Value::Null]).collect::<Vec<_>>()},
                "payload": payload, "delay_ms": none, "at_ms": none, "every_ms": none}},
        ],
    })
}

/// Says exactly what the server takes where the derived schemas say less: ids' lengths and
/// characters, the kinds the runtime hosts, an alarm's three shapes, a cron expression, the
/// time zones, an event's idempotency key.
fn make_precise(document: &mut Value, runtime: &Runtime) {
    precise_parameters(document, &runtime.kinds());
    if let Some(schema) = document.pointer_mut("/components/schemas/AlarmBody") {
        *schema = alarm_body();
    }
    if let Some(durability) = document.pointer_mut("/components/schemas/StartOptions/properties/durability") {
        *durability = json!({"type": ["string", "null"], "enum": ["sync", "async", "exit", null]});
    }
    // The whole ranges of the server's unsigned fields, not the signed formats derived.
    for (field, max) in [
        ("effects_max", u64::from(u32::MAX)),
        ("recoveries_max", u64::from(u32::MAX)),
        ("cost_units_max", u64::MAX),
    ] {
        if let Some(limit) =
            document.pointer_mut(&format!("/components/schemas/BudgetBody/properties/{field}"))
        {
            *limit = json!({"type": ["integer", "null"], "minimum": 0, "maximum": max});
        }
    }
    if let Some(wall) = document.pointer_mut("/components/schemas/BudgetBody/properties/wall_time_max") {
        *wall = json!({"type": ["string", "null"], "pattern": "^[0-9]{1,6}(ms|s|m|h|d)$",
            "description": "how long after its start it may go on starting work (`90m`, `2h`)"});
    }
    if let Some(reason) = document.pointer_mut("/components/schemas/PauseBody/properties/reason") {
        *reason = id_schema();
    }
    if let Some(key) = document.pointer_mut("/components/schemas/EventBody/properties/idempotency_key") {
        let mut id = id_schema();
        id["type"] = json!(["string", "null"]);
        *key = id;
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

/// Gives every integer of a Rust type (`"format": "uint32"`, as schemars writes it) the
/// bounds of its type, which JSON Schema does not know from the format alone: a number past
/// them is not the agent's input.
fn bound_integers(value: &mut Value) {
    match value {
        Value::Object(map) => {
            let bounds: Option<(i128, i128)> = match map.get("format").and_then(Value::as_str) {
                Some("uint8") => Some((0, u8::MAX.into())),
                Some("uint16") => Some((0, u16::MAX.into())),
                Some("uint32" | "uint") => Some((0, u32::MAX.into())),
                Some("uint64") => Some((0, u64::MAX.into())),
                Some("int8") => Some((i8::MIN.into(), i8::MAX.into())),
                Some("int16") => Some((i16::MIN.into(), i16::MAX.into())),
                Some("int32" | "int") => Some((i32::MIN.into(), i32::MAX.into())),
                Some("int64") => Some((i64::MIN.into(), i64::MAX.into())),
                _ => None,
            };
            if let Some((min, max)) = bounds {
                let number = |n: i128| {
                    u64::try_from(n)
                        .map(Value::from)
                        .unwrap_or_else(|_| Value::from(i64::try_from(n).unwrap_or(0)))
                };
                map.entry("minimum").or_insert_with(|| number(min));
                map.entry("maximum").or_insert_with(|| number(max));
            }
            map.values_mut().for_each(bound_integers);
        }
        Value::Array(items) => items.iter_mut().for_each(bound_integers),
        _ => {}
    }
}

/// `POST /runs` takes a start body of each kind the runtime hosts (`StartBody_KIND`), its
/// `input` typed when the agent gives its input's schema (`Agent::input_schema`) and any
/// JSON otherwise: a kind the server does not host is not in the document.
fn with_start_bodies(document: &mut Value, runtime: &Runtime) {
    let kinds = runtime.kinds();
    let mut bodies = Vec::new();
    let mut components = serde_json::Map::new();
    for kind in &kinds {
        // A kind whose agent gives no schema takes any JSON as its input.
        let mut input = runtime.input_schema(kind).unwrap_or_else(|| json!({}));
        let prefix = format!("{}_", component_name(kind));
        if let Some(input) = input.as_object_mut() {
            input.remove("$schema");
            if let Some(Value::Object(defs)) = input.remove("$defs") {
                for (name, mut def) in defs {
                    rewrite_refs(&mut def, &prefix);
                    bound_integers(&mut def);
                    components.insert(format!("{prefix}{}", component_name(&name)), def);
                }
            }
        }
        rewrite_refs(&mut input, &prefix);
        bound_integers(&mut input);
        let name = format!("StartBody_{}", component_name(kind));
        components.insert(
            name.clone(),
            json!({
                "type": "object",
                "description": format!("starts a run of `{kind}`"),
                "required": ["kind", "input"],
                "additionalProperties": false,
                "properties": {
                    "kind": {"type": "string", "const": kind},
                    "input": input,
                    "options": {"anyOf": [{"$ref": "#/components/schemas/StartOptions"}, {"type": "null"}]},
                },
            }),
        );
        bodies.push(json!({"$ref": format!("#/components/schemas/{name}")}));
    }
    if bodies.is_empty() {
        return;
    }
    // The kinds are distinct constants: exactly one body matches.
    let choice = "oneOf";
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
