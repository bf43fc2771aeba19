//! Where runs' traces are exported (`traces` in the config).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::limits;

/// Where a run's trace goes (`traces` in the config): OpenTelemetry spans over OTLP/HTTP
/// (protobuf). Off unless `endpoint` is set here or in `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
/// (the full URL) or `OTEL_EXPORTER_OTLP_ENDPOINT` (a base, `/v1/traces` added);
/// `OTEL_EXPORTER_OTLP_HEADERS` adds headers.
///
/// ```
/// use durafiber_runtime::RuntimeConfig;
///
/// let config = RuntimeConfig::from_json(r#"{"traces": {
///     "endpoint": "http://localhost:4318/v1/traces",
///     "headers": {"x-team": "agents"},
///     "ui": "http://localhost:16686/trace/{trace_id}"
/// }}"#)?;
/// assert_eq!(config.traces.export_every, std::time::Duration::from_secs(1));
/// # Ok::<(), durafiber_runtime::RuntimeError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TraceExport {
    /// The collector's OTLP/HTTP traces URL, as is: `http://localhost:4318/v1/traces`.
    pub endpoint: Option<String>,
    /// Headers sent with every export (a vendor's API key, say).
    pub headers: std::collections::BTreeMap<String, String>,
    /// Spans are sent at most this long after they end ("1s").
    #[serde(with = "humantime_serde")]
    pub export_every: Duration,
    /// Spans that may wait to be sent (8,192); past it, new ones are dropped, never waited for.
    pub queue_max: usize,
    /// How long one export may take ("10s").
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// The `service.name` of the spans ("durafiber").
    pub service_name: String,
    /// A trace UI's page for one trace, `{trace_id}` in it replaced by the run's trace id:
    /// the console links each run to it.
    pub ui: Option<String>,
}

impl Default for TraceExport {
    fn default() -> Self {
        TraceExport {
            endpoint: None,
            headers: Default::default(),
            export_every: limits::TRACE_EXPORT_EVERY_DEFAULT,
            queue_max: limits::TRACE_QUEUE_MAX_DEFAULT,
            timeout: limits::TRACE_EXPORT_TIMEOUT_DEFAULT,
            service_name: "durafiber".into(),
            ui: None,
        }
    }
}
