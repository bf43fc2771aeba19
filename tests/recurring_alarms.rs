//! Periodic and cron alarms keep their schedule (§8, extended): cron expressions in a time
//! zone fire at local time and list their next due time; a failed occurrence is retried by
//! itself while the next one fires on time; an occurrence whose retries run out is
//! dead-lettered alone and the run goes on, unless `on_alarm_exhausted` says otherwise; and
//! all of it holds when the crash-simulating store crashes at random barriers.

use durafiber_runtime::Timestamp;
use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
    time::Duration,
};

use durafiber_demo::sim::SIM_EPOCH_MS as T0;
use durafiber_runtime::{
    Agent, AgentError, AlarmEvent, AlarmSpec, Ctx, ExhaustedAction, Recovered, RunStatus, Runtime,
    clock::{Clock, VirtualClock},
    rng::SeededRng,
};
use durafiber_store::{SimBackend, SimCrash, Store, StoreConfig};
use serde::{Deserialize, Serialize};

const SECOND: u64 = 1_000;
const HOUR: u64 = 3_600 * SECOND;
const DAY: u64 = 24 * HOUR;

/// One delivery as the handler saw it.
#[derive(Debug, Clone, PartialEq)]
struct Delivery {
    at_ms: u64,
    scheduled_ms: u64,
    retry_count: u32,
    ok: bool,
}

type Log = Arc<Mutex<Vec<Delivery>>>;

#[derive(Debug, Clone, Serialize, Deserialize)]
enum Schedule {
    Every(u64),
    Cron { expr: String, zone: Option<String> },
}

/// Sets one alarm `tick` and stays open. A delivery fails while `fails(scheduled, retry)`.
/// It keeps the default `on_alarm_exhausted`.
struct Ticker {
    log: Log,
    fails: fn(u64, u32) -> bool,
}

impl Ticker {
    fn new(log: &Log, fails: fn(u64, u32) -> bool) -> Self {
        Ticker { log: log.clone(), fails }
    }
}

fn spec_of(schedule: Schedule) -> Result<AlarmSpec, AgentError> {
    Ok(match schedule {
        Schedule::Every(ms) => AlarmSpec::every(Duration::from_millis(ms), &"tick")?,
        Schedule::Cron { expr, zone: None } => AlarmSpec::cron(&expr, &"tick")?,
        Schedule::Cron { expr, zone: Some(zone) } => AlarmSpec::cron(&expr, &"tick")?.in_time_zone(&zone)?,
    })
}

impl Agent for Ticker {
    const KIND: &'static str = "ticker";
    type Input = Schedule;
    type Stash = ();
    type Output = ();
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, schedule: Schedule) -> Result<(), AgentError> {
        ctx.set_alarm("tick", spec_of(schedule)?).await?;
        ctx.cancelled().await;
        Ok(())
    }

    /// A stash on every re-entry is progress, so that a storm of crashes is no reason to
    /// escalate a run that only waits.
    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, _: Recovered<Self>) -> Result<(), AgentError> {
        ctx.stash("recovered", &()).await?;
        ctx.cancelled().await;
        Ok(())
    }

    async fn on_alarm(&self, ctx: &mut Ctx<Self>, alarm: AlarmEvent) -> Result<(), AgentError> {
        assert!(alarm.recurring, "a periodic or cron alarm says so");
        let ok = !(self.fails)(alarm.scheduled_time_ms.as_millis(), alarm.retry_count);
        let delivery = Delivery {
            at_ms: ctx.now().as_millis(),
            scheduled_ms: alarm.scheduled_time_ms.as_millis(),
            retry_count: alarm.retry_count,
            ok,
        };
        self.log.lock().expect("log").push(delivery);
        if ok { Ok(()) } else { Err(AgentError::fail("the upstream is down")) }
    }
}

/// A ticker whose every delivery fails, and whose exhausted occurrences escalate the run.
struct StrictTicker {
    log: Log,
}

impl Agent for StrictTicker {
    const KIND: &'static str = "strict_ticker";
    type Input = Schedule;
    type Stash = ();
    type Output = ();
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, schedule: Schedule) -> Result<(), AgentError> {
        ctx.set_alarm("tick", spec_of(schedule)?).await?;
        ctx.cancelled().await;
        Ok(())
    }

    async fn on_alarm(&self, ctx: &mut Ctx<Self>, alarm: AlarmEvent) -> Result<(), AgentError> {
        let delivery = Delivery {
            at_ms: ctx.now().as_millis(),
            scheduled_ms: alarm.scheduled_time_ms.as_millis(),
            retry_count: alarm.retry_count,
            ok: false,
        };
        self.log.lock().expect("log").push(delivery);
        Err(AgentError::fail("the upstream is down"))
    }

    fn on_alarm_exhausted(&self, _: &Ctx<Self>, _: &AlarmEvent) -> ExhaustedAction {
        ExhaustedAction::Escalate
    }
}

fn never(_: u64, _: u32) -> bool {
    false
}

async fn open<A: Agent>(sim: &SimBackend, clock: VirtualClock, agent: A) -> Runtime {
    let store = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store");
    Runtime::builder(store).virtual_clock(clock).agent(agent).open().await.expect("runtime")
}

fn deliveries(log: &Log) -> Vec<Delivery> {
    log.lock().expect("log").clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cron_alarm_fires_at_local_time_on_weekdays_and_lists_its_next_time() {
    let log = Log::default();
    let rt =
        open(&SimBackend::new(), VirtualClock::new(Timestamp::from_millis(T0)), Ticker::new(&log, never))
            .await;
    // T0 is Thursday 1 January 2026, midnight UTC; nine in Berlin is eight UTC in winter.
    let schedule = Schedule::Cron { expr: "0 9 * * MON-FRI".into(), zone: Some("Europe/Berlin".into()) };
    let run = rt.start::<Ticker>("standup", &schedule).await.expect("start").run_id;
    rt.advance(Duration::ZERO).await.expect("advance");
    let alarms = rt.alarms(&run).expect("alarms");
    assert_eq!(alarms.len(), 1);
    assert_eq!(alarms[0].due_at_ms, Timestamp::from_millis(T0 + 8 * HOUR), "listed with its next due time");
    let cron = alarms[0].cron.as_ref().expect("a cron alarm lists its schedule");
    assert_eq!((cron.expr.as_str(), cron.time_zone.as_deref()), ("0 9 * * MON-FRI", Some("Europe/Berlin")));

    rt.advance(Duration::from_millis(7 * DAY)).await.expect("advance a week");
    let at: Vec<u64> = deliveries(&log).iter().map(|d| d.at_ms).collect();
    // Thursday, Friday, then Monday to Wednesday: no weekend.
    let expected: Vec<u64> = [0, 1, 4, 5, 6].iter().map(|d| T0 + d * DAY + 8 * HOUR).collect();
    assert_eq!(at, expected);
    assert!(deliveries(&log).iter().all(|d| d.scheduled_ms == d.at_ms && d.retry_count == 0));
    assert_eq!(
        rt.alarms(&run).expect("alarms")[0].due_at_ms,
        Timestamp::from_millis(T0 + 7 * DAY + 8 * HOUR),
        "Thursday's next"
    );
    rt.shutdown().await;
}

/// The first occurrence of a one-minute schedule fails every time.
fn first_minute_fails(scheduled: u64, _: u32) -> bool {
    scheduled == T0 + 60 * SECOND
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_occurrence_is_retried_beside_the_schedule_and_dead_lettered_alone() {
    let log = Log::default();
    let rt = open(
        &SimBackend::new(),
        VirtualClock::new(Timestamp::from_millis(T0)),
        Ticker::new(&log, first_minute_fails),
    )
    .await;
    let run = rt.start::<Ticker>("minutely", &Schedule::Every(60 * SECOND)).await.expect("start").run_id;
    rt.advance(Duration::from_secs(70)).await.expect("advance");
    let alarms = rt.alarms(&run).expect("alarms");
    assert_eq!(
        alarms[0].due_at_ms,
        Timestamp::from_millis(T0 + 120 * SECOND),
        "the schedule went on at once"
    );
    assert_eq!(alarms[0].retrying.len(), 1, "the failed occurrence is retried by itself");
    assert_eq!(alarms[0].retrying[0].scheduled_at_ms, Timestamp::from_millis(T0 + 60 * SECOND));

    rt.advance(Duration::from_secs(530)).await.expect("advance to ten minutes");
    let log = deliveries(&log);
    let on_time: Vec<u64> = log.iter().filter(|d| d.ok).map(|d| d.at_ms).collect();
    let expected: Vec<u64> = (2..=10).map(|m| T0 + m * 60 * SECOND).collect();
    assert_eq!(on_time, expected, "every later minute fired on time, once");
    assert!(log.iter().filter(|d| d.ok).all(|d| d.retry_count == 0 && d.at_ms == d.scheduled_ms));
    let first: Vec<&Delivery> = log.iter().filter(|d| d.scheduled_ms == T0 + 60 * SECOND).collect();
    assert_eq!(first.len(), 7, "the first delivery and six retries");
    for (n, pair) in first.windows(2).enumerate() {
        let base = 2_000u64 << n;
        let waited = pair[1].at_ms - pair[0].at_ms;
        assert!((base..=base + base / 4).contains(&waited), "retry {} waited {waited} ms", n + 1);
        assert_eq!(pair[1].retry_count, n as u32 + 1);
    }

    let dead = rt.dead_letters(10).expect("dead letters");
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].alarm.scheduled_at_ms,
        Timestamp::from_millis(T0 + 60 * SECOND),
        "only the exhausted occurrence"
    );
    assert!(!rt.status(&run).expect("status").is_terminal(), "the run goes on");
    assert!(!matches!(rt.status(&run).expect("status"), RunStatus::Escalated { .. }));
    let alarms = rt.alarms(&run).expect("alarms");
    assert!(alarms[0].retrying.is_empty());
    assert_eq!(alarms[0].due_at_ms, Timestamp::from_millis(T0 + 11 * 60 * SECOND));
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_alarm_exhausted_may_still_escalate_a_recurring_alarm() {
    let log = Log::default();
    let rt = open(
        &SimBackend::new(),
        VirtualClock::new(Timestamp::from_millis(T0)),
        StrictTicker { log: log.clone() },
    )
    .await;
    let schedule = Schedule::Cron { expr: "*/5 * * * *".into(), zone: None };
    let run = rt.start::<StrictTicker>("five", &schedule).await.expect("start").run_id;
    rt.advance(Duration::from_secs(600)).await.expect("advance");
    match rt.status(&run).expect("status") {
        RunStatus::Escalated { reason } => assert_eq!(reason, "alarm_exhausted:tick"),
        other => panic!("expected an escalation, got {other:?}"),
    }
    // Until then, each five minutes fired on time beside the retries of the first.
    // The first occurrence, five minutes in, ran out of retries; the run ended there.
    let scheduled: BTreeSet<u64> = deliveries(&log).iter().map(|d| d.scheduled_ms).collect();
    assert_eq!(scheduled, BTreeSet::from([T0 + 5 * 60 * SECOND]));
    assert_eq!(deliveries(&log).len(), 7);
    assert!(rt.alarms(&run).expect("alarms").is_empty(), "an ended run keeps no alarm");
    rt.shutdown().await;
}

/// Occurrences on the half minute fail their first two deliveries.
fn half_minutes_fail_twice(scheduled: u64, retry: u32) -> bool {
    (scheduled - T0).is_multiple_of(30 * SECOND) && retry < 2
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schedule_and_its_retries_survive_crashes_at_random_barriers() {
    let sim = SimBackend::new();
    let clock = VirtualClock::new(Timestamp::from_millis(T0));
    let log = Log::default();
    let mut rng = SeededRng::new(17);
    let rt = open(&sim, clock.clone(), Ticker::new(&log, half_minutes_fail_twice)).await;
    let run = rt.start::<Ticker>("ten", &Schedule::Every(10 * SECOND)).await.expect("start").run_id;
    rt.advance(Duration::ZERO).await.expect("advance");
    rt.shutdown().await;
    let mut crashes = 0;
    for _ in 0..25 {
        let rt = open(&sim, clock.clone(), Ticker::new(&log, half_minutes_fail_twice)).await;
        sim.crash_at(SimCrash::AfterBarrier(sim.counts().1 + 1 + rng.between(0, 5)));
        let _ = rt.advance(Duration::from_secs(7 + rng.between(0, 19))).await;
        rt.shutdown().await;
        crashes += usize::from(sim.is_crashed());
        sim.revive();
    }
    assert!(crashes >= 10, "the store crashed {crashes} times");
    let rt = open(&sim, clock.clone(), Ticker::new(&log, half_minutes_fail_twice)).await;
    let resumed_at = clock.now();
    rt.advance(Duration::from_secs(300)).await.expect("advance");

    let log = deliveries(&log);
    assert!(
        log.iter().all(|d| (d.scheduled_ms - T0).is_multiple_of(10 * SECOND)),
        "only scheduled occurrences"
    );
    let dead: BTreeSet<u64> = rt
        .dead_letters(100)
        .expect("dead letters")
        .iter()
        .map(|d| d.alarm.scheduled_at_ms.as_millis())
        .collect();
    for failed in log.iter().filter(|d| !d.ok && d.at_ms < resumed_at.as_millis()) {
        let retried_to_success = log.iter().any(|d| d.ok && d.scheduled_ms == failed.scheduled_ms);
        assert!(
            retried_to_success || dead.contains(&failed.scheduled_ms),
            "the occurrence of {} failed and was neither retried to success nor dead-lettered",
            failed.scheduled_ms - T0
        );
    }
    let on_time_after =
        log.iter().filter(|d| d.at_ms >= resumed_at.as_millis() && d.at_ms == d.scheduled_ms).count();
    assert!(on_time_after >= 25, "the schedule fires on time after the crashes ({on_time_after} times)");
    assert_eq!(rt.status(&run).expect("status"), RunStatus::Running);
    assert!(rt.check_liveness().expect("liveness").is_empty());
    rt.shutdown().await;
}
