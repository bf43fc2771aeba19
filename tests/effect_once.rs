//! Side effects happen once (§5), counted upstream: a real HTTP server on 127.0.0.1 that
//! deduplicates by `Idempotency-Key`, as payment APIs do.
//!
//! The refund flow (approval → refund → confirmation email) is crashed at every write after
//! the approval, once before and once after its barrier, on the crash-simulating store, and
//! then driven through the eviction matrix: never evicted, evicted after each boundary, and
//! evicted at seeded random points. Every case ends with exactly one refund and one email
//! upstream, and the ledger's receipt hash equals the upstream object's.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use durafiber_runtime::testing::BuilderTestExt;
use durafiber_runtime::{
    CrashHook, Decision, RunStatus, Runtime, RuntimeConfig, clock::VirtualClock, payload_hash,
};
use durafiber_store::{CrashPoint, SimBackend, Store, StoreConfig};
use durafiber_testkit::sim::SIM_EPOCH_MS;
use durafiber_testkit::{
    agents::{Refund, RefundInput, RefundOutput},
    upstream::Upstream,
};

fn input(upstream: &Upstream) -> RefundInput {
    RefundInput {
        order_id: "ord_1001".into(),
        amount_cents: 4_200,
        customer_email: "ada@example.com".into(),
        upstream: upstream.url(),
        api_key: None,
    }
}

async fn open(sim: &SimBackend, now_ms: u64, config: RuntimeConfig, hook: Option<CrashHook>) -> Runtime {
    durafiber_testkit::init_tracing();
    let store = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store");
    let mut builder = Runtime::builder(store)
        .config(config)
        .virtual_clock(VirtualClock::new(now_ms))
        .agent(Refund::default());
    if let Some(hook) = hook {
        builder = builder.crash_hook(hook);
    }
    builder.open().await.expect("runtime")
}

/// Approves the run's pending approval, if it has one, quoting the hash the view shows.
async fn approve_pending(rt: &Runtime, run_id: &str) -> bool {
    let Ok(pending) = rt.pending_approvals(Some(run_id)) else { return false };
    let Some(p) = pending.first() else { return false };
    rt.approve(run_id, &p.approval_id, &p.payload_hash, Decision { approved: true, comment: "ok".into() })
        .await
        .is_ok()
}

/// Advances virtual time, approving when asked, until the run ends or the store crashes.
async fn drive(rt: &Runtime, sim: &SimBackend, run_id: &str) -> Option<RunStatus> {
    for _ in 0..600 {
        if sim.is_crashed() {
            return None;
        }
        match rt.status(run_id) {
            Ok(s) if s.is_terminal() => return Some(s),
            Ok(RunStatus::WaitingApproval { .. }) => {
                approve_pending(rt, run_id).await;
            }
            _ => {}
        }
        let _ = rt.advance(Duration::from_secs(1)).await;
    }
    panic!("run {run_id} did not finish in 600 virtual seconds");
}

/// One refund and one email upstream, and the ledger agrees with them.
fn assert_once_upstream(rt: &Runtime, upstream: &Upstream, run_id: &str, case: &str) {
    let refunds = upstream.objects("refunds");
    let emails = upstream.objects("emails");
    assert_eq!(refunds.len(), 1, "{case}: refunds upstream {refunds:?}");
    assert_eq!(emails.len(), 1, "{case}: emails upstream {emails:?}");
    let ledger = rt.inspect(run_id).expect("inspect").ledger;
    for (effect, object) in [("refund", &refunds[0]), ("email:confirmation", &emails[0])] {
        let entry = ledger.iter().find(|e| e.effect_id == effect).expect("ledger entry");
        let receipt = entry.committed.as_ref().expect("committed");
        let upstream_hash = payload_hash(object).expect("json");
        assert_eq!(receipt.receipt_hash, upstream_hash, "{case}: {effect} receipt matches upstream");
        assert_eq!(object["idempotency_key"], entry.idempotency_key.as_str(), "{case}: one key per effect");
    }
}

async fn crash_once(point: CrashPoint) -> bool {
    let upstream = Upstream::start().await.expect("upstream");
    let sim = SimBackend::new();
    let rt = open(&sim, SIM_EPOCH_MS, RuntimeConfig::default(), None).await;
    let run_id = rt.start::<Refund>("refund-1001", &input(&upstream)).await.expect("start").run_id;
    rt.wait_for(&run_id, |s| matches!(s, RunStatus::WaitingApproval { .. })).await.expect("waits");
    rt.advance(Duration::ZERO).await.expect("settle");
    sim.crash_at(point);
    let first = drive(&rt, &sim, &run_id).await;
    let now = rt.now_ms();
    rt.shutdown().await;
    if first.is_some() && !sim.is_crashed() {
        return false; // the flow finished before reaching this crash point
    }
    sim.revive();
    let rt = open(&sim, now, RuntimeConfig::default(), None).await;
    let status = drive(&rt, &sim, &run_id).await.expect("no second crash");
    assert!(matches!(status, RunStatus::Completed { .. }), "{point:?}: {status:?}");
    assert_once_upstream(&rt, &upstream, &run_id, &format!("{point:?}"));
    rt.shutdown().await;
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_refund_flow_crashed_at_every_boundary_refunds_and_emails_once() {
    let mut reached = 0;
    for n in 1..=60 {
        let a = crash_once(CrashPoint::AfterApply(n)).await;
        let b = crash_once(CrashPoint::AfterBarrier(n)).await;
        if !a && !b {
            break;
        }
        reached += 1;
    }
    // decision, registration, stash, prepare, commit, stash, prepare, commit, stash, finish:
    // ten writes, of which group commit may merge two that happen to be concurrent.
    assert!(reached >= 8, "only {reached} crash points reached");
}

/// Runs the whole flow once under a crash hook and a config; returns the output and the
/// upstream's request bodies.
async fn flow(config: RuntimeConfig, hook: Option<CrashHook>) -> (RefundOutput, Vec<serde_json::Value>, u64) {
    let upstream = Upstream::start().await.expect("upstream");
    let sim = SimBackend::new();
    let rt = open(&sim, SIM_EPOCH_MS, config, hook).await;
    let run_id = rt.start::<Refund>("refund-1001", &input(&upstream)).await.expect("start").run_id;
    let status = drive(&rt, &sim, &run_id).await.expect("no crash");
    assert!(matches!(status, RunStatus::Completed { .. }), "{status:?}");
    assert_once_upstream(&rt, &upstream, &run_id, "matrix");
    let out: RefundOutput = rt.output(&run_id).expect("output").expect("completed");
    let bodies = ["refunds", "emails"]
        .iter()
        .flat_map(|c| upstream.objects(c))
        .map(|o| o["request"].clone())
        .collect();
    let evictions = rt.metrics().evictions;
    rt.shutdown().await;
    (out, bodies, evictions)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_eviction_matrix_ends_in_the_same_state_with_the_same_upstream_objects() {
    let (live_out, live_bodies, live_evictions) = flow(RuntimeConfig::default(), None).await;
    assert_eq!(live_evictions, 0, "the live flow is never evicted");
    // Evicted once after boundary k, for every boundary the flow has.
    for k in 1..=20u32 {
        let seen = Arc::new(AtomicU32::new(0));
        let counter = seen.clone();
        let hook: CrashHook = Arc::new(move |_, _| counter.fetch_add(1, Ordering::SeqCst) + 1 == k);
        let (out, bodies, evictions) = flow(RuntimeConfig::default(), Some(hook)).await;
        assert_eq!((&out, &bodies), (&live_out, &live_bodies), "evicted after boundary {k}");
        if evictions == 0 {
            assert!(k > 8, "the flow has at least 8 boundaries, stopped at {k}");
            break;
        }
    }
    for seed in 1..=3 {
        let config = RuntimeConfig { seed, chaos_evict_rate: 0.3, ..RuntimeConfig::default() };
        let (out, bodies, _) = flow(config, None).await;
        assert_eq!((&out, &bodies), (&live_out, &live_bodies), "chaos seed {seed}");
    }
}
