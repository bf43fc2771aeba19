//! Durability modes and group commit at the runtime's level (§3.2, §3.3).
//!
//! - `async`: a stash returns before it is durable; a crash loses the stashes no barrier
//!   covered yet, and nothing older — a later sync boundary (an effect) covers them.
//! - `exit`: stashes stay in memory until the fiber waits or ends, then are written with
//!   that boundary.
//! - group commit: fifty runs stashing at once share barriers — fewer barriers than
//!   boundaries, counted by the store's writer on a real sled directory.

use durafiber_runtime::Timestamp;
use std::{sync::Arc, time::Duration};

use durafiber_demo::agents::{Steps, StepsInput};
use durafiber_runtime::{
    Agent, AgentError, Ctx, Decision, DurabilityMode, Recovered, RunStatus, Runtime, RuntimeConfig,
    clock::VirtualClock,
};
use durafiber_store::{SimBackend, Store, StoreConfig};

const EPOCH_MS: u64 = 1_000_000_000;

/// `async` mode: stash 1, an effect (always sync), stash 2, then wait.
/// `exit` mode: stash 1, stash 2, a wait in memory, then an approval.
struct Modes;

impl Agent for Modes {
    const KIND: &'static str = "modes";
    type Input = ();
    type Stash = u32;
    type Output = u32;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<u32, AgentError> {
        ctx.stash("one", &1).await?;
        ctx.effect("note", 1, |_key, n| async move { Ok::<u32, String>(n) }).await?;
        ctx.stash("two", &2).await?;
        ctx.sleep_in_memory(Duration::from_secs(10)).await;
        ctx.request_approval("go", &"finish?").await?;
        Ok(2)
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, r: Recovered<Self>) -> Result<u32, AgentError> {
        ctx.cancelled().await;
        Ok(r.stash.unwrap_or(0))
    }
}

fn runtime_config(durability: DurabilityMode) -> RuntimeConfig {
    RuntimeConfig { durability, ..Default::default() }
}

async fn open(sim: &SimBackend, clock: &VirtualClock, durability: DurabilityMode) -> Runtime {
    // No timed flush: in `async` mode only a sync boundary makes a stash durable.
    let store_config = StoreConfig { flush_every: Duration::from_secs(3600), ..Default::default() };
    let store = Store::with_backend(Arc::new(sim.clone()), store_config).expect("store");
    Runtime::builder(store)
        .virtual_clock(clock.clone())
        .config(runtime_config(durability))
        .agent(Modes)
        .open()
        .await
        .expect("runtime")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_stash_is_lost_in_a_crash_unless_a_later_sync_boundary_covered_it() {
    let (sim, clock) = (SimBackend::new(), VirtualClock::new(Timestamp::from_millis(EPOCH_MS)));
    let rt = open(&sim, &clock, DurabilityMode::Async).await;
    let run = rt.start::<Modes>("a", &()).await.expect("start").run_id;
    rt.advance(Duration::from_secs(1)).await.expect("advance");
    assert_eq!(rt.inspect(&run).expect("inspect").stash.map(|s| s.step), Some("two".into()), "visible");
    sim.crash();
    rt.shutdown().await;
    sim.revive();
    let rt = open(&sim, &clock, DurabilityMode::Async).await;
    let stash = rt.inspect(&run).expect("inspect").stash.expect("stash one was covered by the effect");
    assert_eq!((stash.step.as_str(), stash.seq), ("one", 1), "stash two was lost, stash one was not");
    assert_eq!(rt.status(&run).expect("status"), RunStatus::Running, "sync boundaries survived");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exit_mode_stash_is_written_only_when_the_fiber_waits() {
    let (sim, clock) = (SimBackend::new(), VirtualClock::new(Timestamp::from_millis(EPOCH_MS)));
    let rt = open(&sim, &clock, DurabilityMode::Exit).await;
    let run = rt.start::<Modes>("e", &()).await.expect("start").run_id;
    rt.advance(Duration::from_secs(1)).await.expect("advance");
    assert!(rt.inspect(&run).expect("inspect").stash.is_none(), "exit mode keeps stashes in memory");
    rt.advance(Duration::from_secs(10)).await.expect("advance");
    let stash = rt.inspect(&run).expect("inspect").stash.expect("written with the pause");
    assert_eq!((stash.step.as_str(), stash.seq), ("two", 2));
    let pending = rt.pending_approvals(Some(&run)).expect("pending");
    let decision = Decision { approved: true, comment: String::new() };
    rt.approve(&run, "go", &pending[0].payload_hash, decision).await.expect("approve");
    assert_eq!(rt.wait(&run).await.expect("wait"), RunStatus::Completed { output_json: "2".into() });
    assert_eq!(rt.wait_output::<Modes>(&run).await.expect("wait"), Ok(2), "the output, typed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_runs_stashing_at_once_share_barriers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_dir(dir.path(), StoreConfig::default()).expect("store");
    let rt = Runtime::builder(store.clone()).agent(Steps::default()).open().await.expect("runtime");
    let before = store.writer_stats().barriers.load(std::sync::atomic::Ordering::Relaxed);
    // All at once, and each stash 20 ms after the last returned: the runs' stashes come
    // together, round after round. Started one after another and stashing without a pause,
    // each run would trail the one before by a barrier, and a fast disk would give most
    // stashes a barrier of their own.
    let runs = futures::future::join_all((0..50).map(|i| {
        let rt = rt.clone();
        async move {
            let input = StepsInput { steps: 10, pause_ms: 20 };
            rt.start::<Steps>(&format!("g{i}"), &input).await.expect("start").run_id
        }
    }))
    .await;
    for run in &runs {
        assert!(matches!(rt.wait(run).await.expect("wait"), RunStatus::Completed { .. }));
    }
    let barriers = store.writer_stats().barriers.load(std::sync::atomic::Ordering::Relaxed) - before;
    // Each run: accept, registration, ten stashes, end — 13 sync boundaries.
    let boundaries = 50 * 13;
    assert!(barriers * 2 < boundaries, "{barriers} barriers for {boundaries} boundaries: no group commit");
    rt.shutdown().await;
}

/// The runtime's `flush_every` holds for a store its user opened with another setting: an
/// async write is covered by a barrier within the runtime's window, not the store's hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtimes_flush_every_holds_for_a_store_opened_with_another() {
    use durafiber_store::{Batch, Durability, tables};
    let sim = SimBackend::new();
    let hour = StoreConfig { flush_every: Duration::from_secs(3600), ..StoreConfig::default() };
    let store = Store::with_backend(Arc::new(sim.clone()), hour).expect("store");
    let config = RuntimeConfig { flush_every: Duration::from_millis(5), ..RuntimeConfig::default() };
    let rt =
        Runtime::builder(store.clone()).config(config).agent(Steps::default()).open().await.expect("open");
    let barriers = || store.writer_stats().barriers.load(std::sync::atomic::Ordering::SeqCst);
    let before = barriers();
    let mut batch = Batch::new();
    batch.put(tables::keys::storage("run_x", "k"), &"v".to_string()).expect("put");
    store.commit(batch, Durability::Async).await.expect("async write");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while barriers() == before {
        assert!(std::time::Instant::now() < deadline, "no barrier within 10 s: flush_every not applied");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    sim.crash();
    rt.shutdown().await;
    sim.revive();
    let store = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("reopen");
    let survived: Option<String> = store.get(&tables::keys::storage("run_x", "k")).expect("read");
    assert_eq!(survived.as_deref(), Some("v"), "covered by the barrier before the crash");
}
