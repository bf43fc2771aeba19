//! An OpenTelemetry collector on 127.0.0.1 that keeps every span it is sent (OTLP/HTTP,
//! protobuf), so a test can find a run's trace as Jaeger or Tempo would see it — and the
//! raw bytes it was sent, to look for what must never leave the process.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    sync::Arc,
    time::Duration,
};

use axum::{Router, body::Bytes, extract::State, http::StatusCode, routing::post};
use opentelemetry_proto::tonic::{
    collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse},
    common::v1::{AnyValue, KeyValue, any_value},
};
use parking_lot::Mutex;
use prost::Message;

/// One span as the collector received it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedSpan {
    /// Hex, 32 digits.
    pub trace_id: String,
    /// Hex, 16 digits.
    pub span_id: String,
    /// Hex, 16 digits; empty for a trace's root.
    pub parent_span_id: String,
    pub name: String,
    /// Every attribute, its value as text.
    pub attributes: BTreeMap<String, String>,
    /// The sending process's resource attributes (`process.pid`, `service.instance.id`).
    pub resource: BTreeMap<String, String>,
    pub start_ns: u64,
    pub end_ns: u64,
    /// The span's status says it failed.
    pub failed: bool,
    /// Spans it links to, as (trace id, span id).
    pub links: Vec<(String, String)>,
}

impl ReceivedSpan {
    /// An attribute's value, if the span has it.
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

#[derive(Default)]
struct Received {
    spans: Vec<ReceivedSpan>,
    bodies: Vec<u8>,
    /// Exports still to refuse with 503.
    refuse: usize,
    refused: usize,
}

/// The collector; it stops when dropped.
pub struct Receiver {
    addr: SocketAddr,
    received: Arc<Mutex<Received>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Receiver {
    /// Starts on an ephemeral port of 127.0.0.1.
    pub async fn start() -> std::io::Result<Receiver> {
        let received = Arc::new(Mutex::new(Received::default()));
        let app = Router::new().route("/v1/traces", post(export)).with_state(received.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "the OTLP receiver stopped");
            }
        });
        Ok(Receiver { addr, received, task })
    }

    /// The URL to export traces to (`traces.endpoint`).
    pub fn endpoint(&self) -> String {
        format!("http://{}/v1/traces", self.addr)
    }

    /// Every span received so far, in the order it came.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.received.lock().spans.clone()
    }

    /// The spans of one trace.
    pub fn trace(&self, trace_id: &str) -> Vec<ReceivedSpan> {
        self.received.lock().spans.iter().filter(|s| s.trace_id == trace_id).cloned().collect()
    }

    /// Every request body received, one after the other, as sent.
    pub fn raw(&self) -> Vec<u8> {
        self.received.lock().bodies.clone()
    }

    /// Answers the next `n` exports 503, as a collector that is down would.
    pub fn refuse_next(&self, n: usize) {
        self.received.lock().refuse = n;
    }

    /// Exports refused so far.
    pub fn refused(&self) -> usize {
        self.received.lock().refused
    }

    /// Waits until `done(spans)` holds, polling; false if it did not within `deadline`.
    pub async fn wait_for(&self, deadline: Duration, done: impl Fn(&[ReceivedSpan]) -> bool) -> bool {
        let until = std::time::Instant::now() + deadline;
        loop {
            if done(&self.received.lock().spans) {
                return true;
            }
            if std::time::Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn export(State(received): State<Arc<Mutex<Received>>>, body: Bytes) -> (StatusCode, Vec<u8>) {
    let mut r = received.lock();
    r.bodies.extend_from_slice(&body);
    if r.refuse > 0 {
        r.refuse -= 1;
        r.refused += 1;
        return (StatusCode::SERVICE_UNAVAILABLE, Vec::new());
    }
    let request = match ExportTraceServiceRequest::decode(body.as_ref()) {
        Ok(request) => request,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string().into_bytes()),
    };
    for resource_spans in request.resource_spans {
        let resource = resource_spans.resource.map(|r| attributes(&r.attributes)).unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                r.spans.push(ReceivedSpan {
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    name: span.name,
                    attributes: attributes(&span.attributes),
                    resource: resource.clone(),
                    start_ns: span.start_time_unix_nano,
                    end_ns: span.end_time_unix_nano,
                    // STATUS_CODE_ERROR
                    failed: span.status.is_some_and(|s| s.code == 2),
                    links: span.links.iter().map(|l| (hex(&l.trace_id), hex(&l.span_id))).collect(),
                });
            }
        }
    }
    (StatusCode::OK, ExportTraceServiceResponse::default().encode_to_vec())
}

/// What is wrong with one run's trace, `spans` all of `trace_id`: not one root, a root not
/// named `run` or whose run's trace id differs, a span id twice, a parent missing, a span
/// of another run, one that ends before it starts, an effect's key executed twice.
pub fn problems(trace_id: &str, spans: &[ReceivedSpan]) -> Vec<String> {
    let mut problems = Vec::new();
    let roots: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.parent_span_id.is_empty()).collect();
    let [root] = roots.as_slice() else {
        problems.push(format!("{} roots", roots.len()));
        return problems;
    };
    let run_id = root.attr("durafiber.run.id").unwrap_or_default();
    if root.name != "run" || durafiber_runtime::trace::trace_id_of(&run_id.into()) != trace_id {
        problems.push(format!("root {} of run {run_id} in trace {trace_id}", root.name));
    }
    let mut ids = BTreeSet::new();
    for span in spans {
        if !ids.insert(span.span_id.as_str()) {
            problems.push(format!("span {} ({}) sent twice", span.span_id, span.name));
        }
        if span.attr("durafiber.run.id") != Some(run_id) {
            problems.push(format!("span {} is of run {:?}", span.name, span.attr("durafiber.run.id")));
        }
        if span.end_ns < span.start_ns {
            problems.push(format!("span {} ends before it starts", span.name));
        }
    }
    for span in spans {
        if !span.parent_span_id.is_empty() && !ids.contains(span.parent_span_id.as_str()) {
            problems.push(format!("the parent of {} ({}) is missing", span.name, span.parent_span_id));
        }
    }
    let mut executed: BTreeMap<&str, usize> = BTreeMap::new();
    for span in spans.iter().filter(|s| s.attr("durafiber.effect.outcome") == Some("executed")) {
        *executed.entry(span.attr("durafiber.effect.key").unwrap_or_default()).or_default() += 1;
    }
    for (key, n) in executed.into_iter().filter(|(_, n)| *n > 1) {
        problems.push(format!("effect key {key} executed {n} times"));
    }
    problems
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attributes(list: &[KeyValue]) -> BTreeMap<String, String> {
    list.iter().map(|kv| (kv.key.clone(), kv.value.as_ref().map(text).unwrap_or_default())).collect()
}

fn text(value: &AnyValue) -> String {
    match &value.value {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}
