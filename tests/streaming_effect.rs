//! Streaming effects (`Ctx::effect_stream`) against a fake OpenAI-compatible server on
//! 127.0.0.1: a model's answer reaches readers as it streams; a call cut half-way is taken
//! back with a reset and made again with the same key; the durable stream ends with exactly
//! one complete answer; a committed answer is never asked for again, whatever re-enters the
//! fiber — crashes at every boundary, lost writes, kills between the answer and its receipt,
//! evictions.

use std::{sync::Arc, time::Duration};

use durafiber_examples::openai::{self, Message, ModelConfig};
use durafiber_runtime::{
    Agent, AgentError, Boundary, Ctx, EffectOptions, Recovered, RunStatus, Runtime, StreamItem,
    testing::BuilderTestExt,
};
use durafiber_store::{Store, StoreConfig};
use durafiber_testkit::{
    check::AgentCheck,
    openai::{FakeOpenAi, Reply, numbered_tokens},
};
use futures::StreamExt as _;
use serde::{Deserialize, Serialize};

/// Asks the model one question and streams the answer; "done" after it.
#[derive(Clone, Default)]
struct Answerer;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Question {
    base_url: String,
    prompt: String,
}

impl Agent for Answerer {
    const KIND: &'static str = "answerer";
    type Input = Question;
    /// The answer, once it is in.
    type Stash = String;
    type Output = String;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, q: Question) -> Result<String, AgentError> {
        ctx.emit(&format!("Q: {}", q.prompt))?;
        let answer = ask(ctx, q).await?;
        ctx.stash("answered", &answer).await?;
        ctx.emit("done")?;
        Ok(answer)
    }

    async fn on_fiber_recovered(
        &self,
        ctx: &mut Ctx<Self>,
        r: Recovered<Self>,
    ) -> Result<String, AgentError> {
        match r.stash {
            Some(answer) => {
                ctx.emit("done")?;
                Ok(answer)
            }
            None => self.run_fiber(ctx, r.input).await,
        }
    }
}

async fn ask(ctx: &mut Ctx<Answerer>, q: Question) -> Result<String, AgentError> {
    let policy = EffectOptions {
        attempts: 4,
        backoff_initial: Duration::from_millis(10),
        backoff_max: Duration::from_millis(50),
        timeout: Some(Duration::from_secs(30)),
        limit: None,
    };
    let http = openai::http_client();
    let turn = ctx
        .effect_stream("answer", q, policy, |key, q, sink| {
            let http = http.clone();
            async move {
                let model =
                    ModelConfig { base_url: q.base_url, model: "fake".into(), key_secret: None, limit: None };
                let messages = [Message::text("user", &q.prompt)];
                openai::stream_turn(&http, &model, None, &key, &messages, &serde_json::json!([]), &sink).await
            }
        })
        .await?;
    Ok(turn.message.content.unwrap_or_default())
}

fn question(model: &FakeOpenAi) -> Question {
    Question { base_url: model.base_url(), prompt: "count".into() }
}

async fn runtime(dir: &std::path::Path, hook: Option<durafiber_runtime::CrashHook>) -> Runtime {
    let store = Store::open_dir(dir, StoreConfig::default()).expect("store");
    let mut builder = Runtime::builder(store).agent(Answerer);
    if let Some(hook) = hook {
        builder = builder.crash_hook(hook);
    }
    builder.open().await.expect("runtime")
}

/// What a reader shows after `items`, applying the stream's rules: a durable chunk replaces
/// the partial ones shown before it, a reset drops them.
fn shown(items: &[StreamItem]) -> (Vec<String>, Vec<String>) {
    let (mut durable, mut partial) = (Vec::new(), Vec::new());
    for item in items {
        match item {
            StreamItem::Chunk(c) => {
                partial.clear();
                durable.push(c.data::<String>().expect("a string chunk"));
            }
            StreamItem::Partial(p) => {
                partial.push(serde_json::from_str::<String>(&p.data_json).expect("text"));
            }
            StreamItem::Reset(_) => partial.clear(),
        }
    }
    (durable, partial)
}

/// The run's durable output stream, as text.
fn stored(rt: &Runtime, run_id: &durafiber_runtime::RunId) -> Vec<String> {
    let chunks = rt.stream_chunks(run_id, 0, 1_000).expect("chunks");
    chunks.iter().map(|c| c.data::<String>().expect("text")).collect()
}

fn transcript(answer_tokens: usize) -> Vec<String> {
    let mut all = vec!["Q: count".to_string()];
    all.extend(numbered_tokens(answer_tokens));
    all.push("done".into());
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_at_chunk_50_of_100_is_taken_back_and_its_retry_leaves_one_complete_answer() {
    durafiber_testkit::init_tracing();
    let model = FakeOpenAi::start().await.expect("model");
    let tokens = numbered_tokens(100);
    let words: Vec<&str> = tokens.iter().map(String::as_str).collect();
    model.script(Reply::text_cut(&words, 50));
    model.default_answer(Reply::text(&words));
    model.hold_at(30);
    let dir = tempfile::tempdir().expect("dir");
    let rt = runtime(dir.path(), None).await;
    let run_id = rt.start::<Answerer>("q", &question(&model)).await.expect("start").run_id;
    let mut reader = rt.stream(&run_id, 0).expect("stream");

    // The first call stops at its 30th chunk: the reader has been shown the first 30, live.
    let mut items = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !items.iter().any(|i| matches!(i, StreamItem::Partial(p) if p.index == 29)) {
        let item = tokio::time::timeout_at(deadline, reader.next()).await.expect("partial chunks in time");
        items.push(item.expect("the stream goes on").expect("an item"));
    }
    let (durable, partial) = shown(&items);
    assert_eq!(durable, vec!["Q: count".to_string()]);
    assert_eq!(partial, tokens[..30].to_vec(), "the call's first 30 chunks, before any is durable");
    assert!(
        rt.stream_chunks(&run_id, 1, 10).expect("chunks").is_empty(),
        "nothing of the answer is durable yet"
    );

    // It goes on to chunk 50 and is cut; the effect calls again, with the same key.
    model.release();
    let rest = reader.map(|i| i.expect("an item")).collect::<Vec<_>>();
    items.extend(tokio::time::timeout(Duration::from_secs(60), rest).await.expect("the stream ends"));
    let status = rt.wait(&run_id).await.expect("wait");
    assert!(matches!(&status, RunStatus::Completed { .. }), "{status:?}");

    let resets: Vec<_> = items.iter().filter(|i| matches!(i, StreamItem::Reset(_))).collect();
    assert_eq!(resets.len(), 1, "the cut call's chunks are taken back once: {resets:?}");
    let first_call_shown =
        items.iter().filter(|i| matches!(i, StreamItem::Partial(p) if p.call == 1)).count();
    assert!((30..=50).contains(&first_call_shown), "{first_call_shown} partial chunks of the cut call");
    let reset_at = items.iter().position(|i| matches!(i, StreamItem::Reset(_))).expect("a reset");
    assert!(
        items[..reset_at].iter().all(|i| !matches!(i, StreamItem::Partial(p) if p.call != 1)),
        "the reset comes before the second call's chunks"
    );
    let (durable, partial) = shown(&items);
    assert_eq!(durable, transcript(100), "the reader ends with one complete answer");
    assert!(partial.is_empty());
    assert_eq!(stored(&rt, &run_id), transcript(100), "the durable stream holds exactly one complete answer");

    let calls = model.recorded();
    assert_eq!(calls.len(), 2, "the cut call and its retry");
    assert!(calls[0].idempotency_key.is_some() && calls[0].idempotency_key == calls[1].idempotency_key);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_answer_is_not_asked_for_again_by_a_fiber_evicted_after_it() {
    let model = FakeOpenAi::start().await.expect("model");
    for boundary in [Boundary::AfterEffectCommit("answer".into()), Boundary::AfterStash("answered".into())] {
        model.reset();
        let dir = tempfile::tempdir().expect("dir");
        let once = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (at, evicted) = (boundary.clone(), once.clone());
        let hook: durafiber_runtime::CrashHook =
            Arc::new(move |_, b| *b == at && !evicted.swap(true, std::sync::atomic::Ordering::SeqCst));
        let rt = runtime(dir.path(), Some(hook)).await;
        let run_id = rt.start::<Answerer>("q", &question(&model)).await.expect("start").run_id;
        let status = tokio::time::timeout(Duration::from_secs(60), rt.wait(&run_id)).await.expect("ends");
        assert!(matches!(&status, Ok(RunStatus::Completed { .. })), "{boundary}: {status:?}");
        assert!(once.load(std::sync::atomic::Ordering::SeqCst), "{boundary}: the run was evicted there");
        assert_eq!(model.recorded().len(), 1, "{boundary}: the model was asked once");
        assert_eq!(stored(&rt, &run_id), transcript(20), "{boundary}: one copy of the answer");
        rt.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checker_finds_one_answer_and_one_transcript_in_every_crash_kill_and_eviction() {
    let model = Arc::new(FakeOpenAi::start().await.expect("model"));
    let report = AgentCheck::new(Answerer)
        .input(&question(&model))
        .upstream(model.clone())
        .crash_at_every_boundary()
        .kill_during_effects()
        .eviction_matrix()
        .run()
        .await;
    report.assert_ok();
    assert_eq!(report.baseline.requests.len(), 1, "one completion");
    assert!(report.cases.len() >= 6, "only {} cases", report.cases.len());
}
