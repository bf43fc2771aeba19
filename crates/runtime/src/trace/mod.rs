//! One trace per run, exported over OTLP (off unless an endpoint is configured).
//!
//! A run's trace id is derived from its run id (`ids.rs`), and so are the ids of its root
//! span and of each fiber attempt's span: whichever process re-enters the run — after a
//! crash, an eviction, on another node — adds its spans to the same trace under the same
//! parents, without storing anything. A span is sent once it has ended, with the times it
//! ran; nothing stays open across a wait. A caller's `traceparent` on a start becomes a
//! link of the run's root span, and an effect's call gets its span's `traceparent`
//! through [`traceparent`].
//!
//! Spans: `run` (the root, as the run is accepted), `activation` (each event a run's actor
//! handles), `fiber.attempt` (a fiber from its start to its end; one that did not end by
//! itself is sent by the run's next attempt, `run/attempt_span.rs`), and under the attempt
//! `stash`, `effect <id>`, `approval.request`, `sleep`, `event.wait`; under the root
//! `approval.vote`, `approval.decision`, `alarm <name>`, `evict`, `park`, `escalate` and
//! `run.settle`.

mod export;
mod ids;

use durafiber_api::Timestamp;
use durafiber_store::RunId;
use std::{borrow::Cow, time::SystemTime};

use opentelemetry::{
    InstrumentationScope, KeyValue, Value,
    trace::{Link, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceState},
};
use opentelemetry_sdk::trace::{BatchSpanProcessor, SpanData, SpanEvents, SpanLinks, SpanProcessor};

pub(crate) use ids::{attempt_span_id, fresh_span_id, root_span_id, trace_id};
pub use ids::{parse_traceparent, trace_id_of};

use crate::{config::TraceExport, error::RuntimeError, secret::Secrets};

tokio::task_local! {
    static CURRENT: String;
}

/// The W3C `traceparent` of the span an effect's call runs under, for the outgoing request,
/// so the upstream's own spans join the run's trace. `None` outside an effect's closure, or
/// when traces are not exported.
///
/// ```no_run
/// # async fn call<A: durafiber_runtime::Agent>(ctx: &mut durafiber_runtime::Ctx<A>) -> Result<(), durafiber_runtime::AgentError> {
/// let http = reqwest::Client::new();
/// let charged: String = ctx
///     .effect("charge", 1200u64, |key, cents| {
///         let http = http.clone();
///         async move {
///             let mut request = http.post("https://payments.example/charges").header("Idempotency-Key", key);
///             if let Some(parent) = durafiber_runtime::trace::traceparent() {
///                 request = request.header("traceparent", parent);
///             }
///             request.json(&cents).send().await?.text().await
///         }
///     })
///     .await?;
/// # Ok(()) }
/// ```
pub fn traceparent() -> Option<String> {
    CURRENT.try_with(Clone::clone).ok()
}

/// Runs `f` and its future with `parent` as [`traceparent`]'s answer.
pub(crate) async fn with_traceparent<F, Fut>(parent: Option<String>, f: F) -> Fut::Output
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future,
{
    match parent {
        None => f().await,
        Some(parent) => {
            let future = CURRENT.sync_scope(parent.clone(), f);
            CURRENT.scope(parent, future).await
        }
    }
}

/// The trace UI's page of the run `run_id`, when `config` names a UI.
pub fn ui_link(config: &TraceExport, run_id: &RunId) -> Option<String> {
    let template = config.ui.as_ref()?;
    Some(template.replace("{trace_id}", &trace_id_of(run_id)))
}

/// Whose child a span is.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Parent {
    /// The run's root span.
    Root,
    /// The span of the run's fiber attempt `n`.
    Attempt(u32),
}

/// A span that ended, ready to send.
pub(crate) struct Ended<'a> {
    pub run_id: &'a RunId,
    pub agent: &'a str,
    pub name: Cow<'static, str>,
    pub parent: Parent,
    /// Its own id: derived for the spans others name as parent, else fresh.
    pub span_id: SpanId,
    pub start: Timestamp,
    pub end: Timestamp,
    pub attributes: Vec<KeyValue>,
    /// What the span failed with, if it did.
    pub error: Option<String>,
    pub client: bool,
    /// A caller's span this one continues (a start's `traceparent`).
    pub link: Option<SpanContext>,
}

impl<'a> Ended<'a> {
    /// A span of the run `run_id` of kind `agent`, from `start` to `end`.
    pub fn new(
        run_id: &'a RunId,
        agent: &'a str,
        name: impl Into<Cow<'static, str>>,
        parent: Parent,
    ) -> Self {
        Ended {
            run_id,
            agent,
            name: name.into(),
            parent,
            span_id: SpanId::INVALID,
            start: Timestamp::ZERO,
            end: Timestamp::ZERO,
            attributes: Vec::new(),
            error: None,
            client: false,
            link: None,
        }
    }

    pub fn times(mut self, start: Timestamp, end: Timestamp) -> Self {
        self.start = start;
        self.end = end.max(start);
        self
    }

    pub fn id(mut self, span_id: SpanId) -> Self {
        self.span_id = span_id;
        self
    }

    pub fn attr(mut self, key: &'static str, value: impl Into<Value>) -> Self {
        self.attributes.push(KeyValue::new(key, value));
        self
    }

    pub fn error(mut self, error: Option<String>) -> Self {
        self.error = error;
        self
    }

    pub fn client(mut self) -> Self {
        self.client = true;
        self
    }

    pub fn link(mut self, link: Option<SpanContext>) -> Self {
        self.link = link;
        self
    }
}

/// This runtime's span exporter; inert when traces are off.
pub(crate) struct Traces {
    out: Option<std::sync::Arc<BatchSpanProcessor>>,
    node: String,
}

impl Traces {
    /// Exports as `config` says, or not at all when it names no endpoint and neither do the
    /// `OTEL_EXPORTER_OTLP_*` variables.
    pub fn open(config: &TraceExport, node: &str) -> Result<Traces, RuntimeError> {
        Ok(Traces { out: export::processor(config, node)?.map(std::sync::Arc::new), node: node.to_string() })
    }

    pub fn off() -> Traces {
        Traces { out: None, node: String::new() }
    }

    pub fn is_on(&self) -> bool {
        self.out.is_some()
    }

    /// The `traceparent` of `span` in `run_id`'s trace, when traces are exported.
    pub fn traceparent(&self, run_id: &RunId, span: SpanId) -> Option<String> {
        self.is_on().then(|| ids::traceparent(trace_id(run_id), span))
    }

    /// Sends `span`, every string in it cleared of secret values.
    pub fn send(&self, secrets: &Secrets, span: Ended<'_>) {
        let Some(out) = &self.out else { return };
        let trace_id = trace_id(span.run_id);
        let span_id = if span.span_id == SpanId::INVALID { fresh_span_id() } else { span.span_id };
        let parent_span_id = match span.parent {
            Parent::Root if span_id == ids::root_span_id(span.run_id) => SpanId::INVALID,
            Parent::Root => ids::root_span_id(span.run_id),
            Parent::Attempt(n) => attempt_span_id(span.run_id, n),
        };
        let redact = |text: String| if secrets.is_empty() { text } else { secrets.redact(&text) };
        let mut attributes = Vec::with_capacity(span.attributes.len() + 3);
        attributes.push(KeyValue::new("durafiber.run.id", span.run_id.to_string()));
        attributes.push(KeyValue::new("durafiber.agent", span.agent.to_string()));
        attributes.push(KeyValue::new("durafiber.node", self.node.clone()));
        for KeyValue { key, value, .. } in span.attributes {
            let value = match value {
                Value::String(s) => Value::from(redact(s.to_string())),
                other => other,
            };
            attributes.push(KeyValue::new(key, value));
        }
        let status = match span.error {
            Some(error) => Status::error(redact(error)),
            None => Status::Unset,
        };
        let mut links = SpanLinks::default();
        if let Some(context) = span.link {
            links.links.push(Link::with_context(context));
        }
        out.on_end(SpanData {
            span_context: SpanContext::new(
                trace_id,
                span_id,
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            ),
            parent_span_id,
            parent_span_is_remote: false,
            span_kind: if span.client { SpanKind::Client } else { SpanKind::Internal },
            name: span.name,
            start_time: at(span.start),
            end_time: at(span.end),
            attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links,
            status,
            instrumentation_scope: InstrumentationScope::builder("durafiber").build(),
        });
    }

    /// Sends what waits to be sent (at a shutdown), on a thread of its own: the flush
    /// blocks until the collector answers or the export times out.
    pub async fn flush(&self) {
        if let Some(out) = &self.out {
            let out = out.clone();
            let _ = tokio::task::spawn_blocking(move || out.force_flush()).await;
        }
    }
}

fn at(t: Timestamp) -> SystemTime {
    SystemTime::UNIX_EPOCH
        .checked_add(std::time::Duration::from_millis(t.as_millis()))
        .unwrap_or(SystemTime::UNIX_EPOCH)
}
