//! Forking a run that keeps storage: the fork starts with the storage as it was at its
//! boundary — written, overwritten and deleted keys put back as they were there — and storage
//! written before the run kept its history is refused, not guessed.

use std::{collections::BTreeMap, time::Duration};

use durafiber_runtime::{
    Agent, AgentError, Ctx, ForkOptions, Recovered, RunStatus, Runtime, RuntimeConfig, RuntimeError,
};
use durafiber_store::{Batch, Durability, Store, StoreConfig, tables::keys};
use serde_json::{Value, json};

/// Five steps, each a stash after a storage write: puts `a`, overwrites it, puts `b`, deletes
/// `a`, puts `c`. Waits for the event `go` before the first step; given `true`, a recovered
/// fiber (a fork) waits for `resume` before it goes on, so its first storage can be read.
#[derive(Clone, Default)]
struct Writer;

impl Writer {
    async fn steps(&self, ctx: &mut Ctx<Self>, from: u32) -> Result<u32, AgentError> {
        if from == 0 {
            let _: Option<()> = ctx.wait_for_event("go", None).await?;
        }
        for step in from..5 {
            let s = ctx.storage();
            match step {
                0 => s.put("a", &1).await?,
                1 => s.put("a", &2).await?,
                2 => s.put("b", &"bee").await?,
                3 => drop(s.delete("a").await?),
                _ => s.put("c", &[1, 2]).await?,
            }
            ctx.stash("step", &(step + 1)).await?;
        }
        Ok(5)
    }
}

impl Agent for Writer {
    const KIND: &'static str = "storage-writer";
    type Input = bool;
    type Stash = u32;
    type Output = u32;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: bool) -> Result<u32, AgentError> {
        self.steps(ctx, 0).await
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, r: Recovered<Self>) -> Result<u32, AgentError> {
        let from = r.stash.unwrap_or(0);
        if r.input && from > 0 {
            let _: Option<()> = ctx.wait_for_event("resume", None).await?;
        }
        self.steps(ctx, from).await
    }
}

fn storage_of(rt: &Runtime, run: &durafiber_runtime::RunId) -> BTreeMap<String, Value> {
    let page = rt.storage_list(run, "", None, 100).expect("storage");
    page.into_iter().map(|(k, v)| (k, serde_json::from_str(&v).expect("json"))).collect()
}

async fn open(dir: &std::path::Path, config: RuntimeConfig) -> Runtime {
    let store = Store::open_dir(dir, StoreConfig::default()).expect("store");
    Runtime::builder(store).config(config).agent(Writer).open().await.expect("runtime")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_starts_with_the_storage_as_it_was_at_its_boundary() {
    let dir = tempfile::tempdir().expect("dir");
    let rt = open(dir.path(), RuntimeConfig::default()).await;
    let source = rt.start::<Writer>("w", &false).await.expect("start").run_id;
    rt.send_event(&source, "go", &(), None).await.expect("go");
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(30), rt.wait(&source))
            .await
            .expect("in time")
            .expect("wait"),
        RunStatus::Completed { output_json: "5".into() }
    );
    let at: Vec<u64> = rt.history(&source).expect("history").iter().map(|h| h.seq).collect();
    assert_eq!(at.len(), 5, "{at:?}");
    // What each boundary's stash saw: the storage after its step.
    let expected = [
        json!({"a": 1}),
        json!({"a": 2}),
        json!({"a": 2, "b": "bee"}),
        json!({"b": "bee"}),
        json!({"b": "bee", "c": [1, 2]}),
    ];
    let before = storage_of(&rt, &source);
    for (i, seq) in at.iter().enumerate() {
        let held = ForkOptions { input_json: Some("true".into()), ..ForkOptions::default() };
        let fork = rt.fork(&source, *seq, &format!("f-{seq}"), held).await.expect("fork");
        let started: Value = serde_json::to_value(storage_of(&rt, &fork.run_id)).expect("json");
        assert_eq!(started, expected[i], "the fork at boundary {seq} started with its storage then");
        rt.send_event(&fork.run_id, "resume", &(), None).await.expect("resume");
        let ended =
            tokio::time::timeout(Duration::from_secs(30), rt.wait(&fork.run_id)).await.expect("in time");
        assert_eq!(ended.expect("wait"), RunStatus::Completed { output_json: "5".into() });
        assert_eq!(
            serde_json::to_value(storage_of(&rt, &fork.run_id)).expect("json"),
            expected[4],
            "the fork went on from there"
        );
    }
    assert_eq!(storage_of(&rt, &source), before, "the source's storage is untouched");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_written_before_its_history_was_kept_is_not_guessed() {
    let dir = tempfile::tempdir().expect("dir");
    let rt = open(dir.path(), RuntimeConfig::default()).await;
    let source = rt.start::<Writer>("w", &false).await.expect("start").run_id;
    rt.send_event(&source, "go", &(), None).await.expect("go");
    tokio::time::timeout(Duration::from_secs(30), rt.wait(&source)).await.expect("in time").expect("wait");
    rt.shutdown().await;
    drop(rt);
    // As a store from before storage histories: the record that says where it is whole goes.
    {
        let store = Store::open_dir(dir.path(), StoreConfig::default()).expect("store");
        let mut batch = Batch::new();
        batch.delete(keys::storage_log(&source));
        store.commit(batch, Durability::Sync).await.expect("commit");
    }
    let rt = open(dir.path(), RuntimeConfig::default()).await;
    match rt.fork(&source, 2, "f", ForkOptions::default()).await {
        Err(RuntimeError::ForkRefused { reason, .. }) => {
            assert!(reason.contains("written before it kept a history"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_storage_history_keeps_only_what_the_boundaries_kept_need() {
    let dir = tempfile::tempdir().expect("dir");
    let config = RuntimeConfig { history_max: 1, ..RuntimeConfig::default() };
    let rt = open(dir.path(), config).await;
    let source = rt.start::<Writer>("w", &false).await.expect("start").run_id;
    rt.send_event(&source, "go", &(), None).await.expect("go");
    tokio::time::timeout(Duration::from_secs(30), rt.wait(&source)).await.expect("in time").expect("wait");
    let kept: Vec<u64> = rt.history(&source).expect("history").iter().map(|h| h.seq).collect();
    assert_eq!(kept, [5]);
    let fork = rt.fork(&source, 5, "f", ForkOptions::default()).await.expect("fork");
    assert_eq!(storage_of(&rt, &fork.run_id), storage_of(&rt, &source));
    rt.shutdown().await;
    drop(rt);
    let store = Store::open_dir(dir.path(), StoreConfig::default()).expect("store");
    let undo = store.keys_in(&keys::STORAGE_UNDO.of_run(&source), None, 100, None).expect("keys");
    let boundaries: Vec<u64> =
        undo.iter().filter_map(|k| keys::storage_undo_parts(k)).map(|(seq, _)| seq).collect();
    // Five writes, after boundaries 0 to 4; the last forgot those more than two before it.
    assert_eq!(boundaries, [2, 3, 4]);
}

/// Writes `asked`, stashes, and asks a person, who never answers: the pause escalates, and
/// `on_escalate` — run outside the fiber, on a run no longer in memory — writes `paged`.
#[derive(Clone, Default)]
struct Pager;

impl Agent for Pager {
    const KIND: &'static str = "pager";
    type Input = ();
    type Stash = u32;
    type Output = ();
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<(), AgentError> {
        ctx.storage().put("asked", &true).await?;
        ctx.stash("asked", &1).await?;
        ctx.request_approval("go", &json!({"what": "a page"})).await?;
        Ok(())
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, _: Recovered<Self>) -> Result<(), AgentError> {
        ctx.request_approval("go", &json!({"what": "a page"})).await?;
        Ok(())
    }

    async fn on_escalate(&self, ctx: &mut Ctx<Self>, _reason: &str) {
        let _ = ctx.storage().put("paged", &true).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_on_escalate_writes_comes_after_every_boundary_and_no_fork_sees_it() {
    let store =
        Store::with_backend(std::sync::Arc::new(durafiber_store::SimBackend::new()), StoreConfig::default())
            .expect("store");
    let config = RuntimeConfig { escalate_after: Duration::from_secs(3_600), ..RuntimeConfig::default() };
    let rt = Runtime::builder(store)
        .config(config)
        .virtual_clock(durafiber_runtime::clock::VirtualClock::new(durafiber_runtime::Timestamp::ZERO))
        .agent(Pager)
        .open()
        .await
        .expect("runtime");
    let run = rt.start::<Pager>("p", &()).await.expect("start").run_id;
    rt.advance(Duration::from_secs(2 * 3_600)).await.expect("advance");
    assert!(matches!(rt.status(&run).expect("status"), RunStatus::Escalated { .. }));
    assert_eq!(storage_of(&rt, &run).get("paged"), Some(&json!(true)), "the hook wrote");
    let last = rt.history(&run).expect("history").last().map(|h| h.seq).expect("a boundary");
    let fork = rt.fork(&run, last, "after-the-page", ForkOptions::default()).await.expect("fork");
    assert_eq!(
        serde_json::to_value(storage_of(&rt, &fork.run_id)).expect("json"),
        json!({"asked": true}),
        "the fork from the last boundary starts without what the hook wrote after it"
    );
    rt.shutdown().await;
}
