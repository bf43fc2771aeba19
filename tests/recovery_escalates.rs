//! A recovery hook that panics every time is retried with backoff and then escalated (§3.6),
//! while the other runs finish. On the virtual clock, so the 1 s, 2 s, 4 s, 8 s backoffs take
//! no real time.

use durafiber_runtime::Timestamp;
use std::time::Duration;

use durafiber_demo::agents::{Steps, StepsInput};
use durafiber_runtime::{Agent, AgentError, Ctx, Recovered, RunStatus, Runtime, clock::VirtualClock};
use durafiber_store::{SimBackend, Store, StoreConfig};

struct Fragile;

impl Agent for Fragile {
    const KIND: &'static str = "fragile";
    type Input = ();
    type Stash = u32;
    type Output = ();
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<(), AgentError> {
        ctx.stash("started", &1).await?;
        ctx.sleep_in_memory(Duration::from_secs(3600)).await;
        Ok(())
    }

    async fn on_fiber_recovered(&self, _: &mut Ctx<Self>, _: Recovered<Self>) -> Result<(), AgentError> {
        panic!("this hook always panics");
    }
}

/// An agent that does not implement the hook: the default escalates, it never guesses.
struct NoHook;

impl Agent for NoHook {
    const KIND: &'static str = "no_hook";
    type Input = ();
    type Stash = ();
    type Output = ();
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<(), AgentError> {
        ctx.sleep_in_memory(Duration::from_secs(3600)).await;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_that_always_panics_is_escalated_after_max_recover_attempts_and_others_finish() {
    durafiber_testkit::init_tracing();
    let clock = VirtualClock::new(Timestamp::from_millis(1_000_000));
    let store =
        Store::with_backend(std::sync::Arc::new(SimBackend::new()), StoreConfig::default()).expect("store");
    let rt = Runtime::builder(store)
        .virtual_clock(clock)
        .agent(Fragile)
        .agent(NoHook)
        .agent(Steps::default())
        .open()
        .await
        .expect("runtime");
    let fragile = rt.start::<Fragile>("f", &()).await.expect("start");
    let no_hook = rt.start::<NoHook>("n", &()).await.expect("start");
    let steady = rt.start::<Steps>("s", &StepsInput { steps: 30, pause_ms: 0 }).await.expect("start");
    rt.wait_for(&fragile.run_id, |s| *s == RunStatus::Running).await.expect("running");
    rt.wait_for(&no_hook.run_id, |s| *s == RunStatus::Running).await.expect("running");
    rt.evict(&fragile.run_id).await;
    rt.evict(&no_hook.run_id).await;
    for _ in 0..20 {
        rt.advance(Duration::from_secs(30)).await.expect("advance");
        if rt.status(&fragile.run_id).expect("status").is_terminal() {
            break;
        }
    }
    match rt.wait(&fragile.run_id).await.expect("wait") {
        RunStatus::Escalated { reason } => {
            assert!(
                reason.starts_with("recovery hook failed 5 times: panic: this hook always panics"),
                "{reason}"
            );
        }
        other => panic!("expected Escalated, got {other:?}"),
    }
    let recoveries =
        rt.events().iter().filter(|e| e.run_id == fragile.run_id && e.kind == "recovered").count();
    assert_eq!(recoveries, 5, "five attempts, the default max_recover_attempts");
    match rt.wait(&no_hook.run_id).await.expect("wait") {
        RunStatus::Escalated { reason } => assert!(reason.contains("no recovery hook"), "{reason}"),
        other => panic!("expected Escalated, got {other:?}"),
    }
    assert!(matches!(rt.wait(&steady.run_id).await.expect("wait"), RunStatus::Completed { .. }));
    assert_eq!(rt.metrics().escalations, 2);
}

/// Waits two days in memory, holding its keep-alive.
struct Patient;

impl Agent for Patient {
    const KIND: &'static str = "patient";
    type Input = ();
    type Stash = ();
    type Output = ();
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<(), AgentError> {
        ctx.sleep_in_memory(Duration::from_secs(48 * 3600)).await;
        Ok(())
    }

    async fn on_fiber_recovered(&self, _: &mut Ctx<Self>, _: Recovered<Self>) -> Result<(), AgentError> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_found_interrupted_after_max_age_is_escalated_not_resumed() {
    let store =
        Store::with_backend(std::sync::Arc::new(SimBackend::new()), StoreConfig::default()).expect("store");
    let rt = Runtime::builder(store)
        .virtual_clock(VirtualClock::new(Timestamp::from_millis(1_000_000)))
        .agent(Patient)
        .open()
        .await
        .expect("runtime");
    let run = rt.start::<Patient>("old", &()).await.expect("start").run_id;
    // The fiber waits, holding its keep-alive, while a day and an hour pass.
    for _ in 0..25 {
        rt.advance(Duration::from_secs(3600)).await.expect("advance");
    }
    assert_eq!(rt.status(&run).expect("status"), RunStatus::Running);
    rt.evict(&run).await;
    rt.advance(Duration::ZERO).await.expect("advance");
    assert_eq!(rt.status(&run).expect("status"), RunStatus::Escalated { reason: "max_age".into() });
    assert!(!rt.events().iter().any(|e| e.run_id == run && e.kind == "recovered"), "never resumed");
}
