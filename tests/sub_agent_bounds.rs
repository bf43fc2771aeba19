//! What a parent's bounds do to its sub-agents: its budget counts their effects and cost
//! units (a child stops at its parent's limit as at its own), pausing the parent's run or
//! kind holds them, and a child is deleted with its parent, never before it.

use durafiber_runtime::StartRequest;
use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use durafiber_runtime::{
    Agent, AgentError, Budget, Ctx, EffectError, RunOptions, RunStatus, Runtime, RuntimeError,
};
use durafiber_store::{RunId, Store, StoreConfig};
use serde::{Deserialize, Serialize};

/// The idempotency keys the outside world was called with.
type Upstream = Arc<Mutex<BTreeSet<String>>>;

/// An effect that records its key upstream.
async fn call<A: Agent>(ctx: &mut Ctx<A>, upstream: &Upstream, id: &str) -> Result<(), AgentError> {
    let upstream = upstream.clone();
    let _: String = ctx
        .effect(id, (), move |key, ()| {
            let upstream = upstream.clone();
            async move {
                upstream.lock().map_err(|_| EffectError::retryable("poisoned"))?.insert(key.clone());
                Ok::<String, EffectError>(key)
            }
        })
        .await?;
    Ok(())
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    turns: u32,
    cost_per_turn: u64,
    /// Waits for the event `go` before its first turn.
    wait_for_go: bool,
}

/// A sub-agent: per turn, charges and calls the upstream.
struct Helper {
    upstream: Upstream,
}

impl Agent for Helper {
    const KIND: &'static str = "helper";
    type Input = Job;
    type Stash = ();
    type Output = u32;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, job: Job) -> Result<u32, AgentError> {
        if job.wait_for_go {
            let _: Option<()> = ctx.wait_for_event("go", None).await?;
        }
        for turn in 0..job.turns {
            ctx.charge(job.cost_per_turn, "model call");
            call(ctx, &self.upstream, &format!("helper:{turn}")).await?;
        }
        Ok(job.turns)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Assignment {
    own_effects: u32,
    job: Job,
    /// Joins the child; else ends without waiting for it.
    join: bool,
}

/// Makes its own effects, starts a helper, and says how the helper ended.
struct Boss {
    upstream: Upstream,
}

impl Agent for Boss {
    const KIND: &'static str = "boss";
    type Input = Assignment;
    type Stash = ();
    type Output = String;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, a: Assignment) -> Result<String, AgentError> {
        for i in 0..a.own_effects {
            call(ctx, &self.upstream, &format!("boss:{i}")).await?;
        }
        let helper = ctx.start_child::<Helper>("helper", &a.job).await?;
        if !a.join {
            return Ok("left it".into());
        }
        match ctx.join(&helper).await {
            Ok(turns) => Ok(format!("{turns} turns")),
            Err(AgentError::ChildFailed { state, detail, .. }) => Ok(format!("{state}: {detail}")),
            Err(e) => Err(e),
        }
    }
}

async fn runtime(dir: &std::path::Path, upstream: &Upstream) -> Runtime {
    let store = Store::open_dir(dir, StoreConfig::default()).expect("store");
    Runtime::builder(store)
        .agent(Boss { upstream: upstream.clone() })
        .agent(Helper { upstream: upstream.clone() })
        .open()
        .await
        .expect("runtime")
}

async fn ended(rt: &Runtime, run_id: &RunId) -> RunStatus {
    tokio::time::timeout(Duration::from_secs(60), rt.wait(run_id)).await.expect("in time").expect("wait")
}

fn output(status: &RunStatus) -> String {
    match status {
        RunStatus::Completed { output_json } => serde_json::from_str(output_json).expect("a string"),
        other => panic!("not completed: {other:?}"),
    }
}

fn child_of(rt: &Runtime, parent: &RunId) -> RunId {
    rt.inspect(parent).expect("inspect").children.first().expect("a child").run_id.clone()
}

/// Polls (with a deadline) until `run_id`'s state satisfies `done`.
async fn until(rt: &Runtime, run_id: &RunId, what: &str, done: impl Fn(&RunStatus) -> bool) -> RunStatus {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = rt.inspect(run_id).expect("inspect").run.status;
        if done(&status) {
            return status;
        }
        assert!(Instant::now() < deadline, "{what}: still {status:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn with(budget: Budget) -> RunOptions {
    RunOptions { budget, ..RunOptions::default() }
}

fn job(turns: u32, cost_per_turn: u64, wait_for_go: bool) -> Job {
    Job { turns, cost_per_turn, wait_for_go }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parents_effects_budget_counts_its_childs_effects() {
    let upstream = Upstream::default();
    let dir = tempfile::tempdir().expect("dir");
    let rt = runtime(dir.path(), &upstream).await;
    let a = Assignment { own_effects: 2, job: job(10, 0, false), join: true };
    let budget = Budget { effects_max: Some(5), ..Budget::default() };
    let parent = rt
        .start_run(StartRequest::of::<Boss>("b-1", &a).expect("input").with_options(with(budget)))
        .await
        .expect("start")
        .run_id;
    let said = output(&ended(&rt, &parent).await);
    assert_eq!(
        said,
        format!("escalated: budget: effects, counted against run {parent}"),
        "the child stopped at its parent's limit, and the parent handled it"
    );
    let made = upstream.lock().expect("upstream").len();
    assert_eq!(made, 5, "two of the parent's effects and three of the child's: {made}");
    let child = child_of(&rt, &parent);
    let spent = rt.inspect(&child).expect("inspect").budget.expect("the child's spending").spent;
    assert_eq!(spent.effects, 3, "the child's own count");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parents_cost_budget_counts_its_childs_cost_units() {
    let upstream = Upstream::default();
    let dir = tempfile::tempdir().expect("dir");
    let rt = runtime(dir.path(), &upstream).await;
    let a = Assignment { own_effects: 0, job: job(10, 4, false), join: true };
    let budget = Budget { cost_units_max: Some(10), ..Budget::default() };
    let parent = rt
        .start_run(StartRequest::of::<Boss>("b-2", &a).expect("input").with_options(with(budget)))
        .await
        .expect("start")
        .run_id;
    let said = output(&ended(&rt, &parent).await);
    assert_eq!(said, format!("escalated: budget: cost_units, counted against run {parent}"));
    // 4 and 8 units are within 10; the third turn's charge crosses it before its call.
    assert_eq!(upstream.lock().expect("upstream").len(), 2);
    // Without a limit above it, the same child makes every call.
    let free = rt.start::<Boss>("b-3", &a).await.expect("start").run_id;
    assert_eq!(output(&ended(&rt, &free).await), "10 turns");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pausing_a_parent_or_its_kind_holds_its_child_until_the_resume() {
    let upstream = Upstream::default();
    let dir = tempfile::tempdir().expect("dir");
    let rt = runtime(dir.path(), &upstream).await;
    for (i, by_kind) in [false, true].into_iter().enumerate() {
        upstream.lock().expect("upstream").clear();
        let a = Assignment { own_effects: 0, job: job(2, 0, true), join: true };
        let parent = rt.start::<Boss>(&format!("p-{i}"), &a).await.expect("start").run_id;
        let waiting = |s: &RunStatus| matches!(s, RunStatus::WaitingEvent { .. });
        until(&rt, &parent, "the parent joins", waiting).await;
        let child = child_of(&rt, &parent);
        until(&rt, &child, "the child waits for go", waiting).await;
        match by_kind {
            false => rt.pause_run(&parent, "checking the plan").await.expect("pause"),
            true => rt.pause_kind("boss", "checking the plan").await.expect("pause"),
        }
        rt.send_event(&child, "go", &(), None).await.expect("go");
        let held = until(&rt, &child, "the child is held", |s| matches!(s, RunStatus::Paused { .. })).await;
        let RunStatus::Paused { reason } = held else { unreachable!() };
        assert!(reason.contains(&format!("run {parent} above it is paused")), "{reason}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(upstream.lock().expect("upstream").is_empty(), "no effect of the child while held");
        let resumed = match by_kind {
            false => rt.resume_run(&parent).await.expect("resume"),
            true => rt.resume_kind("boss").await.expect("resume"),
        };
        assert!(resumed);
        assert_eq!(output(&ended(&rt, &parent).await), "2 turns");
        assert_eq!(upstream.lock().expect("upstream").len(), 2);
    }
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_is_deleted_with_its_parent_and_an_open_child_is_left_on_its_own() {
    let upstream = Upstream::default();
    let dir = tempfile::tempdir().expect("dir");
    let rt = runtime(dir.path(), &upstream).await;
    let a = Assignment { own_effects: 1, job: job(1, 0, false), join: true };
    let parent = rt.start::<Boss>("d-1", &a).await.expect("start").run_id;
    assert_eq!(output(&ended(&rt, &parent).await), "1 turns");
    let child = child_of(&rt, &parent);
    match rt.delete_run(&child).await {
        Err(RuntimeError::KeptWithParent { run_id, parent: p }) => {
            assert_eq!((run_id, p), (child.clone(), parent.clone()));
        }
        other => panic!("a child went before its parent: {other:?}"),
    }
    let deleted = rt.delete_run(&parent).await.expect("delete");
    assert!(deleted.records > 2, "{deleted:?}");
    assert!(matches!(rt.inspect(&child), Err(RuntimeError::UnknownRun { .. })), "the child went with it");

    // A parent that ended without waiting for its child: the child is left, on its own.
    let a = Assignment { own_effects: 0, job: job(1, 0, true), join: false };
    let parent = rt.start::<Boss>("d-2", &a).await.expect("start").run_id;
    assert_eq!(output(&ended(&rt, &parent).await), "left it");
    let child = child_of(&rt, &parent);
    rt.delete_run(&parent).await.expect("delete");
    let alone = rt.inspect(&child).expect("the open child stays");
    assert!(alone.parent.is_none(), "no one's child now");
    rt.send_event(&child, "go", &(), None).await.expect("go");
    assert!(matches!(ended(&rt, &child).await, RunStatus::Completed { .. }));
    rt.delete_run(&child).await.expect("deleted on its own");
    rt.shutdown().await;
}
