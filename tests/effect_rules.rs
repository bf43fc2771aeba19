//! The effect ledger's rules beyond "once" (§2.3, §5.4, §5.5): no effect starts after a
//! cancellation, the same effect id with other arguments is a conflict and never a second
//! effect, and a failing call is retried with the same key per the policy — three attempts
//! in all — before the error reaches the fiber.
//!
//! Calls are counted by the closure itself, so "not called" is observed, not assumed.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use durafiber_runtime::{Agent, AgentError, Ctx, RunStatus, Runtime, clock::VirtualClock};
use durafiber_store::{SimBackend, Store, StoreConfig};

const EPOCH_MS: u64 = 1_000_000_000;

/// What each test's agent does once its fiber runs.
#[derive(Clone, Copy)]
enum Script {
    /// Waits for cancellation, then tries an effect.
    EffectAfterCancel,
    /// The same effect id twice, with other arguments.
    Diverge,
    /// An effect whose first `fails` calls fail.
    Flaky { fails: u32 },
}

struct Effects {
    script: Script,
    calls: Arc<AtomicU32>,
    keys: Arc<Mutex<Vec<String>>>,
}

impl Agent for Effects {
    const KIND: &'static str = "effects";
    type Input = ();
    type Stash = ();
    type Output = u32;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<u32, AgentError> {
        let (calls, keys) = (self.calls.clone(), self.keys.clone());
        let call = move |fails: u32| {
            let (calls, keys) = (calls.clone(), keys.clone());
            move |key: String, n: u32| {
                let (calls, keys) = (calls.clone(), keys.clone());
                async move {
                    keys.lock().expect("keys").push(key);
                    let made = calls.fetch_add(1, Ordering::SeqCst) + 1;
                    if made <= fails { Err(format!("call {made} failed")) } else { Ok(n) }
                }
            }
        };
        match self.script {
            Script::EffectAfterCancel => {
                ctx.cancelled().await;
                ctx.effect("refund", 1, call(0)).await
            }
            Script::Diverge => {
                ctx.effect("refund", 1, call(0)).await?;
                ctx.effect("refund", 2, call(0)).await
            }
            Script::Flaky { fails } => ctx.effect("refund", 7, call(fails)).await,
        }
    }
}

async fn open(script: Script) -> (Runtime, Arc<AtomicU32>, Arc<Mutex<Vec<String>>>) {
    let (calls, keys) = (Arc::new(AtomicU32::new(0)), Arc::new(Mutex::new(Vec::new())));
    let store = Store::with_backend(Arc::new(SimBackend::new()), StoreConfig::default()).expect("store");
    let rt = Runtime::builder(store)
        .virtual_clock(VirtualClock::new(EPOCH_MS))
        .agent(Effects { script, calls: calls.clone(), keys: keys.clone() })
        .open()
        .await
        .expect("runtime");
    (rt, calls, keys)
}

/// §2.3: the fiber sees the cancellation; the effect it then asks for never starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_effect_starts_after_a_cancellation() {
    let (rt, calls, _) = open(Script::EffectAfterCancel).await;
    let run = rt.start::<Effects>("c", &()).await.expect("start").run_id;
    rt.advance(Duration::ZERO).await.expect("advance");
    rt.cancel(&run, "customer withdrew").await.expect("cancel");
    // The signal reaches the parked fiber outside virtual time: wait for the run to end.
    let ended = rt.wait(&run).await.expect("wait");
    assert_eq!(ended, RunStatus::Cancelled { reason: "customer withdrew".into() });
    assert_eq!(calls.load(Ordering::SeqCst), 0, "the effect was called after the cancellation");
    assert!(rt.inspect(&run).expect("inspect").ledger.is_empty(), "no key was even minted");
}

/// §5.4: control flow that diverged is an `EffectConflict`, never a second effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_effect_id_with_other_arguments_is_a_conflict_not_a_second_effect() {
    let (rt, calls, _) = open(Script::Diverge).await;
    let run = rt.start::<Effects>("d", &()).await.expect("start").run_id;
    rt.advance(Duration::ZERO).await.expect("advance");
    match rt.status(&run).expect("status") {
        RunStatus::Failed { error } => {
            assert!(error.contains("refund was prepared with other arguments"), "{error}")
        }
        other => panic!("expected Failed with EffectConflict, got {other:?}"),
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one call: the first effect only");
    assert_eq!(rt.inspect(&run).expect("inspect").ledger.len(), 1);
}

/// §5.5: two failures, then success, all with one key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_call_is_retried_with_the_same_key_and_succeeds_on_the_third_attempt() {
    let (rt, calls, keys) = open(Script::Flaky { fails: 2 }).await;
    let run = rt.start::<Effects>("f", &()).await.expect("start").run_id;
    // Full-jitter backoff of at most 100 ms, then 200 ms.
    rt.advance(Duration::from_secs(1)).await.expect("advance");
    assert_eq!(rt.output::<u32>(&run).expect("output"), Some(7));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let keys = keys.lock().expect("keys").clone();
    assert!(keys.iter().all(|k| *k == keys[0]), "one key for every attempt: {keys:?}");
}

/// §5.5: three failures exhaust the policy; the error reaches the fiber, naming the attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_failed_attempts_surface_as_an_error_to_the_fiber() {
    let (rt, calls, _) = open(Script::Flaky { fails: 10 }).await;
    let run = rt.start::<Effects>("x", &()).await.expect("start").run_id;
    rt.advance(Duration::from_secs(10)).await.expect("advance");
    match rt.status(&run).expect("status") {
        RunStatus::Failed { error } => {
            assert_eq!(error, "effect refund failed after 3 attempts: call 3 failed")
        }
        other => panic!("expected Failed, got {other:?}"),
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let entry = &rt.inspect(&run).expect("inspect").ledger[0];
    assert!(entry.committed.is_none(), "a failed effect stays prepared, its key kept for a retry");
}
