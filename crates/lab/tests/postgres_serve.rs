//! `durafiber serve --store postgres://…`: the server keeps its runs in a PostgreSQL
//! database (a private server the test kit starts), survives SIGKILL there as it does on the
//! embedded store, and refuses a second server on the same database with one clear line.

mod common;

use durafiber_testkit::process::{CHILD_DEADLINE, OutputWithin};
use std::{collections::HashSet, ffi::OsStr, process::Command, time::Duration};

use common::{BIN, Served};
use durafiber_testkit::postgres::PgServer;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_started_over_http_survive_a_sigkill_in_the_database_and_complete() {
    let pg = PgServer::start().expect("a PostgreSQL server");
    let url = pg.fresh_database().expect("a database");
    let dir = tempfile::tempdir().expect("tempdir");
    let store = [OsStr::new("--store"), OsStr::new(&url)];
    let mut server = Served::start_with(dir.path(), &store);
    let http = server.client();
    let mut started = HashSet::new();
    for i in 0..20 {
        let body = json!({"kind": "steps", "input": {"steps": 40, "pause_ms": 20}}).to_string();
        let r = http
            .post(server.url("/runs"))
            .header("Idempotency-Key", format!("pg-{i}"))
            .body(body)
            .send()
            .await
            .expect("start");
        assert_eq!(r.status().as_u16(), 201, "{}", r.text().await.unwrap_or_default());
        let v: Value = r.json().await.expect("json");
        started.insert(v["run_id"].as_str().expect("run_id").to_string());
    }
    // Runs are mid-flight (40 steps 20 ms apart) when the server dies.
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.sigkill();
    assert!(!dir.path().join("sled").exists(), "the runs live in the database, not the data directory");

    // A second server on the same database is refused while the new one holds it.
    let server = Served::start_with(dir.path(), &store);
    let second = tempfile::tempdir().expect("tempdir");
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(second.path())
        .args(["--store", &url])
        .output_within(CHILD_DEADLINE)
        .expect("run a second server");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a second server opened a database in use");
    assert!(err.contains("in use by another process"), "{err}");

    for id in &started {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let r = http.get(server.url(&format!("/runs/{id}"))).send().await.expect("get");
            assert_eq!(r.status().as_u16(), 200, "run {id} was lost");
            let v: Value = r.json().await.expect("json");
            let output = &v["run"]["status"]["completed"]["output"];
            if !output.is_null() {
                assert_eq!(output["done"], 40, "{v}");
                break;
            }
            assert!(std::time::Instant::now() < deadline, "run {id} did not complete: {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let runs: Value =
        http.get(server.url("/runs?limit=100")).send().await.expect("list").json().await.expect("json");
    assert_eq!(runs["runs"].as_array().map(Vec::len), Some(started.len()), "no run was invented");
}
