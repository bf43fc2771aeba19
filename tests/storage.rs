//! Per-run storage (`ctx.storage()`) and requests with replies (`on_request`).
//!
//! - The API: get, get_many, list in key order with paging, delete, a failed transaction
//!   writes nothing; handlers read and write it; inspection lists it.
//! - Limits are typed errors: key bytes, value bytes, keys per run.
//! - On the crash-simulating store, crashed after every write and every barrier of a run
//!   that moves units between two keys in transactions: no crash ever exposes half a
//!   transaction, and the recovered run ends with exactly the committed state.
//! - Evicted at every boundary and under seeded chaos, the same run ends the same way.

use durafiber_runtime::Timestamp;
use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::Duration,
};

use durafiber_runtime::testing::BuilderTestExt;
use durafiber_runtime::{
    Agent, AgentError, Boundary, CrashHook, Ctx, Recovered, RunStatus, Runtime, RuntimeConfig, RuntimeError,
    clock::VirtualClock,
};
use durafiber_store::{RunId, SimBackend, SimCrash, Store, StoreConfig, tables::keys};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

const EPOCH_MS: u64 = 1_000_000_000;
const UNITS: u64 = 100;

/// Moves one unit from `a` to `b` per step, logging each step in the same transaction; the
/// log makes a step re-entered after a crash a no-op. Stashes after each step.
struct Transfers;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
enum Ask {
    Put(String, Value),
    Get(String),
    GetMany(Vec<String>),
    List {
        prefix: String,
        after: Option<String>,
        limit: usize,
    },
    Delete(String),
    /// Writes `key` then fails: the transaction must leave nothing behind.
    FailAfterPut(String),
    /// Waits in memory for this many seconds, past the message wall limit.
    Stall(u64),
}

impl Transfers {
    async fn work(&self, ctx: &mut Ctx<Self>, from: u64, steps: u64) -> Result<u64, AgentError> {
        for step in from..steps {
            ctx.storage()
                .transaction(|txn| {
                    let log = format!("log/{step:04}");
                    if txn.contains(&log)? {
                        return Ok(());
                    }
                    let a: u64 = txn.get("a")?.unwrap_or(UNITS);
                    let b: u64 = txn.get("b")?.unwrap_or(0);
                    txn.put("a", &(a - 1))?;
                    txn.put("b", &(b + 1))?;
                    txn.put(&log, &step)
                })
                .await?;
            ctx.stash(&format!("step-{step}"), &(step + 1)).await?;
        }
        Ok(ctx.storage().get::<u64>("b")?.unwrap_or(0))
    }
}

impl Agent for Transfers {
    const KIND: &'static str = "transfers";
    type Input = u64;
    type Stash = u64;
    type Output = u64;
    type Message = Ask;

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, steps: u64) -> Result<u64, AgentError> {
        if steps == 0 {
            ctx.cancelled().await;
            return Err(AgentError::Cancelled("asked to stop".into()));
        }
        self.work(ctx, 0, steps).await
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, r: Recovered<Self>) -> Result<u64, AgentError> {
        if r.input == 0 {
            return self.run_fiber(ctx, 0).await;
        }
        self.work(ctx, r.stash.unwrap_or(0), r.input).await
    }

    async fn on_request(&self, ctx: &mut Ctx<Self>, ask: Ask) -> Result<Value, AgentError> {
        let storage = ctx.storage();
        Ok(match ask {
            Ask::Put(key, value) => json!(storage.put(&key, &value).await?),
            Ask::Get(key) => json!(storage.get::<Value>(&key)?),
            Ask::GetMany(keys) => {
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                json!(storage.get_many::<Value>(&keys)?)
            }
            Ask::List { prefix, after, limit } => {
                json!(storage.list::<Value>(&prefix, after.as_deref(), limit)?)
            }
            Ask::Delete(key) => json!(storage.delete(&key).await?),
            Ask::FailAfterPut(key) => {
                storage
                    .transaction(|txn| {
                        txn.put(&key, &1)?;
                        Err::<(), _>(AgentError::fail("changed my mind"))
                    })
                    .await?;
                Value::Null
            }
            Ask::Stall(secs) => {
                ctx.sleep_in_memory(Duration::from_secs(secs)).await;
                Value::Null
            }
        })
    }
}

/// An agent that takes no requests: the default `on_request` refuses.
struct Mute;

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
}

async fn open_with(
    sim: &SimBackend,
    clock: &VirtualClock,
    config: RuntimeConfig,
    hook: Option<CrashHook>,
) -> Runtime {
    let store = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store");
    let mut builder =
        Runtime::builder(store).config(config).virtual_clock(clock.clone()).agent(Transfers).agent(Mute);
    if let Some(hook) = hook {
        builder = builder.crash_hook(hook);
    }
    builder.open().await.expect("runtime")
}

async fn runtime(config: RuntimeConfig) -> Runtime {
    open_with(&SimBackend::new(), &VirtualClock::new(Timestamp::from_millis(EPOCH_MS)), config, None).await
}

async fn ask(rt: &Runtime, run: &RunId, ask: Ask) -> Result<Value, RuntimeError> {
    rt.request::<Transfers, Value>(run, &ask).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_reads_writes_lists_in_key_order_and_a_failed_transaction_writes_nothing() {
    let rt = runtime(RuntimeConfig::default()).await;
    let run = rt.start::<Transfers>("api", &0).await.expect("start").run_id;
    for (key, value) in [("b", json!(2)), ("a", json!({"x": 1})), ("c/1", json!("one")), ("c/2", json!([2]))]
    {
        ask(&rt, &run, Ask::Put(key.into(), value)).await.expect("put");
    }
    assert_eq!(ask(&rt, &run, Ask::Get("a".into())).await.expect("get"), json!({"x": 1}));
    assert_eq!(ask(&rt, &run, Ask::Get("zz".into())).await.expect("get"), Value::Null);
    let many =
        ask(&rt, &run, Ask::GetMany(vec!["a".into(), "b".into(), "nope".into()])).await.expect("get_many");
    assert_eq!(many, json!({"a": {"x": 1}, "b": 2}));
    let all =
        ask(&rt, &run, Ask::List { prefix: String::new(), after: None, limit: 10 }).await.expect("list");
    assert_eq!(all, json!([["a", {"x": 1}], ["b", 2], ["c/1", "one"], ["c/2", [2]]]));
    let page = ask(&rt, &run, Ask::List { prefix: "c/".into(), after: Some("c/1".into()), limit: 10 }).await;
    assert_eq!(page.expect("page"), json!([["c/2", [2]]]));
    let first = ask(&rt, &run, Ask::List { prefix: String::new(), after: None, limit: 1 }).await;
    assert_eq!(first.expect("first"), json!([["a", {"x": 1}]]));
    assert_eq!(ask(&rt, &run, Ask::Delete("b".into())).await.expect("delete"), json!(true));
    assert_eq!(ask(&rt, &run, Ask::Delete("b".into())).await.expect("delete"), json!(false));

    let failed = ask(&rt, &run, Ask::FailAfterPut("half".into())).await;
    assert!(matches!(failed, Err(RuntimeError::Agent(AgentError::Fail(_)))), "{failed:?}");
    assert_eq!(ask(&rt, &run, Ask::Get("half".into())).await.expect("get"), Value::Null);

    // Inspection sees what the run wrote, with the values as JSON text.
    let listed = rt.storage_list(&run, "c/", None, 10).expect("inspect");
    assert_eq!(listed, vec![("c/1".into(), "\"one\"".into()), ("c/2".into(), "[2]".into())]);
    assert!(matches!(
        rt.storage_list(&"run_nope".into(), "", None, 10),
        Err(RuntimeError::UnknownRun { .. })
    ));

    // Survives eviction: storage is the run's, not the actor's.
    rt.evict(&run).await;
    assert_eq!(ask(&rt, &run, Ask::Get("c/1".into())).await.expect("get"), json!("one"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_get_typed_replies_and_their_failures() {
    let config = RuntimeConfig { message_wall_limit: Duration::from_secs(60), ..Default::default() };
    let rt = runtime(config).await;
    let run = rt.start::<Transfers>("req", &0).await.expect("start").run_id;
    ask(&rt, &run, Ask::Put("n".into(), json!(7))).await.expect("put");
    let n: Option<u64> = rt.request::<Transfers, _>(&run, &Ask::Get("n".into())).await.expect("typed");
    assert_eq!(n, Some(7));
    assert!(matches!(rt.request_json(&run, "\"nonsense\"").await, Err(RuntimeError::WrongMessage { .. })));

    // A handler past the wall limit fails, and its caller is answered.
    let stalled = tokio::spawn({
        let rt = rt.clone();
        let run = run.clone();
        async move { ask(&rt, &run, Ask::Stall(3600)).await }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !stalled.is_finished() {
        assert!(std::time::Instant::now() < deadline, "the stalled request was never answered");
        rt.advance(Duration::from_secs(30)).await.expect("advance");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let answer = stalled.await.expect("join");
    assert!(
        matches!(&answer, Err(RuntimeError::Agent(AgentError::Fail(m))) if m.contains("wall limit")),
        "{answer:?}"
    );

    let mute = rt.start::<Mute>("mute", &()).await.expect("start").run_id;
    let refused = rt.request::<Mute, Value>(&mute, &()).await;
    assert!(matches!(&refused, Err(RuntimeError::Agent(AgentError::Fail(m))) if m.contains("no requests")));

    rt.cancel(&run, "done").await.expect("cancel");
    assert!(matches!(rt.wait(&run).await.expect("wait"), RunStatus::Cancelled { .. }));
    assert!(matches!(ask(&rt, &run, Ask::Get("n".into())).await, Err(RuntimeError::RunFinished { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_limits_are_typed_errors() {
    let rt = runtime(RuntimeConfig { storage_keys_max: 3, ..Default::default() }).await;
    let run = rt.start::<Transfers>("limits", &0).await.expect("start").run_id;
    let limit = |r: Result<Value, RuntimeError>| match r {
        Err(RuntimeError::Agent(AgentError::StorageLimit { what, size, max })) => (what, size, max),
        other => panic!("expected StorageLimit, got {other:?}"),
    };
    let long_key = "k".repeat(2049);
    assert_eq!(limit(ask(&rt, &run, Ask::Put(long_key, json!(1))).await), ("key bytes", 2049, 2048));
    let big = json!("x".repeat(128 * 1024));
    let (what, _, max) = limit(ask(&rt, &run, Ask::Put("big".into(), big)).await);
    assert_eq!((what, max), ("value bytes", 128 * 1024));
    for key in ["k1", "k2", "k3"] {
        ask(&rt, &run, Ask::Put(key.into(), json!(1))).await.expect("within the key limit");
    }
    assert_eq!(limit(ask(&rt, &run, Ask::Put("k4".into(), json!(1))).await), ("keys in the run", 4, 3));
    ask(&rt, &run, Ask::Put("k1".into(), json!(2))).await.expect("overwriting adds no key");
    ask(&rt, &run, Ask::Delete("k2".into())).await.expect("delete");
    ask(&rt, &run, Ask::Put("k4".into(), json!(1))).await.expect("room again after a delete");
    // A fresh activation counts the keys from the store.
    rt.evict(&run).await;
    assert_eq!(limit(ask(&rt, &run, Ask::Put("k5".into(), json!(1))).await), ("keys in the run", 4, 3));
    let keys: Vec<String> =
        rt.storage_list(&run, "", None, 10).expect("list").into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, ["k1", "k3", "k4"]);
}

/// The units in a store: (a, b, steps logged). Every transaction keeps a + b = UNITS and
/// b = steps logged, so any other reading is half a transaction.
fn units_in(sim: &SimBackend) -> (u64, u64, u64) {
    let store = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store");
    let rows = store.scan(&keys::STORAGE.all(), None, usize::MAX).expect("scan");
    let mut found = (UNITS, 0, 0);
    for (key, text) in rows {
        let text = text.expect("decode");
        match keys::storage_name(&key).unwrap_or_default() {
            "a" => found.0 = text.parse().expect("a"),
            "b" => found.1 = text.parse().expect("b"),
            _ => found.2 += 1,
        }
    }
    store.close();
    found
}

/// Crashes the store at `point` during a run of `steps`, checks the store holds whole
/// transactions only, reopens and finishes. False when the run ended before the point.
async fn crash_once(point: SimCrash, steps: u64) -> bool {
    let (sim, clock) = (SimBackend::new(), VirtualClock::new(Timestamp::from_millis(EPOCH_MS)));
    sim.crash_at(point);
    let rt = open_with(&sim, &clock, RuntimeConfig::default(), None).await;
    if rt.start::<Transfers>("t", &steps).await.is_ok() {
        let _ = rt.advance(Duration::ZERO).await;
    }
    let crashed = sim.is_crashed();
    rt.shutdown().await;
    sim.revive();
    let (a, b, logged) = units_in(&sim);
    assert_eq!((a + b, b), (UNITS, logged), "{point:?}: half a transaction survived the crash");
    let rt = open_with(&sim, &clock, RuntimeConfig::default(), None).await;
    let run = rt.start::<Transfers>("t", &steps).await.expect("start after the crash").run_id;
    rt.advance(Duration::from_secs(600)).await.expect("advance");
    assert_eq!(rt.status(&run).expect("status"), RunStatus::Completed { output_json: steps.to_string() });
    rt.shutdown().await;
    assert_eq!(units_in(&sim), (UNITS - steps, steps, steps), "{point:?}");
    crashed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_are_whole_after_a_crash_at_every_write() {
    let mut reached = 0;
    for n in 1..=40 {
        let before = crash_once(SimCrash::AfterApply(n), 4).await;
        let after = crash_once(SimCrash::AfterBarrier(n), 4).await;
        if !before && !after {
            break;
        }
        reached += 1;
    }
    // accept, registration, then a transaction and a stash per step, the end.
    assert!(reached >= 10, "only {reached} crash points were reached");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_at_every_boundary_or_by_chaos_the_run_ends_the_same() {
    // Each boundary evicts the run once, the first time it is reached.
    let seen = Arc::new(Mutex::new(HashSet::new()));
    let hook: CrashHook = {
        let seen = seen.clone();
        Arc::new(move |_run: &RunId, point: &Boundary| seen.lock().expect("lock").insert(point.clone()))
    };
    let sim = SimBackend::new();
    let config = RuntimeConfig { fiber_keep_alive: false, ..Default::default() };
    let rt = open_with(&sim, &VirtualClock::new(Timestamp::from_millis(EPOCH_MS)), config, Some(hook)).await;
    let run = rt.start::<Transfers>("evicted", &6).await.expect("start").run_id;
    rt.advance(Duration::from_secs(3600)).await.expect("advance");
    assert_eq!(rt.status(&run).expect("status"), RunStatus::Completed { output_json: "6".into() });
    assert!(seen.lock().expect("lock").len() >= 6, "evicted at {:?}", seen.lock().expect("lock"));
    rt.shutdown().await;
    assert_eq!(units_in(&sim), (UNITS - 6, 6, 6));

    for seed in 0..6 {
        let sim = SimBackend::new();
        let config =
            RuntimeConfig { seed, chaos_evict_rate: 0.3, fiber_keep_alive: false, ..Default::default() };
        let rt = open_with(&sim, &VirtualClock::new(Timestamp::from_millis(EPOCH_MS)), config, None).await;
        let run = rt.start::<Transfers>("chaos", &6).await.expect("start").run_id;
        rt.advance(Duration::from_secs(3600)).await.expect("advance");
        assert_eq!(
            rt.status(&run).expect("status"),
            RunStatus::Completed { output_json: "6".into() },
            "seed {seed}"
        );
        rt.shutdown().await;
        assert_eq!(units_in(&sim), (UNITS - 6, 6, 6), "seed {seed}");
    }
}
