//! What every handler shares ([`AppState`], who may reach the server ([`Access`])), the
//! API's error shape ([`ApiError`]), and the small helpers every JSON handler uses.

use durafiber_api::ApiErrorKind;
use std::net::SocketAddr;

use axum::{
    Json,
    body::Bytes,
    extract::Query,
    http::StatusCode,
    response::{IntoResponse, Response},
};
use durafiber_runtime::{Runtime, RuntimeError, Secrets};
use serde_json::json;

use crate::session::Sessions;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// The runtime served.
    pub runtime: Runtime,
    /// Used to redact secret values from inspection output.
    pub secrets: Secrets,
    /// The process's Prometheus recorder, rendered by `GET /metrics`.
    pub prometheus: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// Which hosts and origins the server answers, and whether `/metrics` is open.
    pub access: Access,
    /// The console's signed-in browsers.
    pub sessions: std::sync::Arc<Sessions>,
    /// Turns true when the server begins to stop: open event streams end then.
    pub stopping: tokio::sync::watch::Receiver<bool>,
    /// How requests are passed on to the node that runs their run.
    pub peers: Peers,
}

/// How this node reaches the others: over TLS when it serves TLS itself, with a bound on
/// how long a request passed on waits for its answer.
#[derive(Clone)]
pub struct Peers {
    /// The client, trusting the server's own certificate chain when it has one.
    pub client: reqwest::Client,
    /// Whether the nodes speak TLS to each other.
    pub tls: bool,
    /// How long a request passed on waits for its answer.
    pub timeout: std::time::Duration,
}

impl Peers {
    /// `https` or `http`.
    pub fn scheme(&self) -> &'static str {
        if self.tls { "https" } else { "http" }
    }
}

/// The process's Prometheus recorder: installed as the `metrics` facade's global recorder
/// the first time it is asked for, so every runtime in the process reports through it.
/// `None` when another recorder was installed first.
pub fn prometheus() -> Option<metrics_exporter_prometheus::PrometheusHandle> {
    static HANDLE: std::sync::OnceLock<Option<metrics_exporter_prometheus::PrometheusHandle>> =
        std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| match prometheus_builder().install_recorder() {
            Ok(handle) => {
                durafiber_runtime::describe_metrics();
                Some(handle)
            }
            Err(e) => {
                tracing::warn!(error = %e, "no Prometheus recorder: another one is installed");
                None
            }
        })
        .clone()
}

/// Latency histograms as Prometheus histograms (buckets, so quantiles aggregate across
/// servers), from 100 µs to a minute, in seconds.
const LATENCY_BUCKETS_SECONDS: [f64; 14] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 60.0];

fn prometheus_builder() -> metrics_exporter_prometheus::PrometheusBuilder {
    let builder = metrics_exporter_prometheus::PrometheusBuilder::new();
    // Only an empty bucket list is refused, and this one is not.
    match builder.set_buckets(&LATENCY_BUCKETS_SECONDS) {
        Ok(builder) => builder,
        Err(_) => metrics_exporter_prometheus::PrometheusBuilder::new(),
    }
}

/// An API error: a status and a JSON body.
pub struct ApiError(pub StatusCode, pub String, pub ApiErrorKind);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({"error": self.1, "kind": self.2.name()}))).into_response()
    }
}

impl From<RuntimeError> for ApiError {
    fn from(e: RuntimeError) -> Self {
        use RuntimeError::*;
        let (status, kind) = match &e {
            UnknownRun { .. } => (StatusCode::NOT_FOUND, ApiErrorKind::UnknownRun),
            NotOwner { .. } | Store(durafiber_store::StoreError::Fenced { .. }) => {
                (StatusCode::MISDIRECTED_REQUEST, ApiErrorKind::NotOwner)
            }
            UnknownKind { .. } => (StatusCode::BAD_REQUEST, ApiErrorKind::UnknownKind),
            KeyConflict { .. } => (StatusCode::CONFLICT, ApiErrorKind::KeyConflict),
            StaleApproval { .. } => (StatusCode::CONFLICT, ApiErrorKind::StaleApproval),
            NotPending { .. } => (StatusCode::CONFLICT, ApiErrorKind::NotPending),
            AlreadyDecided { .. } => (StatusCode::CONFLICT, ApiErrorKind::AlreadyDecided),
            AlreadyVoted { .. } => (StatusCode::CONFLICT, ApiErrorKind::AlreadyVoted),
            NotAReviewer { .. } => (StatusCode::FORBIDDEN, ApiErrorKind::NotAReviewer),
            DeciderUnknown { .. } => (StatusCode::BAD_REQUEST, ApiErrorKind::DeciderUnknown),
            ForkRefused { .. } => (StatusCode::CONFLICT, ApiErrorKind::ForkRefused),
            RunFinished { .. } => (StatusCode::CONFLICT, ApiErrorKind::RunFinished),
            RunOpen { .. } => (StatusCode::CONFLICT, ApiErrorKind::RunOpen),
            KeptWithParent { .. } => (StatusCode::CONFLICT, ApiErrorKind::KeptWithParent),
            InvalidInput(_) | Config(_) | Durability(_) => {
                (StatusCode::BAD_REQUEST, ApiErrorKind::InvalidInput)
            }
            // The agent refused what the request asked: it conflicts with the run as it is.
            Agent(_) => (StatusCode::CONFLICT, ApiErrorKind::Agent),
            WrongMessage { .. } => (StatusCode::CONFLICT, ApiErrorKind::WrongMessage),
            ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, ApiErrorKind::ShuttingDown),
            Evicted { .. } => (StatusCode::SERVICE_UNAVAILABLE, ApiErrorKind::Evicted),
            Store(durafiber_store::StoreError::StorageFull { .. }) => {
                (StatusCode::INSUFFICIENT_STORAGE, ApiErrorKind::StorageFull)
            }
            Store(durafiber_store::StoreError::Failed { .. }) => {
                (StatusCode::SERVICE_UNAVAILABLE, ApiErrorKind::StoreFailed)
            }
            // The rest, and kinds added later (the enum is `#[non_exhaustive]`), are the
            // server's own failure.
            _ => (StatusCode::INTERNAL_SERVER_ERROR, ApiErrorKind::Internal),
        };
        ApiError(status, e.to_string(), kind)
    }
}

/// Who may reach the server, decided at start-up.
#[derive(Debug, Clone)]
pub struct Access {
    /// `host:port` and bare host names a request's `Host` (and `Origin`) may name.
    allowed_hosts: Vec<String>,
    /// Whether `GET /metrics` is open without a token (for a scraper on the same host).
    pub(super) open_metrics: bool,
}

impl Access {
    /// The listen address, `localhost`, `127.0.0.1` and `[::1]` on its port, and `extra`
    /// (each `host` or `host:port`).
    pub fn new(listen: SocketAddr, extra: &[String], open_metrics: bool) -> Self {
        let port = listen.port();
        let mut allowed_hosts = vec![
            listen.to_string(),
            format!("localhost:{port}"),
            format!("127.0.0.1:{port}"),
            format!("[::1]:{port}"),
        ];
        allowed_hosts.extend(extra.iter().map(|h| h.to_ascii_lowercase()));
        Access { allowed_hosts, open_metrics }
    }

    pub(super) fn allows_host(&self, authority: &str) -> bool {
        let authority = authority.to_ascii_lowercase();
        let bare = authority.rsplit_once(':').map(|(h, _)| h).unwrap_or(&authority).to_string();
        self.allowed_hosts.iter().any(|h| *h == authority || *h == bare)
    }
}

pub fn bad_request(msg: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, msg.into(), ApiErrorKind::BadRequest)
}

/// Any JSON value of a body, as it is (a message's or a request's).
pub fn parse_value(body: &Bytes) -> Result<serde_json::Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| bad_request(format!("malformed JSON body: {e}")))
}

/// A body of the API's shapes, read as its document says: an object of fields (never an
/// array, which serde would otherwise take for a struct's fields in order), whose integer
/// fields may be written `5272.0` as JSON Schema allows. The agents' own values (`input`,
/// `payload`) are left exactly as sent.
pub fn parse<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    let mut value = parse_value(body)?;
    shape(&mut value, true)?;
    serde_json::from_value(value).map_err(|e| bad_request(format!("malformed JSON body: {e}")))
}

/// The fields whose values are the agents' own JSON.
const FREE_FIELDS: [&str; 2] = ["input", "payload"];

fn shape(value: &mut serde_json::Value, top: bool) -> Result<(), ApiError> {
    use serde_json::Value;
    match value {
        Value::Array(_) => Err(bad_request("an array where the API takes an object or a single value")),
        Value::Object(fields) => {
            for (name, field) in fields.iter_mut() {
                if FREE_FIELDS.contains(&name.as_str()) {
                    integers(field);
                } else {
                    shape(field, false)?;
                }
            }
            Ok(())
        }
        Value::Number(_) if !top => {
            integers(value);
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Every float in `value` with no fraction, within `i64`/`u64`, as the integer it equals:
/// `5272.0` is `5272` in JSON's own terms (and in its canonical form).
fn integers(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::Number(n) if n.is_f64() => {
            // Only where a float holds every integer exactly (below 2^53): a larger one may
            // not be the integer that was written.
            const EXACT: f64 = 9_007_199_254_740_992.0;
            let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < EXACT) else { return };
            *n = serde_json::Number::from(f as i64);
        }
        Value::Array(items) => items.iter_mut().for_each(integers),
        Value::Object(fields) => fields.values_mut().for_each(integers),
        _ => {}
    }
}

pub type ApiResult = Result<Response, ApiError>;

pub fn ok(value: impl serde::Serialize) -> ApiResult {
    Ok(Json(
        serde_json::to_value(value).map_err(|e| {
            ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string(), ApiErrorKind::Internal)
        })?,
    )
    .into_response())
}

/// Query strings are read as plain pairs, so a malformed one gets the same JSON error shape.
pub type Params = Query<std::collections::HashMap<String, String>>;

/// The query parameter `name` as a whole number from `min` to `max`, as the API's document
/// declares it: anything else (an empty value too) is refused, never clamped.
pub fn bounded(
    query: &std::collections::HashMap<String, String>,
    name: &str,
    min: u64,
    max: u64,
) -> Result<Option<u64>, ApiError> {
    let Some(text) = query.get(name) else { return Ok(None) };
    match text.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(Some(n)),
        _ => Err(bad_request(format!("{name} must be a whole number from {min} to {max}, not {text:?}"))),
    }
}

/// A list's page size when the request names none.
pub const PAGE_DEFAULT: usize = 100;

/// A list request's page: `limit` (default [`PAGE_DEFAULT`], at most
/// [`durafiber_runtime::limits::LIST_PAGE_MAX`]) and `after`, the previous page's last item.
pub struct PageQuery {
    /// How many items at most.
    pub limit: usize,
    /// The previous page's last item, as the list names it.
    pub after: Option<String>,
}

impl PageQuery {
    /// The page `query` asks for; an out-of-range `limit` is refused, never clamped.
    pub fn of(query: &std::collections::HashMap<String, String>) -> Result<PageQuery, ApiError> {
        let max = durafiber_runtime::limits::LIST_PAGE_MAX as u64;
        let limit = bounded(query, "limit", 1, max)?.map_or(PAGE_DEFAULT, |n| n as usize);
        Ok(PageQuery { limit, after: query.get("after").cloned() })
    }
}

/// A page of a list as a JSON array; when it is full (`next` names its last item), a
/// `Link: <path?…&limit=…&after=…>; rel="next"` header gives the next page's address, with
/// the request's other parameters (`keep`) as they were.
pub fn page_of(
    items: impl serde::Serialize,
    path: &str,
    keep: &[(&str, &str)],
    limit: usize,
    next: Option<String>,
) -> ApiResult {
    let mut response = ok(items)?;
    if let Some(after) = next {
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        for (name, value) in keep {
            query.append_pair(name, value);
        }
        query.append_pair("limit", &limit.to_string());
        query.append_pair("after", &after);
        let link = format!("<{path}?{}>; rel=\"next\"", query.finish());
        if let Ok(value) = axum::http::HeaderValue::from_str(&link) {
            response.headers_mut().insert(axum::http::header::LINK, value);
        }
    }
    Ok(response)
}
