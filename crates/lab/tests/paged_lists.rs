//! Every list of `durafiber serve` answers a page at a time: `GET /approvals`,
//! `/runs/{id}/alarms`, `/paused` and `/events` take `limit` and `after`, answer at most
//! `limit` (100 when none is named), and a full page names the next in a `Link` header.

use std::collections::BTreeSet;

use durafiber_testkit::upstream::Upstream;
use serde_json::{Value, json};

mod common;
use common::Served;

/// The answer's status, its `Link: <…>; rel="next"` address (when there is one) and its body.
async fn get(http: &reqwest::Client, server: &Served, path: &str) -> (u16, Option<String>, Value) {
    let r = http.get(server.url(path)).send().await.expect("request");
    let status = r.status().as_u16();
    let next = r.headers().get("link").map(|v| {
        let text = v.to_str().expect("ascii link");
        assert!(text.ends_with(">; rel=\"next\""), "{text}");
        text.trim_start_matches('<').trim_end_matches(">; rel=\"next\"").to_string()
    });
    (status, next, r.json().await.expect("JSON"))
}

/// Follows `first` page by page through the `Link` headers; returns each page's items.
async fn pages(http: &reqwest::Client, server: &Served, first: &str, items: &str) -> Vec<Vec<Value>> {
    let mut out = Vec::new();
    let mut next = Some(first.to_string());
    while let Some(path) = next.take() {
        let (status, link, body) = get(http, server, &path).await;
        assert_eq!(status, 200, "GET {path}: {body}");
        let page = if items.is_empty() { &body } else { &body[items] };
        out.push(page.as_array().expect("a page is an array").clone());
        next = link;
        assert!(out.len() < 20, "the pages end");
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_list_answers_a_page_and_names_the_next() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Served::start(dir.path());
    let http = server.client();
    let upstream = Upstream::start().await.expect("upstream");

    // Seven runs waiting for a refund's approval.
    let mut runs = BTreeSet::new();
    for n in 0..7 {
        let refund = json!({"kind": "refund", "input": {"order_id": format!("o{n}"), "amount_cents": 5,
            "customer_email": "a@b.c", "upstream": upstream.url(), "api_key": null}});
        let r = http
            .post(server.url("/runs"))
            .header("Idempotency-Key", format!("order-{n}"))
            .body(refund.to_string())
            .send()
            .await
            .expect("start");
        let started: Value = r.json().await.expect("json");
        runs.insert(started["run_id"].as_str().expect("run id").to_string());
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while get(&http, &server, "/approvals").await.2.as_array().map_or(0, Vec::len) < 7 {
        assert!(std::time::Instant::now() < deadline, "seven approvals pending");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    // Approvals: 3 + 3 + 1, each once, runs in the order they were started.
    let approvals = pages(&http, &server, "/approvals?limit=3", "").await;
    assert_eq!(approvals.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3, 1]);
    let seen: Vec<String> =
        approvals.concat().iter().map(|p| p["run_id"].as_str().expect("run id").to_string()).collect();
    assert_eq!(seen, runs.iter().cloned().collect::<Vec<_>>(), "every run once, in order");
    let client = durafiber_client::Client::from_addr(server.addr).with_token(Some(server.token.clone()));
    let after = format!("{}/refund", seen[5]);
    let last = client.approvals_page(Some(&after), 3).await.expect("page after the sixth");
    assert_eq!(last.len(), 1);
    assert_eq!(last[0].run_id.as_str(), seen[6]);
    assert_eq!(client.approvals().await.expect("all").len(), 7);

    // Alarms of one run: its five and the runtime's own escalation, two at a time.
    let run = seen[0].clone();
    for name in ["a1", "a2", "a3", "a4", "a5"] {
        let r = http
            .put(server.url(&format!("/runs/{run}/alarms/{name}")))
            .body(json!({"delay_ms": 3_600_000, "payload": {}}).to_string())
            .send()
            .await
            .expect("set alarm");
        assert_eq!(r.status().as_u16(), 200);
    }
    let alarms = pages(&http, &server, &format!("/runs/{run}/alarms?limit=2"), "").await;
    assert_eq!(alarms.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2, 2, 0]);
    let names: Vec<&str> = alarms.iter().flatten().map(|a| a["name"].as_str().expect("name")).collect();
    assert_eq!(names, ["a1", "a2", "a3", "a4", "a5", "escalate:refund"]);
    assert_eq!(client.alarms(&run.as_str().into()).await.expect("all alarms").len(), 6);

    // Paused runs: five held, two a page; the kinds on every page.
    for run in seen.iter().take(5) {
        let r = http
            .post(server.url(&format!("/runs/{run}/pause")))
            .body(json!({"reason": "audit"}).to_string())
            .send()
            .await
            .expect("pause");
        assert_eq!(r.status().as_u16(), 200);
    }
    let paused = pages(&http, &server, "/paused?limit=2", "runs").await;
    assert_eq!(paused.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2, 1]);
    let held: Vec<&str> = paused.iter().flatten().map(|p| p["target"].as_str().expect("target")).collect();
    assert_eq!(held, seen[..5].iter().map(String::as_str).collect::<Vec<_>>());
    let (_, _, body) = get(&http, &server, "/paused?limit=2").await;
    assert_eq!(body["next"].as_str(), Some(seen[1].as_str()), "`next` names the page's last run");

    // The event log: a page of two names the third event on.
    let (status, link, first) = get(&http, &server, "/events?limit=2").await;
    assert_eq!((status, first.as_array().map(Vec::len)), (200, Some(2)));
    let second = first[1]["seq"].as_u64().expect("seq");
    assert_eq!(link.as_deref(), Some(format!("/events?limit=2&after={second}").as_str()));
    let (_, _, next) = get(&http, &server, &format!("/events?limit=2&after={second}")).await;
    assert!(next[0]["seq"].as_u64().expect("seq") > second);

    // A page that cannot be: refused, never clamped.
    for path in [
        "/events?limit=1001",
        "/approvals?limit=0",
        "/approvals?limit=1001",
        "/approvals?after=no-slash",
        "/paused?limit=1001",
    ] {
        let (status, _, e) = get(&http, &server, path).await;
        assert_eq!((status, e["kind"].as_str()), (400, Some("BadRequest")), "GET {path}: {e}");
    }
    let (status, _, e) = get(&http, &server, &format!("/runs/{run}/alarms?limit=1001")).await;
    assert_eq!((status, e["kind"].as_str()), (400, Some("BadRequest")), "{e}");
}
