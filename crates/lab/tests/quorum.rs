//! A refund that takes two of three named reviewers, through a real server SIGKILLed
//! between the two decisions: alice approves, the server dies, a second server refuses
//! alice's change of mind, a stale hash and mallory, takes bob's approval, and the run
//! continues once — one refund at the upstream, both deciders recorded.

use std::time::Duration;

use durafiber_testkit::upstream::Upstream;
use reqwest::StatusCode;
use serde_json::{Value, json};

mod common;
use common::Served;

async fn decide(
    server: &Served,
    token: &str,
    run_id: &str,
    hash: &str,
    approved: bool,
) -> (StatusCode, Value) {
    let r = server
        .client_with(token)
        .post(server.url(&format!("/runs/{run_id}/approvals/refund")))
        .body(json!({"payload_hash": hash, "approved": approved, "comment": ""}).to_string())
        .send()
        .await
        .expect("decide");
    (r.status(), r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_three_decide_once_across_a_sigkill_between_the_decisions() {
    let upstream = Upstream::start().await.expect("upstream");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut first = Served::start(dir.path());
    let tokens: Vec<String> = {
        let mut t = Vec::new();
        for name in ["alice", "bob", "carol", "mallory"] {
            t.push(first.create_token(name, "reviewer").await);
        }
        t
    };
    let (alice, bob, mallory) = (&tokens[0], &tokens[1], &tokens[3]);
    let input = json!({"order_id": "o-9", "amount_cents": 250_000, "customer_email": "a@b.c",
        "upstream": upstream.url(),
        "approval_rule": {"required": 2, "from": {"named": ["alice", "bob", "carol"]}}});
    let run_id = first.start_run("refund", "o-9", input, &[]).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let hash = loop {
        let shown = first.run_view(&run_id).await;
        if let Some(hash) = shown["approvals"][0]["payload_hash"].as_str() {
            break hash.to_string();
        }
        assert!(std::time::Instant::now() < deadline, "the run never asked: {shown}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    let (status, out) = decide(&first, alice, &run_id, &hash, true).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(
        (out["decided"].clone(), out["approvals"].clone(), out["required"].clone()),
        (json!(false), json!(1), json!(2))
    );
    // The vote is durable once answered: the server dies right after it.
    first.sigkill();

    let second = Served::start(dir.path());
    let shown = second.run_view(&run_id).await;
    assert!(shown["run"]["status"].get("waiting_approval").is_some(), "{shown}");
    assert_eq!(shown["approvals"][0]["votes"][0]["by"], json!("alice"));
    let (status, out) = decide(&second, alice, &run_id, &hash, false).await;
    assert_eq!((status, out["kind"].clone()), (StatusCode::CONFLICT, json!("AlreadyVoted")), "{out}");
    let (status, out) = decide(&second, bob, &run_id, "sha256:stale", true).await;
    assert_eq!((status, out["kind"].clone()), (StatusCode::CONFLICT, json!("StaleApproval")), "{out}");
    let (status, out) = decide(&second, mallory, &run_id, &hash, true).await;
    assert_eq!((status, out["kind"].clone()), (StatusCode::FORBIDDEN, json!("NotAReviewer")), "{out}");
    assert!(upstream.objects("refunds").is_empty(), "refunded on one approval");

    let (status, out) = decide(&second, bob, &run_id, &hash, true).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["decided"], json!(true));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let done = loop {
        let shown = second.run_view(&run_id).await;
        if shown["run"]["status"].get("completed").is_some() {
            break shown;
        }
        assert!(std::time::Instant::now() < deadline, "the run did not complete: {shown}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(done["run"]["status"]["completed"]["output"]["approved"], json!(true));
    assert_eq!(upstream.objects("refunds").len(), 1, "one refund");
    let approval = &done["approvals"][0];
    assert_eq!(approval["decision"]["comment"], json!("approved by alice, bob"));
    let deciders: Vec<&str> =
        approval["votes"].as_array().expect("votes").iter().filter_map(|v| v["by"].as_str()).collect();
    assert_eq!(deciders, ["alice", "bob"]);
}
