//! Side effects happen once (§5), counted upstream: a real HTTP server on 127.0.0.1 that
//! deduplicates by `Idempotency-Key`, as payment APIs do.
//!
//! The refund flow (approval → refund → confirmation email) goes through the public checker:
//! crashed after every boundary and with every store write lost, killed between each
//! effect's call and its receipt, evicted at every boundary and by seeded chaos. Every case
//! ends as the uninterrupted run did, with exactly one refund and one email upstream, and the
//! ledger's receipt hash equals the upstream object's.

use std::sync::Arc;

use durafiber_demo::agents::{Refund, RefundInput};
use durafiber_runtime::{Boundary, Decision, RunStatus, Runtime, payload_hash};
use durafiber_testkit::{check::AgentCheck, upstream::Upstream};

fn input(upstream: &Upstream) -> RefundInput {
    RefundInput {
        order_id: "ord_1001".into(),
        amount_cents: 4_200,
        customer_email: "ada@example.com".into(),
        upstream: upstream.url(),
        api_key: None,
        approval_rule: None,
    }
}

fn check(upstream: &Arc<Upstream>) -> AgentCheck<Refund> {
    AgentCheck::new(Refund::default())
        .input(&input(upstream))
        .upstream(upstream.clone())
        .approve_with(|_| Decision { approved: true, comment: "ok".into() })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_refund_flow_crashed_at_every_boundary_and_evicted_everywhere_refunds_and_emails_once() {
    durafiber_testkit::init_tracing();
    let upstream = Arc::new(Upstream::start().await.expect("upstream"));
    let check =
        check(&upstream).crash_at_every_boundary().kill_during_effects().eviction_matrix().seeds(1..4);
    let points = check.crash_points().await;
    for expected in [
        Boundary::AfterApprovalRequest("refund".into()).into(),
        Boundary::AfterEffectPrepare("refund".into()).into(),
        Boundary::AfterEffectCall("refund".into()).into(),
        Boundary::AfterEffectCommit("email:confirmation".into()).into(),
        Boundary::AfterStash("emailed".into()).into(),
    ] {
        assert!(points.contains(&expected), "the dry run passes {expected}: {points:?}");
    }
    let report = check.run().await;
    report.assert_ok();
    assert!(matches!(report.baseline.final_state, Some(RunStatus::Completed { .. })));
    assert_eq!(report.baseline.requests.len(), 2, "one refund and one email");
    // Every boundary crashed, every write lost, every boundary evicted, three seeds.
    assert!(report.cases.len() >= 8 + 10 + 8 + 3, "only {} cases", report.cases.len());
    for case in std::iter::once(&report.baseline).chain(&report.cases) {
        assert_eq!(case.upstream.len(), 2, "{}: one object per key, two keys", case.name);
        assert!(case.upstream.values().all(|n| *n == 1), "{}", case.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_committed_receipt_is_the_upstream_object_of_its_key() {
    let upstream = Arc::new(Upstream::start().await.expect("upstream"));
    let store = durafiber_store::Store::with_backend(
        Arc::new(durafiber_store::SimBackend::new()),
        durafiber_store::StoreConfig::default(),
    )
    .expect("store");
    let rt = Runtime::builder(store).agent(Refund::default()).open().await.expect("runtime");
    let run_id = rt.start::<Refund>("refund-1001", &input(&upstream)).await.expect("start").run_id;
    rt.wait_for(&run_id, |s| matches!(s, RunStatus::WaitingApproval { .. })).await.expect("waits");
    let pending = rt.pending_approvals(Some(&run_id)).expect("pending");
    let p = pending.first().expect("one approval");
    rt.approve(&run_id, &p.approval_id, &p.payload_hash, Decision { approved: true, comment: "ok".into() })
        .await
        .expect("approve");
    assert!(matches!(rt.wait(&run_id).await.expect("wait"), RunStatus::Completed { .. }));
    let ledger = rt.inspect(&run_id).expect("inspect").ledger;
    for (effect, collection) in [("refund", "refunds"), ("email:confirmation", "emails")] {
        let objects = upstream.objects(collection);
        assert_eq!(objects.len(), 1, "{collection}");
        let entry = ledger.iter().find(|e| e.effect_id == effect).expect("ledger entry");
        let receipt = entry.committed.as_ref().expect("committed");
        assert_eq!(receipt.receipt_hash, payload_hash(&objects[0]).expect("json"), "{effect}");
        assert_eq!(objects[0]["idempotency_key"], entry.idempotency_key.as_str(), "{effect}");
    }
    rt.shutdown().await;
}
