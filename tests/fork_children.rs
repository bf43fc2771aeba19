//! A fork keeps its family: a coordinator starts child `a`, joins it, starts child `b`,
//! publishes, then waits for `b`. Forked at every boundary after its first child started,
//! each fork has the children started before its point as the same runs — `a` joined answers
//! from its end, `b` still going is joined, neither is started again — and starts anew only
//! the children started after its point. No child run and no upstream object is made twice;
//! `b`'s end reaches every fork that inherited it at once, not at a join's recheck. The
//! checker forks the same coordinator (children that do not wait) at every boundary.

use std::{sync::Arc, time::Duration};

use durafiber_runtime::{
    Agent, AgentError, Ctx, ForkOptions, ListFilter, Recovered, RunId, RunStatus, Runtime,
};
use durafiber_store::{Store, StoreConfig};
use durafiber_testkit::{
    check::AgentCheck,
    upstream::{Upstream, post_idempotent},
};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Makes one part upstream, after the event `go` when told to wait for it.
#[derive(Clone, Default)]
struct Maker;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Part {
    upstream: String,
    item: String,
    wait: bool,
}

impl Agent for Maker {
    const KIND: &'static str = "maker";
    type Input = Part;
    type Stash = ();
    type Output = String;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, part: Part) -> Result<String, AgentError> {
        if part.wait {
            let _: Option<serde_json::Value> = ctx.wait_for_event("go", None).await?;
        }
        let http = reqwest::Client::new();
        let item = part.item.clone();
        ctx.effect("make", part, move |key, part| {
            let http = http.clone();
            async move {
                post_idempotent(&http, &part.upstream, "parts", &key, None, &json!({"item": part.item})).await
            }
        })
        .await
        .map(|_: serde_json::Value| format!("made {item}"))
    }

    async fn on_fiber_recovered(
        &self,
        ctx: &mut Ctx<Self>,
        r: Recovered<Self>,
    ) -> Result<String, AgentError> {
        self.run_fiber(ctx, r.input).await
    }
}

/// Starts `a`, joins it, starts `b`, publishes, joins `b`; a stash after each step, a chunk
/// and a storage key on the way.
#[derive(Clone, Default)]
struct Coordinator;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    upstream: String,
    /// Whether `b` waits for the event `go`.
    b_waits: bool,
}

impl Agent for Coordinator {
    const KIND: &'static str = "coordinator";
    type Input = Job;
    type Stash = u32;
    type Output = Vec<String>;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, job: Job) -> Result<Vec<String>, AgentError> {
        ctx.stash("begun", &0).await?;
        let part = |item: &str, wait| Part { upstream: job.upstream.clone(), item: item.into(), wait };
        let a = ctx.start_child::<Maker>("a", &part("a", false)).await?;
        ctx.stash("a-started", &1).await?;
        let made_a = ctx.join(&a).await?;
        ctx.emit(&json!({"text": made_a}))?;
        ctx.storage().put("a", &made_a).await?;
        ctx.stash("a-joined", &2).await?;
        let b = ctx.start_child::<Maker>("b", &part("b", job.b_waits)).await?;
        ctx.stash("b-started", &3).await?;
        let http = reqwest::Client::new();
        let base = job.upstream.clone();
        let _: serde_json::Value = ctx
            .effect("publish", made_a.clone(), move |key, text| {
                let (http, base) = (http.clone(), base.clone());
                async move { post_idempotent(&http, &base, "posts", &key, None, &json!({"text": text})).await }
            })
            .await?;
        ctx.stash("published", &4).await?;
        let made_b = ctx.join(&b).await?;
        Ok(vec![made_a, made_b])
    }

    // Every step answers from its record when re-entered: running again is resuming.
    async fn on_fiber_recovered(
        &self,
        ctx: &mut Ctx<Self>,
        r: Recovered<Self>,
    ) -> Result<Vec<String>, AgentError> {
        self.run_fiber(ctx, r.input).await
    }
}

async fn polled<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(found) = check() {
            return found;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: not within 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn makers(rt: &Runtime) -> Vec<RunId> {
    let filter = ListFilter { kind: Some("maker".into()), limit: 100, ..ListFilter::default() };
    rt.list(&filter).expect("list").runs.into_iter().map(|r| r.run_id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_at_every_boundary_after_its_children_started_makes_no_child_and_no_object_twice() {
    let upstream = Upstream::start().await.expect("upstream");
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_dir(dir.path(), StoreConfig::default()).expect("store");
    let rt = Runtime::builder(store).agent(Coordinator).agent(Maker).open().await.expect("runtime");
    let job = Job { upstream: upstream.url(), b_waits: true };
    let source = rt.start::<Coordinator>("job-1", &job).await.expect("start").run_id;
    // Published, and waiting for `b`, which waits for `go`.
    polled("the source waits for b", || {
        let waits = matches!(rt.status(&source).ok()?, RunStatus::WaitingEvent { name } if name.starts_with("child:"));
        (waits && rt.history(&source).ok()?.iter().any(|h| h.step == "published")).then_some(())
    })
    .await;
    assert_eq!(makers(&rt).len(), 2, "a and b");
    assert_eq!((upstream.objects("parts").len(), upstream.objects("posts").len()), (1, 1));

    let history = rt.history(&source).expect("history");
    let points: Vec<(u64, String)> =
        history.iter().filter(|h| h.step != "begun").map(|h| (h.seq, h.step.clone())).collect();
    assert_eq!(
        points.iter().map(|(_, s)| s.as_str()).collect::<Vec<_>>(),
        ["a-started", "a-joined", "b-started", "published"]
    );
    let (mut new_makers, mut new_posts) = (0, 0);
    let mut forks = Vec::new();
    for (at, step) in &points {
        let fork = rt.fork(&source, *at, &format!("fork-{at}"), ForkOptions::default()).await.expect("fork");
        // A child started after the point is the fork's own, started anew; one before is the same.
        let b_is_new = matches!(step.as_str(), "a-started" | "a-joined");
        new_makers += usize::from(b_is_new);
        new_posts += usize::from(step != "published");
        polled(&format!("the fork at {step} waits for b"), || {
            let waits = matches!(rt.status(&fork.run_id).ok()?, RunStatus::WaitingEvent { name } if name.starts_with("child:"));
            waits.then_some(())
        })
        .await;
        assert_eq!(makers(&rt).len(), 2 + new_makers, "child runs after the fork at {step}");
        assert_eq!(upstream.objects("parts").len(), 1, "a's part is made once, whatever forks it");
        assert_eq!(upstream.objects("posts").len(), 1 + new_posts, "posts after the fork at {step}");
        let children = rt.inspect(&fork.run_id).expect("inspect").children;
        let names: Vec<&str> = children.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["a", "b"], "the fork at {step} shows its family");
        forks.push((step.clone(), fork.run_id));
    }

    // Cancelling a fork cancels the children it started, not those it inherited: b goes on.
    let (published, _) = points.last().expect("a point");
    let cancelled =
        rt.fork(&source, *published, "fork-cancelled", ForkOptions::default()).await.expect("fork");
    rt.cancel(&cancelled.run_id, "not needed").await.expect("cancel");
    let b = rt.inspect(&source).expect("inspect").children[1].run_id.clone();
    assert!(!rt.status(&b).expect("status").is_terminal(), "an inherited child was cancelled with the fork");

    // `go` to every waiting part: b once, and the b of each fork that started its own.
    for maker in makers(&rt) {
        if !rt.status(&maker).expect("status").is_terminal() {
            rt.send_event(&maker, "go", &json!({}), Some("go")).await.expect("go");
        }
    }
    let ended = tokio::time::timeout(Duration::from_secs(60), rt.wait(&source)).await.expect("in time");
    assert!(matches!(ended.expect("wait"), RunStatus::Completed { .. }));
    for (step, fork) in &forks {
        // Within a join's first recheck (a minute): b's end was sent to the forks too.
        let ended = tokio::time::timeout(Duration::from_secs(30), rt.wait(fork)).await;
        let ended = ended.unwrap_or_else(|_| panic!("the fork at {step} did not hear b's end"));
        let output: Vec<String> = match ended.expect("wait") {
            RunStatus::Completed { output_json } => serde_json::from_str(&output_json).expect("output"),
            other => panic!("the fork at {step} ended {other:?}"),
        };
        assert_eq!(output, ["made a", "made b"], "fork at {step}");
    }
    assert_eq!(makers(&rt).len(), 2 + new_makers, "no child started twice");
    assert_eq!(upstream.objects("parts").len(), 2 + new_makers, "one part per child run");
    assert_eq!(upstream.objects("posts").len(), 1 + new_posts);

    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checker_forks_a_coordinator_with_children_at_every_boundary() {
    let upstream = Arc::new(Upstream::start().await.expect("upstream"));
    let job = Job { upstream: upstream.url(), b_waits: false };
    let report = AgentCheck::new(Coordinator)
        .with_agent(Maker)
        .input(&job)
        .upstream(upstream.clone())
        .fork_at_every_boundary()
        .run()
        .await;
    report.assert_ok();
    assert!(report.cases.len() >= 4, "a fork per boundary: {} cases", report.cases.len());
}
