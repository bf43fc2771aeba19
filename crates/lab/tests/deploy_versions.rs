//! A deploy never escalates a run for what its fiber says. The deploy example's trip agent
//! is built as two versions outside the workspace: `trip-v2` rewords the progress chunk v1
//! emits after its last stash and bumps the stash's version (with an upgrade from 1). Runs
//! started with v1 wait on an event, a durable sleep and an approval; the server is
//! SIGKILLed; v2's `check-deploy` replays every open run (exit 0, each re-emission listed);
//! v2 serves and every run completes, its stream holding v1's chunk once. `trip-v2-conflict`
//! books other nights for a booking runs already made: its `check-deploy` exits 1 naming
//! the run and the effect, and the store is untouched. On the embedded store and on
//! PostgreSQL.

use durafiber_runtime::RunId;
use durafiber_testkit::process::{CHILD_DEADLINE, OutputWithin};
use std::{
    ffi::OsStr,
    process::Command,
    time::{Duration, Instant},
};

use durafiber_client::{Client, StartOptions};
use durafiber_testkit::postgres::PgServer;
use futures::StreamExt;
use serde_json::{Value, json};

mod common;
use common::{Served, example::example_bin};

/// How long the sleeping run's cooling-off lasts: longer than a kill and a check take.
const SLEEP_SECS: u64 = 20;

/// Where runs are kept: a data directory's embedded store, or a PostgreSQL database.
#[derive(Clone)]
enum Place {
    Embedded,
    Postgres(String),
}

impl Place {
    /// `serve`'s extra arguments.
    fn serve_args(&self) -> Vec<String> {
        match self {
            Place::Embedded => Vec::new(),
            Place::Postgres(url) => vec!["--store".into(), url.clone()],
        }
    }

    /// `check-deploy`'s arguments for the store `data` or the database.
    fn check_args(&self, data: &std::path::Path) -> Vec<String> {
        match self {
            Place::Embedded => vec!["--data".into(), data.display().to_string()],
            Place::Postgres(url) => vec!["--store".into(), url.clone()],
        }
    }
}

fn serve(version: &str, data: &std::path::Path, place: &Place) -> Served {
    let args = place.serve_args();
    let extra: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    Served::start_program(&example_bin(version), data, &extra, &[])
}

/// `VERSION check-deploy --json`: its exit code and report.
fn check_deploy(version: &str, data: &std::path::Path, place: &Place) -> (Option<i32>, Value) {
    let out = Command::new(example_bin(version))
        .arg("check-deploy")
        .args(place.check_args(data))
        .arg("--json")
        .output_within(CHILD_DEADLINE)
        .expect("run check-deploy");
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "{version} check-deploy printed no report: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), report)
}

/// Polls the run until its state is `state` (a minute at most).
async fn wait_state(client: &Client, run_id: &RunId, state: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match client.status(run_id).await {
            Ok(status) if status.name() == state => return,
            other => assert!(Instant::now() < deadline, "run {run_id} is {other:?}, not {state}, after 60 s"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts a trip waiting on `wait` with v1; its run id once it waits.
async fn start_trip(client: &Client, wait: &str) -> RunId {
    let input = json!({"trip": "lyon", "wait": wait, "sleep_secs": SLEEP_SECS});
    let started = client.start("trip", &format!("trip-{wait}"), &input, &StartOptions::default()).await;
    let run_id = started.expect("start").run_id;
    let state = match wait {
        "event" => "waiting_event",
        "sleep" => "waiting_alarm",
        _ => "waiting_approval",
    };
    wait_state(client, &run_id, state).await;
    run_id
}

/// The findings the replay lists for `run_id`.
fn findings_of<'a>(report: &'a Value, run_id: &str) -> Vec<&'a str> {
    report["replay"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["run_id"] == json!(run_id))
        .flat_map(|r| r["findings"].as_array().into_iter().flatten().filter_map(Value::as_str))
        .collect()
}

async fn runs_waiting_across_a_deploy_complete(place: Place) {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let mut v1 = serve("trip-v1", &data, &place);
    let token = v1.token.clone();
    let client = Client::from_addr(v1.addr).with_token(Some(token.clone()));
    let mut runs = Vec::new();
    for wait in ["event", "sleep", "approval"] {
        runs.push((wait, start_trip(&client, wait).await));
    }
    v1.sigkill();

    let (code, report) = check_deploy("trip-v2", &data, &place);
    assert_eq!(code, Some(0), "v2 escalates nothing: {report}");
    assert_eq!(
        (report["would_escalate"].as_u64(), report["replayed"].as_u64()),
        (Some(0), Some(3)),
        "{report}"
    );
    for (wait, run_id) in &runs {
        let findings = findings_of(&report, run_id);
        assert!(
            findings
                .iter()
                .any(|f| f.starts_with("chunk 1 re-emitted differently") && f.contains(r#""by":"v2""#)),
            "the {wait} run's re-emission is listed: {findings:?}"
        );
    }

    let v2 = serve("trip-v2", &data, &place);
    let client = Client::from_addr(v2.addr).with_token(Some(token));
    for (wait, run_id) in &runs {
        match *wait {
            "event" => {
                client
                    .send_event(run_id, "payment", &json!({"paid": true}), Some("paid"))
                    .await
                    .expect("event");
            }
            "approval" => {
                let pending = client.approvals().await.expect("approvals");
                let asked = pending.iter().find(|p| p.run_id == *run_id).expect("its approval pending");
                client
                    .decide(run_id, &asked.approval_id, &asked.payload_hash, true, "ok")
                    .await
                    .expect("decide");
            }
            _ => {}
        }
    }
    let deadline = Duration::from_secs(SLEEP_SECS + 60);
    for (wait, run_id) in &runs {
        let booked: Value = client.wait_output(run_id, deadline).await.unwrap_or_else(|e| {
            panic!("the {wait} run did not complete after the deploy: {e}\n{}", v2.log())
        });
        assert_eq!(booked["confirmed"], json!(true), "{wait}: {booked}");
    }
    for (wait, run_id) in &runs {
        // The stream of an ended run ends after its last chunk.
        let items: Vec<_> = client.stream(run_id, 0).collect().await;
        let texts: Vec<Value> = items
            .into_iter()
            .filter_map(|item| item.expect("a stream item").durable())
            .map(|chunk| chunk.data::<Value>().expect("json"))
            .collect();
        assert_eq!(
            texts,
            [
                json!({"text": "trip:planning"}),
                json!({"text": "payment:waiting", "by": "v1"}),
                json!({"text": "trip:booked"})
            ],
            "{wait}: the durable chunk stands, once"
        );
    }
}

async fn a_deploy_that_changes_an_effects_arguments_is_refused_before_any_run_is_touched(place: Place) {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let mut v1 = serve("trip-v1", &data, &place);
    let client = Client::from_addr(v1.addr).with_token(Some(v1.token.clone()));
    let run_id = start_trip(&client, "event").await;
    v1.sigkill();
    let (code, report) = check_deploy("trip-v2-conflict", &data, &place);
    assert_eq!(code, Some(1), "{report}");
    assert_eq!(report["would_escalate"].as_u64(), Some(1), "{report}");
    let findings = findings_of(&report, &run_id);
    assert!(
        findings.iter().any(|f| f.contains("would escalate") && f.contains("effect hotel")),
        "the run and its effect are named: {report}"
    );
    // Nothing was touched: v1 serves the run on, waiting as before.
    let v1 = serve("trip-v1", &data, &place);
    let client = Client::from_addr(v1.addr).with_token(Some(v1.token.clone()));
    wait_state(&client, &run_id, "waiting_event").await;
    client.send_event(&run_id, "payment", &json!({"paid": true}), Some("paid")).await.expect("event");
    let booked: Value =
        client.wait_output(&run_id, Duration::from_secs(60)).await.expect("completes with v1");
    assert_eq!(booked["confirmed"], json!(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_waiting_across_a_deploy_complete_on_the_embedded_store() {
    runs_waiting_across_a_deploy_complete(Place::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_waiting_across_a_deploy_complete_on_postgres() {
    let pg = PgServer::start().expect("a PostgreSQL server");
    runs_waiting_across_a_deploy_complete(Place::Postgres(pg.fresh_database().expect("a database"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflicting_deploy_is_refused_on_the_embedded_store() {
    a_deploy_that_changes_an_effects_arguments_is_refused_before_any_run_is_touched(Place::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflicting_deploy_is_refused_on_postgres() {
    let pg = PgServer::start().expect("a PostgreSQL server");
    a_deploy_that_changes_an_effects_arguments_is_refused_before_any_run_is_touched(Place::Postgres(
        pg.fresh_database().expect("a database"),
    ))
    .await;
}
