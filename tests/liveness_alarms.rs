//! No run left behind by its alarms (§3.6, §3.7, §8): alarm times that cannot wrap, periods
//! kept as set, and one runtime's failing alarms never slowing another's.

use durafiber_runtime::Timestamp;
use std::{
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use durafiber_runtime::{
    Agent, AgentError, AlarmEvent, AlarmSpec, Ctx, Runtime, RuntimeError, clock::VirtualClock,
};
use durafiber_store::{SimBackend, Store, StoreConfig};

const EPOCH_MS: u64 = 1_000_000_000;

fn sim_store(sim: &SimBackend) -> Store {
    Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store")
}

/// Counts deliveries of its alarms.
struct Ticker {
    ticks: Arc<AtomicU32>,
}

impl Agent for Ticker {
    const KIND: &'static str = "ticker";
    type Input = ();
    type Stash = ();
    type Output = ();
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<(), AgentError> {
        ctx.cancelled().await;
        Ok(())
    }

    async fn on_alarm(&self, _: &mut Ctx<Self>, _: AlarmEvent) -> Result<(), AgentError> {
        self.ticks.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Issue 10, point 8: alarm times used to wrap (a huge delay fired at once; a huge period
/// every second), and periods under a second fired at 1 Hz.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alarm_times_never_wrap_and_short_periods_keep_their_period() {
    let ticks = Arc::new(AtomicU32::new(0));
    // The system clock: the driver's own wake-ups are what is under test.
    let rt = Runtime::builder(sim_store(&SimBackend::new()))
        .agent(Ticker { ticks: ticks.clone() })
        .open()
        .await
        .expect("runtime");
    let run = rt.start::<Ticker>("t", &()).await.expect("start").run_id;
    let refused = |r: Result<(), RuntimeError>| matches!(r, Err(RuntimeError::InvalidInput(_)));
    let huge = Duration::from_millis(u64::MAX);
    assert!(refused(rt.set_alarm(&run, "late", AlarmSpec::after(huge, &()).expect("spec")).await));
    assert!(refused(rt.set_alarm(&run, "slow", AlarmSpec::every(huge, &()).expect("spec")).await));
    assert!(refused(rt.set_alarm(&run, "zero", AlarmSpec::every(Duration::ZERO, &()).expect("spec")).await));
    // Below the shortest period, refused with the limit named.
    let too_fast = AlarmSpec::every(Duration::from_millis(1), &()).expect("spec");
    match rt.set_alarm(&run, "too-fast", too_fast).await {
        Err(RuntimeError::InvalidInput(why)) => assert!(why.contains("ALARM_PERIOD_MIN"), "{why}"),
        other => panic!("a 1 ms period was not refused: {other:?}"),
    }
    assert!(refused(
        rt.set_alarm(&run, "far", AlarmSpec::at(Timestamp::from_millis(u64::MAX), &()).expect("spec")).await
    ));
    assert!(rt.alarms(&run).expect("alarms").is_empty(), "nothing refused was stored");

    let every = AlarmSpec::every(Duration::from_millis(100), &()).expect("spec");
    rt.set_alarm(&run, "fast", every).await.expect("set");
    // Eight ticks take 0.8 s at the period and at least 7 s at 1 Hz; 6 s leaves room for a
    // loaded machine without letting the old behaviour pass.
    let deadline = std::time::Instant::now() + Duration::from_secs(6);
    while ticks.load(Ordering::SeqCst) < 8 {
        assert!(std::time::Instant::now() < deadline, "a 100 ms period fired {ticks:?} times in 6 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let record = rt.alarms(&run).expect("alarms").into_iter().find(|a| a.name == "fast").expect("fast");
    assert_eq!(record.every_ms, Some(100));
    rt.shutdown().await;
}

/// Issue 10, point 5: the runtime's own alarm failures were counted in a process-wide static,
/// so one runtime's broken store made another's alarms back off up to 1024 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_runtimes_alarm_failures_do_not_slow_another_runtime() {
    let ticks = Arc::new(AtomicU32::new(0));
    let open = |sim: &SimBackend, ticks: &Arc<AtomicU32>| {
        let (sim, ticks) = (sim.clone(), ticks.clone());
        async move {
            Runtime::builder(sim_store(&sim))
                .virtual_clock(VirtualClock::new(Timestamp::from_millis(EPOCH_MS)))
                .agent(Ticker { ticks })
                .open()
                .await
                .expect("runtime")
        }
    };
    let (broken_sim, healthy_sim) = (SimBackend::new(), SimBackend::new());
    let broken = open(&broken_sim, &Arc::new(AtomicU32::new(0))).await;
    let healthy = open(&healthy_sim, &ticks).await;
    for rt in [&broken, &healthy] {
        let run = rt.start::<Ticker>("t", &()).await.expect("start").run_id;
        rt.set_alarm(&run, "a", AlarmSpec::after(Duration::from_secs(1), &()).expect("spec"))
            .await
            .expect("set");
    }
    // The broken runtime fails delivery after delivery for an hour: its backoff grows.
    broken_sim.crash();
    let _ = broken.advance(Duration::from_secs(3600)).await;
    // The healthy runtime's store blips once; its own backoff starts at one second.
    healthy_sim.crash();
    let _ = healthy.advance(Duration::from_secs(1)).await;
    healthy_sim.revive();
    healthy.advance(Duration::from_secs(5)).await.expect("advance");
    assert_eq!(ticks.load(Ordering::SeqCst), 1, "delivered within seconds of the store's return");
}
