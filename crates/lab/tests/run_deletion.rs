//! `DELETE /runs/{id}` on `durafiber serve`: an admin deletes a settled run and everything it
//! owns; an open run is refused with 409 `RunOpen` and kept; the audit trail records who
//! deleted what; the typed client does the same.

use durafiber_client::{ApiErrorKind, Client, ClientError, Status};
use durafiber_runtime::RunId;
use serde_json::{Value, json};

mod common;
use common::Served;

async fn send(req: reqwest::RequestBuilder) -> (u16, Value) {
    let r = req.send().await.expect("an answer");
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_deletes_a_settled_run_and_an_open_one_is_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Served::start(dir.path());
    let http = server.client();
    let start = |key: &str, input: Value| {
        http.post(server.url("/runs"))
            .header("Idempotency-Key", key)
            .header("content-type", "application/json")
            .body(json!({"kind": "steps", "input": input}).to_string())
    };
    let (_, done) = send(start("done", json!({"steps": 2, "pause_ms": 0}))).await;
    let done = RunId::from(done["run_id"].as_str().expect("run id"));
    let (_, open) = send(start("open", json!({"steps": 100_000, "pause_ms": 1000}))).await;
    let open = RunId::from(open["run_id"].as_str().expect("run id"));
    let client = Client::from_addr(server.addr).with_token(Some(server.token.clone()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !matches!(client.status(&done).await.expect("status"), Status::Completed { .. }) {
        assert!(std::time::Instant::now() < deadline, "the short run never completed");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    let (s, e) = send(http.delete(server.url(&format!("/runs/{open}")))).await;
    assert_eq!((s, e["kind"].as_str()), (409, Some("RunOpen")), "{e}");
    assert_eq!(send(http.get(server.url(&format!("/runs/{open}")))).await.0, 200, "the open run is kept");
    match client.delete_run(&open).await {
        Err(ClientError::Api { kind: ApiErrorKind::RunOpen, .. }) => {}
        other => panic!("the client deleting an open run: {other:?}"),
    }

    let (s, deleted) = send(http.delete(server.url(&format!("/runs/{done}")))).await;
    assert_eq!(s, 200, "{deleted}");
    assert_eq!(deleted["run_id"], done.as_str());
    assert!(deleted["records"].as_u64().is_some_and(|n| n >= 2), "{deleted}");
    let (s, e) = send(http.get(server.url(&format!("/runs/{done}")))).await;
    assert_eq!((s, e["kind"].as_str()), (404, Some("UnknownRun")), "{e}");
    match client.delete_run(&done).await {
        Err(ClientError::Api { kind: ApiErrorKind::UnknownRun, .. }) => {}
        other => panic!("deleting it again: {other:?}"),
    }

    let (_, audit) = send(http.get(server.url("/audit?limit=1000"))).await;
    let entries = audit["entries"].as_array().expect("entries");
    assert!(
        entries
            .iter()
            .any(|e| e["action"] == "delete_run" && e["run_id"] == done.as_str() && e["actor"] == "admin"),
        "{audit}"
    );
}
