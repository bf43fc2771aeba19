//! Durable alarms (§8): the retry schedule, at-least-once delivery across real SIGKILLs,
//! overdue alarms after a restart in due order, re-setting inside a handler, and a million
//! pending alarms with a bounded scheduler window.

use durafiber_runtime::Timestamp;
use durafiber_testkit::process::{CHILD_DEADLINE, OutputWithin};
use std::{
    process::Command,
    sync::{Arc, Mutex},
    time::Duration,
};

use durafiber_demo::sim;
use durafiber_runtime::testing::RuntimeTestExt;
use durafiber_runtime::{
    Agent, AgentError, AlarmEvent, AlarmSpec, Ctx, Recovered, Runtime, RuntimeConfig, clock::VirtualClock,
    limits,
};
use durafiber_store::{SimBackend, Store, StoreConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_alarm_is_retried_at_2_4_8_16_32_64_seconds_then_dead_lettered() {
    let (_, r) = sim::alarm_retry(3, None).await.expect("sim");
    assert_eq!(r.attempts, 7, "the first delivery and six retries");
    assert_eq!(r.delays_ms.len(), 6);
    for (n, d) in r.delays_ms.iter().enumerate() {
        let base = 2_000u64 << n;
        assert!((base..=base + base / 4).contains(d), "retry {} waited {d} ms", n + 1);
    }
    assert!(r.dead_lettered && r.exhausted_hook_ran && !r.succeeded);
    let (_, ok) = sim::alarm_retry(3, Some(2)).await.expect("sim");
    assert_eq!((ok.attempts, ok.succeeded, ok.dead_lettered), (3, true, false));
}

type Log = Arc<Mutex<Vec<(String, u64, u32)>>>;

/// Sets the alarms it is given, then stays open; logs every delivery; fails a delivery
/// named `reset` once after re-setting it an hour later.
struct Alarmed {
    log: Log,
}

impl Agent for Alarmed {
    const KIND: &'static str = "alarmed";
    type Input = Vec<(String, u64)>;
    type Stash = ();
    type Output = ();
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, alarms: Vec<(String, u64)>) -> Result<(), AgentError> {
        for (name, delay_ms) in alarms {
            let spec = AlarmSpec::after(Duration::from_millis(delay_ms), &name)?;
            ctx.set_alarm(&name, spec).await?;
        }
        ctx.cancelled().await;
        Ok(())
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, _: Recovered<Self>) -> Result<(), AgentError> {
        ctx.cancelled().await;
        Ok(())
    }

    async fn on_alarm(&self, ctx: &mut Ctx<Self>, alarm: AlarmEvent) -> Result<(), AgentError> {
        self.log.lock().expect("log").push((alarm.name.clone(), ctx.now().as_millis(), alarm.retry_count));
        if alarm.name == "reset"
            && alarm.retry_count == 0
            && ctx.now() < Timestamp::from_millis(T0 + 3_600_000)
        {
            let spec = AlarmSpec::after(Duration::from_secs(3600), &"later")?;
            ctx.set_alarm("reset", spec).await?;
            return Err(AgentError::fail("failed after re-setting"));
        }
        Ok(())
    }
}

const T0: u64 = sim::SIM_EPOCH_MS;

async fn open(sim: &SimBackend, clock: VirtualClock, log: &Log) -> Runtime {
    open_with_window(sim, clock, log, limits::ALARM_WINDOW_DEFAULT).await
}

async fn open_with_window(sim: &SimBackend, clock: VirtualClock, log: &Log, alarm_window: usize) -> Runtime {
    let store = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store");
    Runtime::builder(store)
        .config(RuntimeConfig { alarm_window, ..Default::default() })
        .virtual_clock(clock)
        .agent(Alarmed { log: log.clone() })
        .open()
        .await
        .expect("runtime")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alarms_that_fell_due_while_down_fire_promptly_after_start_in_due_order() {
    let sim = SimBackend::new();
    let log = Log::default();
    let rt = open(&sim, VirtualClock::new(Timestamp::from_millis(T0)), &log).await;
    let alarms = vec![("c".to_string(), 30_000), ("a".to_string(), 10_000), ("b".to_string(), 20_000)];
    let run = rt.start::<Alarmed>("job", &alarms).await.expect("start").run_id;
    rt.advance(Duration::from_secs(5)).await.expect("advance");
    rt.shutdown().await;
    assert!(log.lock().expect("log").is_empty());

    // The process is down for a minute; all three fall due meanwhile.
    let rt = open(&sim, VirtualClock::new(Timestamp::from_millis(T0 + 60_000)), &log).await;
    rt.advance(Duration::ZERO).await.expect("advance");
    let delivered: Vec<(String, u64)> =
        log.lock().expect("log").iter().map(|(n, t, _)| (n.clone(), *t)).collect();
    let at = T0 + 60_000;
    assert_eq!(delivered, vec![("a".into(), at), ("b".into(), at), ("c".into(), at)]);
    assert!(rt.alarms(&run).expect("alarms").is_empty(), "removed after success");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_resets_its_alarm_and_fails_keeps_the_new_time_and_is_not_retried() {
    let log = Log::default();
    let rt = open(&SimBackend::new(), VirtualClock::new(Timestamp::from_millis(T0)), &log).await;
    let run = rt.start::<Alarmed>("job", &vec![("reset".to_string(), 1_000)]).await.expect("start").run_id;
    rt.advance(Duration::from_secs(600)).await.expect("advance");
    assert_eq!(log.lock().expect("log").len(), 1, "the failed delivery is not retried");
    let alarms = rt.alarms(&run).expect("alarms");
    assert_eq!(alarms.len(), 1);
    assert_eq!(alarms[0].due_at_ms, Timestamp::from_millis(T0 + 1_000 + 3_600_000), "the new time stands");
    assert_eq!(alarms[0].attempts_started, 0);
    rt.advance(Duration::from_secs(3600)).await.expect("advance");
    let log = log.lock().expect("log").clone();
    assert_eq!(log.len(), 2);
    assert_eq!((log[1].1, log[1].2), (T0 + 3_601_000, 0), "delivered at the new time, as a first attempt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_pending_alarms_keep_memory_bounded_and_the_earliest_fires_on_time() {
    let sim = SimBackend::new();
    let log = Log::default();
    let rt = open(&sim, VirtualClock::new(Timestamp::from_millis(T0)), &log).await;
    let run = rt.start::<Alarmed>("job", &vec![("earliest".to_string(), 5_000)]).await.expect("start").run_id;
    rt.advance(Duration::ZERO).await.expect("advance");
    rt.shutdown().await;

    let store = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store");
    durafiber_demo::bulk::write_pending_alarms(
        &store,
        std::slice::from_ref(&run),
        "later",
        1_000_000,
        Timestamp::from_millis(T0 + 3_600_000),
        Duration::from_millis(10),
    )
    .await
    .expect("bulk write");
    store.close();

    let rt = open(&sim, VirtualClock::new(Timestamp::from_millis(T0)), &log).await;
    assert!(rt.alarm_window_len() <= limits::ALARM_WINDOW_DEFAULT, "window {}", rt.alarm_window_len());
    rt.advance(Duration::from_secs(5)).await.expect("advance");
    assert_eq!(log.lock().expect("log").as_slice(), &[("earliest".to_string(), T0 + 5_000, 0)]);
    assert_eq!(rt.metrics().alarm_lateness.max_us, 0, "fired exactly on time");
    assert!(rt.alarm_window_len() <= limits::ALARM_WINDOW_DEFAULT);
}

fn run_child(location: &str, mode: &str) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_alarm-child"))
        .arg(location)
        .arg(mode)
        .output_within(CHILD_DEADLINE)
        .expect("run alarm-child");
    (out.status.code(), String::from_utf8_lossy(&out.stdout).to_string())
}

#[test]
fn a_sigkill_during_the_handler_redelivers_the_alarm_as_a_retry_after_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    redelivered_after_a_kill(dir.path().to_str().expect("utf-8 path"));
}

#[test]
fn a_sigkill_during_the_handler_redelivers_the_alarm_as_a_retry_after_restart_on_postgres() {
    let server = durafiber_testkit::postgres::PgServer::start().expect("a PostgreSQL server");
    redelivered_after_a_kill(&server.fresh_database().expect("a database"));
}

fn redelivered_after_a_kill(location: &str) {
    let (code, out) = run_child(location, "kill-once");
    assert_eq!(code, None, "killed by SIGKILL: {out}");
    assert_eq!(out.trim(), "attempt 0 false");
    let (code, out) = run_child(location, "kill-once");
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        vec!["attempt 1 true", "handled"],
        "the persisted count is redelivered"
    );
}

#[test]
fn a_handler_that_kills_the_process_every_time_is_dead_lettered_after_seven_attempts() {
    let dir = tempfile::tempdir().expect("tempdir");
    dead_lettered_after_seven(dir.path().to_str().expect("utf-8 path"));
}

#[test]
fn a_handler_that_kills_the_process_every_time_is_dead_lettered_after_seven_attempts_on_postgres() {
    let server = durafiber_testkit::postgres::PgServer::start().expect("a PostgreSQL server");
    dead_lettered_after_seven(&server.fresh_database().expect("a database"));
}

fn dead_lettered_after_seven(location: &str) {
    let mut attempts = Vec::new();
    for restart in 0..12 {
        let (code, out) = run_child(location, "kill-always");
        attempts.extend(out.lines().filter(|l| l.starts_with("attempt")).map(str::to_string));
        if code == Some(0) {
            assert_eq!(out.lines().last(), Some("ended escalated"), "restart {restart}: {out}");
            break;
        }
        assert_eq!(code, None, "restart {restart}: killed, not failed: {out}");
    }
    let expected: Vec<String> = (0..7).map(|n| format!("attempt {n} {}", n > 0)).collect();
    assert_eq!(attempts, expected, "seven attempts across seven restarts, never an eighth");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_periodic_alarm_repeats_and_setting_it_again_is_a_no_op() {
    let log = Log::default();
    let rt = open(&SimBackend::new(), VirtualClock::new(Timestamp::from_millis(T0)), &log).await;
    let run = rt.start::<Alarmed>("job", &vec![]).await.expect("start").run_id;
    let every = || AlarmSpec::every(Duration::from_secs(10), &"tick").expect("spec");
    rt.set_alarm(&run, "tick", every()).await.expect("set");
    rt.advance(Duration::from_secs(15)).await.expect("advance");
    rt.set_alarm(&run, "tick", every()).await.expect("set again");
    assert_eq!(
        rt.alarms(&run).expect("alarms")[0].due_at_ms,
        Timestamp::from_millis(T0 + 20_000),
        "idempotent by name"
    );
    rt.advance(Duration::from_secs(20)).await.expect("advance");
    let times: Vec<u64> = log.lock().expect("log").iter().map(|(_, t, _)| t - T0).collect();
    assert_eq!(times, vec![10_000, 20_000, 30_000]);
    assert!(rt.cancel_alarm(&run, "tick").await.expect("cancel"));
    rt.advance(Duration::from_secs(60)).await.expect("advance");
    assert_eq!(log.lock().expect("log").len(), 3, "a cancelled alarm stays quiet");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_alarms_than_the_window_fire_each_once_on_time_with_more_set_past_its_horizon_meanwhile() {
    const WINDOW: usize = 1024;
    let sim = SimBackend::new();
    let log = Log::default();
    let rt = open_with_window(&sim, VirtualClock::new(Timestamp::from_millis(T0)), &log, WINDOW).await;
    // Twice the window, one every 2 ms from the first second on.
    let count = 2 * WINDOW as u64;
    let early: Vec<(String, u64)> = (0..count).map(|i| (format!("a{i:05}"), 1_000 + 2 * i)).collect();
    let run = rt.start::<Alarmed>("many", &early).await.expect("start").run_id;
    rt.advance(Duration::ZERO).await.expect("advance");
    let mut want: Vec<(String, u64)> = early.iter().map(|(n, d)| (n.clone(), T0 + d)).collect();
    // While the window works through them, more are set: some past its horizon, between
    // alarms only the store holds; some after everything.
    for step in 0..8u64 {
        rt.advance(Duration::from_millis(1_000)).await.expect("advance");
        for j in 0..50u64 {
            let due = T0 + 1_001 + step * 1_000 + 2 * (200 + j * 37) % (2 * count) + 1_000;
            let name = format!("b{step}-{j:02}");
            rt.set_alarm(&run, &name, AlarmSpec::at(Timestamp::from_millis(due), &name).expect("spec"))
                .await
                .expect("set");
            want.push((name, due.max(rt.now().as_millis())));
        }
        assert!(rt.alarm_window_len() <= WINDOW, "window {}", rt.alarm_window_len());
    }
    rt.advance(Duration::from_secs(60)).await.expect("advance");
    let got = log.lock().expect("log").clone();
    let mut fired: Vec<(String, u64)> = got.iter().map(|(n, at, _)| (n.clone(), *at)).collect();
    assert!(got.iter().all(|(_, _, retry)| *retry == 0), "no alarm was retried");
    assert!(fired.windows(2).all(|w| w[0].1 <= w[1].1), "alarms fired out of due order");
    fired.sort();
    want.sort();
    assert_eq!(fired.len(), want.len(), "each alarm fires exactly once");
    assert_eq!(fired, want, "each alarm fires at its due time");
}
