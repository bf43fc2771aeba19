//! Forking a run from a boundary of its history without paying twice: a refund (drafted →
//! approved → refunded → emailed) completes, then is forked at each of its three boundaries.
//! Each fork inherits what the source had settled before its boundary — the decision, the
//! refund's receipt — and calls the upstream only for what came after: at boundary 3
//! nothing, at 2 the email, at 1 the refund and the email (after a new approval). No
//! inherited key reaches the upstream again, the source's records are unchanged, the same
//! key returns the same fork, and a wrong input or a boundary the history does not keep is
//! refused; a fork of a fork inherits what its source had inherited. The checker does the
//! same on a simulated disk (`fork_at_every_boundary`).

use std::time::Duration;

use durafiber_demo::agents::{Refund, RefundInput, RefundOutput};
use durafiber_runtime::{Decision, ForkOptions, RunId, RunStatus, Runtime, RuntimeError};
use durafiber_store::{Store, StoreConfig};
use durafiber_testkit::{check::AgentCheck, upstream::Upstream};
use serde_json::Value;

async fn approve_when_asked(rt: &Runtime, run: &RunId) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(p) = rt.pending_approvals(Some(run)).expect("pending").into_iter().next() {
            let yes = Decision { approved: true, comment: "ok".into() };
            rt.approve(run, &p.approval_id, &p.payload_hash, yes).await.expect("approve");
            return;
        }
        if rt.status(run).expect("status").is_terminal() {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "run {run} never asked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn records_of(rt: &Runtime, run: &RunId) -> Value {
    let mut shown = serde_json::to_value(rt.inspect(run).expect("inspect")).expect("json");
    shown["history"] = serde_json::to_value(rt.history(run).expect("history")).expect("json");
    shown
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_at_each_boundary_pays_only_for_what_came_after_it() {
    let upstream = Upstream::start().await.expect("upstream");
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_at(dir.path().to_str().expect("utf-8"), StoreConfig::default()).expect("store");
    let rt = Runtime::builder(store).agent(Refund::default()).open().await.expect("runtime");
    let input = RefundInput {
        order_id: "o-1".into(),
        amount_cents: 4_200,
        customer_email: "ada@example.com".into(),
        upstream: upstream.url(),
        api_key: None,
        approval_rule: None,
    };
    let source = rt.start::<Refund>("refund-o-1", &input).await.expect("start").run_id;
    approve_when_asked(&rt, &source).await;
    assert!(matches!(rt.wait(&source).await.expect("wait"), RunStatus::Completed { .. }));
    let history = rt.history(&source).expect("history");
    let steps: Vec<(u64, &str)> = history.iter().map(|h| (h.seq, h.step.as_str())).collect();
    assert_eq!(steps, [(1, "drafted"), (2, "refunded"), (3, "emailed")]);
    let before = records_of(&rt, &source);
    assert_eq!(upstream.requests(), 2);

    // What each fork calls the upstream for: (its boundary, new requests, refunds, emails).
    let mut expected = (2u64, 1usize, 1usize);
    for (at, new_requests, new_refunds, new_emails) in
        [(3u64, 0u64, 0usize, 0usize), (2, 1, 0, 1), (1, 2, 1, 1)]
    {
        let fork = rt.fork(&source, at, &format!("fork-{at}"), ForkOptions::default()).await.expect("fork");
        assert!(fork.accepted);
        approve_when_asked(&rt, &fork.run_id).await;
        let status = rt.wait(&fork.run_id).await.expect("wait");
        assert!(matches!(status, RunStatus::Completed { .. }), "fork at {at}: {status:?}");
        let output: RefundOutput = rt.output(&fork.run_id).expect("output").expect("an output");
        assert!(output.approved, "fork at {at}");
        expected = (expected.0 + new_requests, expected.1 + new_refunds, expected.2 + new_emails);
        let seen = (upstream.requests(), upstream.objects("refunds").len(), upstream.objects("emails").len());
        assert_eq!(seen, expected, "fork at {at}: (requests, refunds, emails)");

        // The fork says where it came from and what it inherited.
        let shown = serde_json::to_value(rt.inspect(&fork.run_id).expect("inspect")).expect("json");
        let from = &shown["forked_from"];
        assert_eq!(from["source_run_id"], Value::from(source.as_str()));
        assert_eq!(from["at_seq"], Value::from(at));
        let inherited: Vec<&str> =
            from["inherited_effects"].as_array().expect("list").iter().filter_map(Value::as_str).collect();
        let wanted: &[&str] = match at {
            3 => &["email:confirmation", "refund"],
            2 => &["refund"],
            _ => &[],
        };
        assert_eq!(inherited, wanted, "fork at {at}");
        // The same key is the same fork.
        let again = rt.fork(&source, at, &format!("fork-{at}"), ForkOptions::default()).await.expect("again");
        assert_eq!((again.run_id, again.accepted), (fork.run_id, false));
    }
    assert_eq!(records_of(&rt, &source), before, "the source changed");

    // A fork of a fork inherits what its own source had inherited.
    let first = rt.fork(&source, 3, "fork-3", ForkOptions::default()).await.expect("fork-3").run_id;
    let last = rt.history(&first).expect("history").last().expect("a boundary").seq;
    let again = rt.fork(&first, last, "fork-of-fork", ForkOptions::default()).await.expect("fork of a fork");
    assert!(matches!(rt.wait(&again.run_id).await.expect("wait"), RunStatus::Completed { .. }));
    assert_eq!(upstream.requests(), expected.0, "a fork of a fork called the upstream");

    let wrong = ForkOptions { input_json: Some(r#"{"order": 7}"#.into()), ..ForkOptions::default() };
    let refused = rt.fork(&source, 2, "fork-wrong", wrong).await;
    assert!(
        matches!(&refused, Err(RuntimeError::ForkRefused { reason, .. }) if reason.contains("not refund's")),
        "{refused:?}"
    );
    let refused = rt.fork(&source, 9, "fork-nowhere", ForkOptions::default()).await;
    assert!(matches!(refused, Err(RuntimeError::ForkRefused { .. })), "{refused:?}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checker_forks_a_refund_at_every_boundary_and_finds_nothing_paid_twice() {
    let upstream = std::sync::Arc::new(Upstream::start().await.expect("upstream"));
    let input = RefundInput {
        order_id: "o-2".into(),
        amount_cents: 990,
        customer_email: "grace@example.com".into(),
        upstream: upstream.url(),
        api_key: None,
        approval_rule: None,
    };
    let report = AgentCheck::new(Refund::default())
        .input(&input)
        .upstream(upstream.clone())
        .approve_with(|_| Decision { approved: true, comment: "ok".into() })
        .fork_at_every_boundary()
        .run()
        .await;
    report.assert_ok();
    let names: Vec<&str> = report.cases.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["forked at boundary 1", "forked at boundary 2", "forked at boundary 3"]);
    // New objects only after the fork point: the refund's fork at 1 makes both, at 2 the
    // email, at 3 nothing.
    let made: Vec<usize> = report.cases.iter().map(|c| c.requests.len()).collect();
    assert_eq!(made, [2, 1, 0]);
}
