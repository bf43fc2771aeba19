//! What every handler shares ([`AppState`]) and the API's error shape ([`ApiError`]).

use axum::{
    Json,
    http::StatusCode,
    response::{IntoResponse, Response},
};
use durafiber_runtime::{Runtime, RuntimeError, Secrets};
use serde_json::json;

use super::{guard::Access, session::Sessions};

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
pub struct ApiError(pub StatusCode, pub String, pub &'static str);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({"error": self.1, "kind": self.2}))).into_response()
    }
}

impl From<RuntimeError> for ApiError {
    fn from(e: RuntimeError) -> Self {
        use RuntimeError::*;
        let (status, kind) = match &e {
            UnknownRun { .. } => (StatusCode::NOT_FOUND, "UnknownRun"),
            UnknownKind { .. } => (StatusCode::BAD_REQUEST, "UnknownKind"),
            KeyConflict { .. } => (StatusCode::CONFLICT, "KeyConflict"),
            StaleApproval { .. } => (StatusCode::CONFLICT, "StaleApproval"),
            NotPending { .. } => (StatusCode::CONFLICT, "NotPending"),
            AlreadyDecided { .. } => (StatusCode::CONFLICT, "AlreadyDecided"),
            RunFinished { .. } => (StatusCode::CONFLICT, "RunFinished"),
            InvalidInput(_) | Config(_) => (StatusCode::BAD_REQUEST, "InvalidInput"),
            Agent(_) => (StatusCode::UNPROCESSABLE_ENTITY, "Agent"),
            ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, "ShuttingDown"),
            Evicted { .. } => (StatusCode::SERVICE_UNAVAILABLE, "Evicted"),
            Store(durafiber_store::StoreError::StorageFull { .. }) => {
                (StatusCode::INSUFFICIENT_STORAGE, "StorageFull")
            }
            Store(durafiber_store::StoreError::Failed { .. }) => {
                (StatusCode::SERVICE_UNAVAILABLE, "StoreFailed")
            }
            NotVirtual | Store(_) | LivenessViolation { .. } => {
                (StatusCode::INTERNAL_SERVER_ERROR, "Internal")
            }
        };
        ApiError(status, e.to_string(), kind)
    }
}
