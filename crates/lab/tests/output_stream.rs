//! A client follows a run's output stream over server-sent events while the server is killed
//! with SIGKILL at random moments and restarted: reconnecting with `Last-Event-ID`, it ends
//! with every one of 1,000 chunks exactly once and in order, then `event: end`.

mod common;

use std::time::{Duration, Instant};

use common::Served;
use durafiber_runtime::rng::SeededRng;
use serde_json::{Value, json};

/// One server-sent event: its name, id and data.
#[derive(Debug, Default, Clone)]
struct SseEvent {
    event: String,
    id: Option<u64>,
    data: String,
}

/// Parses complete events out of `buffer`, leaving a partial one in it.
fn parse_events(buffer: &mut String) -> Vec<SseEvent> {
    let mut out = Vec::new();
    while let Some(end) = buffer.find("\n\n") {
        let block: String = buffer.drain(..end + 2).collect();
        let mut event = SseEvent::default();
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("event:") {
                event.event = v.trim().to_string();
            } else if let Some(v) = line.strip_prefix("id:") {
                event.id = v.trim().parse().ok();
            } else if let Some(v) = line.strip_prefix("data:") {
                event.data.push_str(v.strip_prefix(' ').unwrap_or(v));
            }
        }
        if !event.event.is_empty() {
            out.push(event);
        }
    }
    out
}

/// Reads events from `url` into `transcript` until `event: end` (true) or until the
/// connection breaks or `stop_at` passes (false).
async fn follow(
    http: &reqwest::Client,
    url: &str,
    last_id: Option<u64>,
    transcript: &mut Vec<(u64, String)>,
    stop_at: Instant,
) -> bool {
    let mut request = http.get(url).header("Accept", "text/event-stream").timeout(Duration::from_secs(120));
    if let Some(id) = last_id {
        request = request.header("Last-Event-ID", id.to_string());
    }
    let Ok(mut response) = request.send().await else { return false };
    assert_eq!(response.status(), 200);
    let mut buffer = String::new();
    loop {
        let left = stop_at.saturating_duration_since(Instant::now());
        let Ok(Ok(Some(chunk))) = tokio::time::timeout(left, response.chunk()).await else {
            return false;
        };
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        for event in parse_events(&mut buffer) {
            match event.event.as_str() {
                "chunk" => {
                    let data: String = serde_json::from_str(&event.data).expect("a JSON string chunk");
                    transcript.push((event.id.expect("a chunk has an id"), data));
                }
                "end" => {
                    assert_eq!(event.data, "completed");
                    return true;
                }
                other => panic!("unexpected event {other}: {}", event.data),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reconnecting_through_sigkills_gets_every_chunk_once_in_order() {
    let data = tempfile::tempdir().expect("data dir");
    let mut server = Served::start(data.path());
    let input = json!({"kind": "writer", "input": {"chunks": 1000, "per_stash": 7, "pause_ms": 3}});
    let started: Value = server
        .client()
        .post(server.url("/runs"))
        .header("Idempotency-Key", "tokens")
        .body(input.to_string())
        .send()
        .await
        .expect("start")
        .json()
        .await
        .expect("json");
    let run_id = started["run_id"].as_str().expect("run id").to_string();

    let mut rng = SeededRng::new(0x5eed);
    let mut transcript: Vec<(u64, String)> = Vec::new();
    let mut kills = 0;
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        assert!(Instant::now() < deadline, "the stream did not end; {} chunks so far", transcript.len());
        let http = server.client();
        let url = server.url(&format!("/runs/{run_id}/stream"));
        let last = transcript.last().map(|(seq, _)| *seq);
        // Follow for a random while, then kill the server under the client (three times).
        let stop_at =
            if kills < 3 { Instant::now() + Duration::from_millis(rng.between(150, 700)) } else { deadline };
        if follow(&http, &url, last, &mut transcript, stop_at).await {
            break;
        }
        if kills < 3 {
            server.sigkill();
            kills += 1;
        }
        server = Served::start(data.path());
    }
    assert_eq!(kills, 3);
    let expected: Vec<(u64, String)> = (0..1000).map(|n| (n, format!("token {n}"))).collect();
    assert_eq!(transcript.len(), expected.len(), "chunks received");
    assert_eq!(transcript, expected, "every chunk once, in order");
    let run: Value = server
        .client()
        .get(server.url(&format!("/runs/{run_id}")))
        .send()
        .await
        .expect("run")
        .json()
        .await
        .expect("json");
    assert_eq!(run["run"]["status"]["completed"]["output"], 1000, "{run}");
    let attempts = run["run"]["attempt"].as_u64().unwrap_or(0);
    assert!(attempts >= 3, "the kills landed mid-run: {attempts} fiber attempts");
}
