//! Lifecycle rules the other files leave out, each on the virtual clock unless it is about
//! the system clock's own wake-ups: recovery backoff timing (§3.6), the `resumed` reason
//! after a decision (§6.3), approval age (§6.5), cold starts measured (§7.2), keep-alive in
//! its three forms (§7.4), forced hibernation (§7.5), absolute-time alarms (§8.1), due order
//! across runs and delivery that activates a hibernated or evicted run (§8.2), a panicking
//! handler, the wall limit and uncounted runtime failures (§8.4), and every metric (§9.2).

use durafiber_runtime::Timestamp;
use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use durafiber_runtime::{
    Agent, AgentError, AlarmEvent, AlarmSpec, Ctx, Decision, Recovered, RunStatus, Runtime, RuntimeConfig,
    clock::VirtualClock,
};
use durafiber_store::{SimBackend, Store, StoreConfig};

const EPOCH_MS: u64 = 1_000_000_000;

type Log = Arc<Mutex<Vec<String>>>;

/// Does what its input names; logs recoveries and alarm deliveries.
struct Life {
    log: Log,
}

impl Life {
    fn note(&self, line: String) {
        self.log.lock().expect("log").push(line);
    }

    async fn work(&self, ctx: &mut Ctx<Self>, mode: &str) -> Result<String, AgentError> {
        match mode {
            "approve" => {
                ctx.stash("asked", &1).await?;
                let d = ctx.request_approval("ok", &"ship it?").await?;
                Ok(format!("approved={}", d.approved))
            }
            "hold" => {
                ctx.keep_alive_while(ctx.sleep_in_memory(Duration::from_secs(400))).await;
                Ok("held".into())
            }
            "guard" => {
                let guard = ctx.keep_alive();
                ctx.sleep_in_memory(Duration::from_secs(400)).await;
                drop(guard);
                ctx.sleep_in_memory(Duration::from_secs(400)).await;
                Ok("guarded".into())
            }
            "fail-recovery" => Err(AgentError::fail("still broken")),
            "effect" => {
                ctx.effect("note", 1, |_key, n| async move { Ok::<u32, String>(n) }).await?;
                ctx.cancelled().await;
                Ok("noted".into())
            }
            _ => {
                ctx.cancelled().await;
                Ok("cancelled".into())
            }
        }
    }
}

impl Agent for Life {
    const KIND: &'static str = "life";
    type Input = String;
    type Stash = u32;
    type Output = String;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, mode: String) -> Result<String, AgentError> {
        if mode == "fail-recovery" {
            ctx.stash("started", &0).await?;
            ctx.sleep_in_memory(Duration::from_secs(3600)).await;
        }
        self.work(ctx, &mode).await
    }

    async fn on_fiber_recovered(
        &self,
        ctx: &mut Ctx<Self>,
        r: Recovered<Self>,
    ) -> Result<String, AgentError> {
        self.note(format!("recovered {:?} at {}", r.reason, ctx.now()));
        self.work(ctx, &r.input).await
    }

    async fn on_alarm(&self, ctx: &mut Ctx<Self>, alarm: AlarmEvent) -> Result<(), AgentError> {
        self.note(format!(
            "alarm {} {} at {} retry {}",
            ctx.run_id(),
            alarm.name,
            ctx.now(),
            alarm.retry_count
        ));
        let own = ctx.alarms()?.iter().filter(|a| a.system.is_none()).count();
        self.note(format!("delivery {} {} own alarms {own}", alarm.name, alarm.delivery_id));
        match alarm.name.as_str() {
            "panics" => panic!("handler bug"),
            "hangs" => std::future::pending().await,
            _ => Ok(()),
        }
    }
}

async fn open_with(
    sim: &SimBackend,
    clock: Option<&VirtualClock>,
    config: RuntimeConfig,
    log: &Log,
) -> Runtime {
    let store = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store");
    let mut builder = Runtime::builder(store).config(config).agent(Life { log: log.clone() });
    if let Some(clock) = clock {
        builder = builder.virtual_clock(clock.clone());
    }
    builder.open().await.expect("runtime")
}

async fn open(config: RuntimeConfig) -> (Runtime, Log) {
    let log = Log::default();
    let rt = open_with(
        &SimBackend::new(),
        Some(&VirtualClock::new(Timestamp::from_millis(EPOCH_MS))),
        config,
        &log,
    )
    .await;
    (rt, log)
}

fn lines(log: &Log, prefix: &str) -> Vec<String> {
    log.lock().expect("log").iter().filter(|l| l.starts_with(prefix)).cloned().collect()
}

fn yes() -> Decision {
    Decision { approved: true, comment: String::new() }
}

/// §3.6: a failing hook is retried 1 s, 2 s, 4 s, 8 s after each failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_hook_is_retried_after_1_2_4_and_8_seconds() {
    let (rt, log) = open(RuntimeConfig::default()).await;
    let run = rt.start::<Life>("b", &"fail-recovery".into()).await.expect("start").run_id;
    rt.advance(Duration::ZERO).await.expect("advance");
    rt.evict(&run).await;
    rt.advance(Duration::from_secs(60)).await.expect("advance");
    let times: Vec<u64> = lines(&log, "recovered")
        .iter()
        .map(|l| l.rsplit(' ').next().and_then(|t| t.parse().ok()).expect("time"))
        .collect();
    let gaps: Vec<u64> = times.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(gaps, vec![1_000, 2_000, 4_000, 8_000], "{times:?}");
    assert!(matches!(rt.status(&run).expect("status"), RunStatus::Escalated { .. }));
}

/// §6.3 and §6.5: the pending view ages with the clock; a decision reaching a run whose
/// fiber was evicted re-enters it with reason `resumed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_after_eviction_resumes_with_reason_resumed_and_the_view_shows_age() {
    let (rt, log) = open(RuntimeConfig::default()).await;
    let run = rt.start::<Life>("a", &"approve".into()).await.expect("start").run_id;
    rt.advance(Duration::from_secs(90)).await.expect("advance");
    let pending = rt.pending_approvals(Some(&run)).expect("pending");
    assert_eq!(pending[0].age_ms, Duration::from_millis(90_000));
    rt.evict(&run).await;
    rt.advance(Duration::from_secs(30)).await.expect("advance");
    assert_eq!(rt.pending_approvals(Some(&run)).expect("pending")[0].age_ms, Duration::from_millis(120_000));
    rt.approve(&run, "ok", &pending[0].payload_hash, yes()).await.expect("approve");
    assert_eq!(
        rt.wait(&run).await.expect("wait"),
        RunStatus::Completed { output_json: "\"approved=true\"".into() }
    );
    let recovered = lines(&log, "recovered");
    assert!(recovered.iter().any(|l| l.starts_with("recovered Resumed")), "{recovered:?}");
}

/// §7.2: every activation is a cold start, and each is timed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_starts_are_counted_and_timed() {
    let (rt, _) = open(RuntimeConfig::default()).await;
    let run = rt.start::<Life>("c", &"wait".into()).await.expect("start").run_id;
    rt.advance(Duration::ZERO).await.expect("advance");
    rt.evict(&run).await;
    rt.advance(Duration::ZERO).await.expect("advance");
    let m = rt.metrics();
    assert_eq!(m.activations, 2);
    assert_eq!(m.cold_start.count, 2, "each activation is timed");
    assert!(m.cold_start.max_us > 0);
}

fn no_fiber_keep_alive() -> RuntimeConfig {
    RuntimeConfig { fiber_keep_alive: false, ..Default::default() }
}

/// §7.4: with `fiber_keep_alive = false` runtime-wide, `keep_alive_while` holds the run
/// through 400 s of waiting; nothing is evicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_while_holds_a_run_when_fibers_do_not_hold_themselves() {
    let (rt, _) = open(no_fiber_keep_alive()).await;
    let run = rt.start::<Life>("h", &"hold".into()).await.expect("start").run_id;
    rt.advance(Duration::from_secs(401)).await.expect("advance");
    assert_eq!(rt.output::<String>(&run).expect("output"), Some("held".into()));
    assert_eq!(rt.metrics().evictions, 0);
    assert!(rt.metrics().heartbeats >= 13, "a heartbeat every 30 s while held");
}

/// §7.4: `ctx.keep_alive()` holds while it lives; once dropped, the runtime-wide
/// `fiber_keep_alive = false` applies and the waiting fiber is evicted within 70–140 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_ctx_guard_leaves_the_fiber_to_be_evicted() {
    let (rt, log) = open(no_fiber_keep_alive()).await;
    let run = rt.start::<Life>("g", &"guard".into()).await.expect("start").run_id;
    rt.advance(Duration::from_secs(399)).await.expect("advance");
    assert_eq!(rt.metrics().evictions, 0, "held by the guard");
    rt.advance(Duration::from_secs(142)).await.expect("advance");
    assert_eq!(rt.metrics().evictions, 1, "evicted once the guard was dropped");
    assert_eq!(lines(&log, "recovered Evicted").len(), 1);
    assert_eq!(rt.run(&run).expect("run").recover_attempts, 1, "the recovery in progress");
}

/// §7.5: a forced hibernation stops a run without a fiber, and leaves a running fiber alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_hibernation_stops_only_a_run_without_a_fiber() {
    let (rt, _) = open(RuntimeConfig::default()).await;
    let busy = rt.start::<Life>("busy", &"wait".into()).await.expect("start").run_id;
    let done = rt.start::<Life>("done", &"wait".into()).await.expect("start").run_id;
    rt.advance(Duration::ZERO).await.expect("advance");
    rt.cancel(&done, "stop").await.expect("cancel");
    rt.wait(&done).await.expect("wait");
    // The status is written before the fiber's task has ended: let it end.
    rt.advance(Duration::ZERO).await.expect("advance");
    rt.keep_alive(&done).await.expect("activate").release();
    rt.hibernate(&busy).await;
    rt.hibernate(&done).await;
    assert!(rt.is_live(&busy).await, "a running fiber is not hibernateable");
    assert!(!rt.is_live(&done).await);
    assert_eq!(rt.metrics().hibernations, 1);
}

/// §8.1 and §8.2: an alarm set for an absolute time fires exactly then; alarms of several
/// runs fire in due order; delivery activates a run that was evicted and one that was
/// hibernated (both waiting for a human, so neither has a fiber in memory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absolute_alarms_fire_at_their_time_in_due_order_and_activate_sleeping_runs() {
    let (rt, log) = open(RuntimeConfig::default()).await;
    let live = rt.start::<Life>("live", &"wait".into()).await.expect("start").run_id;
    let cancelled = rt.start::<Life>("cancelled", &"wait".into()).await.expect("start").run_id;
    let evicted = rt.start::<Life>("evicted", &"approve".into()).await.expect("start").run_id;
    let hibernated = rt.start::<Life>("hibernated", &"approve".into()).await.expect("start").run_id;
    rt.advance(Duration::ZERO).await.expect("advance");
    let dues = [
        (&cancelled, EPOCH_MS + 20_000),
        (&live, EPOCH_MS + 35_000),
        (&hibernated, EPOCH_MS + 40_000),
        (&evicted, EPOCH_MS + 50_000),
    ];
    for (run, due) in dues.iter().rev() {
        rt.set_alarm(run, "wake", AlarmSpec::at(Timestamp::from_millis(*due), &()).expect("spec"))
            .await
            .expect("set");
    }
    rt.cancel(&cancelled, "done").await.expect("cancel");
    rt.wait(&cancelled).await.expect("wait");
    rt.evict(&evicted).await;
    rt.evict(&hibernated).await;
    rt.keep_alive(&hibernated).await.expect("activate").release();
    rt.hibernate(&hibernated).await;
    assert!(!rt.is_live(&evicted).await && !rt.is_live(&hibernated).await);
    rt.advance(Duration::from_secs(60)).await.expect("advance");
    let delivered = lines(&log, "alarm");
    let expected: Vec<String> =
        dues[1..].iter().map(|(run, at)| format!("alarm {run} wake at {at} retry 0")).collect();
    assert_eq!(delivered, expected, "due order, at the exact times; the cancelled run's alarm went with it");
    let ids: std::collections::BTreeSet<String> = lines(&log, "delivery").into_iter().collect();
    assert_eq!(ids.len(), 3, "each run's occurrence has its own delivery id: {ids:?}");
}

/// §8.4: a panicking handler is a failed attempt, retried like an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_counts_as_a_failed_attempt() {
    let (rt, log) = open(RuntimeConfig::default()).await;
    let run = rt.start::<Life>("p", &"wait".into()).await.expect("start").run_id;
    rt.set_alarm(&run, "panics", AlarmSpec::after(Duration::from_secs(1), &()).expect("spec"))
        .await
        .expect("set");
    rt.advance(Duration::from_secs(5)).await.expect("advance");
    let attempts = lines(&log, "alarm");
    assert_eq!(attempts.len(), 2, "the first delivery and a retry 2–2.5 s later: {attempts:?}");
    assert!(attempts[1].ends_with("retry 1"));
    assert_eq!(rt.alarms(&run).expect("alarms")[0].attempts_started, 2);
    assert_eq!(rt.metrics().alarm_retries, 2);
    let deliveries = lines(&log, "delivery");
    assert_eq!(deliveries.len(), 2);
    assert_eq!(deliveries[0], deliveries[1], "a retry keeps the occurrence's delivery id");
    assert!(deliveries[0].starts_with("delivery panics dlv_") && deliveries[0].ends_with("own alarms 1"));
}

/// §8.4: a handler past `alarm_wall_limit` has failed and is retried. On the system clock,
/// where the limit is enforced, with a limit of 300 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_past_the_wall_limit_fails_and_is_retried() {
    let log = Log::default();
    let config = RuntimeConfig {
        alarm_wall_limit: Duration::from_millis(300),
        alarm_retry_base: Duration::from_millis(200),
        ..Default::default()
    };
    let rt = open_with(&SimBackend::new(), None, config, &log).await;
    let run = rt.start::<Life>("w", &"wait".into()).await.expect("start").run_id;
    rt.set_alarm(&run, "hangs", AlarmSpec::after(Duration::ZERO, &()).expect("spec")).await.expect("set");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while lines(&log, "alarm").len() < 2 {
        assert!(std::time::Instant::now() < deadline, "no retry after the wall limit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(lines(&log, "alarm")[1].ends_with("retry 1"));
    rt.shutdown().await;
}

/// §8.4: while the store refuses every write, deliveries fail in the runtime, not in the
/// handler: they are not counted, and the alarm is delivered as a first attempt once the
/// store is back — within the 1024 s cap of the runtime's backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_of_the_runtime_are_not_counted_and_back_off_at_most_1024_seconds() {
    let (sim, clock, log) =
        (SimBackend::new(), VirtualClock::new(Timestamp::from_millis(EPOCH_MS)), Log::default());
    let rt = open_with(&sim, Some(&clock), RuntimeConfig::default(), &log).await;
    let run = rt.start::<Life>("s", &"wait".into()).await.expect("start").run_id;
    rt.set_alarm(&run, "wake", AlarmSpec::after(Duration::from_secs(1), &()).expect("spec"))
        .await
        .expect("set");
    rt.advance(Duration::ZERO).await.expect("advance");
    sim.crash();
    let _ = rt.advance(Duration::from_secs(3 * 3600)).await; // the store is down: liveness cannot be read
    assert!(lines(&log, "alarm").is_empty(), "no handler ran while the store was down");
    sim.revive();
    rt.advance(Duration::from_secs(1024)).await.expect("advance");
    let delivered = lines(&log, "alarm");
    assert_eq!(delivered.len(), 1, "{delivered:?}");
    assert!(delivered[0].ends_with("retry 0"), "not counted: {}", delivered[0]);
}

/// §9.2: every counter and histogram the contract lists moves in one busy scenario.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_listed_metric_is_exposed_and_moves() {
    let (rt, _) = open(RuntimeConfig::default()).await;
    let waiting = rt.start::<Life>("m1", &"wait".into()).await.expect("start").run_id;
    let approving = rt.start::<Life>("m2", &"approve".into()).await.expect("start").run_id;
    let failing = rt.start::<Life>("m3", &"fail-recovery".into()).await.expect("start").run_id;
    rt.advance(Duration::ZERO).await.expect("advance");
    rt.set_alarm(&waiting, "panics", AlarmSpec::after(Duration::from_secs(1), &()).expect("spec"))
        .await
        .expect("set");
    rt.evict(&failing).await;
    rt.advance(Duration::from_secs(300)).await.expect("advance");
    let idle = rt.start::<Life>("m4", &"wait".into()).await.expect("start").run_id;
    let noted = rt.start::<Life>("m5", &"effect".into()).await.expect("start").run_id;
    rt.advance(Duration::ZERO).await.expect("advance");
    rt.evict(&noted).await;
    let pending = rt.pending_approvals(Some(&approving)).expect("pending");
    rt.approve(&approving, "ok", &pending[0].payload_hash, yes()).await.expect("approve");
    rt.wait(&approving).await.expect("wait");
    rt.cancel(&idle, "stop").await.expect("cancel");
    rt.wait(&idle).await.expect("wait");
    rt.advance(Duration::from_secs(30)).await.expect("advance");
    let m = rt.metrics();
    let counters = [
        ("starts", m.starts),
        ("activations", m.activations),
        ("hibernations", m.hibernations),
        ("evictions", m.evictions),
        ("recoveries", m.recoveries),
        ("heartbeats", m.heartbeats),
        ("alarm_retries", m.alarm_retries),
        ("dead_letters", m.dead_letters),
        ("escalations", m.escalations),
        ("effects_prevented", m.effects_prevented),
    ];
    for (name, value) in counters {
        assert!(value > 0, "{name} never moved: {m:?}");
    }
    for (name, h) in [
        ("cold_start", &m.cold_start),
        ("recover_latency", &m.recover_latency),
        ("stash_commit", &m.stash_commit),
        ("alarm_lateness", &m.alarm_lateness),
    ] {
        assert!(h.count > 0, "{name} has no samples: {m:?}");
    }
}

/// §3.5 and §6.3: a decision that comes after `max_age` (a human may take up to three days)
/// resumes the run; `max_age` is for runs found interrupted, not for runs that waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_after_max_age_resumes_the_run_instead_of_escalating_it() {
    let (rt, _) = open(RuntimeConfig::default()).await;
    let run = rt.start::<Life>("late", &"approve".into()).await.expect("start").run_id;
    rt.advance(Duration::from_secs(30 * 3600)).await.expect("advance");
    assert!(!rt.is_live(&run).await, "evicted while it waited");
    let pending = rt.pending_approvals(Some(&run)).expect("pending");
    rt.approve(&run, "ok", &pending[0].payload_hash, yes()).await.expect("approve");
    rt.advance(Duration::ZERO).await.expect("advance");
    assert_eq!(rt.output::<String>(&run).expect("output"), Some("approved=true".into()));
}
