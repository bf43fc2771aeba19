//! Approvals by more than one person (`ctx.request_approval_with`): a refund over its limit
//! needs two of three named reviewers.
//!
//! - Under every crash, lost write and eviction the checker plays (with a decision a step,
//!   so a crash falls between the two), the refund is made once, after both decisions.
//! - Each person counts once: a repeat is answered as a repeat, a different second decision
//!   is `AlreadyVoted`; someone the rule leaves out is `NotAReviewer`; a decision without a
//!   name is `DeciderUnknown`; a stale hash is `StaleApproval`; the second approval decides,
//!   once, and a third person finds it `AlreadyDecided`. One decline declines.
//!
//! `crates/lab/tests/quorum.rs` SIGKILLs a server between the two decisions, and the
//! console's browser test approves a 2-of-2 refund with two reviewers.

use std::{sync::Arc, time::Duration};

use durafiber_demo::agents::{Refund, RefundInput, RefundOutput};
use durafiber_runtime::{
    ApprovalRule, Decider, Decision, Reviewers, RunId, RunStatus, Runtime, RuntimeError,
};
use durafiber_store::{Store, StoreConfig};
use durafiber_testkit::{check::AgentCheck, upstream::Upstream};

fn two_of_three() -> ApprovalRule {
    ApprovalRule::of(2).from(Reviewers::Named(vec!["alice".into(), "bob".into(), "carol".into()]))
}

fn input(order: &str, upstream: &Upstream) -> RefundInput {
    RefundInput {
        order_id: order.into(),
        amount_cents: 250_000,
        customer_email: "ada@example.com".into(),
        upstream: upstream.url(),
        api_key: None,
        approval_rule: Some(two_of_three()),
    }
}

fn yes() -> Decision {
    Decision { approved: true, comment: "fine".into() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_that_takes_two_of_three_is_made_once_under_every_crash_and_eviction() {
    let upstream = Arc::new(Upstream::start().await.expect("upstream"));
    let report = AgentCheck::new(Refund::default())
        .input(&input("o-1", &upstream))
        .upstream(upstream.clone())
        .approve_with(|_| yes())
        .deciders(&["alice", "bob"])
        .crash_at_every_boundary()
        .eviction_matrix()
        .run()
        .await;
    report.assert_ok();
    let Some(RunStatus::Completed { output_json }) = &report.baseline.final_state else {
        panic!("the baseline did not complete: {:?}", report.baseline.final_state);
    };
    let output: RefundOutput = serde_json::from_str(output_json).expect("a refund output");
    assert!(output.approved && output.refund_id.is_some(), "{output:?}");
}

async fn pending_of(rt: &Runtime, run: &RunId) -> durafiber_runtime::PendingApproval {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(p) = rt.pending_approvals(Some(run)).expect("pending").into_iter().next() {
            return p;
        }
        assert!(std::time::Instant::now() < deadline, "the run never asked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_person_counts_once_and_the_rule_decides_once() {
    let upstream = Upstream::start().await.expect("upstream");
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_at(dir.path().to_str().expect("utf-8"), StoreConfig::default()).expect("store");
    let rt = Runtime::builder(store).agent(Refund::default()).open().await.expect("runtime");
    let run = rt.start::<Refund>("o-2", &input("o-2", &upstream)).await.expect("start").run_id;
    let p = pending_of(&rt, &run).await;
    assert_eq!((p.required, p.votes.len()), (2, 0));
    let hash = p.payload_hash.clone();
    let reviewer = |name: &str| Decider::new(name, &["reader", "reviewer"]);

    let refused = rt.approve(&run, "refund", &hash, yes()).await;
    assert!(matches!(refused, Err(RuntimeError::DeciderUnknown { .. })), "{refused:?}");
    let refused = rt.approve_as(&run, "refund", &hash, yes(), &reviewer("mallory")).await;
    assert!(matches!(refused, Err(RuntimeError::NotAReviewer { .. })), "{refused:?}");

    let first = rt.approve_as(&run, "refund", &hash, yes(), &reviewer("alice")).await.expect("alice");
    assert!(first.recorded && !first.decided && first.approvals == 1 && first.required == 2, "{first:?}");
    let again = rt.approve_as(&run, "refund", &hash, yes(), &reviewer("alice")).await.expect("alice again");
    assert!(!again.recorded && !again.decided, "{again:?}");
    let no = Decision { approved: false, comment: "changed my mind".into() };
    let twice = rt.approve_as(&run, "refund", &hash, no, &reviewer("alice")).await;
    assert!(matches!(twice, Err(RuntimeError::AlreadyVoted { .. })), "{twice:?}");
    let stale = rt.approve_as(&run, "refund", "sha256:0000", yes(), &reviewer("bob")).await;
    assert!(matches!(stale, Err(RuntimeError::StaleApproval { .. })), "{stale:?}");
    assert!(matches!(rt.status(&run).expect("status"), RunStatus::WaitingApproval { .. }));
    let p = pending_of(&rt, &run).await;
    assert_eq!(p.votes.iter().map(|v| v.by.as_str()).collect::<Vec<_>>(), ["alice"]);
    assert!(upstream.objects("refunds").is_empty(), "refunded before the second approval");

    let second = rt.approve_as(&run, "refund", &hash, yes(), &reviewer("bob")).await.expect("bob");
    assert!(second.recorded && second.decided && second.approvals == 2, "{second:?}");
    let late = rt.approve_as(&run, "refund", &hash, yes(), &reviewer("carol")).await;
    assert!(matches!(late, Err(RuntimeError::AlreadyDecided { .. })), "{late:?}");
    assert!(matches!(rt.wait(&run).await.expect("wait"), RunStatus::Completed { .. }));
    assert_eq!(upstream.objects("refunds").len(), 1);
    let shown = serde_json::to_value(rt.inspect(&run).expect("inspect")).expect("json");
    let approval = &shown["approvals"][0];
    assert_eq!(approval["decision"]["comment"], "approved by alice, bob");
    let deciders: Vec<&str> =
        approval["votes"].as_array().expect("votes").iter().filter_map(|v| v["by"].as_str()).collect();
    assert_eq!(deciders, ["alice", "bob"]);
    assert_eq!(approval["rule"]["required"], 2);

    // One decline declines.
    let declined = rt.start::<Refund>("o-3", &input("o-3", &upstream)).await.expect("start").run_id;
    let p = pending_of(&rt, &declined).await;
    let no = Decision { approved: false, comment: "over the limit".into() };
    let out =
        rt.approve_as(&declined, "refund", &p.payload_hash, no, &reviewer("carol")).await.expect("carol");
    assert!(out.decided && out.approvals == 0, "{out:?}");
    assert!(matches!(rt.wait(&declined).await.expect("wait"), RunStatus::Completed { .. }));
    let output: Option<RefundOutput> = rt.output(&declined).expect("output");
    assert!(!output.expect("an output").approved);
    assert_eq!(upstream.objects("refunds").len(), 1);
    rt.shutdown().await;
}
