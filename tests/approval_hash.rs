//! Human approvals (§6): bound to the run and the payload hash the reviewer saw, decided
//! once, escalated on silence. On the virtual clock, so 72 hours of silence take no time.

use durafiber_runtime::Timestamp;
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use durafiber_demo::sim::SIM_EPOCH_MS;
use durafiber_runtime::{
    Agent, AgentError, Ctx, Decision, ListFilter, Recovered, RunStatus, Runtime, RuntimeError,
    clock::VirtualClock,
};
use durafiber_store::{SimBackend, Store, StoreConfig};

/// Asks for approval of a payment and returns the decision.
struct Payout {
    escalated: Arc<AtomicBool>,
}

impl Agent for Payout {
    const KIND: &'static str = "payout";
    type Input = u64;
    type Stash = ();
    type Output = bool;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, cents: u64) -> Result<bool, AgentError> {
        let decision =
            ctx.request_approval("payout", &serde_json::json!({"cents": cents, "to": "acct_9"})).await?;
        Ok(decision.approved)
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, r: Recovered<Self>) -> Result<bool, AgentError> {
        self.run_fiber(ctx, r.input).await
    }

    async fn on_escalate(&self, ctx: &mut Ctx<Self>, reason: &str) {
        // The hook reaches the run: what it stores is there after the escalation.
        let noted = ctx.storage().put("escalated_because", &reason.to_string()).await;
        if reason == "approval_timeout" && noted.is_ok() {
            self.escalated.store(true, Ordering::SeqCst);
        }
    }
}

async fn runtime(escalated: &Arc<AtomicBool>) -> Runtime {
    let store = Store::with_backend(Arc::new(SimBackend::new()), StoreConfig::default()).expect("store");
    Runtime::builder(store)
        .virtual_clock(VirtualClock::new(Timestamp::from_millis(SIM_EPOCH_MS)))
        .agent(Payout { escalated: escalated.clone() })
        .open()
        .await
        .expect("runtime")
}

fn yes() -> Decision {
    Decision { approved: true, comment: "looks right".into() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_must_quote_the_pending_hash_and_is_recorded_once() {
    let flag = Arc::default();
    let rt = runtime(&flag).await;
    let run = rt.start::<Payout>("p1", &500).await.expect("start").run_id;
    rt.advance(Duration::ZERO).await.expect("settle");
    let pending = rt.pending_approvals(None).expect("pending");
    assert_eq!(pending.len(), 1);
    let p = &pending[0];
    assert_eq!((p.run_id.as_str(), p.approval_id.as_str()), (run.as_str(), "payout"));
    assert_eq!(
        p.payload,
        serde_json::json!({"cents": 500, "to": "acct_9"}),
        "the view shows what the run showed"
    );

    let stale = "0".repeat(64);
    assert!(matches!(
        rt.approve(&run, "payout", &stale, yes()).await,
        Err(RuntimeError::StaleApproval { .. })
    ));
    assert_eq!(rt.status(&run).expect("status"), RunStatus::WaitingApproval { approval_id: "payout".into() });
    assert!(rt.inspect(&run).expect("inspect").approvals[0].decision.is_none(), "nothing moved");
    assert!(matches!(
        rt.approve(&run, "other", &p.payload_hash, yes()).await,
        Err(RuntimeError::NotPending { .. })
    ));
    assert!(matches!(
        rt.approve(&"run_nope".into(), "payout", &p.payload_hash, yes()).await,
        Err(RuntimeError::UnknownRun { .. })
    ));

    assert!(rt.approve(&run, "payout", &p.payload_hash, yes()).await.expect("approve").recorded);
    assert!(!rt.approve(&run, "payout", &p.payload_hash, yes()).await.expect("repeat").recorded, "a no-op");
    let no = Decision { approved: false, comment: "changed my mind".into() };
    assert!(matches!(
        rt.approve(&run, "payout", &p.payload_hash, no).await,
        Err(RuntimeError::AlreadyDecided { .. })
    ));
    rt.advance(Duration::ZERO).await.expect("settle");
    assert_eq!(rt.output::<bool>(&run).expect("output"), Some(true));
    assert!(rt.pending_approvals(None).expect("pending").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_after_eviction_resumes_the_run_with_the_same_result() {
    let flag = Arc::default();
    let rt = runtime(&flag).await;
    let run = rt.start::<Payout>("p2", &700).await.expect("start").run_id;
    rt.advance(Duration::ZERO).await.expect("settle");
    rt.evict(&run).await;
    assert!(!rt.is_live(&run).await);
    let hash = rt.pending_approvals(Some(&run)).expect("pending")[0].payload_hash.clone();
    rt.approve(&run, "payout", &hash, yes()).await.expect("approve");
    rt.advance(Duration::ZERO).await.expect("settle");
    assert_eq!(rt.output::<bool>(&run).expect("output"), Some(true));
    assert!(rt.events().iter().any(|e| e.run_id == run && e.kind == "approval_replayed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silence_for_escalate_after_escalates_and_a_late_decision_is_not_pending() {
    let escalated = Arc::new(AtomicBool::new(false));
    let rt = runtime(&escalated).await;
    let run = rt.start::<Payout>("p3", &900).await.expect("start").run_id;
    rt.advance(Duration::from_secs(72 * 3600 - 1)).await.expect("advance");
    assert_eq!(rt.status(&run).expect("status"), RunStatus::WaitingApproval { approval_id: "payout".into() });
    rt.advance(Duration::from_secs(1)).await.expect("advance");
    assert_eq!(rt.status(&run).expect("status"), RunStatus::Escalated { reason: "approval_timeout".into() });
    assert!(escalated.load(Ordering::SeqCst), "on_escalate ran");
    let noted = rt.storage_list(&run, "", None, 10).expect("storage");
    assert_eq!(noted, vec![("escalated_because".to_string(), "\"approval_timeout\"".to_string())]);
    let hash = rt.inspect(&run).expect("inspect").approvals[0].payload_hash.clone();
    assert!(matches!(rt.approve(&run, "payout", &hash, yes()).await, Err(RuntimeError::NotPending { .. })));
    assert_eq!(
        rt.list(&ListFilter { limit: 10, ..Default::default() }).expect("list").runs.len(),
        1,
        "no new run"
    );
}
