//! The model-calling example against a fake OpenAI-compatible server and a tools upstream, both
//! on 127.0.0.1: through the crash and eviction checker with every option, and as its own
//! binary, SIGKILLed in the middle of a streamed answer and at random times after, with a
//! client following its output stream across the restarts.

mod common;

use std::{sync::Arc, time::Duration};

use common::{eventually, free_port, pending_approval, rand_seed, serve};

use durafiber::client::{Client, StartOptions, Status};
use durafiber::testkit::{
    check::{AgentCheck, CheckUpstream, UpstreamFuture},
    openai::{FakeOpenAi, Reply, numbered_tokens},
    upstream::Upstream,
};
use durafiber::{Decision, StreamItem, rng::SeededRng};
use durafiber_examples::model_agent::{ModelAgent, Task};
use durafiber_examples::openai::ModelConfig;
use futures::StreamExt as _;
use serde_json::{Value, json};

/// The model's script: look the order up, refund it (a person approves), then answer.
fn script(model: &FakeOpenAi, answer: &[&str]) {
    model.script(Reply::tool_call("lookup_order", &json!({"order_id": "ord_1"})));
    model.script(Reply::tool_call("refund", &json!({"order_id": "ord_1", "cents": 500})));
    model.script(Reply::text(answer));
}

fn task() -> Task {
    Task { prompt: "Refund 5.00 on ord_1, it arrived broken.".into(), max_turns: 6 }
}

/// The model and the tools, counted together by the checker.
struct World {
    model: Arc<FakeOpenAi>,
    tools: Arc<Upstream>,
}

impl CheckUpstream for World {
    fn reset(&self) -> UpstreamFuture<'_, ()> {
        Box::pin(async move {
            self.model.reset();
            self.tools.reset();
        })
    }

    fn objects(&self) -> UpstreamFuture<'_, Vec<(String, String, Value)>> {
        Box::pin(async move {
            let mut all = self.model.objects().await;
            all.extend(CheckUpstream::objects(&*self.tools).await);
            all
        })
    }

    fn calls(&self) -> UpstreamFuture<'_, Vec<(String, String)>> {
        Box::pin(async move {
            let mut all = self.model.calls().await;
            all.extend(self.tools.calls());
            all
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_agent_pays_for_each_turn_and_calls_each_tool_once_under_every_crash_kill_eviction_and_fork()
 {
    let model = Arc::new(FakeOpenAi::start().await.expect("model"));
    let tools = Arc::new(Upstream::start().await.expect("tools"));
    script(&model, &["Refunded ", "5.00 ", "on ord_1."]);
    let config =
        ModelConfig { base_url: model.base_url(), model: "fake".into(), key_secret: None, limit: None };
    let agent = ModelAgent::new(config, &tools.url());
    let report = AgentCheck::new(agent)
        .input(&task())
        .upstream(Arc::new(World { model: model.clone(), tools: tools.clone() }))
        .approve_with(|_| Decision { approved: true, comment: "broken on arrival".into() })
        .crash_at_every_boundary()
        .kill_during_effects()
        .eviction_matrix()
        .fork_at_every_boundary()
        .seeds(1..3)
        .run()
        .await;
    report.assert_ok();
    assert!(report.cases.iter().any(|c| c.name.contains("fork")), "forked at its boundaries");
    let baseline = &report.baseline;
    assert!(
        matches!(&baseline.final_state, Some(durafiber::RunStatus::Completed { output_json }) if output_json.contains("Refunded 5.00 on ord_1.")),
        "{:?}",
        baseline.final_state
    );
    // Three model turns and two tool calls, each once.
    assert_eq!(baseline.requests.len(), 5, "{:?}", baseline.requests);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_agent_killed_mid_answer_and_at_random_streams_one_complete_answer_to_its_reader() {
    let seed = std::env::var("DURAFIBER_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand_seed);
    eprintln!("seed {seed} (DURAFIBER_SEED={seed} to repeat)");
    let mut rng = SeededRng::new(seed);
    let model = FakeOpenAi::start().await.expect("model");
    let tools = Upstream::start().await.expect("tools");
    let tokens = numbered_tokens(100);
    let words: Vec<&str> = tokens.iter().map(String::as_str).collect();
    script(&model, &words);
    model.require_key("sk-test-123");
    model.chunk_delay(Duration::from_millis(3));
    model.hold_at(40); // the answer's stream stops at its 40th chunk until released
    let data = tempfile::tempdir().expect("data");
    let port = free_port();
    let mut server = serve(data.path(), port, &model, &tools, &[], &[]);
    let token = std::fs::read_to_string(data.path().join("admin.token")).expect("admin token");
    let client = Client::new(&format!("http://127.0.0.1:{port}"))
        .expect("client")
        .with_token(Some(token.trim().to_string()))
        .with_retry_budget(Duration::from_secs(60));
    let run_id = client
        .start("model-agent", "ticket-1", &task(), &StartOptions::default())
        .await
        .expect("start")
        .run_id;

    let items = Arc::new(std::sync::Mutex::new(Vec::<StreamItem>::new()));
    let reader = tokio::spawn({
        let (items, stream) = (items.clone(), client.stream(&run_id, 0));
        async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(item) = stream.next().await {
                items.lock().expect("items").push(item.expect("the stream's items"));
            }
        }
    });

    // The refund waits for a person.
    let pending = pending_approval(&client, &run_id).await;
    assert_eq!(pending.payload["tool"], "refund");
    client.decide(&run_id, &pending.approval_id, &pending.payload_hash, true, "ok").await.expect("approve");

    // The answer streams to chunk 40, live: killed there.
    eventually("the reader is shown 40 chunks of the answer", || {
        let items = items.clone();
        async move {
            items.lock().expect("items").iter().any(|i| matches!(i, StreamItem::Partial(p) if p.index == 39))
        }
    })
    .await;
    server.kill().expect("SIGKILL");
    server.wait().expect("reaped");
    model.release();

    // Back up, and killed again at random times while it answers again.
    for _ in 0..2 {
        server = serve(data.path(), port, &model, &tools, &[], &[]);
        tokio::time::sleep(Duration::from_millis(rng.between(0, 400))).await;
        server.kill().expect("SIGKILL");
        server.wait().expect("reaped");
    }
    server = serve(data.path(), port, &model, &tools, &[], &[]);
    let status = client.wait(&run_id, Duration::from_secs(120)).await.expect("wait");
    let answer: String = tokens.concat();
    assert!(matches!(&status, Status::Completed { output } if *output == json!(answer)), "{status:?}");
    tokio::time::timeout(Duration::from_secs(60), reader).await.expect("the stream ends").expect("reader");

    let items = items.lock().expect("items").clone();
    assert!(
        items.iter().any(|i| matches!(i, StreamItem::Reset(_))),
        "the reader saw the cut answer taken back"
    );
    let (mut durable, mut partial) = (Vec::new(), Vec::new());
    for item in &items {
        match item {
            StreamItem::Chunk(c) => {
                partial.clear();
                durable.push(c.data::<String>().expect("text"));
            }
            StreamItem::Partial(p) => partial.push(p.data_json.clone()),
            StreamItem::Reset(_) => partial.clear(),
        }
    }
    assert_eq!(durable, tokens, "the reader ends with one complete answer, each chunk once");
    assert!(partial.is_empty(), "nothing provisional left shown");
    let stored: Vec<Value> = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/runs/{run_id}/stream"))
        .bearer_auth(token.trim())
        .send()
        .await
        .expect("the stream, as JSON")
        .json()
        .await
        .expect("chunks");
    assert_eq!(stored.len(), 100, "the durable transcript holds the answer once");

    // Each model turn completed once (the cut one asked again with its key); each tool once.
    let recorded = model.recorded();
    let mut keys: Vec<_> = recorded.iter().filter_map(|r| r.idempotency_key.clone()).collect();
    keys.dedup();
    assert_eq!(keys.len(), 3, "three turns: {keys:?}");
    assert_eq!(tools.objects("lookup_order").len(), 1);
    assert_eq!(tools.objects("refund").len(), 1);
    server.kill().expect("stop");
    let _ = server.wait();
}
