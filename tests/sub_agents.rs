//! Sub-agents (`Ctx::start_child`, `Ctx::join`): a parent crashed at every boundary, with
//! every write lost, killed between effects' calls and receipts and evicted everywhere makes
//! each child once and joins each once; a child's failure reaches the parent's join as an
//! error it handles; parent and children are linked in inspection; cancelling a parent
//! cancels its open children.

use std::{sync::Arc, time::Duration};

use durafiber_runtime::{Agent, AgentError, Ctx, ListFilter, Recovered, RunState, RunStatus, Runtime};
use durafiber_store::{Store, StoreConfig};
use durafiber_testkit::{
    check::AgentCheck,
    upstream::{Upstream, post_idempotent},
};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Makes one part upstream and says which; an item called "bad" fails.
#[derive(Clone, Default)]
struct Worker;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Part {
    upstream: String,
    item: String,
}

impl Agent for Worker {
    const KIND: &'static str = "worker";
    type Input = Part;
    type Stash = ();
    type Output = String;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, part: Part) -> Result<String, AgentError> {
        if part.item == "bad" {
            return Err(AgentError::fail("no such item"));
        }
        let http = reqwest::Client::new();
        let made: serde_json::Value = ctx
            .effect("make", part.clone(), move |key, part| {
                let http = http.clone();
                async move {
                    post_idempotent(&http, &part.upstream, "parts", &key, None, &json!({"item": part.item}))
                        .await
                }
            })
            .await?;
        // What was made, as the upstream recorded it (its ids depend on which child came first).
        Ok(format!("made {}", made["request"]["item"].as_str().unwrap_or_default()))
    }

    async fn on_fiber_recovered(
        &self,
        ctx: &mut Ctx<Self>,
        r: Recovered<Self>,
    ) -> Result<String, AgentError> {
        self.run_fiber(ctx, r.input).await
    }
}

/// Starts a worker per item, then joins each: what each made, or why it failed.
#[derive(Clone, Default)]
struct Planner;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Plan {
    upstream: String,
    items: Vec<String>,
}

impl Agent for Planner {
    const KIND: &'static str = "planner";
    type Input = Plan;
    type Stash = ();
    type Output = Vec<String>;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, plan: Plan) -> Result<Vec<String>, AgentError> {
        let mut children = Vec::new();
        for (i, item) in plan.items.iter().enumerate() {
            let part = Part { upstream: plan.upstream.clone(), item: item.clone() };
            children.push(ctx.start_child::<Worker>(&format!("part-{i}"), &part).await?);
        }
        let mut made = Vec::new();
        for child in &children {
            match ctx.join(child).await {
                Ok(id) => made.push(id),
                Err(AgentError::ChildFailed { name, state, detail, .. }) => {
                    made.push(format!("{name} {state}: {detail}"));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(made)
    }

    async fn on_fiber_recovered(
        &self,
        ctx: &mut Ctx<Self>,
        r: Recovered<Self>,
    ) -> Result<Vec<String>, AgentError> {
        // Started again, the children are the same runs; joined again, their ends.
        self.run_fiber(ctx, r.input).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_crashed_and_evicted_everywhere_makes_each_child_once_and_joins_each_once() {
    let upstream = Arc::new(Upstream::start().await.expect("upstream"));
    let plan = Plan { upstream: upstream.url(), items: vec!["gear".into(), "bolt".into()] };
    let report = AgentCheck::new(Planner)
        .with_agent(Worker)
        .input(&plan)
        .upstream(upstream.clone())
        .crash_at_every_boundary()
        .kill_during_effects()
        .eviction_matrix()
        .run()
        .await;
    report.assert_ok();
    assert!(
        matches!(&report.baseline.final_state, Some(RunStatus::Completed { output_json }) if output_json == r#"["made gear","made bolt"]"#),
        "{:?}",
        report.baseline.final_state
    );
    assert!(report.cases.len() >= 8, "only {} cases", report.cases.len());
    for case in std::iter::once(&report.baseline).chain(&report.cases) {
        assert_eq!(case.upstream.len(), 2, "{}: one part per child", case.name);
    }
}

async fn runtime(dir: &std::path::Path) -> Runtime {
    let store = Store::open_dir(dir, StoreConfig::default()).expect("store");
    Runtime::builder(store).agent(Planner).agent(Worker).agent(Listener).open().await.expect("runtime")
}

async fn ended(rt: &Runtime, run_id: &durafiber_runtime::RunId) -> RunStatus {
    tokio::time::timeout(Duration::from_secs(60), rt.wait(run_id)).await.expect("in time").expect("wait")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_child_reaches_its_parents_join_and_both_show_their_link() {
    let upstream = Upstream::start().await.expect("upstream");
    let dir = tempfile::tempdir().expect("dir");
    let rt = runtime(dir.path()).await;
    let plan = Plan { upstream: upstream.url(), items: vec!["gear".into(), "bad".into(), "bolt".into()] };
    let parent = rt.start::<Planner>("plan-1", &plan).await.expect("start").run_id;
    let status = ended(&rt, &parent).await;
    let RunStatus::Completed { output_json } = &status else { panic!("{status:?}") };
    let made: Vec<String> = serde_json::from_str(output_json).expect("output");
    assert_eq!(made.len(), 3);
    assert_eq!(made[1], "part-1 failed: no such item", "the failure reached the join: {made:?}");
    assert_eq!(upstream.objects("parts").len(), 2);

    let inspected = rt.inspect(&parent).expect("inspect");
    let states: Vec<_> = inspected.children.iter().map(|c| (c.name.as_str(), c.state.as_str())).collect();
    assert_eq!(states, [("part-0", "completed"), ("part-1", "failed"), ("part-2", "completed")]);
    let child = &inspected.children[1].run_id;
    let linked = rt.inspect(child).expect("inspect").parent.expect("a parent");
    assert_eq!((linked.parent_run_id.as_str(), linked.name.as_str()), (parent.as_str(), "part-1"));
    let filter = ListFilter { kind: Some("worker".into()), limit: 100, ..ListFilter::default() };
    assert_eq!(rt.list(&filter).expect("list").runs.len(), 3, "each child once");

    // The same start again is the same parent, and makes no child anew.
    let again = rt.start::<Planner>("plan-1", &plan).await.expect("start");
    assert_eq!((again.run_id, again.accepted), (parent, false));
    assert_eq!(rt.list(&filter).expect("list").runs.len(), 3);
    rt.shutdown().await;
}

/// A child that waits for an event it is never sent.
#[derive(Clone, Default)]
struct Listener;

impl Agent for Listener {
    const KIND: &'static str = "listener";
    type Input = ();
    type Stash = ();
    type Output = ();
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, (): ()) -> Result<(), AgentError> {
        let _: Option<String> = ctx.wait_for_event("never", None).await?;
        Ok(())
    }
}

/// Starts two listeners and joins the first.
#[derive(Clone, Default)]
struct Convener;

impl Agent for Convener {
    const KIND: &'static str = "convener";
    type Input = ();
    type Stash = ();
    type Output = ();
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, (): ()) -> Result<(), AgentError> {
        let first = ctx.start_child::<Listener>("first", &()).await?;
        ctx.start_child::<Listener>("second", &()).await?;
        ctx.join(&first).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_parent_cancels_its_open_children() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open_dir(dir.path(), StoreConfig::default()).expect("store");
    let rt = Runtime::builder(store).agent(Convener).agent(Listener).open().await.expect("runtime");
    let parent = rt.start::<Convener>("c", &()).await.expect("start").run_id;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let children = rt.inspect(&parent).expect("inspect").children;
        if children.len() == 2 && children.iter().all(|c| c.state == RunState::WaitingEvent.name()) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the children never waited: {children:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    rt.cancel(&parent, "not needed").await.expect("cancel");
    assert!(matches!(ended(&rt, &parent).await, RunStatus::Cancelled { .. }));
    for child in rt.inspect(&parent).expect("inspect").children {
        let status = ended(&rt, &child.run_id).await;
        assert!(
            matches!(&status, RunStatus::Cancelled { reason } if reason.contains("its parent") && reason.contains("not needed")),
            "{}: {status:?}",
            child.name
        );
    }
    rt.shutdown().await;
}
