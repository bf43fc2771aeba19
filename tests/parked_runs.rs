//! Runs waiting for people cost no fiber (§6.1, §7): a fiber idle on a durable wait leaves
//! memory after `hibernate_after`, and past `waiting_in_memory` waiting fibers the longest
//! waiting leave at once. A decision re-enters a parked run from its journal, and it goes on
//! exactly once. On the virtual clock.

use durafiber_runtime::Timestamp;
use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use durafiber_demo::sim::SIM_EPOCH_MS;
use durafiber_runtime::{
    Agent, AgentError, Ctx, Decision, Recovered, RunId, RunStatus, Runtime, RuntimeConfig,
    clock::VirtualClock,
};
use durafiber_store::{SimBackend, Store, StoreConfig};

/// Asks for one approval; counts the times a decision let it go on.
struct Asker {
    went_on: Arc<AtomicUsize>,
}

impl Agent for Asker {
    const KIND: &'static str = "asker";
    type Input = ();
    type Stash = ();
    type Output = bool;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, (): ()) -> Result<bool, AgentError> {
        self.ask(ctx).await
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, _: Recovered<Self>) -> Result<bool, AgentError> {
        self.ask(ctx).await
    }
}

impl Asker {
    async fn ask(&self, ctx: &mut Ctx<Self>) -> Result<bool, AgentError> {
        let decision = ctx.request_approval("go", &"may it go on?").await?;
        self.went_on.fetch_add(1, Ordering::SeqCst);
        Ok(decision.approved)
    }
}

async fn runtime(config: RuntimeConfig, went_on: &Arc<AtomicUsize>) -> Runtime {
    let store = Store::with_backend(Arc::new(SimBackend::new()), StoreConfig::default()).expect("store");
    Runtime::builder(store)
        .virtual_clock(VirtualClock::new(Timestamp::from_millis(SIM_EPOCH_MS)))
        .config(config)
        .agent(Asker { went_on: went_on.clone() })
        .open()
        .await
        .expect("runtime")
}

async fn approve_all(rt: &Runtime, runs: &[RunId]) {
    for run in runs {
        let pending = rt.pending_approvals(Some(run)).expect("pending");
        let hash = &pending.first().expect("a pending approval").payload_hash;
        let yes = Decision { approved: true, comment: String::new() };
        rt.approve(run, "go", hash, yes).await.expect("approve");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_fiber_leaves_memory_after_hibernate_after_and_a_decision_brings_it_back_once() {
    let went_on = Arc::new(AtomicUsize::new(0));
    let rt = runtime(RuntimeConfig::default(), &went_on).await;
    let run = rt.start::<Asker>("a", &()).await.expect("start").run_id;
    rt.advance(Duration::from_secs(9)).await.expect("advance");
    assert!(rt.is_live(&run).await, "a fiber that waited less than hibernate_after keeps its future");
    assert_eq!(rt.metrics().parks, 0);
    rt.advance(Duration::from_secs(2)).await.expect("advance");
    assert!(!rt.is_live(&run).await, "a fiber idle on its wait for 10 s is parked");
    let m = rt.metrics();
    assert_eq!((m.parks, m.evictions), (1, 0));
    assert_eq!(rt.status(&run).expect("status"), RunStatus::WaitingApproval { approval_id: "go".into() });

    approve_all(&rt, std::slice::from_ref(&run)).await;
    rt.advance(Duration::ZERO).await.expect("advance");
    assert!(matches!(rt.status(&run).expect("status"), RunStatus::Completed { .. }));
    assert_eq!(went_on.load(Ordering::SeqCst), 1, "the decision let it go on once");
    assert_eq!(rt.metrics().recoveries, 1, "re-entered from its journal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_waiting_in_memory_the_longest_waiting_fibers_are_parked_at_once() {
    let went_on = Arc::new(AtomicUsize::new(0));
    let config = RuntimeConfig { waiting_in_memory: 3, ..RuntimeConfig::default() };
    let rt = runtime(config, &went_on).await;
    let mut runs = Vec::new();
    for i in 0..10 {
        runs.push(rt.start::<Asker>(&format!("r{i}"), &()).await.expect("start").run_id);
        rt.advance(Duration::from_millis(10)).await.expect("advance");
    }
    rt.advance(Duration::ZERO).await.expect("advance");
    let mut live = Vec::new();
    for run in &runs {
        live.push(rt.is_live(run).await);
    }
    // Well within hibernate_after: only the bound parked them, the first to wait first.
    assert_eq!(live, [vec![false; 7], vec![true; 3]].concat(), "the three that waited last are live");
    assert_eq!(rt.metrics().parks, 7);

    approve_all(&rt, &runs).await;
    rt.advance(Duration::ZERO).await.expect("advance");
    for run in &runs {
        assert!(matches!(rt.status(run).expect("status"), RunStatus::Completed { .. }), "{run}");
    }
    assert_eq!(went_on.load(Ordering::SeqCst), 10, "each run went on once");
    assert_eq!(rt.metrics().recoveries, 7, "the parked ones were re-entered; the live ones went on in place");
    assert!(rt.check_liveness().expect("liveness").is_empty());
}

#[test]
fn waiting_in_memory_is_read_from_the_config() {
    let config = RuntimeConfig::from_json(r#"{"waiting_in_memory": 50}"#).expect("config");
    assert_eq!(config.waiting_in_memory, 50);
    assert_eq!(RuntimeConfig::default().waiting_in_memory, 10_000);
}
