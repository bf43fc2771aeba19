//! One trace per run (OpenTelemetry over OTLP/HTTP), found at a collector in the test's
//! process (`durafiber_testkit::otlp::Receiver`):
//!
//! - crashed at every boundary, evicted at every boundary and by chaos (`AgentCheck`), each
//!   case's run has exactly one trace, whose id is derived from its run id, with one root,
//!   no span whose parent is missing, no span id twice, each effect executed once, and a
//!   recovered attempt after every crash;
//! - a caller's `traceparent` is a link of the run's root; an effect's call carries its
//!   span's `traceparent` to the upstream; a secret never leaves in a span, even when a
//!   reviewer pastes it into a decision's comment; a collector that refuses exports for a
//!   while loses nothing.
//!
//! `crates/lab/tests/traces.rs` SIGKILLs a server mid-run and finds both processes' spans
//! in one trace.

use durafiber_runtime::StartRequest;
use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use durafiber_runtime::{
    Agent, AgentError, Ctx, Decision, Recovered, RunId, RunStatus, Runtime, RuntimeConfig, RuntimeError,
    Secrets, TraceExport, trace,
};
use durafiber_store::{Store, StoreConfig};
use durafiber_testkit::{
    check::AgentCheck,
    otlp::{self, ReceivedSpan, Receiver},
    upstream::{Upstream, post_idempotent},
};
use serde_json::{Value, json};

/// Everything a run's trace can show: a stash, an effect, an approval, a durable sleep, an
/// event wait, a second effect.
#[derive(Clone, Default)]
struct Errand {
    http: reqwest::Client,
}

impl Errand {
    async fn go(&self, ctx: &mut Ctx<Self>, upstream: String, done: u32) -> Result<u32, AgentError> {
        if done == 0 {
            ctx.stash("began", &1).await?;
        }
        let http = self.http.clone();
        let base = upstream.clone();
        let _: Value = ctx
            .effect("charge", json!({"amount_cents": 700}), move |key, body| {
                let (http, base) = (http.clone(), base.clone());
                async move { post_idempotent(&http, &base, "charges", &key, None, &body).await }
            })
            .await?;
        let decision = ctx.request_approval("ship", &json!({"amount_cents": 700})).await?;
        if !decision.approved {
            return Err(AgentError::escalate("the reviewer said no"));
        }
        ctx.sleep_for("cool-off", Duration::from_secs(5)).await?;
        let _: Option<Value> = ctx.wait_for_event("receipt", Some(Duration::from_secs(600))).await?;
        let http = self.http.clone();
        let _: Value = ctx
            .effect("email", json!({"template": "shipped"}), move |key, body| {
                let (http, base) = (http.clone(), upstream.clone());
                async move { post_idempotent(&http, &base, "emails", &key, None, &body).await }
            })
            .await?;
        ctx.stash("done", &2).await?;
        Ok(2)
    }
}

impl Agent for Errand {
    const KIND: &'static str = "errand";
    type Input = String;
    type Stash = u32;
    type Output = u32;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, upstream: String) -> Result<u32, AgentError> {
        self.go(ctx, upstream, 0).await
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, r: Recovered<Self>) -> Result<u32, AgentError> {
        self.go(ctx, r.input, r.stash.unwrap_or(0)).await
    }
}

fn traced(receiver: &Receiver) -> RuntimeConfig {
    RuntimeConfig {
        traces: TraceExport {
            endpoint: Some(receiver.endpoint()),
            export_every: Duration::from_millis(50),
            ..TraceExport::default()
        },
        ..RuntimeConfig::default()
    }
}

/// The spans by trace id.
fn by_trace(spans: &[ReceivedSpan]) -> BTreeMap<String, Vec<ReceivedSpan>> {
    let mut traces: BTreeMap<String, Vec<ReceivedSpan>> = BTreeMap::new();
    for span in spans {
        traces.entry(span.trace_id.clone()).or_default().push(span.clone());
    }
    traces
}

fn names(spans: &[ReceivedSpan]) -> BTreeSet<String> {
    spans.iter().map(|s| s.name.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_run_keeps_one_whole_trace_through_crashes_and_evictions_at_every_boundary() {
    let receiver = Receiver::start().await.expect("receiver");
    let upstream = Arc::new(Upstream::start().await.expect("upstream"));
    let report = AgentCheck::new(Errand::default())
        .input(&upstream.url())
        .upstream(upstream.clone())
        .config(traced(&receiver))
        .approve_with(|_| Decision { approved: true, comment: "fine".into() })
        .send_event("receipt", json!({"n": 1}))
        .crash_at_every_boundary()
        .kill_during_effects()
        .eviction_matrix()
        .seeds(1..3)
        .run()
        .await;
    report.assert_ok();
    let cases = report.cases.len() + 1;

    // Every case's runtime sent what it had at its shutdown.
    let traces = by_trace(&receiver.spans());
    assert_eq!(traces.len(), cases, "one trace per case's run");
    let mut problems = Vec::new();
    for (trace_id, spans) in &traces {
        for problem in otlp::problems(trace_id, spans) {
            problems.push(format!("{trace_id}: {problem}"));
        }
        // Each run completed: each effect was executed in it exactly once, and it settled once.
        for effect in ["effect charge", "effect email"] {
            let executed = spans
                .iter()
                .filter(|s| s.name == effect && s.attr("durafiber.effect.outcome") == Some("executed"))
                .count();
            if executed != 1 {
                problems.push(format!("{trace_id}: {effect} executed {executed} times"));
            }
        }
        let settled: Vec<_> = spans.iter().filter(|s| s.name == "run.settle").collect();
        if settled.len() != 1 || settled[0].attr("durafiber.run.state") != Some("completed") {
            problems.push(format!("{trace_id}: settled {settled:?}"));
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");

    // The uninterrupted run shows every kind of span.
    let all: Vec<ReceivedSpan> = traces.values().flatten().cloned().collect();
    let wanted = [
        "run",
        "activation",
        "fiber.attempt",
        "stash",
        "effect charge",
        "effect email",
        "approval.request",
        "approval.decision",
        "sleep",
        "event.wait",
        "run.settle",
    ];
    let fullest = traces.values().map(|spans| names(spans)).max_by_key(BTreeSet::len).expect("a trace");
    for name in wanted {
        assert!(fullest.contains(name), "no {name} span in {fullest:?}");
    }
    // Crashes and evictions left attempts that did not end, each sent by the recovered one.
    let unfinished = all.iter().filter(|s| s.attr("durafiber.outcome") == Some("left memory")).count();
    assert!(unfinished > 0, "no attempt left memory");
    assert!(all.iter().any(|s| s.name == "fiber.attempt" && s.attr("durafiber.recovered") == Some("true")));
    assert!(all.iter().any(|s| s.name == "evict"), "no eviction span");
    assert!(all.iter().any(|s| s.attr("durafiber.effect.outcome") == Some("replayed")), "nothing replayed");
}

/// Escalates with its input's text as the reason.
#[derive(Clone, Default)]
struct Giver;

impl Agent for Giver {
    const KIND: &'static str = "giver";
    type Input = String;
    type Stash = ();
    type Output = ();
    type Message = ();

    async fn run_fiber(&self, _ctx: &mut Ctx<Self>, reason: String) -> Result<(), AgentError> {
        Err(AgentError::escalate(reason))
    }

    async fn on_fiber_recovered(&self, _ctx: &mut Ctx<Self>, r: Recovered<Self>) -> Result<(), AgentError> {
        Err(AgentError::escalate(r.input))
    }
}

const SECRET: &str = "sk-live-51Hx9TOPSECRETvalue";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_trace_links_an_effect_carries_its_span_and_no_secret_leaves() {
    let receiver = Receiver::start().await.expect("receiver");
    let upstream = Upstream::start().await.expect("upstream");
    // The collector is down for the first exports: they are sent again.
    receiver.refuse_next(2);
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_at(dir.path().to_str().expect("utf-8"), StoreConfig::default()).expect("store");
    let secrets = Secrets::from_map([("upstream".to_string(), SECRET.to_string())].into());
    let rt = Runtime::builder(store)
        .config(traced(&receiver))
        .secrets(secrets)
        .agent(Errand::default())
        .agent(Giver)
        .open()
        .await
        .expect("runtime");

    let caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let input = serde_json::to_value(upstream.url()).expect("json");
    let run = rt
        .start_run(StartRequest::new("errand", "e-1", input).with_traceparent(Some(caller)))
        .await
        .expect("start")
        .run_id;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let pending = loop {
        let pending = rt.pending_approvals(Some(&run)).expect("pending");
        if let Some(p) = pending.into_iter().next() {
            break p;
        }
        assert!(std::time::Instant::now() < deadline, "the run never asked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // A reviewer pastes the key into the comment: the span says it redacted.
    let comment = format!("ok, charged with {SECRET}");
    rt.approve(&run, "ship", &pending.payload_hash, Decision { approved: true, comment })
        .await
        .expect("approve");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !matches!(rt.status(&run).expect("status"), RunStatus::WaitingEvent { .. }) {
        assert!(std::time::Instant::now() < deadline, "the run never waited for its receipt");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    rt.send_event(&run, "receipt", &json!({"n": 1}), Some("r-1")).await.expect("event");
    assert!(matches!(rt.wait(&run).await.expect("wait"), RunStatus::Completed { .. }));
    // A malformed header is ignored, and an escalation has its span.
    let giver = rt
        .start_run(
            StartRequest::new("giver", "g-1", format!("gave up, key {SECRET}").into())
                .with_traceparent(Some("00-zz")),
        )
        .await
        .expect("start")
        .run_id;
    assert!(matches!(rt.wait(&giver).await.expect("wait"), RunStatus::Escalated { .. }));
    // A run's last spans are sent by its fiber just after its end is written, which `wait`
    // sees: shutting down at once could stop the fiber between the two.
    let ended = |run: &RunId, last: &'static str| {
        let trace_id = trace::trace_id_of(run);
        move |spans: &[ReceivedSpan]| {
            let of_run = |name: &str| spans.iter().any(|s| s.trace_id == trace_id && s.name == name);
            of_run(last) && of_run("fiber.attempt")
        }
    };
    assert!(
        receiver.wait_for(Duration::from_secs(30), ended(&run, "run.settle")).await,
        "the errand's last spans"
    );
    assert!(
        receiver.wait_for(Duration::from_secs(30), ended(&giver, "escalate")).await,
        "the giver's last spans"
    );
    rt.shutdown().await;

    let trace_id = trace::trace_id_of(&run);
    let spans = receiver.trace(&trace_id);
    assert!(otlp::problems(&trace_id, &spans).is_empty(), "{:#?}", otlp::problems(&trace_id, &spans));
    assert!(receiver.refused() >= 2, "the collector refused {} exports", receiver.refused());
    let root = spans.iter().find(|s| s.name == "run").expect("root");
    assert_eq!(
        root.links,
        vec![("0af7651916cd43dd8448eb211c80319c".to_string(), "b7ad6b7169203331".to_string())]
    );
    // The upstream heard each effect's span: this trace, the effect span's id.
    let heard = upstream.traceparents();
    assert_eq!(heard.len(), 2, "{heard:?}");
    for (collection, _, parent) in &heard {
        let span_id = parent.split('-').nth(2).expect("span id");
        let effect = spans.iter().find(|s| s.span_id == span_id).expect("the effect's span");
        assert!(parent.starts_with(&format!("00-{trace_id}-")), "{parent}");
        let name = if collection == "charges" { "effect charge" } else { "effect email" };
        assert_eq!(effect.name, name);
        assert_eq!(effect.attr("durafiber.effect.outcome"), Some("executed"));
    }
    let decision = spans.iter().find(|s| s.name == "approval.decision").expect("decision span");
    assert_eq!(decision.attr("durafiber.approval.approved"), Some("true"));
    assert!(!decision.attr("durafiber.approval.comment").unwrap_or_default().contains(SECRET));

    let giver_spans = receiver.trace(&trace::trace_id_of(&giver));
    let root = giver_spans.iter().find(|s| s.name == "run").expect("root");
    assert!(root.links.is_empty(), "a malformed traceparent made a link");
    let escalated = giver_spans.iter().find(|s| s.name == "escalate").expect("escalation span");
    assert!(escalated.failed);
    assert!(escalated.attr("durafiber.escalation.reason").unwrap_or_default().starts_with("gave up, key "));

    let raw = receiver.raw();
    assert!(!raw.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()), "a secret left in a span");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_is_not_a_url_is_a_config_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_at(dir.path().to_str().expect("utf-8"), StoreConfig::default()).expect("store");
    let config = RuntimeConfig {
        traces: TraceExport { endpoint: Some("not a url".into()), ..TraceExport::default() },
        ..RuntimeConfig::default()
    };
    let opened = Runtime::builder(store).config(config).agent(Giver).open().await;
    assert!(matches!(&opened, Err(RuntimeError::Config(e)) if e.contains("traces")), "{:?}", opened.err());
}
