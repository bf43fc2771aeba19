//! A secret given to an agent is used, and never written (§4.5), and goes only where it is
//! bound to: not in any file of the data directory, not in inspection output, not in the
//! event log — even when the upstream echoes back every header it was sent — and never to
//! an upstream the run's input names if the secret is not bound to it.

use std::sync::{Arc, Mutex};

use axum::{Json, Router, http::HeaderMap, routing::post};
use durafiber_demo::agents::{Refund, RefundInput};
use durafiber_runtime::{AgentError, Decision, RunStatus, Runtime, RuntimeError, Secret, Secrets};
use durafiber_store::{RunId, Store, StoreConfig};
use serde_json::json;

const SECRET: &str = "sk_live_TOPSECRET_4242_never_on_disk";

fn all_bytes_under(dir: &std::path::Path) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read_dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else {
                bytes.extend(std::fs::read(&path).expect("read"));
            }
        }
    }
    bytes
}

/// An upstream that answers every POST with an id and everything it was sent: headers and
/// body. Returns its base URL and what it saw.
async fn echoing_upstream() -> (String, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let app = Router::new().route(
        "/v1/{collection}",
        post(move |headers: HeaderMap, body: String| {
            let log = log.clone();
            async move {
                let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                log.lock().expect("log").push(auth.clone());
                Json(json!({"id": format!("obj_{}", log.lock().expect("log").len()), "echo": {"authorization": auth, "body": body}}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), seen)
}

fn input(order: &str, upstream: &str) -> RefundInput {
    RefundInput {
        order_id: order.into(),
        amount_cents: 100,
        customer_email: "bo@example.com".into(),
        upstream: upstream.into(),
        api_key: Some(Secret::named("upstream_key")),
        approval_rule: None,
    }
}

async fn approve_and_wait(rt: &Runtime, run: &RunId) -> RunStatus {
    rt.wait_for(run, |s| matches!(s, RunStatus::WaitingApproval { .. })).await.expect("waits");
    let hash = rt.pending_approvals(Some(run)).expect("pending")[0].payload_hash.clone();
    rt.approve(run, "refund", &hash, Decision { approved: true, comment: String::new() })
        .await
        .expect("approve");
    rt.wait(run).await.expect("wait")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_goes_only_where_it_is_bound_and_is_never_stored_nor_shown() {
    let (upstream, seen) = echoing_upstream().await;
    let (elsewhere, seen_elsewhere) = echoing_upstream().await;
    let bound_to = upstream.trim_start_matches("http://").to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let secrets = Secrets::default().bind("upstream_key", SECRET, &[&bound_to]).expect("bind");
    let store = Store::open_dir(dir.path(), StoreConfig::default()).expect("store");
    let rt = Runtime::builder(store).secrets(secrets).agent(Refund::default()).open().await.expect("runtime");

    // Bound: sent, echoed back — and redacted from the ledger, the output, the events.
    let run = rt.start::<Refund>("secret-run", &input("ord_7", &upstream)).await.expect("start").run_id;
    assert!(matches!(approve_and_wait(&rt, &run).await, RunStatus::Completed { .. }));
    assert!(seen.lock().expect("seen").iter().all(|a| a == &format!("Bearer {SECRET}")), "the key was sent");
    let shown = serde_json::to_string(&rt.inspect(&run).expect("inspect")).expect("json");
    assert!(shown.contains("upstream_key") && shown.contains("[redacted]"), "{shown}");
    assert!(!shown.contains(SECRET), "the echoed value is not shown");
    let events = format!("{:?}", rt.events());
    assert!(!events.contains(SECRET));

    // Not bound: a run whose input names another upstream fails before anything is sent.
    let exfil = rt.start::<Refund>("exfil-run", &input("ord_8", &elsewhere)).await.expect("start").run_id;
    match approve_and_wait(&rt, &exfil).await {
        RunStatus::Failed { error } => assert!(error.contains("may not be sent to"), "{error}"),
        other => panic!("expected Failed, got {other:?}"),
    }
    assert!(seen_elsewhere.lock().expect("seen").is_empty(), "nothing reached the other upstream");
    assert!(rt.events().iter().any(|e| e.run_id == exfil && e.kind == "secret_refused"));
    rt.settle().await;
    let audit = durafiber_store::access::of_run(rt.store(), &exfil).expect("audit");
    assert!(
        audit.iter().any(|e| e.action == "secret_refused" && e.actor == format!("run:{exfil}")),
        "{audit:?}"
    );
    assert!(!format!("{:?}", Secret::named("upstream_key")).contains(SECRET));

    rt.shutdown().await;
    rt.store().close();
    let disk = all_bytes_under(dir.path());
    assert!(!disk.is_empty());
    assert!(!disk.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()), "the secret reached the disk");
}

#[test]
fn a_refusal_is_typed() {
    let e = AgentError::SecretRefused { name: "k".into(), destination: "http://evil:1".into() };
    assert_eq!(RuntimeError::Agent(e).to_string(), "agent: secret k may not be sent to http://evil:1");
}
