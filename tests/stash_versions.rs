//! Stash versions across deploys: version 2 of an agent, whose `Stash` gained a field
//! without a default, deployed over a store of version 1 runs — crashed at every boundary
//! on the crash-simulating store — finishes every run through `upgrade_stash`. A stash newer
//! than the code, an older one without an upgrade, and a stash that does not decode as the
//! version it claims escalate with both versions named; nothing panics, nothing defaults.

use std::sync::Arc;

use durafiber_runtime::{Agent, AgentError, Ctx, ListFilter, Recovered, RunStatus, Runtime, RuntimeConfig};
use durafiber_store::{RunId, SimBackend, SimCrash, Store, StoreConfig};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ProgressV1 {
    done: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ProgressV2 {
    done: u32,
    /// New in version 2, with no serde default: a version 1 stash does not decode as it.
    origin: String,
}

/// What version 2 returns: how far it got, and where the progress it resumed from came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Outcome {
    done: u32,
    resumed_origin: Option<String>,
}

/// Counts to `input`, one stash per step; waits for cancellation after step `park_at`
/// (0: never), so that runs stay open across a deploy.
#[derive(Clone, Copy, Serialize, Deserialize)]
struct Input {
    steps: u32,
    park_at: u32,
}

#[derive(Default)]
struct CounterV1;

impl CounterV1 {
    async fn count(&self, ctx: &mut Ctx<Self>, input: Input, from: u32) -> Result<Outcome, AgentError> {
        for done in from + 1..=input.steps {
            ctx.stash(&format!("step-{done}"), &ProgressV1 { done }).await?;
            if done == input.park_at {
                ctx.cancelled().await;
                return Err(AgentError::Cancelled("parked".into()));
            }
        }
        finished_at_once(input)
    }
}

impl Agent for CounterV1 {
    const KIND: &'static str = "counter";
    type Input = Input;
    type Stash = ProgressV1;
    type Output = Outcome;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, input: Input) -> Result<Outcome, AgentError> {
        self.count(ctx, input, 0).await
    }

    async fn on_fiber_recovered(
        &self,
        ctx: &mut Ctx<Self>,
        r: Recovered<Self>,
    ) -> Result<Outcome, AgentError> {
        self.count(ctx, r.input, r.stash.map_or(0, |s| s.done)).await
    }
}

/// Version 2: it knows version 1's shape.
#[derive(Default)]
struct CounterV2;

impl CounterV2 {
    async fn count(
        &self,
        ctx: &mut Ctx<Self>,
        input: Input,
        from: u32,
        resumed_origin: Option<String>,
    ) -> Result<Outcome, AgentError> {
        for done in from + 1..=input.steps {
            ctx.stash(&format!("step-{done}"), &ProgressV2 { done, origin: "v2".into() }).await?;
        }
        Ok(Outcome { done: input.steps, resumed_origin })
    }
}

/// Version 2's upgrade from version 1, shared by both version 2 agents below.
fn upgrade_from_v1(from_version: u32, old: serde_json::Value) -> Result<ProgressV2, AgentError> {
    match from_version {
        1 => {
            let v1: ProgressV1 = serde_json::from_value(old).map_err(|e| AgentError::fail(e.to_string()))?;
            Ok(ProgressV2 { done: v1.done, origin: "upgraded from v1".into() })
        }
        v => Err(AgentError::escalate(format!("stash_version: no upgrade from {v}"))),
    }
}

impl Agent for CounterV2 {
    const KIND: &'static str = "counter";
    const STASH_VERSION: u32 = 2;
    type Input = Input;
    type Stash = ProgressV2;
    type Output = Outcome;
    type Message = ();

    fn upgrade_stash(from_version: u32, old: serde_json::Value) -> Result<ProgressV2, AgentError> {
        upgrade_from_v1(from_version, old)
    }

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, input: Input) -> Result<Outcome, AgentError> {
        self.count(ctx, input, 0, None).await
    }

    async fn on_fiber_recovered(
        &self,
        ctx: &mut Ctx<Self>,
        r: Recovered<Self>,
    ) -> Result<Outcome, AgentError> {
        let (from, origin) = r.stash.map_or((0, None), |s| (s.done, Some(s.origin)));
        self.count(ctx, r.input, from, origin).await
    }
}

/// Version 2 deployed without an upgrade: a version 1 stash escalates its run.
#[derive(Default)]
struct CounterV2Bare;

impl Agent for CounterV2Bare {
    const KIND: &'static str = "counter";
    const STASH_VERSION: u32 = 2;
    type Input = Input;
    type Stash = ProgressV2;
    type Output = Outcome;
    type Message = ();

    async fn run_fiber(&self, _: &mut Ctx<Self>, input: Input) -> Result<Outcome, AgentError> {
        finished_at_once(input)
    }

    async fn on_fiber_recovered(&self, _: &mut Ctx<Self>, r: Recovered<Self>) -> Result<Outcome, AgentError> {
        recovered_as_is(r.stash)
    }
}

/// Version 1 again, but forgetting to bump the version after changing the type.
#[derive(Default)]
struct CounterV1Changed;

impl Agent for CounterV1Changed {
    const KIND: &'static str = "counter";
    type Input = Input;
    type Stash = ProgressV2;
    type Output = Outcome;
    type Message = ();

    async fn run_fiber(&self, _: &mut Ctx<Self>, input: Input) -> Result<Outcome, AgentError> {
        finished_at_once(input)
    }

    async fn on_fiber_recovered(&self, _: &mut Ctx<Self>, r: Recovered<Self>) -> Result<Outcome, AgentError> {
        recovered_as_is(r.stash)
    }
}

/// Version 2 whose upgrade has a bug that panics.
#[derive(Default)]
struct CounterV2Panicking;

impl Agent for CounterV2Panicking {
    const KIND: &'static str = "counter";
    const STASH_VERSION: u32 = 2;
    type Input = Input;
    type Stash = ProgressV2;
    type Output = Outcome;
    type Message = ();

    fn upgrade_stash(_: u32, _: serde_json::Value) -> Result<ProgressV2, AgentError> {
        panic!("the upgrade has a bug")
    }

    async fn run_fiber(&self, _: &mut Ctx<Self>, input: Input) -> Result<Outcome, AgentError> {
        finished_at_once(input)
    }

    async fn on_fiber_recovered(&self, _: &mut Ctx<Self>, r: Recovered<Self>) -> Result<Outcome, AgentError> {
        recovered_as_is(r.stash)
    }
}

/// The fiber of the test agents that only decode: done at once.
fn finished_at_once(input: Input) -> Result<Outcome, AgentError> {
    Ok(Outcome { done: input.steps, resumed_origin: None })
}

/// Their recovery: done where the (version 2) stash says.
fn recovered_as_is(stash: Option<ProgressV2>) -> Result<Outcome, AgentError> {
    Ok(Outcome { done: stash.map_or(0, |s| s.done), resumed_origin: None })
}

fn store(sim: &SimBackend) -> Store {
    Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store")
}

async fn open<A: Agent>(sim: &SimBackend, agent: A) -> Runtime {
    Runtime::builder(store(sim)).agent(agent).open().await.expect("runtime")
}

/// Version 1 crashed at `point`, then version 2 deployed over what the disk kept. Returns
/// false when version 1 finished before the crash point.
async fn deploy_v2_after_crash(point: SimCrash) -> bool {
    let sim = SimBackend::new();
    let mut crashed = sim.crashed_signal();
    sim.crash_at(point);
    let v1 = open(&sim, CounterV1).await;
    let input = Input { steps: 4, park_at: 0 };
    if let Ok(out) = v1.start::<CounterV1>("run", &input).await {
        tokio::select! {
            status = v1.wait(&out.run_id) => {
                if matches!(status, Ok(RunStatus::Completed { .. })) && !sim.is_crashed() {
                    v1.shutdown().await;
                    return false;
                }
            }
            _ = crashed.wait_for(|c| *c) => {}
        }
    }
    v1.shutdown().await;
    assert!(sim.is_crashed(), "{point:?}: the store should have crashed");
    sim.revive();

    let v2 = open(&sim, CounterV2).await;
    // The caller retries its start with the same key: the same run, or a new one if the
    // accept itself was lost.
    let id = v2.start::<CounterV2>("run", &input).await.expect("start").run_id;
    let status = v2.wait(&id).await.expect("wait");
    assert!(matches!(status, RunStatus::Completed { .. }), "{point:?}: {status:?}");
    let out: Outcome = v2.output(&id).expect("output").expect("completed");
    assert_eq!(out.done, 4, "{point:?}");
    if let Some(origin) = &out.resumed_origin {
        // Recovered from a stash: a version 1 one, upgraded, or version 2's own.
        assert!(origin == "upgraded from v1" || origin == "v2", "{point:?}: {origin}");
    }
    // Version 2 stashed from where it resumed; a version 1 stash stays only when it was the
    // last step already (then version 2 had nothing left to stash).
    match v2.stash_version(&id).expect("version") {
        Some(2) => {}
        Some(1) => {
            let stash = v2.inspect(&id).expect("inspect").stash.expect("a stash");
            assert_eq!(stash.step, "step-4", "{point:?}: a version 1 stash short of the end was kept");
            // Upgraded and finished by version 2, or finished by version 1 before the crash.
            let origin = out.resumed_origin.as_deref();
            assert!(origin.is_none_or(|o| o == "upgraded from v1"), "{point:?}: {origin:?}");
        }
        other => panic!("{point:?}: stash version {other:?}"),
    }
    v2.shutdown().await;
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_2_finishes_version_1_runs_crashed_at_every_boundary() {
    let mut reached = 0;
    let mut upgraded = 0;
    for n in 1..=30 {
        let before = deploy_v2_after_crash(SimCrash::AfterApply(n)).await;
        let after = deploy_v2_after_crash(SimCrash::AfterBarrier(n)).await;
        if !before && !after {
            break;
        }
        reached += 1;
        upgraded += usize::from(after);
    }
    // accept + registration + 4 stashes + finish.
    assert!(reached >= 7, "only {reached} crash points were reached");
    assert!(upgraded >= 4, "version 1 stashes were upgraded after only {upgraded} crash points");
}

/// Five version 1 runs parked mid-way: the deploy's list finds them; version 2 upgrades and
/// finishes each; the list is empty afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_lists_the_runs_it_must_carry_then_carries_them() {
    let sim = SimBackend::new();
    let v1 = open(&sim, CounterV1).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let out =
            v1.start::<CounterV1>(&format!("run-{i}"), &Input { steps: 6, park_at: 2 }).await.expect("start");
        ids.push(out.run_id);
    }
    for id in &ids {
        while v1.stash_version(id).expect("version").is_none()
            || v1.inspect(id).expect("inspect").stash.is_none_or(|s| s.seq < 2)
        {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
    v1.shutdown().await;

    let below_2 = ListFilter { limit: 100, stash_version_below: Some(2), ..Default::default() };
    let passive = Runtime::builder(store(&sim)).agent(CounterV2).passive().open().await.expect("passive");
    let to_carry: Vec<RunId> =
        passive.list(&below_2).expect("list").runs.into_iter().map(|r| r.run_id).collect();
    assert_eq!(to_carry.len(), 5, "{to_carry:?}");
    assert!(
        passive
            .list(&ListFilter { stash_version_below: Some(1), ..below_2.clone() })
            .expect("list")
            .runs
            .is_empty()
    );
    passive.shutdown().await;

    let v2 = open(&sim, CounterV2).await;
    for id in &ids {
        assert!(matches!(v2.wait(id).await.expect("wait"), RunStatus::Completed { .. }));
        let out: Outcome = v2.output(id).expect("output").expect("completed");
        assert_eq!(out, Outcome { done: 6, resumed_origin: Some("upgraded from v1".into()) });
    }
    assert!(v2.list(&below_2).expect("list").runs.is_empty(), "every run was carried");
    v2.shutdown().await;
}

/// Opens `agent` over a store holding one run of `CounterV1` parked after its first stash,
/// and returns the run's escalation reason.
async fn escalation_reason<A: Agent>(sim: &SimBackend, id: &RunId, agent: A) -> String {
    let rt = open(sim, agent).await;
    let status = rt.wait(id).await.expect("wait");
    rt.shutdown().await;
    match status {
        RunStatus::Escalated { reason } => reason,
        other => panic!("expected an escalation, got {other:?}"),
    }
}

async fn parked_v1_run(sim: &SimBackend) -> RunId {
    let v1 = open(sim, CounterV1).await;
    let id = v1.start::<CounterV1>("parked", &Input { steps: 3, park_at: 1 }).await.expect("start").run_id;
    while v1.inspect(&id).expect("inspect").stash.is_none() {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    v1.shutdown().await;
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_stash_without_an_upgrade_escalates_naming_both_versions() {
    let sim = SimBackend::new();
    let id = parked_v1_run(&sim).await;
    let reason = escalation_reason(&sim, &id, CounterV2Bare).await;
    assert!(reason.starts_with("stash_version:"), "{reason}");
    assert!(reason.contains("version 1") && reason.contains("version 2"), "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stash_newer_than_the_code_escalates_naming_both_versions() {
    // Version 2 writes a version 2 stash and parks; then version 1 is rolled back in.
    let sim = SimBackend::new();
    let id = {
        let rt = open(&sim, ParkingV2).await;
        let id = rt.start::<ParkingV2>("newer", &Input { steps: 3, park_at: 1 }).await.expect("start").run_id;
        while rt.stash_version(&id).expect("version") != Some(2) {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        rt.shutdown().await;
        id
    };
    let reason = escalation_reason(&sim, &id, CounterV1).await;
    assert!(reason.starts_with("stash_version:") && reason.contains("newer"), "{reason}");
    assert!(reason.contains("version 2") && reason.contains("version 1"), "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_stash_type_without_a_version_bump_escalates_with_the_fix() {
    let sim = SimBackend::new();
    let id = parked_v1_run(&sim).await;
    let reason = escalation_reason(&sim, &id, CounterV1Changed).await;
    assert!(reason.starts_with("stash_version:"), "{reason}");
    assert!(reason.contains("bump Agent::STASH_VERSION"), "{reason}");
}

/// Version 2 that parks after step `park_at`, for the rollback test.
#[derive(Default)]
struct ParkingV2;

impl Agent for ParkingV2 {
    const KIND: &'static str = "counter";
    const STASH_VERSION: u32 = 2;
    type Input = Input;
    type Stash = ProgressV2;
    type Output = Outcome;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, input: Input) -> Result<Outcome, AgentError> {
        ctx.stash("step-1", &ProgressV2 { done: 1, origin: "v2".into() }).await?;
        ctx.cancelled().await;
        finished_at_once(input)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_that_panics_fails_the_recovery_and_never_strands_the_run() {
    // The stash is upgraded before the recovery hook's future exists: a panic there is the
    // recovery's, counted like one inside the hook, and here (one attempt allowed) escalates.
    let sim = SimBackend::new();
    let id = parked_v1_run(&sim).await;
    let config = RuntimeConfig { max_recover_attempts: 1, ..RuntimeConfig::default() };
    let rt =
        Runtime::builder(store(&sim)).config(config).agent(CounterV2Panicking).open().await.expect("runtime");
    let status = tokio::time::timeout(std::time::Duration::from_secs(60), rt.wait(&id))
        .await
        .expect("the run was left behind")
        .expect("wait");
    rt.shutdown().await;
    match status {
        RunStatus::Escalated { reason } => {
            assert!(
                reason.contains("recovery hook failed") && reason.contains("the upgrade has a bug"),
                "{reason}"
            );
        }
        other => panic!("expected an escalation, got {other:?}"),
    }
}

/// The check before a deploy with the agents `builder` registers, on a passive runtime.
async fn check(
    sim: &SimBackend,
    builder: impl FnOnce(Store) -> durafiber_runtime::RuntimeBuilder,
) -> Vec<durafiber_runtime::DeployProblem> {
    let runtime = builder(store(sim)).passive().open().await.expect("passive");
    let problems = runtime.check_deploy().expect("check");
    runtime.shutdown().await;
    problems
}

/// The check before a deploy, run with each version 2 against a store of version 1 runs:
/// three parked mid-way, one finished. Without an upgrade, or with one that panics, it lists
/// exactly the three open runs; with the upgrade, none; a binary without the kind lists them
/// as not hosted. Nothing in the store changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_before_a_deploy_lists_exactly_the_runs_the_new_code_would_escalate() {
    let sim = SimBackend::new();
    let v1 = open(&sim, CounterV1).await;
    let mut parked = Vec::new();
    for i in 0..3 {
        let input = Input { steps: 6, park_at: 2 };
        parked.push(v1.start::<CounterV1>(&format!("parked-{i}"), &input).await.expect("start").run_id);
    }
    let done = v1.start::<CounterV1>("done", &Input { steps: 2, park_at: 0 }).await.expect("start").run_id;
    assert!(matches!(v1.wait(&done).await.expect("wait"), RunStatus::Completed { .. }));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    for id in &parked {
        while v1.inspect(id).expect("inspect").stash.is_none_or(|s| s.seq < 2) {
            assert!(std::time::Instant::now() < deadline, "{id} never stashed twice");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
    v1.shutdown().await;
    parked.sort();
    let before = store(&sim).snapshot().await.expect("snapshot");

    let ids = |problems: &[durafiber_runtime::DeployProblem]| {
        let mut ids: Vec<RunId> = problems.iter().map(|p| p.run_id.clone()).collect();
        ids.sort();
        ids
    };

    let bare = check(&sim, |s| Runtime::builder(s).agent(CounterV2Bare)).await;
    assert_eq!(ids(&bare), parked, "{bare:?}");
    for p in &bare {
        assert_eq!(p.kind, "counter");
        assert!(p.reason.contains("stash") && p.reason.contains('1') && p.reason.contains('2'), "{p}");
    }
    let panicking = check(&sim, |s| Runtime::builder(s).agent(CounterV2Panicking)).await;
    assert_eq!(ids(&panicking), parked, "{panicking:?}");
    assert!(panicking.iter().all(|p| p.reason.contains("the upgrade has a bug")), "{panicking:?}");
    let unhosted = check(&sim, Runtime::builder).await;
    assert_eq!(ids(&unhosted), parked, "{unhosted:?}");
    assert!(unhosted.iter().all(|p| p.reason.contains("not registered")), "{unhosted:?}");
    let fixed = check(&sim, |s| Runtime::builder(s).agent(CounterV2)).await;
    assert!(fixed.is_empty(), "{fixed:?}");
    let v1_again = check(&sim, |s| Runtime::builder(s).agent(CounterV1)).await;
    assert!(v1_again.is_empty(), "{v1_again:?}");

    assert!(store(&sim).snapshot().await.expect("snapshot") == before, "the check changed the store");
}
