//! The HTTP JSON API of `durafiber serve`, on a real socket: every endpoint, every refusal
//! as a JSON error with a 4xx status, and a SIGKILL mid-request that loses nothing that was
//! acknowledged.

use std::collections::HashSet;

use durafiber_testkit::upstream::Upstream;
use serde_json::{Value, json};

mod common;
use common::Served;

async fn send(req: reqwest::RequestBuilder) -> (u16, Value) {
    let r = req.send().await.expect("request");
    let status = r.status().as_u16();
    (status, r.json().await.expect("every answer is JSON"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_answers_and_every_refusal_is_a_json_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Served::start(dir.path());
    let http = server.client();
    let upstream = Upstream::start().await.expect("upstream");
    let post = |path: &str| http.post(server.url(path)).header("content-type", "application/json");

    assert_eq!(send(http.get(server.url("/health"))).await.0, 200);
    let (s, e) = send(post("/runs").body(r#"{"kind":"steps","input":{}}"#)).await;
    assert_eq!((s, e["kind"].as_str()), (400, Some("BadRequest")), "no Idempotency-Key");
    let (s, e) = send(post("/runs").header("Idempotency-Key", "k").body("{not json")).await;
    assert_eq!(s, 400);
    assert!(e["error"].as_str().expect("message").contains("malformed JSON"));
    let (s, _) =
        send(post("/runs").header("Idempotency-Key", "k").body(r#"{"kind":"nope","input":{}}"#)).await;
    assert_eq!(s, 400);
    let (s, _) =
        send(post("/runs").header("Idempotency-Key", "k").body(r#"{"kind":"steps","input":{"steps":"x"}}"#))
            .await;
    assert_eq!(s, 400);

    let refund = json!({"kind": "refund", "input": {"order_id": "o1", "amount_cents": 5, "customer_email": "a@b.c",
        "upstream": upstream.url(), "api_key": null}});
    let (s, started) =
        send(post("/runs").header("Idempotency-Key", "order-o1").body(refund.to_string())).await;
    assert_eq!(s, 201);
    let run_id = started["run_id"].as_str().expect("run id").to_string();
    let (s, again) = send(post("/runs").header("Idempotency-Key", "order-o1").body(refund.to_string())).await;
    assert_eq!(
        (s, again["run_id"].as_str(), again["accepted"].as_bool()),
        (200, Some(run_id.as_str()), Some(false))
    );
    let mut other = refund.clone();
    other["input"]["amount_cents"] = json!(6);
    let (s, e) = send(post("/runs").header("Idempotency-Key", "order-o1").body(other.to_string())).await;
    assert_eq!((s, e["kind"].as_str()), (409, Some("KeyConflict")));

    let pending = loop {
        let (_, list) = send(http.get(server.url("/approvals"))).await;
        if let Some(p) = list.as_array().and_then(|a| a.first()).cloned() {
            break p;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    assert_eq!(pending["run_id"], run_id.as_str());
    let approve_path = format!("/runs/{run_id}/approvals/refund");
    let (s, e) =
        send(post(&approve_path).body(json!({"payload_hash": "beef", "approved": true}).to_string())).await;
    assert_eq!((s, e["kind"].as_str()), (409, Some("StaleApproval")));
    let (s, _) = send(post(&approve_path).body("[]")).await;
    assert_eq!(s, 400);
    let good = json!({"payload_hash": pending["payload_hash"], "approved": true, "comment": "ok"});
    let (s, a) = send(post(&approve_path).body(good.to_string())).await;
    assert_eq!((s, a["recorded"].as_bool()), (200, Some(true)));
    let (s, a) = send(post(&approve_path).body(good.to_string())).await;
    assert_eq!((s, a["recorded"].as_bool()), (200, Some(false)));
    let no = json!({"payload_hash": pending["payload_hash"], "approved": false});
    assert_eq!(send(post(&approve_path).body(no.to_string())).await.0, 409);

    let (s, e) = send(http.get(server.url("/runs/run_missing"))).await;
    assert_eq!((s, e["kind"].as_str()), (404, Some("UnknownRun")));
    let (s, page) = send(http.get(server.url("/runs?kind=refund&limit=10"))).await;
    assert_eq!((s, page["runs"].as_array().map(Vec::len)), (200, Some(1)));
    let (s, shown) = send(http.get(server.url(&format!("/runs/{run_id}")))).await;
    assert_eq!((s, shown["run"]["run_id"].as_str()), (200, Some(run_id.as_str())));
    // Stored JSON is embedded as JSON, not as strings holding JSON.
    assert!(shown["run"]["input"].is_object() && shown["run"].get("input_json").is_none(), "{shown}");
    let payload = &shown["approvals"][0]["payload"];
    assert!(payload.is_object() || payload.is_array() || payload.is_number(), "{shown}");

    let steps = json!({"kind": "steps", "input": {"steps": 100_000, "pause_ms": 1000}});
    let (_, long) = send(post("/runs").header("Idempotency-Key", "long").body(steps.to_string())).await;
    let long_id = long["run_id"].as_str().expect("id").to_string();
    let alarm = format!("/runs/{long_id}/alarms/reminder");
    assert_eq!(
        send(http.put(server.url(&alarm)).body(r#"{"delay_ms": 60000, "payload": {"n": 1}}"#)).await.0,
        200
    );
    assert_eq!(send(http.put(server.url(&alarm)).body(r#"{"payload": 1}"#)).await.0, 400, "no time given");
    let bad_zone = r#"{"cron": "0 9 * * *", "time_zone": "Mars/Olympus"}"#;
    let (s, e) = send(http.put(server.url(&alarm)).body(bad_zone)).await;
    assert_eq!((s, e["kind"].as_str()), (400, Some("InvalidInput")), "{e}");
    assert!(e["error"].as_str().is_some_and(|m| m.contains("Mars/Olympus")), "{e}");
    let (s, alarms) = send(http.get(server.url(&format!("/runs/{long_id}/alarms")))).await;
    assert_eq!((s, alarms.as_array().map(Vec::len)), (200, Some(1)));
    let (s, gone) = send(http.delete(server.url(&alarm))).await;
    assert_eq!((s, gone["cancelled"].as_bool()), (200, Some(true)));
    let (s, e) = send(post(&format!("/runs/{long_id}/messages")).body("{}")).await;
    assert_eq!((s, e["kind"].as_str()), (409, Some("WrongMessage")), "steps takes `()` messages only");
    let (s, c) = send(post(&format!("/runs/{long_id}/cancel")).body(r#"{"reason":"test"}"#)).await;
    assert_eq!(s, 200, "{c}");
    let (s, e) = send(http.get(server.url("/runs?state=bogus"))).await;
    assert_eq!((s, e["kind"].as_str()), (400, Some("InvalidInput")), "{e}");
    let (s, page) = send(http.get(server.url("/runs?state=waiting_approval"))).await;
    assert!(s == 200 && page["runs"].as_array().is_some(), "{page}");
    let eventually = json!({"kind": "steps", "input": {"steps": 1, "pause_ms": 0}, "options": {"durability": "eventually"}});
    let (s, e) = send(post("/runs").header("Idempotency-Key", "mode-bad").body(eventually.to_string())).await;
    assert_eq!((s, e["kind"].as_str()), (400, Some("InvalidInput")), "{e}");
    let (s, m) = send(http.get(server.url("/metrics.json"))).await;
    assert!(s == 200 && m["starts"].as_u64().is_some_and(|n| n >= 1), "{m}");
    let scraped = http.get(server.url("/metrics")).send().await.expect("scrape");
    let kind = scraped.headers().get("content-type").and_then(|v| v.to_str().ok()).map(str::to_string);
    let text = scraped.text().await.expect("text");
    assert_eq!(kind.as_deref(), Some("text/plain; version=0.0.4; charset=utf-8"));
    assert!(text.lines().any(|l| l.starts_with("durafiber_runs_started_total ")), "{text}");
    assert!(text.lines().any(|l| l.starts_with("durafiber_effects_total ")), "{text}");
    // Histograms with buckets, gauges read from the store, help with units.
    assert!(text.contains("durafiber_stash_commit_seconds_bucket{le=\"0.001\"}"), "{text}");
    assert!(text.contains("durafiber_stash_commit_seconds_count "), "{text}");
    let by_state: f64 = text
        .lines()
        .filter(|l| l.starts_with("durafiber_runs{state="))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(by_state, 2.0, "both runs, each in one state: {text}");
    assert!(text.contains("durafiber_runs{state=\"waiting_event\"} 0"), "every state is listed: {text}");
    assert!(text.lines().any(|l| l.starts_with("durafiber_pending_alarms ")), "{text}");
    assert!(text.lines().any(|l| l.starts_with("durafiber_live_actors ")), "{text}");
    // The store's size and how long writes wait for their checkpoint, for alerts.
    let gauge =
        |name: &str| text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok());
    assert!(gauge("durafiber_store_bytes").is_some_and(|b| b > 0.0), "{text}");
    assert!(gauge("durafiber_checkpoint_lag_seconds").is_some_and(|s| (0.0..60.0).contains(&s)), "{text}");
    assert!(text.contains("# HELP durafiber_stash_commit_seconds"), "{text}");
    assert!(text.contains("# TYPE durafiber_runs gauge"), "{text}");
    let (s, events) = send(http.get(server.url(&format!("/events?run_id={run_id}")))).await;
    assert!(s == 200 && events.as_array().is_some_and(|e| !e.is_empty()));
    // As server-sent events: each event once, with its seq as the id, following the log.
    let mut stream = http
        .get(server.url(&format!("/events?run_id={run_id}")))
        .header("accept", "text/event-stream")
        .send()
        .await
        .expect("stream");
    assert_eq!(stream.headers()["content-type"], "text/event-stream");
    let mut text = String::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !text.contains("event: run") {
        assert!(std::time::Instant::now() < deadline, "no event streamed: {text}");
        let chunk = tokio::time::timeout(std::time::Duration::from_secs(30), stream.chunk()).await;
        text.push_str(&String::from_utf8_lossy(&chunk.expect("in time").expect("chunk").expect("open")));
    }
    assert!(text.contains("id: "), "{text}");
    assert!(text.contains(&format!("\"run_id\":\"{run_id}\"")), "{text}");
    drop(stream);
    // An order: a request answers with what it stored, an event is taken, storage is listed.
    let order = json!({"kind": "order", "input": {"order_id": "ord_h", "amount_cents": 9, "upstream": upstream.url(),
        "alarm_delays_ms": [10], "wait_for_packing": true}});
    let (_, started) = send(post("/runs").header("Idempotency-Key", "order-h").body(order.to_string())).await;
    let order_id = started["run_id"].as_str().expect("id").to_string();
    let (s, reply) = send(post(&format!("/runs/{order_id}/requests")).body("null")).await;
    assert_eq!((s, &reply["reply"]), (200, &json!({})), "{reply}");
    let (s, e) = send(post(&format!("/runs/{order_id}/requests")).body(r#"{"not": "unit"}"#)).await;
    assert_eq!((s, e["kind"].as_str()), (409, Some("WrongMessage")));
    let packed = json!({"payload": {"box": 7}, "idempotency_key": "p1"});
    let (s, sent) = send(post(&format!("/runs/{order_id}/events/packed")).body(packed.to_string())).await;
    assert_eq!((s, sent["outcome"].as_str()), (200, Some("buffered")), "{sent}");
    let (_, again) = send(post(&format!("/runs/{order_id}/events/packed")).body(packed.to_string())).await;
    assert_eq!(again["outcome"].as_str(), Some("duplicate"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let stored = loop {
        let (_, list) = send(http.get(server.url("/approvals"))).await;
        for p in
            list.as_array().cloned().unwrap_or_default().iter().filter(|p| p["run_id"] == order_id.as_str())
        {
            let yes = json!({"payload_hash": p["payload_hash"], "approved": true});
            send(post(&format!("/runs/{order_id}/approvals/ship")).body(yes.to_string())).await;
        }
        let (s, page) = send(http.get(server.url(&format!("/runs/{order_id}/storage")))).await;
        assert_eq!(s, 200, "{page}");
        if page["entries"].as_array().is_some_and(|e| e.len() == 2) {
            break page;
        }
        assert!(std::time::Instant::now() < deadline, "the order never stored its charge and event: {page}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(stored["entries"][0]["key"], "charge_id");
    assert_eq!(stored["entries"][1], json!({"key": "packed", "value": {"box": 7}}));
    let (s, page) = send(http.get(server.url(&format!("/runs/{order_id}/storage?prefix=pa&limit=1")))).await;
    assert_eq!((s, &page["next"]), (200, &json!("packed")), "a full page names the next one: {page}");
    let (s, e) = send(http.get(server.url(&format!("/runs/{order_id}/storage?limit=x")))).await;
    assert_eq!((s, e["kind"].as_str()), (400, Some("BadRequest")));
    assert_eq!(send(http.get(server.url("/runs/run_nope/storage"))).await.0, 404);

    assert_eq!(send(http.get(server.url("/nowhere"))).await.0, 404);
    assert_eq!(send(http.delete(server.url("/approvals"))).await.0, 405);
    let (s, e) = send(http.get(server.url("/runs?limit=many"))).await;
    assert_eq!((s, e["kind"].as_str()), (400, Some("BadRequest")), "a malformed query is a JSON error too");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_mid_request_loses_nothing_that_was_acknowledged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut server = Served::start(dir.path());
    let http = server.client();
    let url = server.url("/runs");
    let (acks, mut acked) = tokio::sync::mpsc::unbounded_channel::<String>();
    for i in 0..300 {
        let (http, url, acks) = (http.clone(), url.clone(), acks.clone());
        tokio::spawn(async move {
            let body = json!({"kind": "steps", "input": {"steps": 3, "pause_ms": 0}}).to_string();
            let Ok(r) = http.post(url).header("Idempotency-Key", format!("k{i}")).body(body).send().await
            else {
                return;
            };
            if r.status().as_u16() == 201
                && let Ok(v) = r.json::<Value>().await
            {
                let _ = acks.send(v["run_id"].as_str().unwrap_or_default().to_string());
            }
        });
    }
    drop(acks);
    // Kill once a first batch is acknowledged, with the rest of the requests in flight.
    let mut acknowledged = HashSet::new();
    while acknowledged.len() < 40 {
        acknowledged.insert(acked.recv().await.expect("acknowledgements arrive"));
    }
    server.sigkill();
    while let Some(id) = acked.recv().await {
        acknowledged.insert(id);
    }
    assert!(!acknowledged.is_empty(), "some starts were acknowledged before the kill");
    let server = Served::start(dir.path());
    for id in &acknowledged {
        let r = http.get(server.url(&format!("/runs/{id}"))).send().await.expect("get");
        assert_eq!(r.status().as_u16(), 200, "acknowledged run {id} was lost");
    }
}

/// The API as its document says: the token is checked before the body's type, an
/// undeclared method is 405 and is not audited, a body-less POST needs no content type,
/// empty filters filter nothing, `null` is an empty optional body, numbers past a declared
/// maximum are refused rather than clamped, and the last admin token cannot be revoked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_does_what_its_document_says() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Served::start(dir.path());
    let http = server.client();
    let bare = reqwest::Client::new();

    // No token: 401, whatever the content type.
    let (s, e) = send(bare.post(server.url("/kinds/steps/resume"))).await;
    assert_eq!((s, e["kind"].as_str()), (401, Some("Unauthorized")), "{e}");
    let (s, _) = send(bare.post(server.url("/runs")).header("content-type", "text/plain").body("x")).await;
    assert_eq!(s, 401);

    // An undeclared method: 405, JSON, and nothing in the audit trail.
    let audit_len = |v: Value| v["entries"].as_array().map_or(0, Vec::len);
    let before = audit_len(send(http.get(server.url("/audit"))).await.1);
    for path in ["/health", "/approvals", "/runs/run_x", "/tokens/x"] {
        let (s, e) = send(http.put(server.url(path))).await;
        assert_eq!((s, e["kind"].as_str()), (405, Some("MethodNotAllowed")), "PUT {path}: {e}");
    }
    let (s, _) =
        send(http.request(reqwest::Method::from_bytes(b"TRACE").expect("method"), server.url("/runs"))).await;
    assert_eq!(s, 405);
    assert_eq!(
        audit_len(send(http.get(server.url("/audit"))).await.1),
        before,
        "an undeclared method was audited"
    );

    // A POST whose schema has no body needs no content type.
    let no_type = reqwest::Client::new();
    let (s, e) = send(no_type.post(server.url("/kinds/steps/resume")).bearer_auth(&server.token)).await;
    assert_eq!(s, 200, "{e}");

    // Empty filters are no filters; `null` is an absent optional body.
    let (s, page) = send(http.get(server.url("/runs?kind=&after="))).await;
    assert_eq!(s, 200, "{page}");
    let (s, e) = send(http.get(server.url("/runs?state="))).await;
    assert_eq!(s, 400, "a state is one of the document's names: {e}");
    let start = http
        .post(server.url("/runs"))
        .header("Idempotency-Key", "c1")
        .json(&json!({"kind": "steps", "input": {"steps": 1000, "pause_ms": 50}}));
    let (_, run) = send(start).await;
    let run_id = run["run_id"].as_str().expect("run id");
    let (s, e) = send(http.post(server.url(&format!("/runs/{run_id}/cancel"))).body("null")).await;
    assert_eq!(s, 200, "{e}");

    // Past a declared maximum: refused, never clamped.
    for path in
        ["/audit?limit=2147483648", "/audit?limit=0", "/events?after=9223372036854775808", "/runs?limit=1001"]
    {
        let (s, e) = send(http.get(server.url(path))).await;
        assert_eq!((s, e["kind"].as_str()), (400, Some("BadRequest")), "GET {path}: {e}");
    }

    // The last admin token stays.
    let (s, e) = send(http.delete(server.url("/tokens/admin"))).await;
    assert_eq!((s, e["kind"].as_str()), (409, Some("LastAdmin")), "{e}");
    let (s, _) = send(http.get(server.url("/tokens"))).await;
    assert_eq!(s, 200, "the admin token still works");
}

/// Every refusal of any size is JSON: a request line of 70 KiB and a header of 1 MB, past
/// what the HTTP parser itself takes, are answered 414 and 431 in the API's error shape.
#[test]
fn heads_too_large_for_the_parser_are_refused_as_json() {
    use std::io::{Read as _, Write as _};
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Served::start(dir.path());
    let ask = |head: String| {
        let mut stream = std::net::TcpStream::connect(server.addr).expect("connect");
        stream.set_read_timeout(Some(std::time::Duration::from_secs(10))).expect("timeout");
        // The server may close before all of it is sent: what it answered is what counts.
        let _ = stream.write_all(head.as_bytes());
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        answer
    };
    let long_uri =
        ask(format!("GET /runs?x={} HTTP/1.1\r\nHost: {}\r\n\r\n", "a".repeat(70 * 1024), server.addr));
    assert!(long_uri.starts_with("HTTP/1.1 414"), "{long_uri:.200}");
    assert!(long_uri.contains(r#""kind":"UriTooLong""#), "{long_uri:.400}");
    let big_header =
        ask(format!("GET /runs HTTP/1.1\r\nHost: {}\r\nx-big: {}\r\n\r\n", server.addr, "b".repeat(1 << 20)));
    assert!(big_header.starts_with("HTTP/1.1 431"), "{big_header:.200}");
    assert!(big_header.contains(r#""kind":"HeadersTooLarge""#), "{big_header:.400}");
}
