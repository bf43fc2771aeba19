//! The kill switch: a paused kind starts no effect until resumed — across a restart — its
//! new starts are accepted and park, its alarms are held, and a resume lets everything
//! continue in order; a single run can be paused the same way.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use durafiber_runtime::{
    Agent, AgentError, AlarmEvent, AlarmSpec, Ctx, EffectError, Recovered, RunState, RunStatus, Runtime,
};
use durafiber_store::{RunId, SimBackend, Store, StoreConfig};

/// What reached the outside world, in order: effect keys' effect ids and alarm deliveries.
type Outside = Arc<Mutex<Vec<String>>>;

/// Sets an alarm, then performs `effects` effects, a stash after each.
struct Worker {
    outside: Outside,
}

impl Worker {
    async fn work(&self, ctx: &mut Ctx<Self>, effects: u32, from: u32) -> Result<u32, AgentError> {
        if from == 0 {
            ctx.set_alarm("ping", AlarmSpec::after(Duration::from_millis(300), &())?).await?;
        }
        for n in from..effects {
            let outside = self.outside.clone();
            let run = ctx.run_id().to_string();
            let _: u32 = ctx
                .effect(&format!("call:{n}"), n, move |_, n| {
                    let (outside, run) = (outside.clone(), run.clone());
                    async move {
                        outside
                            .lock()
                            .map_err(|_| EffectError::retryable("poisoned"))?
                            .push(format!("{run}:call:{n}"));
                        Ok::<u32, EffectError>(n)
                    }
                })
                .await?;
            ctx.stash("called", &(n + 1)).await?;
        }
        Ok(effects)
    }
}

impl Agent for Worker {
    const KIND: &'static str = "worker";
    type Input = u32;
    type Stash = u32;
    type Output = u32;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, effects: u32) -> Result<u32, AgentError> {
        self.work(ctx, effects, 0).await
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, r: Recovered<Self>) -> Result<u32, AgentError> {
        self.work(ctx, r.input, r.stash.unwrap_or(0)).await
    }

    async fn on_alarm(&self, ctx: &mut Ctx<Self>, alarm: AlarmEvent) -> Result<(), AgentError> {
        self.outside.lock().map_err(|_| AgentError::fail("poisoned"))?.push(format!(
            "{}:alarm:{}",
            ctx.run_id(),
            alarm.name
        ));
        Ok(())
    }
}

fn store(sim: &SimBackend) -> Store {
    Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store")
}

async fn open(sim: &SimBackend, outside: &Outside) -> Runtime {
    Runtime::builder(store(sim)).agent(Worker { outside: outside.clone() }).open().await.expect("runtime")
}

fn calls(outside: &Outside, run_id: &str) -> usize {
    outside.lock().expect("outside").iter().filter(|e| e.starts_with(&format!("{run_id}:call:"))).count()
}

async fn paused(rt: &Runtime, run_id: &RunId) {
    let wait = rt.wait_for(run_id, |s| matches!(s, RunStatus::Paused { .. }));
    tokio::time::timeout(Duration::from_secs(30), wait).await.expect("the run parks").expect("status");
}

async fn completed(rt: &Runtime, run_id: &RunId) {
    let status = tokio::time::timeout(Duration::from_secs(30), rt.wait(run_id)).await.expect("the run ends");
    assert!(matches!(status, Ok(RunStatus::Completed { .. })), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_kind_starts_no_effect_until_resumed_across_a_restart() {
    let sim = SimBackend::new();
    let outside = Outside::default();
    let rt = open(&sim, &outside).await;
    rt.pause_kind("worker", "INC-1: runaway spend").await.expect("pause");
    // Started while paused: accepted, the same handle on a repeat, parked before its first step.
    let first = rt.start::<Worker>("a", &3).await.expect("start").run_id;
    assert_eq!(rt.start::<Worker>("a", &3).await.expect("repeat").run_id, first);
    paused(&rt, &first).await;
    match rt.status(&first).expect("status") {
        RunStatus::Paused { reason } => assert_eq!(reason, "INC-1: runaway spend"),
        other => panic!("{other:?}"),
    }
    let second = rt.start::<Worker>("b", &3).await.expect("start").run_id;
    paused(&rt, &second).await;
    assert_eq!(
        rt.list(&durafiber_runtime::ListFilter {
            state: Some(RunState::Paused),
            limit: 100,
            ..Default::default()
        })
        .expect("list")
        .runs
        .len(),
        2
    );
    assert!(rt.check_liveness().expect("liveness").is_empty(), "a paused run waits for its operator");
    rt.shutdown().await;

    // A restart keeps the pause and the parked runs.
    let rt = open(&sim, &outside).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(matches!(rt.status(&first).expect("status"), RunStatus::Paused { .. }));
    assert!(outside.lock().expect("outside").is_empty(), "nothing reached the outside while paused");
    assert_eq!(rt.paused().kinds.len(), 1);

    assert!(rt.resume_kind("worker").await.expect("resume"));
    completed(&rt, &first).await;
    completed(&rt, &second).await;
    assert_eq!((calls(&outside, &first), calls(&outside, &second)), (3, 3));
    assert!(!rt.resume_kind("worker").await.expect("resume again"), "not paused any more");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_holds_a_running_run_at_its_next_effect_and_its_alarms() {
    let sim = SimBackend::new();
    let outside = Outside::default();
    let rt = open(&sim, &outside).await;
    // A run that is running: paused after its first call.
    let run_id = rt.start::<Worker>("r", &200).await.expect("start").run_id;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while calls(&outside, &run_id) == 0 {
        assert!(std::time::Instant::now() < deadline, "no call");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    rt.pause_run(&run_id, "look at it").await.expect("pause");
    paused(&rt, &run_id).await;
    let at_pause = calls(&outside, &run_id);
    // Its alarm falls due meanwhile and is held.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(calls(&outside, &run_id), at_pause, "no effect starts while paused");
    assert!(
        !outside.lock().expect("outside").iter().any(|e| e.ends_with(":alarm:ping")),
        "the alarm is held"
    );
    // Another run of the kind is not paused.
    let other = rt.start::<Worker>("o", &2).await.expect("start").run_id;
    completed(&rt, &other).await;

    assert!(rt.resume_run(&run_id).await.expect("resume"));
    completed(&rt, &run_id).await;
    assert_eq!(calls(&outside, &run_id), 200, "each call once, the pause in between");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !outside.lock().expect("outside").iter().any(|e| e == &format!("{run_id}:alarm:ping")) {
        assert!(std::time::Instant::now() < deadline, "the held alarm was not delivered after the resume");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(rt.pause_run(&run_id, "too late").await.is_err(), "a finished run cannot be paused");
    assert!(rt.pause_kind("nobody", "x").await.is_err(), "an unknown kind is refused");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_left_paused_by_a_resume_that_died_midway_is_reentered_at_start() {
    let sim = SimBackend::new();
    let outside = Outside::default();
    let rt = open(&sim, &outside).await;
    rt.pause_kind("worker", "maintenance").await.expect("pause");
    let run_id = rt.start::<Worker>("m", &2).await.expect("start").run_id;
    paused(&rt, &run_id).await;
    rt.shutdown().await;
    // The resume removed the pause and died before it re-entered the run.
    let store = store(&sim);
    let mut batch = durafiber_store::Batch::new();
    batch.delete(durafiber_store::tables::keys::paused_kind("worker"));
    store.commit(batch, durafiber_store::Durability::Sync).await.expect("lift the pause");
    drop(store);
    let rt = open(&sim, &outside).await;
    completed(&rt, &run_id).await;
    assert_eq!(calls(&outside, &run_id), 2);
    rt.shutdown().await;
}
