//! No run left behind (§3.6, §3.7): every open run is live with a fiber, parked on a durable
//! wait, or holding a wake at a known time — and the runtime's own interruptions are never
//! counted against a run.
//!
//! Each test below defends one way a run used to stop moving or be given up on. They run on
//! the virtual clock and the crash-simulating store; `Runtime::advance` checks the liveness
//! rule after every call, so a run left behind fails the test with its id and state.

use durafiber_runtime::StartRequest;
use durafiber_runtime::Timestamp;
use std::{
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use durafiber_demo::agents::{Steps, StepsInput, StepsOutput};
use durafiber_runtime::testing::RuntimeTestExt;
use durafiber_runtime::{
    Agent, AgentError, Ctx, Recovered, RunOptions, RunStatus, Runtime, RuntimeConfig, RuntimeError,
    clock::VirtualClock,
};
use durafiber_store::tables::keys;
use durafiber_store::{Batch, Durability, SimBackend, Store, StoreConfig, tables};

const EPOCH_MS: u64 = 1_000_000_000;

fn sim_store(sim: &SimBackend) -> Store {
    Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store")
}

/// Stashes once, then waits in memory; its recovery fails at once, every time.
struct Failing;

impl Agent for Failing {
    const KIND: &'static str = "failing";
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
        Err(AgentError::fail("the model endpoint is down"))
    }
}

/// Issue 10, point 1: a hook that fails at once ends its fiber in the same instant its retry
/// falls due. The retry's wake used to find the finished fiber still marked running and was
/// dropped, leaving the run `Running` with nothing to move it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_that_fails_at_once_is_always_retried_until_it_escalates() {
    durafiber_testkit::init_tracing();
    let rt = Runtime::builder(sim_store(&SimBackend::new()))
        .virtual_clock(VirtualClock::new(Timestamp::from_millis(EPOCH_MS)))
        .agent(Failing)
        .open()
        .await
        .expect("runtime");
    let mut runs = Vec::new();
    for i in 0..48 {
        let run = rt.start::<Failing>(&format!("f{i}"), &()).await.expect("start").run_id;
        rt.wait_for(&run, |s| *s == RunStatus::Running).await.expect("running");
        runs.push(run);
    }
    rt.settle().await;
    for run in &runs {
        rt.evict(run).await;
    }
    // 1 + 2 + 4 + 8 s of backoff: a minute is plenty, and each advance checks liveness.
    for _ in 0..12 {
        rt.advance(Duration::from_secs(5)).await.expect("advance");
    }
    for run in &runs {
        match rt.status(run).expect("status") {
            RunStatus::Escalated { reason } => {
                assert_eq!(reason, "recovery hook failed 5 times: the model endpoint is down", "{run}");
            }
            other => panic!("run {run} ended {other:?}"),
        }
    }
}

/// Counts messages; its recovery finishes the run.
struct Listener;

impl Agent for Listener {
    const KIND: &'static str = "listener";
    type Input = ();
    type Stash = ();
    type Output = String;
    type Message = String;

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<String, AgentError> {
        ctx.cancelled().await;
        Ok("fresh".into())
    }

    async fn on_fiber_recovered(&self, _: &mut Ctx<Self>, r: Recovered<Self>) -> Result<String, AgentError> {
        Ok(format!("recovered: {:?}", r.reason))
    }

    async fn on_message(&self, _: &mut Ctx<Self>, _: String) -> Result<(), AgentError> {
        Ok(())
    }
}

/// A run record as a crashed process leaves it: `Running`, no fiber anywhere.
fn interrupted_run(run_id: &str, kind: &str, now_ms: u64) -> tables::RunRecord {
    tables::RunRecord {
        run_id: run_id.into(),
        kind: kind.into(),
        key: format!("key-{run_id}"),
        input_json: "null".into(),
        input_hash: durafiber_runtime::sha256_hex(b"null"),
        status: RunStatus::Running,
        created_at_ms: Timestamp::from_millis(now_ms),
        updated_at_ms: Timestamp::from_millis(now_ms),
        attempt: 1,
        recover_attempts: 0,
        next_recover_at_ms: Timestamp::from_millis(0),
        wake_reason: None,
        cancel_reason: None,
        options: tables::RunOptions::default(),
    }
}

/// Issue 10, point 2: activation by a message (or an alarm, a decision, a keep-alive) spawned
/// the run's actor but never re-entered its interrupted fiber. Here the run appears after
/// the start-up scan (as a restored or salvaged run would): only the message can find it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_to_an_interrupted_run_re_enters_its_fiber() {
    let sim = SimBackend::new();
    let store = sim_store(&sim);
    let rt = Runtime::builder(store.clone())
        .virtual_clock(VirtualClock::new(Timestamp::from_millis(EPOCH_MS)))
        .agent(Listener)
        .open()
        .await
        .expect("runtime");
    let run = interrupted_run("run_restored", Listener::KIND, EPOCH_MS);
    let mut batch = Batch::new();
    batch.put(keys::run(&run.run_id), &run).expect("encode");
    batch.put(keys::open_run(&run.run_id), &()).expect("encode");
    store.commit(batch, Durability::Sync).await.expect("commit");
    let violations = rt.check_liveness().expect("check");
    assert_eq!(violations.len(), 1, "the checker sees the run nothing moves: {violations:?}");
    assert_eq!(violations[0].run_id, run.run_id);

    rt.send::<Listener>(&run.run_id, &"hello".into()).await.expect("send");
    rt.advance(Duration::ZERO).await.expect("advance");
    assert_eq!(rt.output::<String>(&run.run_id).expect("output"), Some("recovered: Crash".into()));
}

/// Issue 10, point 3: the README's chaos recipe. Chaos evicts at 20% of boundaries and idle
/// eviction hits fibers that hold no keep-alive; neither is a failure, so every seed
/// completes. It used to escalate about 3.5% of seeds as "recovery failed 5 times".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_chaos_recipe_completes_for_every_seed() {
    let mut evictions = 0;
    for seed in 0..200 {
        let rt = Runtime::builder(sim_store(&SimBackend::new()))
            .virtual_clock(VirtualClock::new(Timestamp::from_millis(EPOCH_MS)))
            .config(RuntimeConfig { chaos_evict_rate: 0.2, seed, ..Default::default() })
            .agent(Steps::default())
            .open()
            .await
            .expect("runtime");
        let no_keep_alive = RunOptions { fiber_keep_alive: Some(false), ..Default::default() };
        let input = serde_json::to_value(StepsInput { steps: 6, pause_ms: 30_000 }).expect("json");
        let request = StartRequest::new("steps", "case-1", input).with_options(no_keep_alive);
        let run = rt.start_run(request).await.expect("start").run_id;
        rt.advance(Duration::from_secs(600)).await.unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let status = rt.status(&run).expect("status");
        assert!(matches!(status, RunStatus::Completed { .. }), "seed {seed}: {status:?}");
        let out: StepsOutput = rt.output(&run).expect("output").expect("completed");
        assert_eq!(out.done, 6, "seed {seed}");
        evictions += rt.metrics().evictions;
        rt.shutdown().await;
    }
    assert!(evictions > 200, "chaos and idle eviction struck {evictions} times: too few to prove anything");
}

/// Waits in memory during its recovery too, so evictions land inside the recovery hook.
struct Sleeper;

impl Agent for Sleeper {
    const KIND: &'static str = "sleeper";
    type Input = ();
    type Stash = u32;
    type Output = u32;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<u32, AgentError> {
        ctx.stash("started", &0).await?;
        ctx.sleep_in_memory(Duration::from_secs(3600)).await;
        Ok(0)
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, r: Recovered<Self>) -> Result<u32, AgentError> {
        ctx.sleep_in_memory(Duration::from_secs(3600)).await;
        Ok(r.attempt)
    }
}

/// §3.6: forced evictions cut recoveries short ten times; none of them counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evictions_the_runtime_requests_never_count_as_failed_recoveries() {
    let rt = Runtime::builder(sim_store(&SimBackend::new()))
        .virtual_clock(VirtualClock::new(Timestamp::from_millis(EPOCH_MS)))
        .agent(Sleeper)
        .open()
        .await
        .expect("runtime");
    let run = rt.start::<Sleeper>("s", &()).await.expect("start").run_id;
    rt.advance(Duration::ZERO).await.expect("advance");
    for i in 0..10 {
        rt.evict(&run).await;
        rt.advance(Duration::from_secs(1)).await.expect("advance");
        let record = rt.run(&run).expect("run");
        assert_eq!(record.status, RunStatus::Running, "eviction {i}");
        assert_eq!(record.recover_attempts, 1, "eviction {i}: only the recovery in progress counts");
    }
    rt.advance(Duration::from_secs(3600)).await.expect("advance");
    assert_eq!(rt.output::<u32>(&run).expect("output"), Some(11), "the first attempt and ten recoveries");
}

/// §3.6: a process that dies during each recovery, with no boundary since, makes the run a
/// suspect; recovered alone from then on, five more such deaths escalate it, saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_dying_in_every_lone_recovery_escalates_the_run() {
    let sim = SimBackend::new();
    let clock = VirtualClock::new(Timestamp::from_millis(EPOCH_MS));
    let open = || async {
        Runtime::builder(sim_store(&sim))
            .virtual_clock(clock.clone())
            .agent(Sleeper)
            .open()
            .await
            .expect("runtime")
    };
    let mut rt = open().await;
    let run = rt.start::<Sleeper>("s", &()).await.expect("start").run_id;
    rt.advance(Duration::ZERO).await.expect("advance");
    for death in 1..=7 {
        // The store stops taking writes first, as a dead process does; then its tasks go.
        sim.crash();
        rt.shutdown().await;
        sim.revive();
        rt = open().await;
        // Time for the backoff of the deaths so far.
        rt.advance(Duration::from_secs(60)).await.expect("advance");
        let record = rt.run(&run).expect("run");
        if death < 7 {
            assert_eq!(record.status, RunStatus::Running, "death {death}");
            assert_eq!(record.recover_attempts, death, "death {death}");
        } else {
            let reason =
                "its recovery hook ended the process 5 times in a row, each time running alone".to_string();
            assert_eq!(record.status, RunStatus::Escalated { reason });
        }
    }
}

/// Recovers by preparing a new effect, then fails: every recovery makes progress.
struct Stubborn {
    recoveries: Arc<AtomicU32>,
}

impl Agent for Stubborn {
    const KIND: &'static str = "stubborn";
    type Input = ();
    type Stash = ();
    type Output = u32;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<u32, AgentError> {
        ctx.stash("started", &()).await?;
        ctx.sleep_in_memory(Duration::from_secs(3600)).await;
        Ok(0)
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, _: Recovered<Self>) -> Result<u32, AgentError> {
        let n = self.recoveries.fetch_add(1, Ordering::SeqCst) + 1;
        let id = format!("page:{n}");
        ctx.effect(&id, n, |_key, n| async move { Ok::<u32, String>(n) }).await?;
        if n < 8 {
            return Err(AgentError::fail(format!("recovery {n} failed after its effect")));
        }
        Ok(n)
    }
}

/// §3.6: an effect is a boundary, and any boundary resets the recovery count: a hook that
/// fails eight times, each after committing an effect, is never escalated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_effect_boundary_resets_the_recovery_count() {
    let recoveries = Arc::new(AtomicU32::new(0));
    let rt = Runtime::builder(sim_store(&SimBackend::new()))
        .virtual_clock(VirtualClock::new(Timestamp::from_millis(EPOCH_MS)))
        .agent(Stubborn { recoveries: recoveries.clone() })
        .open()
        .await
        .expect("runtime");
    let run = rt.start::<Stubborn>("s", &()).await.expect("start").run_id;
    rt.advance(Duration::ZERO).await.expect("advance");
    rt.evict(&run).await;
    rt.advance(Duration::from_secs(60)).await.expect("advance");
    assert_eq!(rt.output::<u32>(&run).expect("output"), Some(8), "{:?}", rt.status(&run));
}

/// Finishes at once; kept live only by keep-alive guards.
struct Quick;

impl Agent for Quick {
    const KIND: &'static str = "quick";
    type Input = ();
    type Stash = ();
    type Output = ();
    type Message = ();

    async fn run_fiber(&self, _: &mut Ctx<Self>, _: ()) -> Result<(), AgentError> {
        Ok(())
    }
}

/// Issue 10, point 4: a guard taken before a forced eviction, dropped after the run was
/// activated again, used to release the newer guard: the run hibernated while it was held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_from_before_an_eviction_releases_nothing_after_it() {
    let rt = Runtime::builder(sim_store(&SimBackend::new()))
        .virtual_clock(VirtualClock::new(Timestamp::from_millis(EPOCH_MS)))
        .agent(Quick)
        .open()
        .await
        .expect("runtime");
    let run = rt.start::<Quick>("q", &()).await.expect("start").run_id;
    rt.advance(Duration::ZERO).await.expect("advance");
    let old = rt.keep_alive(&run).await.expect("guard");
    rt.evict(&run).await;
    let new = rt.keep_alive(&run).await.expect("guard");
    drop(old);
    rt.advance(Duration::from_secs(60)).await.expect("advance");
    assert!(rt.is_live(&run).await, "the newer guard still holds the run");
    drop(new);
    rt.advance(Duration::from_secs(11)).await.expect("advance");
    assert!(!rt.is_live(&run).await, "released, the run hibernates after hibernate_after");
}

/// Never answers a message; says when a handler has started.
struct Mute {
    started: Arc<tokio::sync::Notify>,
}

impl Agent for Mute {
    const KIND: &'static str = "mute";
    type Input = ();
    type Stash = ();
    type Output = ();
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<(), AgentError> {
        ctx.cancelled().await;
        Ok(())
    }

    async fn on_message(&self, _: &mut Ctx<Self>, _: ()) -> Result<(), AgentError> {
        self.started.notify_one();
        std::future::pending().await
    }
}

/// Issue 10, point 7: a stuck `on_message` used to hold its caller forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_message_handler_fails_at_the_message_wall_limit() {
    let started = Arc::new(tokio::sync::Notify::new());
    let rt = Runtime::builder(sim_store(&SimBackend::new()))
        .virtual_clock(VirtualClock::new(Timestamp::from_millis(EPOCH_MS)))
        .config(RuntimeConfig { message_wall_limit: Duration::from_secs(5), ..Default::default() })
        .agent(Mute { started: started.clone() })
        .open()
        .await
        .expect("runtime");
    let run = rt.start::<Mute>("m", &()).await.expect("start").run_id;
    rt.advance(Duration::ZERO).await.expect("advance");
    let sender = {
        let (rt, run) = (rt.clone(), run.clone());
        tokio::spawn(async move { rt.send::<Mute>(&run, &()).await })
    };
    // The handler runs (and its wall-limit timer is set) before virtual time moves.
    started.notified().await;
    rt.advance(Duration::from_secs(6)).await.expect("advance");
    let answer = tokio::time::timeout(Duration::from_secs(60), sender)
        .await
        .expect("the caller is answered once the wall limit passed")
        .expect("join");
    assert!(
        matches!(&answer, Err(RuntimeError::Agent(e)) if e.to_string().contains("message wall limit")),
        "{answer:?}"
    );
}

/// Issue 10, point 9: recovery latency is measured from the moment the runtime decided to
/// re-enter the run, not from when the runtime opened (it read 303 s in a soak).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_latency_counts_from_the_wake_not_from_the_runtime_opening() {
    let rt = Runtime::builder(sim_store(&SimBackend::new()))
        .virtual_clock(VirtualClock::new(Timestamp::from_millis(EPOCH_MS)))
        .agent(Sleeper)
        .agent(Steps::default())
        .open()
        .await
        .expect("runtime");
    // Real work first, so the runtime is old by the time the recovery happens.
    for i in 0..100 {
        let run =
            rt.start::<Steps>(&format!("w{i}"), &StepsInput { steps: 5, pause_ms: 0 }).await.expect("start");
        rt.wait(&run.run_id).await.expect("wait");
    }
    let run = rt.start::<Sleeper>("s", &()).await.expect("start").run_id;
    rt.advance(Duration::ZERO).await.expect("advance");
    rt.evict(&run).await;
    rt.advance(Duration::ZERO).await.expect("advance");
    let age_us = rt.since_open_us();
    let latency = rt.metrics().recover_latency;
    assert_eq!(latency.count, 1);
    assert!(latency.max_us < age_us / 2, "recovery latency {} µs, runtime age {age_us} µs", latency.max_us);
}
