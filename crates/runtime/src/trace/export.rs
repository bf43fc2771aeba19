//! Spans leave the process over OTLP/HTTP (protobuf), in batches from a thread of their own,
//! so a slow or absent collector never holds a run: past the queue's bound, spans are
//! dropped and counted, never waited for.

use std::collections::HashMap;

use opentelemetry::KeyValue;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::{
    Resource,
    trace::{BatchConfigBuilder, BatchSpanProcessor, SpanProcessor},
};

use crate::{config::TraceExport, error::RuntimeError};

/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`, when either is set:
/// then traces are exported though the configuration names no endpoint.
pub(crate) fn endpoint_from_env() -> Option<String> {
    ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"]
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()))
}

/// The batch processor that sends this runtime's spans, or `None` when traces are off.
pub(crate) fn processor(
    config: &TraceExport,
    node: &str,
) -> Result<Option<BatchSpanProcessor>, RuntimeError> {
    let configured = config.endpoint.as_ref().filter(|e| !e.trim().is_empty());
    if configured.is_none() && endpoint_from_env().is_none() {
        return Ok(None);
    }
    let bad = |e: String| RuntimeError::Config(format!("traces: {e}"));
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(Blocking::new().map_err(|e| bad(e.to_string()))?)
        .with_timeout(config.timeout)
        .with_headers(config.headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect::<HashMap<_, _>>());
    // A configured endpoint wins; without one, the exporter reads the standard variables.
    if let Some(endpoint) = configured {
        builder = builder.with_endpoint(endpoint.trim());
    }
    let exporter = builder.build().map_err(|e| bad(e.to_string()))?;
    let batch = BatchConfigBuilder::default()
        .with_scheduled_delay(config.export_every)
        .with_max_queue_size(config.queue_max.max(1))
        .with_max_export_batch_size(config.queue_max.clamp(1, 512))
        .build();
    let mut processor = BatchSpanProcessor::builder(exporter).with_batch_config(batch).build();
    let resource = Resource::builder_empty()
        .with_service_name(config.service_name.clone())
        .with_attributes([
            KeyValue::new("service.instance.id", format!("{node}/{}", std::process::id())),
            KeyValue::new("process.pid", i64::from(std::process::id())),
            KeyValue::new("durafiber.node", node.to_string()),
        ])
        .build();
    processor.set_resource(&resource);
    Ok(Some(processor))
}

/// The exporter's HTTP client. The batch processor exports from a plain thread (no tokio
/// reactor there), so each export runs on a small runtime of its own on that same thread:
/// no thread more, and nothing that depends on the application's runtime being alive.
#[derive(Debug)]
struct Blocking {
    client: reqwest::Client,
    /// Always `Some` until dropped.
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for Blocking {
    /// Dropped where the exporter is built too (an endpoint refused), inside the
    /// application's runtime, where a runtime may not be dropped by blocking.
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Why the exporter could not be made.
#[derive(Debug, thiserror::Error)]
enum ExporterError {
    #[error("no runtime for the exporter: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("no HTTP client for the exporter: {0}")]
    Client(#[source] reqwest::Error),
}

impl Blocking {
    fn new() -> Result<Blocking, ExporterError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(ExporterError::Runtime)?;
        // Connections are not kept: one batch a second at most, and a kept connection would
        // be driven only while an export runs.
        let client =
            reqwest::Client::builder().pool_max_idle_per_host(0).build().map_err(ExporterError::Client)?;
        Ok(Blocking { client, runtime: Some(runtime) })
    }
}

#[async_trait::async_trait]
impl HttpClient for Blocking {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        if tokio::runtime::Handle::try_current().is_ok() {
            // Only the batch processor's thread exports; a runtime cannot be entered twice.
            return Err("the trace exporter was called on a tokio thread".into());
        }
        let (parts, body) = request.into_parts();
        let request = reqwest::Request::try_from(Request::from_parts(parts, body.to_vec()))?;
        let client = self.client.clone();
        let runtime = self.runtime.as_ref().ok_or("the trace exporter's runtime is gone")?;
        runtime.block_on(async move {
            let answer = client.execute(request).await?;
            let status = answer.status();
            let headers = answer.headers().clone();
            let body = answer.bytes().await?;
            let mut response = Response::builder().status(status.as_u16()).body(body)?;
            *response.headers_mut() = headers;
            Ok(response)
        })
    }
}
