//! Durable external events: an event sent before the wait is buffered, one sent during it is
//! delivered in place, one sent to a run whose fiber was evicted re-enters the run; the same
//! idempotency key twice is delivered once; a timeout ends the wait even without a fiber in
//! memory. On the crash-simulating store, crashed after every write of the flow, the event is
//! seen exactly once and the run finishes under its id.

use durafiber_runtime::Timestamp;
use std::{sync::Arc, time::Duration};

use durafiber_runtime::{
    Agent, AgentError, Ctx, Recovered, RunStatus, Runtime, RuntimeError, SendOutcome, clock::VirtualClock,
};
use durafiber_store::tables::keys;
use durafiber_store::{SimBackend, SimCrash, Store, StoreConfig};

const EPOCH_MS: u64 = 1_000_000_000;

/// Waits for event `go` (with the timeout its input gives, in seconds) and returns it. With
/// `pause` it first sleeps a durable second, so that an event sent right after the start
/// arrives before the wait whatever the scheduler does.
struct Waiter;

/// (timeout in seconds, pause a second before the wait)
type Plan = (Option<u64>, bool);

const NOW: Plan = (None, false);
const PAUSED: Plan = (None, true);

impl Waiter {
    async fn flow(
        &self,
        ctx: &mut Ctx<Self>,
        (timeout_s, pause): Plan,
    ) -> Result<Option<String>, AgentError> {
        ctx.stash("before", &0).await?;
        if pause {
            ctx.sleep_for("pause", Duration::from_secs(1)).await?;
        }
        let got: Option<String> = ctx.wait_for_event("go", timeout_s.map(Duration::from_secs)).await?;
        ctx.stash("after", &1).await?;
        Ok(got)
    }
}

impl Agent for Waiter {
    const KIND: &'static str = "waiter";
    type Input = Plan;
    type Stash = u32;
    type Output = Option<String>;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, plan: Plan) -> Result<Option<String>, AgentError> {
        self.flow(ctx, plan).await
    }

    async fn on_fiber_recovered(
        &self,
        ctx: &mut Ctx<Self>,
        r: Recovered<Self>,
    ) -> Result<Option<String>, AgentError> {
        self.flow(ctx, r.input).await
    }
}

async fn open(sim: &SimBackend, clock: &VirtualClock) -> Runtime {
    let store = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store");
    Runtime::builder(store).virtual_clock(clock.clone()).agent(Waiter).open().await.expect("runtime")
}

async fn runtime() -> Runtime {
    open(&SimBackend::new(), &VirtualClock::new(Timestamp::from_millis(EPOCH_MS))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_is_buffered_delivered_in_place_or_re_enters_an_evicted_run() {
    let rt = runtime().await;
    // Sent before anyone waits: buffered, then taken by the wait.
    let early = rt.start::<Waiter>("early", &PAUSED).await.expect("start").run_id;
    assert_eq!(rt.send_event(&early, "go", &"first", None).await.expect("send"), SendOutcome::Buffered);
    // A live wait: delivered in place.
    let live = rt.start::<Waiter>("live", &NOW).await.expect("start").run_id;
    rt.advance(Duration::ZERO).await.expect("advance");
    assert_eq!(rt.status(&live).expect("status"), RunStatus::WaitingEvent { name: "go".into() });
    assert_eq!(rt.send_event(&live, "go", &"second", None).await.expect("send"), SendOutcome::Delivered);
    // An evicted wait: the event re-enters the run.
    let evicted = rt.start::<Waiter>("evicted", &NOW).await.expect("start").run_id;
    rt.advance(Duration::ZERO).await.expect("advance");
    rt.evict(&evicted).await;
    rt.advance(Duration::from_secs(1)).await.expect("advance");
    assert!(!rt.is_live(&evicted).await, "a waiting run is not re-entered until its event comes");
    assert_eq!(rt.send_event(&evicted, "go", &"third", None).await.expect("send"), SendOutcome::Delivered);
    rt.advance(Duration::ZERO).await.expect("advance");
    for (run, want) in [(&early, "first"), (&live, "second"), (&evicted, "third")] {
        assert_eq!(
            rt.wait(run).await.expect("wait"),
            RunStatus::Completed { output_json: format!("\"{want}\"") }
        );
    }
    assert!(matches!(
        rt.send_event(&early, "go", &"late", None).await,
        Err(RuntimeError::RunFinished { .. })
    ));
    assert!(matches!(
        rt.send_event(&"run_nope".into(), "go", &1, None).await,
        Err(RuntimeError::UnknownRun { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_twice_is_delivered_once() {
    let rt = runtime().await;
    let run = rt.start::<Waiter>("k", &PAUSED).await.expect("start").run_id;
    assert_eq!(rt.send_event(&run, "go", &"once", Some("k1")).await.expect("send"), SendOutcome::Buffered);
    assert_eq!(rt.send_event(&run, "go", &"once", Some("k1")).await.expect("send"), SendOutcome::Duplicate);
    rt.advance(Duration::from_secs(1)).await.expect("advance");
    assert_eq!(rt.output::<Option<String>>(&run).expect("output"), Some(Some("once".into())));
    let leftover = rt.store().keys_and_sizes(&keys::EVENTS.all(), 10).expect("scan");
    assert!(leftover.is_empty(), "the one event was consumed, none left: {leftover:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_ends_the_wait_with_or_without_a_fiber_in_memory() {
    let rt = runtime().await;
    let live = rt.start::<Waiter>("live", &(Some(3600), false)).await.expect("start").run_id;
    let evicted = rt.start::<Waiter>("evicted", &(Some(3600), false)).await.expect("start").run_id;
    rt.advance(Duration::ZERO).await.expect("advance");
    rt.evict(&evicted).await;
    rt.advance(Duration::from_secs(3599)).await.expect("advance");
    assert_eq!(rt.status(&live).expect("status"), RunStatus::WaitingEvent { name: "go".into() });
    rt.advance(Duration::from_secs(2)).await.expect("advance");
    for run in [&live, &evicted] {
        assert_eq!(rt.output::<Option<String>>(run).expect("output"), Some(None), "{run} timed out");
    }
}

/// Runs the flow with a crash armed at `point`; false when the flow ended before it.
async fn crash_once(point: SimCrash) -> bool {
    let (sim, clock) = (SimBackend::new(), VirtualClock::new(Timestamp::from_millis(EPOCH_MS)));
    sim.crash_at(point);
    let rt = open(&sim, &clock).await;
    let started = rt.start::<Waiter>("c", &NOW).await;
    let mut sent = false;
    if let Ok(run) = &started {
        sent = rt.send_event(&run.run_id, "go", &"payload", Some("only")).await.is_ok();
        let _ = rt.advance(Duration::ZERO).await;
    }
    let crashed = sim.is_crashed();
    rt.shutdown().await;
    sim.revive();
    let rt = open(&sim, &clock).await;
    // The caller retries what it was not sure of, with the same keys.
    let run = rt.start::<Waiter>("c", &NOW).await.expect("start after the crash").run_id;
    if !sent {
        // A send that failed may still have been recorded (its barrier finished before the
        // crash): then the repeat is a `Duplicate`, and either way it is delivered once.
        rt.send_event(&run, "go", &"payload", Some("only")).await.expect("send after the crash");
    }
    rt.advance(Duration::ZERO).await.expect("advance");
    assert_eq!(rt.output::<Option<String>>(&run).expect("output"), Some(Some("payload".into())), "{point:?}");
    assert!(
        rt.store().keys_and_sizes(&keys::EVENTS.all(), 10).expect("scan").is_empty(),
        "{point:?}: consumed once"
    );
    rt.shutdown().await;
    crashed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_crashed_at_every_write_is_seen_exactly_once() {
    let mut reached = 0;
    for n in 1..=30 {
        let before = crash_once(SimCrash::AfterApply(n)).await;
        let after = crash_once(SimCrash::AfterBarrier(n)).await;
        if !before && !after {
            break;
        }
        reached += 1;
    }
    // accept, registration, stash, wait, the send, the consume, stash, end.
    assert!(reached >= 6, "only {reached} crash points were reached");
}

/// §2.3: a run parked on an event wait is not executing: a cancellation ends it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_waiting_for_an_event_is_cancelled_at_once() {
    let rt = runtime().await;
    let run = rt.start::<Waiter>("c", &NOW).await.expect("start").run_id;
    rt.advance(Duration::ZERO).await.expect("advance");
    let status = rt.cancel(&run, "not needed").await.expect("cancel");
    assert_eq!(status, RunStatus::Cancelled { reason: "not needed".into() });
    rt.advance(Duration::from_secs(1)).await.expect("advance");
    assert!(matches!(rt.send_event(&run, "go", &1, None).await, Err(RuntimeError::RunFinished { .. })));
}

/// A retried send is answered as a repeat even after the run consumed it and finished: the
/// caller learns it arrived, not that the run is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_send_after_the_run_finished_is_still_a_duplicate() {
    let rt = runtime().await;
    let run = rt.start::<Waiter>("done", &NOW).await.expect("start").run_id;
    rt.advance(Duration::ZERO).await.expect("advance");
    rt.send_event(&run, "go", &"payload", Some("k1")).await.expect("send");
    rt.advance(Duration::from_secs(1)).await.expect("advance");
    assert!(rt.status(&run).expect("status").is_terminal());
    assert_eq!(
        rt.send_event(&run, "go", &"payload", Some("k1")).await.expect("repeat"),
        SendOutcome::Duplicate
    );
    assert!(matches!(
        rt.send_event(&run, "go", &"x", Some("k2")).await,
        Err(RuntimeError::RunFinished { .. })
    ));
}
