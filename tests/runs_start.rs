//! Starting runs (§2) and bad input (§3): the handle is durable and unique per key, a
//! duplicate start returns it, a conflicting one is refused, and every kind of bad input is
//! a typed error while the runtime keeps serving the other runs.

use durafiber_runtime::StartRequest;
use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicUsize, Ordering},
};

use durafiber_demo::agents::{Steps, StepsInput, StepsOutput};
use durafiber_runtime::{
    Agent, AgentError, Ctx, DurabilityMode, ListFilter, RunOptions, RunState, RunStatus, Runtime,
    RuntimeError,
};
use durafiber_store::{Store, StoreConfig};
use serde::{Deserialize, Serialize};

/// Stashes whatever it is sent; finishes when sent "stop"; stashes a huge value on "big".
struct Inbox;

#[derive(Clone, Serialize, Deserialize)]
struct Seen(Vec<String>);

impl Agent for Inbox {
    const KIND: &'static str = "inbox";
    type Input = ();
    type Stash = Seen;
    type Output = ();
    type Message = String;

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<(), AgentError> {
        ctx.cancelled().await;
        Err(AgentError::Cancelled("asked to stop".into()))
    }

    async fn on_message(&self, ctx: &mut Ctx<Self>, msg: String) -> Result<(), AgentError> {
        if msg == "stash" {
            return ctx.stash("seen", &Seen(vec![msg])).await;
        }
        if msg == "big" {
            return ctx.storage().put("big", &Seen(vec!["x".repeat(2 * 1024 * 1024)])).await;
        }
        ctx.storage().put("seen", &Seen(vec![msg])).await
    }
}

/// Counts the messages and requests it handles, and any that overlapped another: a run's
/// events are handled one at a time, whichever actor handles them.
#[derive(Clone, Default)]
struct Serial {
    busy: Arc<AtomicBool>,
    handled: Arc<AtomicUsize>,
    overlaps: Arc<AtomicUsize>,
}

impl Serial {
    async fn handle(&self) -> usize {
        if self.busy.swap(true, Ordering::SeqCst) {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        // Awaits inside the handler, where another actor of the same run would get in.
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        self.busy.store(false, Ordering::SeqCst);
        self.handled.fetch_add(1, Ordering::SeqCst) + 1
    }
}

impl Agent for Serial {
    const KIND: &'static str = "serial";
    type Input = ();
    type Stash = ();
    type Output = ();
    type Message = String;

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<(), AgentError> {
        ctx.cancelled().await;
        Err(AgentError::Cancelled("asked to stop".into()))
    }

    async fn on_message(&self, _: &mut Ctx<Self>, _: String) -> Result<(), AgentError> {
        self.handle().await;
        Ok(())
    }

    async fn on_request(&self, _: &mut Ctx<Self>, _: String) -> Result<serde_json::Value, AgentError> {
        Ok(serde_json::json!(self.handle().await))
    }
}

async fn runtime(dir: &std::path::Path) -> Runtime {
    runtime_with(dir, Serial::default()).await
}

async fn runtime_with(dir: &std::path::Path, serial: Serial) -> Runtime {
    durafiber_testkit::init_tracing();
    let store = Store::open_dir(dir, StoreConfig::default()).expect("open store");
    Runtime::builder(store)
        .agent(Steps::default())
        .agent(Inbox)
        .agent(serial)
        .open()
        .await
        .expect("open runtime")
}

fn steps(n: u32) -> StepsInput {
    StepsInput { steps: n, pause_ms: 0 }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_run_completes_under_the_handle_start_returned() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = runtime(dir.path()).await;
    let out = rt.start::<Steps>("order-1", &steps(5)).await.expect("start");
    assert!(out.accepted);
    // Creation time (12 hex digits), then 128 bits from the OS's cryptographic generator.
    let random = out.run_id.strip_prefix("run_").map(|rest| &rest[12..]).expect("run id shape");
    assert!(random.len() == 32 && random.chars().all(|c| c.is_ascii_hexdigit()), "{}", out.run_id);
    let other = rt.start::<Steps>("order-2", &steps(0)).await.expect("start");
    assert_ne!(&other.run_id[16..], random, "two runs never share their random part");
    assert!(matches!(rt.wait(&out.run_id).await.expect("wait"), RunStatus::Completed { .. }));
    let output: StepsOutput = rt.output(&out.run_id).expect("output").expect("completed");
    assert_eq!(output.done, 5);
    assert_eq!(rt.inspect(&out.run_id).expect("inspect").stash.expect("stash").seq, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_start_returns_the_same_handle_and_a_different_input_conflicts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = runtime(dir.path()).await;
    let first = rt.start::<Steps>("webhook-7", &steps(3)).await.expect("start");
    let again = rt.start::<Steps>("webhook-7", &steps(3)).await.expect("duplicate start");
    assert_eq!(again.run_id, first.run_id);
    assert!(!again.accepted);
    match rt.start::<Steps>("webhook-7", &steps(4)).await {
        Err(RuntimeError::KeyConflict { run_id, .. }) => assert_eq!(run_id, first.run_id),
        other => panic!("expected KeyConflict, got {other:?}"),
    }
    assert_eq!(rt.list(&ListFilter { limit: 100, ..Default::default() }).expect("list").runs.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_starts_with_one_key_make_exactly_one_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Arc::new(runtime(dir.path()).await);
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let rt = rt.clone();
            tokio::spawn(async move { rt.start::<Steps>("same-key", &steps(2)).await.expect("start").run_id })
        })
        .collect();
    let mut ids = std::collections::HashSet::new();
    for t in tasks {
        ids.insert(t.await.expect("join"));
    }
    assert_eq!(ids.len(), 1);
    assert_eq!(rt.list(&ListFilter { limit: 100, ..Default::default() }).expect("list").runs.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_typed_errors_and_other_runs_carry_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = runtime(dir.path()).await;
    let healthy = rt.start::<Steps>("healthy", &steps(20)).await.expect("start");

    assert!(matches!(rt.status(&"run_nope".into()), Err(RuntimeError::UnknownRun { .. })));
    assert!(matches!(rt.cancel(&"run_nope".into(), "x").await, Err(RuntimeError::UnknownRun { .. })));
    assert!(matches!(
        rt.start_run(StartRequest::new("no-such-kind", "k", serde_json::json!({}))).await,
        Err(RuntimeError::UnknownKind { .. })
    ));
    assert!(matches!(
        rt.start_run(StartRequest::new("steps", "k", serde_json::json!({"steps": "many"}))).await,
        Err(RuntimeError::InvalidInput(_))
    ));
    assert!(matches!(
        rt.start_run(StartRequest::new("steps", "bad\0key", serde_json::json!({"steps": 1, "pause_ms": 0})))
            .await,
        Err(RuntimeError::InvalidInput(_))
    ));

    let inbox = rt.start::<Inbox>("inbox", &()).await.expect("start inbox");
    rt.send::<Inbox>(&inbox.run_id, &"hello".to_string()).await.expect("message handled");
    match rt.send::<Inbox>(&inbox.run_id, &"big".to_string()).await {
        Err(RuntimeError::Agent(AgentError::StorageLimit { max, .. })) => assert_eq!(max, 128 * 1024),
        other => panic!("expected StorageLimit, got {other:?}"),
    }
    assert!(matches!(
        rt.send::<Inbox>(&inbox.run_id, &"stash".to_string()).await,
        Err(RuntimeError::Agent(AgentError::StashFromHandler))
    ));
    assert!(matches!(rt.send_json(&inbox.run_id, "42").await, Err(RuntimeError::WrongMessage { .. })));
    let stored = rt.storage_list(&inbox.run_id, "", None, 10).expect("storage");
    assert_eq!(stored, vec![("seen".to_string(), "[\"hello\"]".to_string())]);
    assert!(rt.inspect(&inbox.run_id).expect("inspect").stash.is_none(), "a handler never stashes");

    assert!(rt.cancel(&inbox.run_id, "done with it").await.is_ok());
    assert!(matches!(rt.wait(&inbox.run_id).await.expect("wait"), RunStatus::Cancelled { .. }));
    assert!(matches!(
        rt.send::<Inbox>(&inbox.run_id, &"late".to_string()).await,
        Err(RuntimeError::RunFinished { .. })
    ));
    assert!(matches!(rt.wait(&healthy.run_id).await.expect("wait"), RunStatus::Completed { .. }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_filters_by_state_and_kind_and_pages() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = runtime(dir.path()).await;
    for i in 0..5 {
        let out = rt.start::<Steps>(&format!("k{i}"), &steps(1)).await.expect("start");
        rt.wait(&out.run_id).await.expect("wait");
    }
    rt.start::<Inbox>("inbox", &()).await.expect("start");
    let page =
        rt.list(&ListFilter { limit: 2, kind: Some("steps".into()), ..Default::default() }).expect("list");
    assert_eq!(page.runs.len(), 2);
    let rest = rt
        .list(&ListFilter { limit: 10, kind: Some("steps".into()), after: page.next, ..Default::default() })
        .expect("list");
    assert_eq!(rest.runs.len(), 3);
    let completed = rt
        .list(&ListFilter { limit: 10, state: Some(RunState::Completed), ..Default::default() })
        .expect("list");
    assert_eq!(completed.runs.len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_durability_mode_completes_and_keeps_the_last_stash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = runtime(dir.path()).await;
    for mode in ["sync", "async", "exit"] {
        let options = RunOptions {
            durability: Some(DurabilityMode::parse(mode).expect("mode")),
            ..RunOptions::default()
        };
        let out = rt
            .start_run(
                StartRequest::new(
                    "steps",
                    &format!("mode-{mode}"),
                    serde_json::json!({"steps": 4, "pause_ms": 0}),
                )
                .with_options(options),
            )
            .await
            .expect("start");
        assert!(matches!(rt.wait(&out.run_id).await.expect("wait"), RunStatus::Completed { .. }), "{mode}");
        assert_eq!(rt.inspect(&out.run_id).expect("inspect").stash.expect("stash").seq, 4, "{mode}");
    }
    // A mode is typed; text from outside (a config file, an HTTP body) is parsed first.
    assert!(
        matches!(DurabilityMode::parse("eventually"), Err(e) if e.to_string().contains("sync, async, exit"))
    );
}

/// Sets an alarm whose name the runtime refuses.
struct BadAlarm;

impl Agent for BadAlarm {
    const KIND: &'static str = "bad_alarm";
    type Input = ();
    type Stash = ();
    type Output = ();
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<(), AgentError> {
        let spec = durafiber_runtime::AlarmSpec::after(std::time::Duration::from_secs(1), &())?;
        ctx.set_alarm("bad\0name", spec).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_runtime_call_fails_the_run_instead_of_looping_as_an_interruption() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_dir(dir.path(), StoreConfig::default()).expect("open store");
    let rt = Runtime::builder(store).agent(BadAlarm).open().await.expect("runtime");
    let run = rt.start::<BadAlarm>("bad", &()).await.expect("start").run_id;
    match rt.wait(&run).await.expect("wait") {
        RunStatus::Failed { error } => assert!(error.contains("alarm name"), "{error}"),
        other => panic!("expected Failed, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_right_after_starts_leaves_no_run_behind_holding_the_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = runtime(dir.path()).await;
    // Each start activates its run beside the caller: shutdown comes while some of those
    // activations are still under way.
    for i in 0..200 {
        rt.start::<Inbox>(&format!("late-{i}"), &()).await.expect("start");
    }
    rt.shutdown().await;
    rt.store().close();
    drop(rt);
    // Every actor and fiber let go of the store, so the directory can be opened again at
    // once, in this process.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let reopened = loop {
        match Store::open_dir(dir.path(), StoreConfig::default()) {
            Ok(store) => break store,
            Err(e) if std::time::Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(e) => panic!("the store is still held after shutdown: {e}"),
        }
    };
    reopened.close();
}

/// A run's actor stops once it has been idle for its grace (100 ms), and the next event
/// spawns a fresh one: senders racing that hand-over lose no event, and no two of the run's
/// events are ever handled at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_to_one_run_are_all_handled_one_at_a_time_while_its_actor_comes_and_goes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let serial = Serial::default();
    let rt = runtime_with(dir.path(), serial.clone()).await;
    let run_id = rt.start::<Serial>("serial-1", &()).await.expect("start").run_id;
    // One sender at a time, each event sent about when the actor's grace runs out: some
    // find it, some find it stopping, some find the slot empty and spawn one.
    for i in 0..30u64 {
        rt.send::<Serial>(&run_id, &format!("alone {i}")).await.expect("send");
        tokio::time::sleep(std::time::Duration::from_millis(94 + i % 12)).await;
    }
    assert_eq!(serial.handled.load(Ordering::SeqCst), 30);
    // Eight senders at once, each waiting for its answer before the next: the actor is
    // sometimes busy, sometimes idle and stopping, when an event arrives.
    let mut senders = Vec::new();
    for s in 0..8 {
        let (rt, run_id) = (rt.clone(), run_id.clone());
        senders.push(tokio::spawn(async move {
            for i in 0..40 {
                if i % 3 == 0 {
                    let _: usize = rt.request::<Serial, _>(&run_id, &format!("{s}/{i}")).await?;
                } else {
                    rt.send::<Serial>(&run_id, &format!("{s}/{i}")).await?;
                }
                if i % 5 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            Ok::<_, RuntimeError>(())
        }));
    }
    for sender in senders {
        sender.await.expect("sender task").expect("every event answered");
    }
    assert_eq!(serial.handled.load(Ordering::SeqCst), 30 + 8 * 40, "every event handled, once");
    assert_eq!(serial.overlaps.load(Ordering::SeqCst), 0, "never two at once");
    rt.cancel(&run_id, "done").await.expect("cancel");
    assert!(matches!(rt.wait(&run_id).await.expect("wait"), RunStatus::Cancelled { .. }));
}
