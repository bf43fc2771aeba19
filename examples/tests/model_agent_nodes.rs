//! The model-calling example on two nodes sharing one PostgreSQL database (a private server
//! the test kit starts): a reader following the run's output stream on the node that does
//! not run it is shown the streaming answer as the owner's reader is — its partial chunks as
//! they come, and the reset that takes back a cut answer — and a reader moved from one node
//! to the other mid-answer with `Last-Event-ID` is shown no chunk twice.

mod common;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use common::{eventually, free_port, pending_approval, serve};

use durafiber::client::{Client, StartOptions, Status};
use durafiber::testkit::{
    openai::{FakeOpenAi, Reply, numbered_tokens},
    postgres::PgServer,
    upstream::Upstream,
};
use durafiber_examples::model_agent::Task;
use futures::StreamExt as _;
use serde_json::{Value, json};

/// One server-sent event: its name, id and data.
#[derive(Debug, Clone)]
struct SseEvent {
    event: String,
    id: Option<u64>,
    data: String,
}

/// Takes the complete events out of `buffer`, leaving an unfinished one in it.
fn complete_events(buffer: &mut String) -> Vec<SseEvent> {
    let mut out = Vec::new();
    while let Some(end) = buffer.find("\n\n") {
        let block: String = buffer.drain(..end + 2).collect();
        let mut event = SseEvent { event: "message".into(), id: None, data: String::new() };
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("event:") {
                event.event = v.trim().to_string();
            } else if let Some(v) = line.strip_prefix("id:") {
                event.id = v.trim().parse().ok();
            } else if let Some(v) = line.strip_prefix("data:") {
                event.data.push_str(v.trim_start());
            }
        }
        if !block.trim_start().starts_with(':') {
            out.push(event);
        }
    }
    out
}

type Events = Arc<Mutex<Vec<SseEvent>>>;

/// Follows the run's stream on `base` after `last` (`Last-Event-ID`), adding each event to
/// `events`, until `stop` says so or the stream ends.
async fn follow(
    base: &str,
    token: &str,
    run_id: &str,
    last: Option<u64>,
    events: &Events,
    stop: impl Fn(&[SseEvent]) -> bool,
) {
    let mut request = reqwest::Client::new()
        .get(format!("{base}/runs/{run_id}/stream"))
        .bearer_auth(token)
        .header("Accept", "text/event-stream");
    if let Some(id) = last {
        request = request.header("Last-Event-ID", id.to_string());
    }
    let response = request.send().await.expect("the stream answers");
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    while let Some(bytes) =
        tokio::time::timeout(Duration::from_secs(120), body.next()).await.expect("events come")
    {
        buffer.push_str(&String::from_utf8_lossy(&bytes.expect("bytes")));
        let mut events = events.lock().expect("events");
        events.extend(complete_events(&mut buffer));
        if stop(&events) || events.last().is_some_and(|e| e.event == "end") {
            return;
        }
    }
}

/// The nodes, SIGKILLed when the test ends, however it ends.
struct Servers(Vec<std::process::Child>);

impl Drop for Servers {
    fn drop(&mut self) {
        for server in &mut self.0 {
            let _ = server.kill();
            let _ = server.wait();
        }
    }
}

/// Whether `events` hold the partial chunk `index` of a call after a reset.
fn at_partial_after_reset(events: &[SseEvent], index: u64) -> bool {
    let Some(reset) = events.iter().position(|e| e.event == "reset") else { return false };
    events[reset..].iter().any(|e| {
        e.event == "partial"
            && serde_json::from_str::<Value>(&e.data).is_ok_and(|p| p["index"] == json!(index))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_that_does_not_run_the_model_shows_its_answer_as_the_owner_does() {
    let pg = PgServer::start().expect("a PostgreSQL server");
    let url = pg.fresh_database().expect("a database");
    let model = FakeOpenAi::start().await.expect("model");
    let tools = Upstream::start().await.expect("tools");
    let tokens = numbered_tokens(60);
    let words: Vec<&str> = tokens.iter().map(String::as_str).collect();
    model.script(Reply::tool_call("lookup_order", &json!({"order_id": "ord_1"})));
    model.script(Reply::tool_call("refund", &json!({"order_id": "ord_1", "cents": 500})));
    model.script(Reply::text_cut(&words, 10)); // cut after ten chunks: taken back
    model.script(Reply::text(&words));
    model.require_key("sk-test-123");
    model.chunk_delay(Duration::from_millis(2));
    model.hold_at(40); // the whole answer stops at its 40th chunk until released

    let dirs = [tempfile::tempdir().expect("data"), tempfile::tempdir().expect("data")];
    let ports = [free_port(), free_port()];
    let mut servers = Servers(Vec::new());
    for (i, id) in ["a", "b"].into_iter().enumerate() {
        let extra = ["--store", url.as_str(), "--node-id", id, "--lease-ttl", "2s"];
        servers.0.push(serve(dirs[i].path(), ports[i], &model, &tools, &extra, &[]));
    }
    let token = std::fs::read_to_string(dirs[0].path().join("admin.token")).expect("admin token");
    let token = token.trim().to_string();
    let bases = ports.map(|p| format!("http://127.0.0.1:{p}"));
    let client = Client::new(&bases[0]).expect("client").with_token(Some(token.clone()));
    let task = Task { prompt: "Refund 5.00 on ord_1, it arrived broken.".into(), max_turns: 6 };
    let run_id =
        client.start("model-agent", "ticket-1", &task, &StartOptions::default()).await.expect("start").run_id;

    // Which node runs it: the other one is the one the test reads through.
    let http = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let owner = loop {
        let shown: Value = http
            .get(format!("{}/runs/{run_id}", bases[0]))
            .bearer_auth(&token)
            .send()
            .await
            .expect("the run")
            .json()
            .await
            .expect("json");
        if let Some(node) = shown["node"].as_str() {
            break usize::from(node == "b");
        }
        assert!(tokio::time::Instant::now() < deadline, "no node owns the run: {shown}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (on_owner, elsewhere) = (bases[owner].clone(), bases[1 - owner].clone());

    // A reader on each node, from the start.
    let follow_all = |base: String| {
        let (token, run_id, events) = (token.clone(), run_id.to_string(), Events::default());
        let task = tokio::spawn({
            let events = events.clone();
            async move { follow(&base, &token, &run_id, None, &events, |_| false).await }
        });
        (task, events)
    };
    let (owner_reader, owner_events) = follow_all(on_owner.clone());
    let (other_reader, other_events) = follow_all(elsewhere.clone());

    // A person approves the refund, through the node that does not run it.
    let pending = pending_approval(&client, &run_id).await;
    let other = Client::new(&elsewhere).expect("client").with_token(Some(token.clone()));
    other.decide(&run_id, &pending.approval_id, &pending.payload_hash, true, "ok").await.expect("approve");

    // A third reader starts on the owner and is moved, mid-answer, to the other node.
    let moved = Events::default();
    follow(&on_owner, &token, run_id.as_str(), None, &moved, |events| at_partial_after_reset(events, 20))
        .await;
    let moved = moved.lock().expect("events").clone();
    let last = moved.iter().filter_map(|e| e.id).max();
    let after = Events::default();
    let resumed = tokio::spawn({
        let (elsewhere, token, run_id, after) =
            (elsewhere.clone(), token.clone(), run_id.to_string(), after.clone());
        async move { follow(&elsewhere, &token, &run_id, last, &after, |_| false).await }
    });
    eventually("the moved reader is shown the answer on the other node", || {
        let after = after.clone();
        async move { after.lock().expect("events").iter().any(|e| e.event == "partial") }
    })
    .await;
    // Held at its 40th chunk: both readers are shown the answer so far, after the reset of
    // the cut one — the one on the node that does not run the model too.
    for (node, events) in [("the owner", &owner_events), ("the other node", &other_events)] {
        eventually(&format!("{node}'s reader is shown the answer to its 40th chunk"), || {
            let events = events.clone();
            async move { at_partial_after_reset(&events.lock().expect("events"), 39) }
        })
        .await;
    }
    model.release();
    let status = client.wait(&run_id, Duration::from_secs(120)).await.expect("wait");
    let answer: String = tokens.concat();
    assert!(matches!(&status, Status::Completed { output } if *output == json!(answer)), "{status:?}");

    tokio::time::timeout(Duration::from_secs(60), owner_reader).await.expect("ends").expect("reader");
    tokio::time::timeout(Duration::from_secs(60), other_reader).await.expect("ends").expect("reader");
    let owner_events = owner_events.lock().expect("events").clone();
    let other_events = other_events.lock().expect("events").clone();
    // The node that does not run the model showed what the owner showed: the cut answer
    // taken back, the whole answer as it came (checked above), then the same durable chunks.
    let chunks = |events: &[SseEvent]| -> Vec<String> {
        events.iter().filter(|e| e.event == "chunk").map(|e| e.data.clone()).collect()
    };
    let (owner_chunks, other_chunks) = (chunks(&owner_events), chunks(&other_events));
    assert!(other_events.iter().any(|e| e.event == "reset"), "the other node showed the reset");
    assert_eq!(other_chunks, owner_chunks, "and the same durable chunks");
    let streamed: Vec<String> = tokens.iter().map(|t| json!(t).to_string()).collect();
    assert!(owner_chunks.ends_with(&streamed), "the answer is durable once, in order");

    // The moved reader: durable chunks across its two connections, each once and in order.
    tokio::time::timeout(Duration::from_secs(60), resumed).await.expect("ends").expect("reader");
    let after = after.lock().expect("events").clone();
    assert!(at_partial_after_reset(&moved, 20), "moved mid-answer");
    let ids: Vec<u64> =
        moved.iter().chain(&after).filter(|e| e.event == "chunk").filter_map(|e| e.id).collect();
    let mut unique = ids.clone();
    unique.dedup();
    assert_eq!(ids, unique, "no durable chunk twice");
    assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "none missing: {ids:?}");
    let shown: Vec<String> =
        moved.iter().chain(&after).filter(|e| e.event == "chunk").map(|e| e.data.clone()).collect();
    assert_eq!(shown, owner_chunks, "the moved reader ends with the stream, once");
}
