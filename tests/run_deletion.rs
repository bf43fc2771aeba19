//! Deleting a settled run: every record it owns goes, in batches, and nothing of any other
//! run; an open run is refused; a start with the deleted run's key starts a new run.

use durafiber_runtime::{Agent, AgentError, Ctx, Recovered, RunStatus, Runtime, RuntimeError};
use durafiber_store::{RunId, Store, StoreConfig};
use serde::{Deserialize, Serialize};

/// Writes a storage key, commits an effect, emits `chunks` chunks (a stash every 500), then
/// finishes, or waits for cancellation when `park` is set.
#[derive(Default)]
struct Owner;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Input {
    chunks: u32,
    park: bool,
}

impl Agent for Owner {
    const KIND: &'static str = "owner";
    type Input = Input;
    type Stash = u32;
    type Output = u32;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, input: Input) -> Result<u32, AgentError> {
        ctx.storage().put("note", &"kept with the run").await?;
        let charged: u32 = ctx.effect("charge", 7u32, |_key, n| async move { Ok::<_, String>(n) }).await?;
        for n in 0..input.chunks {
            ctx.emit(&format!("chunk {n}"))?;
            if (n + 1) % 500 == 0 {
                ctx.stash("written", &(n + 1)).await?;
            }
        }
        ctx.stash("done", &input.chunks).await?;
        if input.park {
            ctx.cancelled().await;
            return Err(AgentError::Cancelled("parked".into()));
        }
        Ok(input.chunks + charged)
    }

    async fn on_fiber_recovered(&self, _: &mut Ctx<Self>, r: Recovered<Self>) -> Result<u32, AgentError> {
        Err(AgentError::escalate(format!("not expected to recover at {:?}", r.stash)))
    }
}

/// How many stored records name `run_id` in their key.
async fn records_of(rt: &Runtime, store: &Store, run_id: &RunId) -> usize {
    rt.settle().await;
    let entries = store.snapshot().await.expect("snapshot");
    let id = run_id.as_str().as_bytes();
    entries.iter().filter(|(key, _)| key.windows(id.len()).any(|w| w == id)).count()
}

async fn finished(rt: &Runtime, key: &str, input: &Input) -> RunId {
    let id = rt.start::<Owner>(key, input).await.expect("start").run_id;
    let status = rt.wait(&id).await.expect("wait");
    assert!(matches!(status, RunStatus::Completed { .. }), "{key}: {status:?}");
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settled_run_is_deleted_with_everything_it_owns_and_nothing_else() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_dir(dir.path(), StoreConfig::default()).expect("store");
    let rt = Runtime::builder(store.clone()).agent(Owner).open().await.expect("runtime");

    let big = finished(&rt, "big", &Input { chunks: 2_500, park: false }).await;
    let other = finished(&rt, "other", &Input { chunks: 10, park: false }).await;
    let open = rt.start::<Owner>("open", &Input { chunks: 3, park: true }).await.expect("start").run_id;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while rt.inspect(&open).expect("inspect").stash.is_none() {
        assert!(std::time::Instant::now() < deadline, "the open run never stashed");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }

    let owned = records_of(&rt, &store, &big).await;
    assert!(owned > 2_500, "the big run owns only {owned} records");
    let others = records_of(&rt, &store, &other).await;

    match rt.delete_run(&open).await {
        Err(RuntimeError::RunOpen { run_id, state }) => {
            assert_eq!((run_id, state.as_str()), (open.clone(), "running"));
        }
        other => panic!("deleting an open run: {other:?}"),
    }
    let deleted = rt.delete_run(&big).await.expect("delete");
    assert_eq!(deleted.run_id, big);
    assert!(deleted.records >= 2_500, "{deleted:?}");
    assert_eq!(records_of(&rt, &store, &big).await, 0, "a record of the deleted run is left");
    assert_eq!(records_of(&rt, &store, &other).await, others, "another run lost records");
    assert!(matches!(rt.inspect(&big), Err(RuntimeError::UnknownRun { .. })));
    assert!(matches!(rt.delete_run(&big).await, Err(RuntimeError::UnknownRun { .. })));

    // Its key is forgotten with it: the same start makes a new run.
    let again = finished(&rt, "big", &Input { chunks: 2_500, park: false }).await;
    assert_ne!(again, big);

    // Settled by a cancellation, the open run can go too.
    rt.cancel(&open, "done with it").await.expect("cancel");
    while !rt.status(&open).expect("status").is_terminal() {
        assert!(std::time::Instant::now() < deadline, "the cancelled run never settled");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    rt.delete_run(&open).await.expect("delete the cancelled run");
    assert_eq!(records_of(&rt, &store, &open).await, 0);
    assert!(rt.check_liveness().expect("liveness").is_empty());
    rt.shutdown().await;
}
