//! Budgets per run: a run stops at its next boundary with `Escalated{budget: <which>}` once
//! it crosses its effects, cost units, wall time or recoveries limit, and starts no effect
//! past it — also when the store crashes at every barrier on the way; spending shows in
//! inspection.

use durafiber_runtime::StartRequest;
use durafiber_runtime::Timestamp;
use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
    time::Duration,
};

use durafiber_demo::sim::SIM_EPOCH_MS as T0;
use durafiber_runtime::{
    Agent, AgentError, Budget, Ctx, EffectError, Recovered, RunOptions, RunStatus, Runtime, RuntimeConfig,
    clock::VirtualClock,
};
use durafiber_store::{RunId, SimBackend, SimCrash, Store, StoreConfig};
use serde::{Deserialize, Serialize};

/// The idempotency keys the outside world was called with.
type Upstream = Arc<Mutex<BTreeSet<String>>>;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Plan {
    /// Effects to perform, one per turn.
    turns: u32,
    /// Cost units charged per turn.
    cost_per_turn: u64,
    /// A durable sleep before the turns, ms.
    sleep_first_ms: u64,
}

/// Per turn: charge, call the upstream through an effect, stash the turn.
struct Spender {
    upstream: Upstream,
}

impl Spender {
    async fn turns(&self, ctx: &mut Ctx<Self>, plan: Plan, from: u32) -> Result<u32, AgentError> {
        if plan.sleep_first_ms > 0 {
            ctx.sleep_for("first", Duration::from_millis(plan.sleep_first_ms)).await?;
        }
        for turn in from..plan.turns {
            ctx.charge(plan.cost_per_turn, "model call");
            let upstream = self.upstream.clone();
            let _: String = ctx
                .effect(&format!("call:{turn}"), turn, move |key, _| {
                    let upstream = upstream.clone();
                    async move {
                        upstream.lock().map_err(|_| EffectError::retryable("poisoned"))?.insert(key.clone());
                        Ok::<String, EffectError>(key)
                    }
                })
                .await?;
            ctx.stash("turn", &(turn + 1)).await?;
        }
        Ok(plan.turns)
    }
}

impl Agent for Spender {
    const KIND: &'static str = "spender";
    type Input = Plan;
    type Stash = u32;
    type Output = u32;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, plan: Plan) -> Result<u32, AgentError> {
        self.turns(ctx, plan, 0).await
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, r: Recovered<Self>) -> Result<u32, AgentError> {
        self.turns(ctx, r.input, r.stash.unwrap_or(0)).await
    }
}

fn store(sim: &SimBackend) -> Store {
    Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store")
}

async fn open(sim: &SimBackend, upstream: &Upstream, config: RuntimeConfig) -> Runtime {
    Runtime::builder(store(sim))
        .config(config)
        .virtual_clock(VirtualClock::new(Timestamp::from_millis(T0)))
        .agent(Spender { upstream: upstream.clone() })
        .open()
        .await
        .expect("runtime")
}

fn plan(turns: u32, cost_per_turn: u64) -> Plan {
    Plan { turns, cost_per_turn, sleep_first_ms: 0 }
}

fn with(budget: Budget) -> RunOptions {
    RunOptions { budget, ..RunOptions::default() }
}

async fn escalated(rt: &Runtime, run_id: &RunId) -> String {
    let status = tokio::time::timeout(Duration::from_secs(60), rt.wait(run_id)).await.expect("the run ends");
    match status.expect("status") {
        RunStatus::Escalated { reason } => reason,
        other => panic!("expected a budget stop, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_effects_budget_starts_no_effect_past_it() {
    let upstream = Upstream::default();
    let rt = open(&SimBackend::new(), &upstream, RuntimeConfig::default()).await;
    let budget = Budget { effects_max: Some(2), ..Budget::default() };
    let run_id = rt
        .start_run(StartRequest::of::<Spender>("e", &plan(5, 0)).expect("input").with_options(with(budget)))
        .await
        .expect("start")
        .run_id;
    assert_eq!(escalated(&rt, &run_id).await, "budget: effects");
    assert_eq!(
        upstream.lock().expect("upstream").len(),
        2,
        "exactly the budgeted effects reached the outside"
    );
    let spent = rt.inspect(&run_id).expect("inspect").budget.expect("a budget").spent;
    assert_eq!(spent.effects, 2);
    assert_eq!(rt.metrics().budget_stops, 1);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn charges_past_the_cost_limit_stop_the_run_at_its_next_boundary() {
    let upstream = Upstream::default();
    let rt = open(&SimBackend::new(), &upstream, RuntimeConfig::default()).await;
    let budget = Budget { cost_units_max: Some(100), ..Budget::default() };
    let run_id = rt
        .start_run(StartRequest::of::<Spender>("c", &plan(10, 30)).expect("input").with_options(with(budget)))
        .await
        .expect("start")
        .run_id;
    assert_eq!(escalated(&rt, &run_id).await, "budget: cost_units");
    // Turns 1-3 charge 90; turn 4's charge (120) is over, and its effect does not start.
    assert_eq!(upstream.lock().expect("upstream").len(), 3);
    let spent = rt.inspect(&run_id).expect("inspect").budget.expect("a budget").spent;
    assert_eq!(spent.cost_units, 120, "the crossing charge is recorded with the stopping boundary");
    assert_eq!(rt.metrics().cost_units, 120);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wall_time_counts_from_the_start_across_a_durable_sleep() {
    let upstream = Upstream::default();
    let rt = open(&SimBackend::new(), &upstream, RuntimeConfig::default()).await;
    let budget = Budget { wall_time_max: Some(Duration::from_secs(3600)), ..Budget::default() };
    let slow = Plan { sleep_first_ms: 2 * 3_600_000, ..plan(1, 0) };
    let run_id = rt
        .start_run(StartRequest::of::<Spender>("w", &slow).expect("input").with_options(with(budget)))
        .await
        .expect("start")
        .run_id;
    rt.advance(Duration::from_secs(3 * 3600)).await.expect("advance");
    assert_eq!(escalated(&rt, &run_id).await, "budget: wall_time");
    assert!(upstream.lock().expect("upstream").is_empty());
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_budget_applies_where_a_run_sets_none() {
    let upstream = Upstream::default();
    let config = RuntimeConfig {
        budget: Budget { effects_max: Some(1), ..Budget::default() },
        ..RuntimeConfig::default()
    };
    let rt = open(&SimBackend::new(), &upstream, config).await;
    let run_id = rt.start::<Spender>("d", &plan(3, 0)).await.expect("start").run_id;
    assert_eq!(escalated(&rt, &run_id).await, "budget: effects");
    // A run's own limit wins over the runtime's.
    let own = Budget { effects_max: Some(3), ..Budget::default() };
    let run_id = rt
        .start_run(StartRequest::of::<Spender>("o", &plan(3, 0)).expect("input").with_options(with(own)))
        .await
        .expect("start")
        .run_id;
    assert!(matches!(rt.wait(&run_id).await.expect("wait"), RunStatus::Completed { .. }));
    // A run without any budget keeps no budget record.
    let rt2 = open(&SimBackend::new(), &upstream, RuntimeConfig::default()).await;
    let run_id = rt2.start::<Spender>("n", &plan(1, 0)).await.expect("start").run_id;
    rt2.wait(&run_id).await.expect("wait");
    assert!(rt2.inspect(&run_id).expect("inspect").budget.is_none());
    rt.shutdown().await;
    rt2.shutdown().await;
}

/// Waits in memory forever after its first stash: every restart is a recovery.
struct Sitter;

impl Agent for Sitter {
    const KIND: &'static str = "sitter";
    type Input = ();
    type Stash = ();
    type Output = ();
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<(), AgentError> {
        ctx.stash("sat", &()).await?;
        ctx.cancelled().await;
        Ok(())
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, _: Recovered<Self>) -> Result<(), AgentError> {
        ctx.stash("sat again", &()).await?;
        ctx.cancelled().await;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recoveries_budget_escalates_instead_of_recovering_once_more() {
    let sim = SimBackend::new();
    let open_sitter = || async { Runtime::builder(store(&sim)).agent(Sitter).open().await.expect("runtime") };
    let rt = open_sitter().await;
    let budget = Budget { recoveries_max: Some(2), ..Budget::default() };
    let run_id = rt
        .start_run(StartRequest::of::<Sitter>("s", &()).expect("input").with_options(with(budget)))
        .await
        .expect("start")
        .run_id;
    rt.wait_for(&run_id, |s| matches!(s, RunStatus::Running)).await.expect("running");
    rt.settle().await;
    rt.shutdown().await;
    for recovery in 1..=2 {
        let rt = open_sitter().await;
        rt.settle().await;
        assert_eq!(rt.status(&run_id).expect("status"), RunStatus::Running, "recovery {recovery} is allowed");
        rt.shutdown().await;
    }
    let rt = open_sitter().await;
    assert_eq!(escalated(&rt, &run_id).await, "budget: recoveries");
    rt.shutdown().await;
}

/// The recovery scan reads the budget keys of a batch's range at once; a run among them
/// with a budget still has its record read, one without is recovered without a read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovered_together_only_the_runs_with_a_recoveries_budget_escalate() {
    let sim = SimBackend::new();
    let open_sitter = || async { Runtime::builder(store(&sim)).agent(Sitter).open().await.expect("runtime") };
    let rt = open_sitter().await;
    let mut runs = Vec::new();
    for i in 0..40 {
        let budgeted = i % 3 == 0;
        let budget = Budget { recoveries_max: budgeted.then_some(1), ..Budget::default() };
        let run_id = rt
            .start_run(
                StartRequest::of::<Sitter>(&format!("s-{i:02}"), &())
                    .expect("input")
                    .with_options(with(budget)),
            )
            .await
            .expect("start")
            .run_id;
        runs.push((run_id, budgeted));
    }
    for (run_id, _) in &runs {
        rt.wait_for(run_id, |s| matches!(s, RunStatus::Running)).await.expect("running");
    }
    rt.settle().await;
    rt.shutdown().await;
    // The first restart is a recovery every run may have.
    let rt = open_sitter().await;
    rt.settle().await;
    for (run_id, _) in &runs {
        assert_eq!(rt.status(run_id).expect("status"), RunStatus::Running, "{run_id}: first recovery");
    }
    rt.shutdown().await;
    let rt = open_sitter().await;
    for (run_id, budgeted) in &runs {
        if *budgeted {
            assert_eq!(escalated(&rt, run_id).await, "budget: recoveries", "{run_id}");
        }
    }
    rt.settle().await;
    for (run_id, budgeted) in &runs {
        if !budgeted {
            assert_eq!(rt.status(run_id).expect("status"), RunStatus::Running, "{run_id} has no budget");
        }
    }
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_at_every_barrier_never_lets_an_effect_past_the_budget() {
    let budget = Budget { effects_max: Some(3), ..Budget::default() };
    let mut crashes = 0;
    for n in 1..=30 {
        let sim = SimBackend::new();
        let upstream = Upstream::default();
        let mut crashed = sim.crashed_signal();
        sim.crash_at(SimCrash::AfterBarrier(n));
        let rt = open(&sim, &upstream, RuntimeConfig::default()).await;
        if let Ok(out) = rt
            .start_run(
                StartRequest::of::<Spender>("x", &plan(6, 0)).expect("input").with_options(with(budget)),
            )
            .await
        {
            tokio::select! {
                _ = rt.wait(&out.run_id) => {}
                _ = crashed.wait_for(|c| *c) => {}
            }
        }
        rt.shutdown().await;
        crashes += usize::from(sim.is_crashed());
        sim.revive();
        let rt = open(&sim, &upstream, RuntimeConfig::default()).await;
        let run_id = rt
            .start_run(
                StartRequest::of::<Spender>("x", &plan(6, 0)).expect("input").with_options(with(budget)),
            )
            .await
            .expect("start")
            .run_id;
        assert_eq!(escalated(&rt, &run_id).await, "budget: effects", "barrier {n}");
        assert_eq!(upstream.lock().expect("upstream").len(), 3, "barrier {n}: keys called");
        rt.shutdown().await;
    }
    assert!(crashes >= 10, "only {crashes} crash points were reached");
}
