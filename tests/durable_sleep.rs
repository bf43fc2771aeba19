//! Durable sleep (§2.4): a run that sleeps three days is `Waiting{alarm}`, is evicted like
//! any waiting run, survives a crash of the whole process, and wakes once — at the time first
//! recorded, never a fresh full duration after a recovery.

use durafiber_runtime::Timestamp;
use std::{sync::Arc, time::Duration};

use durafiber_runtime::{
    Agent, AgentError, Ctx, Recovered, RunStatus, Runtime,
    clock::{Clock, VirtualClock},
};
use durafiber_store::{SimBackend, Store, StoreConfig};

const EPOCH_MS: u64 = 1_000_000_000;
const THREE_DAYS: Duration = Duration::from_secs(3 * 24 * 3600);

/// Stashes, sleeps three days durably, and returns the time it woke.
struct Napper;

impl Napper {
    async fn flow(&self, ctx: &mut Ctx<Self>) -> Result<u64, AgentError> {
        ctx.stash("before", &0).await?;
        ctx.sleep_for("nap", THREE_DAYS).await?;
        Ok(ctx.now().as_millis())
    }
}

impl Agent for Napper {
    const KIND: &'static str = "napper";
    type Input = ();
    type Stash = u32;
    type Output = u64;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<u64, AgentError> {
        self.flow(ctx).await
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, _: Recovered<Self>) -> Result<u64, AgentError> {
        self.flow(ctx).await
    }
}

async fn open(sim: &SimBackend, clock: &VirtualClock) -> Runtime {
    let store = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store");
    Runtime::builder(store).virtual_clock(clock.clone()).agent(Napper).open().await.expect("runtime")
}

fn wake_ms() -> u64 {
    EPOCH_MS + THREE_DAYS.as_millis() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_run_waits_on_an_alarm_is_evicted_and_wakes_once_at_its_time() {
    let (sim, clock) = (SimBackend::new(), VirtualClock::new(Timestamp::from_millis(EPOCH_MS)));
    let rt = open(&sim, &clock).await;
    let run = rt.start::<Napper>("n", &()).await.expect("start").run_id;
    rt.advance(Duration::from_secs(1)).await.expect("advance");
    assert_eq!(rt.status(&run).expect("status"), RunStatus::WaitingAlarm { name: "nap".into() });
    let alarms = rt.alarms(&run).expect("alarms");
    assert_eq!((alarms[0].name.as_str(), alarms[0].due_at_ms.as_millis()), ("sleep:nap", wake_ms()));
    rt.advance(Duration::from_secs(3600)).await.expect("advance");
    let m = rt.metrics();
    assert_eq!((m.parks, m.evictions), (1, 0), "a sleeping fiber leaves memory once idle, parked");
    assert!(!rt.is_live(&run).await);
    rt.advance(THREE_DAYS).await.expect("advance");
    let ev: Vec<_> = rt
        .events()
        .into_iter()
        .filter(|e| e.run_id == run)
        .map(|e| format!("{} {} {}", e.at_ms, e.kind, e.detail))
        .collect();
    assert_eq!(
        rt.output::<u64>(&run).expect("output"),
        Some(wake_ms()),
        "woke at the recorded time: {:?} {ev:#?}",
        rt.status(&run)
    );
    assert_eq!(rt.events().iter().filter(|e| e.run_id == run && e.kind == "woke").count(), 1);
    assert!(rt.alarms(&run).expect("alarms").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleep_survives_a_crash_and_keeps_its_original_wake_time() {
    let (sim, clock) = (SimBackend::new(), VirtualClock::new(Timestamp::from_millis(EPOCH_MS)));
    let rt = open(&sim, &clock).await;
    let run = rt.start::<Napper>("n", &()).await.expect("start").run_id;
    rt.advance(Duration::from_secs(24 * 3600)).await.expect("advance");
    sim.crash();
    rt.shutdown().await;
    sim.revive();
    // A day later the process comes back: one day of the three is left, not three.
    let rt = open(&sim, &clock).await;
    rt.advance(Duration::from_secs(24 * 3600)).await.expect("advance");
    assert_eq!(rt.status(&run).expect("status"), RunStatus::WaitingAlarm { name: "nap".into() });
    rt.advance(Duration::from_secs(24 * 3600)).await.expect("advance");
    assert_eq!(rt.output::<u64>(&run).expect("output"), Some(wake_ms()));
    // Down past the wake time: the sleep returns at once after the restart.
    let run2 = rt.start::<Napper>("m", &()).await.expect("start").run_id;
    rt.advance(Duration::from_secs(60)).await.expect("advance");
    sim.crash();
    rt.shutdown().await;
    // Four days pass while the process is down. The old runtime object is still here: what
    // of it its shutdown left in flight must write nothing, as a dead process writes nothing.
    sim.revive();
    clock.set(clock.now().saturating_add(Duration::from_secs(4 * 24 * 3_600)));
    let rt = open(&sim, &clock).await;
    rt.advance(Duration::ZERO).await.expect("advance");
    assert_eq!(rt.output::<u64>(&run2).expect("output"), Some(clock.now().as_millis()));
}

/// Reports, from its alarm handler, the stash its fiber last committed.
struct Reader {
    seen: Arc<std::sync::Mutex<Vec<(u32, String, u64)>>>,
}

impl Agent for Reader {
    const KIND: &'static str = "reader";
    type Input = ();
    type Stash = u32;
    type Output = ();
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<(), AgentError> {
        assert!(ctx.last_stash()?.is_none(), "no stash before the first");
        ctx.stash("one", &1).await?;
        ctx.stash("two", &2).await?;
        let spec = durafiber_runtime::AlarmSpec::after(Duration::from_secs(1), &())?;
        ctx.set_alarm("look", spec).await?;
        // Shorter than `hibernate_after`: the fiber stays in memory and ends in place.
        ctx.sleep_for("wait", Duration::from_secs(5)).await?;
        Ok(())
    }

    async fn on_alarm(
        &self,
        ctx: &mut Ctx<Self>,
        _: durafiber_runtime::AlarmEvent,
    ) -> Result<(), AgentError> {
        if let Some(last) = ctx.last_stash()? {
            self.seen.lock().expect("seen").push(last);
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_reads_the_stash_the_fiber_last_committed() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let store = Store::with_backend(Arc::new(SimBackend::new()), StoreConfig::default()).expect("store");
    let rt = Runtime::builder(store)
        .virtual_clock(VirtualClock::new(Timestamp::from_millis(EPOCH_MS)))
        .agent(Reader { seen: seen.clone() })
        .open()
        .await
        .expect("runtime");
    let run = rt.start::<Reader>("r", &()).await.expect("start").run_id;
    rt.advance(Duration::from_secs(6)).await.expect("advance");
    assert_eq!(*seen.lock().expect("seen"), vec![(2, "two".to_string(), 2)]);
    assert!(matches!(rt.status(&run).expect("status"), RunStatus::Completed { .. }));
}
