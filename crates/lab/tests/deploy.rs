//! The deploy example (`examples/deploy`): a crate outside the workspace that depends only
//! on `durafiber` and hosts an agent the demo does not have. Each test builds it as a user
//! would, then drives its binary's own commands, the typed client and the console.
//!
//! - On the embedded store: `serve`; a reviewer's token from its `tokens` command; a run
//!   started through the typed client; the receipt sent with `send-event`; the server
//!   SIGKILLed while the run waits for its manager; restarted; the approval shown as the
//!   agent describes it and approved in the console in headless Chromium; the run complete;
//!   a second run approved with `approvals list` and `approve`; `runs list`; `backup`,
//!   `restore` and `store verify`.
//! - On PostgreSQL, as two nodes: the same commands through either node, a node SIGKILLed
//!   while its run waits, the decision taken by the survivor.

use durafiber_runtime::RunId;
use durafiber_testkit::process::{CHILD_DEADLINE, OutputWithin};
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use durafiber_client::{Client, StartOptions, Status};
use durafiber_testkit::postgres::PgServer;
use serde_json::{Value, json};

mod common;
use common::{
    Served,
    browser::{Driver, click, screenshot, sign_in, text_of, wait_for_path, wait_for_text},
};

/// The example's `expenses` binary.
fn expenses() -> PathBuf {
    common::example::example_bin("expenses")
}

/// Runs `expenses ARGS`; its standard output as JSON when it succeeds.
fn cli(args: &[&str]) -> Value {
    let out = Command::new(expenses()).args(args).output_within(CHILD_DEADLINE).expect("run expenses");
    assert!(
        out.status.success(),
        "expenses {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

/// Runs `expenses ARGS`; its exit code.
fn cli_code(args: &[&str]) -> Option<i32> {
    Command::new(expenses()).args(args).output_within(CHILD_DEADLINE).expect("run expenses").status.code()
}

fn claim(employee: &str, cents: i64) -> Value {
    json!({"employee": employee, "amount_cents": cents, "currency": "EUR", "description": "train to Lyon"})
}

/// Waits until `client` shows the run in state `state`.
async fn wait_state(client: &Client, run_id: &RunId, state: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match client.status(run_id).await {
            Ok(status) if status.name() == state => return,
            Ok(status) => {
                assert!(Instant::now() < deadline, "run {run_id} is {status:?}, not {state}, after 60 s");
            }
            Err(e) => assert!(Instant::now() < deadline, "run {run_id} unreadable after 60 s: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The pending approval of `run_id` as `approvals list` prints it, once there is one.
fn pending_of(target: &[&str], run_id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut args = vec!["approvals", "list"];
        args.extend_from_slice(target);
        let list = cli(&args);
        if let Some(p) = list.as_array().into_iter().flatten().find(|p| p["run_id"] == json!(run_id)) {
            return p.clone();
        }
        assert!(Instant::now() < deadline, "run {run_id} never asked for approval: {list}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn payment_of(output: &Value) -> &str {
    assert_eq!(output["approved"], json!(true), "{output}");
    output["payment_id"].as_str().expect("a payment id")
}

fn serve(data: &Path, extra: &[&str]) -> Served {
    let extra: Vec<&std::ffi::OsStr> = extra.iter().map(std::convert::AsRef::as_ref).collect();
    Served::start_program(&expenses(), data, &extra, &[])
}

#[test]
fn a_users_binary_has_every_operational_command_and_no_lab_command() {
    let out = Command::new(expenses()).arg("--help").output_within(CHILD_DEADLINE).expect("expenses --help");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{help}");
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    for wanted in [
        "serve",
        "store",
        "backup",
        "restore",
        "runs",
        "tokens",
        "approvals",
        "approve",
        "send-event",
        "cancel",
        "alarms",
        "check-deploy",
    ] {
        assert!(commands.contains(&wanted), "no {wanted} in {commands:?}");
    }
    for lab in ["drill", "torture", "bench", "sim"] {
        assert!(!commands.contains(&lab), "the lab's {lab} is in {commands:?}");
    }
    assert!(help.contains("Usage: expenses"), "{help}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_own_binary_serves_its_agent_through_a_kill_and_a_console_approval() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let data_arg = data.to_str().expect("utf-8 path");
    let mut server = serve(&data, &[]);
    let addr = server.addr.to_string();
    let target = ["--server", addr.as_str(), "--data", data_arg];

    // The OpenAPI document shows this kind's start body, from the input's schema.
    let document: Value =
        reqwest::get(server.url("/openapi.json")).await.expect("openapi").json().await.expect("json");
    let body = &document["components"]["schemas"]["StartBody_expense"];
    assert_eq!(body["properties"]["kind"]["const"], json!("expense"), "{body}");
    assert_eq!(body["properties"]["input"]["properties"]["amount_cents"]["type"], json!("integer"), "{body}");
    let start = &document["paths"]["/runs"]["post"]["requestBody"]["content"]["application/json"]["schema"];
    assert_eq!(start, &json!({"oneOf": [{"$ref": "#/components/schemas/StartBody_expense"}]}));

    // A reviewer's token, from the binary's own command (the admin token is in the data
    // directory, which the command reads).
    let mut args = vec!["tokens", "create", "--role", "reviewer", "--name", "mia"];
    args.extend_from_slice(&target);
    let mia = cli(&args)["token"].as_str().expect("token").to_string();

    // A run through the typed client; the same key again is the same run.
    let client = Client::from_addr(server.addr).with_token(Some(server.token.clone()));
    let started = client
        .start("expense", "claim-1", &claim("Ada", 12_050), &StartOptions::default())
        .await
        .expect("start");
    assert!(started.accepted);
    let again = client
        .start("expense", "claim-1", &claim("Ada", 12_050), &StartOptions::default())
        .await
        .expect("start");
    assert_eq!((again.run_id.clone(), again.accepted), (started.run_id.clone(), false));
    let run_id = started.run_id.clone();
    wait_state(&client, &run_id, "waiting_event").await;

    // The receipt arrives through `send-event`; the run asks its manager.
    let mut args = vec![
        "send-event",
        run_id.as_str(),
        "receipt",
        "--payload",
        r#"{"url":"https://receipts.example/ada-1.png"}"#,
    ];
    args.extend_from_slice(&target);
    assert_eq!(cli(&args)["outcome"], json!("delivered"));
    let pending = pending_of(&target, &run_id);
    let hash = pending["payload_hash"].as_str().expect("hash").to_string();

    // The host dies while the run waits for a human; a new process serves the same data.
    server.sigkill();
    let server = serve(&data, &[]);
    let addr = server.addr.to_string();
    let target = ["--server", addr.as_str(), "--data", data_arg];
    let client = Client::from_addr(server.addr).with_token(Some(server.token.clone()));
    assert_eq!(
        client.status(&run_id).await.expect("status"),
        Status::WaitingApproval { approval_id: "manager".into() }
    );

    // The manager reads the approval as the agent describes it, and approves.
    let mut driver = Driver::start();
    let browser = driver.browser().await;
    sign_in(&browser, &server, &mia).await;
    browser.goto(&server.url("/ui/approvals")).await.expect("inbox");
    wait_for_path(&browser, "/ui/approvals").await;
    let inbox = text_of(&browser, "#inbox").await;
    assert!(inbox.contains("Reimburse Ada") && inbox.contains("120.50 EUR"), "{inbox}");
    assert_eq!(text_of(&browser, "#nav-approvals").await, "Approvals 1");
    let current = browser.find(fantoccini::Locator::Css("#nav-approvals")).await.expect("nav");
    assert_eq!(current.attr("aria-current").await.expect("attr").as_deref(), Some("page"));
    click(&browser, "#inbox a.review").await;
    wait_for_path(&browser, &format!("/ui/runs/{run_id}/approvals/manager")).await;
    assert_eq!(text_of(&browser, "#approval-title").await, "Reimburse Ada");
    let shown = text_of(&browser, "#approval-view").await;
    assert!(shown.contains("120.50 EUR") && shown.contains("the scanned receipt"), "{shown}");
    assert_eq!(text_of(&browser, "#payload-hash").await, hash);
    screenshot(&browser, "deploy-decision").await;
    click(&browser, "#approve").await;
    wait_for_path(&browser, &format!("/ui/runs/{run_id}")).await;
    wait_for_text(&browser, "#state", |s| s == "completed").await;
    let output: Value = client.wait_output(&run_id, Duration::from_secs(60)).await.expect("output");
    let first_payment = payment_of(&output).to_string();
    browser.goto(&server.url("/ui/runs")).await.expect("runs page");
    assert_eq!(text_of(&browser, "#kind").await.split_whitespace().collect::<Vec<_>>(), ["any", "expense"]);

    // A second claim, decided from the command line with the hash it lists.
    let second = client
        .start("expense", "claim-2", &claim("Grace", 900), &StartOptions::default())
        .await
        .expect("start");
    let second_id = second.run_id.clone();
    wait_state(&client, &second_id, "waiting_event").await;
    client
        .send_event(&second_id, "receipt", &json!({"url": "https://receipts.example/g.png"}), Some("scan-1"))
        .await
        .expect("event");
    let pending = pending_of(&target, &second_id);
    let hash = pending["payload_hash"].as_str().expect("hash");
    let mut args = vec!["approve", second_id.as_str(), "manager", "--hash", hash, "--comment", "ok"];
    args.extend_from_slice(&target);
    assert_eq!(cli(&args)["recorded"], json!(true));
    let output: Value = client.wait_output(&second_id, Duration::from_secs(60)).await.expect("output");
    assert_ne!(payment_of(&output), first_payment);

    let mut args = vec!["runs", "list", "--kind", "expense"];
    args.extend_from_slice(&target);
    let page = cli(&args);
    let states: Vec<&str> = page["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .filter_map(|r| r["status"].as_object())
        .filter_map(|s| s.keys().next().map(String::as_str))
        .collect();
    assert_eq!(states, ["completed", "completed"], "{page}");

    // A backup taken while it serves restores into a store that verifies clean, and so
    // does the served store itself once the server has stopped.
    let backup = dir.path().join("expenses.backup");
    let restored = dir.path().join("restored");
    cli(&["backup", "--server", &addr, "--data", data_arg, "--out", backup.to_str().expect("path")]);
    cli(&["restore", backup.to_str().expect("path"), "--data", restored.to_str().expect("path")]);
    assert_eq!(cli_code(&["store", "verify", "--data", restored.to_str().expect("path")]), Some(0));
    // The check before a deploy: refused on the directory the server holds, clean on the
    // restored copy and on the directory once the server has stopped.
    assert_eq!(cli_code(&["check-deploy", "--data", data_arg]), Some(1));
    assert_eq!(cli_code(&["check-deploy", "--data", restored.to_str().expect("path")]), Some(0));
    let mut server = server;
    assert_eq!(server.sigterm(), Some(0));
    assert_eq!(cli_code(&["store", "verify", "--data", data_arg]), Some(0));
    let report = cli(&["check-deploy", "--data", data_arg, "--json"]);
    assert_eq!(report["would_escalate"], 0, "{report}");
    // A settled run deleted with the binary's own command: gone from the store.
    let deleted = cli(&["runs", "delete", second_id.as_str(), "--data", data_arg]);
    assert_eq!(deleted["run_id"], second_id.as_str(), "{deleted}");
    assert_ne!(cli_code(&["runs", "show", second_id.as_str(), "--data", data_arg]), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_binary_runs_as_two_nodes_on_postgres() {
    let pg = PgServer::start().expect("a PostgreSQL server");
    let url = pg.fresh_database().expect("a database");
    let dir = tempfile::tempdir().expect("tempdir");
    let node = |id: &str| {
        let data = dir.path().join(id);
        serve(&data, &["--store", url.as_str(), "--node-id", id, "--lease-ttl", "2s"])
    };
    // One after the other: the first creates the admin token, the second finds it.
    let mut a = node("a");
    let b = node("b");
    let admin = a.token.clone();
    assert!(!admin.is_empty() && b.token.is_empty());
    let (addr_a, addr_b) = (a.addr.to_string(), b.addr.to_string());
    let via_a = ["--server", addr_a.as_str(), "--token", admin.as_str()];
    let via_b = ["--server", addr_b.as_str(), "--token", admin.as_str()];

    let mut args = vec!["tokens", "create", "--role", "reviewer", "--name", "mia"];
    args.extend_from_slice(&via_b);
    let mia = cli(&args)["token"].as_str().expect("token").to_string();

    let client = Client::with_nodes([addr_a.as_str(), addr_b.as_str()])
        .expect("nodes")
        .with_token(Some(admin.clone()));
    let mut runs = Vec::new();
    for n in 0..4 {
        let started = client
            .start("expense", &format!("claim-{n}"), &claim("Ada", 1000 + n), &StartOptions::default())
            .await
            .expect("start");
        runs.push(started.run_id.clone());
    }
    for (n, run_id) in runs.iter().enumerate() {
        wait_state(&client, run_id, "waiting_event").await;
        // Sent through either node: the owner gets it.
        let via = if n % 2 == 0 { &via_a } else { &via_b };
        let mut args = vec![
            "send-event",
            run_id.as_str(),
            "receipt",
            "--payload",
            r#"{"url":"https://receipts.example/r.png"}"#,
        ];
        args.extend_from_slice(via);
        assert_eq!(cli(&args)["outcome"], json!("delivered"));
        pending_of(via, run_id);
    }

    // Node a dies while runs wait for their manager; the reviewer decides through b, which
    // takes a's shards over once a's lease runs out.
    a.sigkill();
    let reviewer = Client::from_addr(b.addr).with_token(Some(mia));
    for (n, run_id) in runs.iter().enumerate() {
        let pending = pending_of(&via_b, run_id);
        let hash = pending["payload_hash"].as_str().expect("hash");
        if n % 2 == 0 {
            reviewer.decide(run_id, "manager", hash, true, "ok").await.expect("decide through b");
        } else {
            // The binary's own `approve`, through the survivor.
            let mut args = vec!["approve", run_id.as_str(), "manager", "--hash", hash, "--comment", "ok"];
            args.extend_from_slice(&via_b);
            assert_eq!(cli(&args)["recorded"], json!(true));
        }
    }
    let mut payments = Vec::new();
    for run_id in &runs {
        let output: Value = client.wait_output(run_id, Duration::from_secs(60)).await.expect("output");
        payments.push(payment_of(&output).to_string());
    }
    payments.sort();
    payments.dedup();
    assert_eq!(payments.len(), runs.len(), "one payment per claim");

    let mut args = vec!["runs", "list", "--kind", "expense", "--state", "completed"];
    args.extend_from_slice(&via_b);
    assert_eq!(cli(&args)["runs"].as_array().map(Vec::len), Some(runs.len()));

    let backup = dir.path().join("nodes.backup");
    let restored = dir.path().join("restored");
    let mut args = vec!["backup", "--out", backup.to_str().expect("path")];
    args.extend_from_slice(&via_b);
    cli(&args);
    cli(&["restore", backup.to_str().expect("path"), "--data", restored.to_str().expect("path")]);
    assert_eq!(cli_code(&["store", "verify", "--data", restored.to_str().expect("path")]), Some(0));
    // The check before a deploy reads the database the nodes serve from.
    assert_eq!(cli_code(&["check-deploy", "--store", url.as_str()]), Some(0));
}

/// The API is its document: schemathesis (pinned; `scripts/test.sh` installs it) generates
/// requests from `/openapi.json` of a real `serve` of the example's binary — valid ones,
/// invalid ones, undeclared methods, missing tokens, and sequences of calls — and every
/// answer must be what the document says, with every check on.
#[test]
fn the_api_is_what_its_document_says_to_schemathesis() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = serve(&dir.path().join("data"), &[]);
    schemathesis_finds_nothing(&server, dir.path());
}

/// The same of the project's own binary, whose demo agents' inputs — nested rules, secrets,
/// durations, integers of every width — are in the document as their types read them.
#[test]
fn the_demo_agents_api_is_what_its_document_says_to_schemathesis() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Served::start(&dir.path().join("data"));
    schemathesis_finds_nothing(&server, dir.path());
}

/// Runs schemathesis with every check against `server`, in `dir`; fails with its report.
fn schemathesis_finds_nothing(server: &Served, dir: &std::path::Path) {
    let tool = std::env::var("DURAFIBER_SCHEMATHESIS").unwrap_or_else(|_| {
        panic!("DURAFIBER_SCHEMATHESIS is not set: run the tests with scripts/test.sh, which installs schemathesis")
    });
    let report = dir.join("report");
    // Its output goes to a file: a pipe nobody reads while it runs could fill and stop it.
    let log = dir.join("schemathesis.log");
    let log_file = std::fs::File::create(&log).expect("log file");
    // Run in the temporary directory: schemathesis keeps a cache of the failures it found
    // in its working directory and replays them next time; each run here starts from none.
    let mut child = Command::new(&tool)
        .current_dir(dir)
        .args(["run", &server.url("/openapi.json"), "--checks", "all", "--max-examples", "30", "--seed", "1"])
        .args(["--no-color", "--report-dir"])
        .arg(&report)
        .arg("-H")
        .arg(format!("Authorization: Bearer {}", server.token))
        .stdout(log_file.try_clone().expect("log file"))
        .stderr(log_file)
        .spawn()
        .unwrap_or_else(|e| panic!("{tool}: {e}"));
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().expect("schemathesis") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("schemathesis ran for more than two minutes");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "schemathesis found differences:\n{text}");
}
