//! The effect ledger's rules beyond "once" (§2.3, §5.4, §5.5): no effect starts after a
//! cancellation, the same effect id with other arguments is a conflict and never a second
//! effect, and a failing call is retried with the same key per the policy — three attempts
//! in all — before the error reaches the fiber. With `effect_with`: a permanent error is not
//! retried, a policy of its own is followed, a call past its timeout counts as a failure, a
//! throttled call (`Retry-After`) waits what the upstream asked; an exhausted effect
//! re-enters the run through recovery, in a first attempt as after one.
//!
//! Calls are counted by the closure itself, so "not called" is observed, not assumed.

use durafiber_runtime::Timestamp;
use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use durafiber_runtime::{
    Agent, AgentError, Ctx, EffectError, EffectOptions, Recovered, RunStatus, Runtime, clock::VirtualClock,
};
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
    /// `effect_with`: the first call is refused for good.
    Rejected,
    /// `effect_with` and `attempts` calls at most: the first `fails` calls fail.
    Policy { fails: u32, attempts: u32 },
    /// `effect_with` with a 50 ms timeout: the first call never answers.
    Hangs,
    /// The first call answers 429 with `Retry-After: 30`; the policy's backoff is 10 ms.
    Throttled,
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
        self.flow(ctx).await
    }

    /// An interrupted run does the same again: the ledger makes that safe.
    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, _: Recovered<Self>) -> Result<u32, AgentError> {
        self.flow(ctx).await
    }
}

impl Effects {
    async fn flow(&self, ctx: &mut Ctx<Self>) -> Result<u32, AgentError> {
        let (calls, keys) = (self.calls.clone(), self.keys.clone());
        let (counted, logged) = (calls.clone(), keys.clone());
        let classified = move |outcome: fn(u32) -> Option<EffectError>| {
            let (calls, keys) = (counted.clone(), logged.clone());
            move |key: String, n: u32| {
                let (calls, keys) = (calls.clone(), keys.clone());
                async move {
                    keys.lock().expect("keys").push(key);
                    let made = calls.fetch_add(1, Ordering::SeqCst) + 1;
                    match outcome(made) {
                        Some(error) => Err(error),
                        None => Ok(n),
                    }
                }
            }
        };
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
            Script::Rejected => {
                let refuse = |_| Some(EffectError::from_status(422, "card declined"));
                ctx.effect_with("charge", 7, EffectOptions::default(), classified(refuse)).await
            }
            Script::Policy { fails, attempts } => {
                let options = EffectOptions {
                    attempts,
                    backoff_initial: Duration::from_millis(10),
                    backoff_max: Duration::from_millis(40),
                    timeout: None,
                    limit: None,
                };
                let (calls, keys) = (self.calls.clone(), self.keys.clone());
                ctx.effect_with("charge", 7, options, move |key, n| {
                    let (calls, keys) = (calls.clone(), keys.clone());
                    async move {
                        keys.lock().expect("keys").push(key);
                        let made = calls.fetch_add(1, Ordering::SeqCst) + 1;
                        if made <= fails { Err(EffectError::from_status(503, "busy")) } else { Ok(n) }
                    }
                })
                .await
            }
            Script::Throttled => {
                let options = EffectOptions {
                    attempts: 3,
                    backoff_initial: Duration::from_millis(10),
                    backoff_max: Duration::from_millis(10),
                    timeout: None,
                    limit: None,
                };
                let calls = self.calls.clone();
                ctx.effect_with("charge", 7, options, move |_, n| {
                    let calls = calls.clone();
                    async move {
                        match calls.fetch_add(1, Ordering::SeqCst) {
                            0 => Err(EffectError::from_response(429, Some("30"), "slow down")),
                            _ => Ok(n),
                        }
                    }
                })
                .await
            }
            Script::Hangs => {
                let options =
                    EffectOptions { timeout: Some(Duration::from_millis(50)), ..EffectOptions::default() };
                let calls = self.calls.clone();
                ctx.effect_with("charge", 7, options, move |_, n| {
                    let calls = calls.clone();
                    async move {
                        if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                            std::future::pending::<()>().await;
                        }
                        Ok(n)
                    }
                })
                .await
            }
        }
    }
}

async fn open(script: Script) -> (Runtime, Arc<AtomicU32>, Arc<Mutex<Vec<String>>>) {
    let (calls, keys) = (Arc::new(AtomicU32::new(0)), Arc::new(Mutex::new(Vec::new())));
    let store = Store::with_backend(Arc::new(SimBackend::new()), StoreConfig::default()).expect("store");
    let rt = Runtime::builder(store)
        .virtual_clock(VirtualClock::new(Timestamp::from_millis(EPOCH_MS)))
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
    let typed = rt.wait_output::<Effects>(&run).await.expect("wait");
    assert_eq!(typed, Err(ended), "a run that did not complete has no output, only its end");
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
            assert!(error.contains("refund was prepared with other arguments"), "{error}");
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
/// Returned, it re-enters the run through recovery — in a first attempt as after a recovery —
/// which tries again with the same key; an outage that outlasts every recovery escalates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_effect_surfaces_then_the_run_is_recovered_and_tries_again_with_the_same_key() {
    let (rt, calls, keys) = open(Script::Flaky { fails: 4 }).await;
    let run = rt.start::<Effects>("x", &()).await.expect("start").run_id;
    rt.advance(Duration::from_millis(600)).await.expect("advance");
    assert_eq!(calls.load(Ordering::SeqCst), 3, "three calls, then the error reached the fiber");
    assert!(matches!(rt.status(&run).expect("status"), RunStatus::Running), "not failed: an outage");
    let entry = &rt.inspect(&run).expect("inspect").ledger[0];
    assert!(entry.committed.is_none(), "a failed effect stays prepared, its key kept for a retry");
    rt.advance(Duration::from_secs(30)).await.expect("advance");
    assert_eq!(rt.output::<u32>(&run).expect("output"), Some(7), "the recovery's second call succeeded");
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    let keys = keys.lock().expect("keys").clone();
    assert!(keys.iter().all(|k| *k == keys[0]), "one key across the recovery: {keys:?}");

    let (rt, calls, _) = open(Script::Flaky { fails: 1_000 }).await;
    let run = rt.start::<Effects>("y", &()).await.expect("start").run_id;
    rt.advance(Duration::from_secs(600)).await.expect("advance");
    match rt.status(&run).expect("status") {
        RunStatus::Escalated { reason } => {
            assert!(reason.contains("effect refund failed after 3 attempts"), "{reason}");
        }
        other => panic!("expected Escalated after every recovery failed, got {other:?}"),
    }
    assert!(calls.load(Ordering::SeqCst) >= 15, "three calls per entry, five recoveries");
}

/// A permanent error is not retried and fails the run: recovering it would hear it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_error_reaches_the_fiber_at_once_and_fails_the_run() {
    let (rt, calls, _) = open(Script::Rejected).await;
    let run = rt.start::<Effects>("r", &()).await.expect("start").run_id;
    rt.advance(Duration::from_secs(60)).await.expect("advance");
    match rt.status(&run).expect("status") {
        RunStatus::Failed { error } => {
            assert_eq!(error, "effect charge was refused: HTTP 422: card declined");
        }
        other => panic!("expected Failed, got {other:?}"),
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1, "a refusal is not retried");
}

/// `effect_with` follows its own policy: five calls where the default makes three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_effect_follows_its_own_retry_policy() {
    let (rt, calls, keys) = open(Script::Policy { fails: 4, attempts: 5 }).await;
    let run = rt.start::<Effects>("p", &()).await.expect("start").run_id;
    // Backoff caps 10, 20, 40, 40 ms: all of it within 200 ms.
    rt.advance(Duration::from_millis(200)).await.expect("advance");
    let log: Vec<_> = rt.events().iter().map(|e| format!("{} {} {}", e.at_ms, e.kind, e.detail)).collect();
    assert_eq!(rt.output::<u32>(&run).expect("output"), Some(7), "{log:#?}");
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    assert_eq!(keys.lock().expect("keys").len(), 5);
    // Attempts must be at least one: a typed error, nothing called.
    let (rt, calls, _) = open(Script::Policy { fails: 0, attempts: 0 }).await;
    let run = rt.start::<Effects>("z", &()).await.expect("start").run_id;
    rt.advance(Duration::from_secs(1)).await.expect("advance");
    assert!(
        matches!(rt.status(&run).expect("status"), RunStatus::Failed { error } if error.contains("attempts must be at least 1"))
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// A call past its timeout counts as a retryable failure; the next call answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_its_timeout_is_retried() {
    let (rt, calls, _) = open(Script::Hangs).await;
    let run = rt.start::<Effects>("h", &()).await.expect("start").run_id;
    rt.advance(Duration::from_secs(1)).await.expect("advance");
    assert_eq!(rt.output::<u32>(&run).expect("output"), Some(7));
    assert_eq!(calls.load(Ordering::SeqCst), 2, "the hung call timed out, the second answered");
}

/// A 429 with `Retry-After: 30` makes the next call wait the 30 s the upstream asked, not
/// the policy's 10 ms backoff; the call after it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_call_waits_what_the_upstream_asked() {
    let (rt, calls, _) = open(Script::Throttled).await;
    let run = rt.start::<Effects>("t", &()).await.expect("start").run_id;
    rt.advance(Duration::from_secs(1)).await.expect("advance");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "called again before its Retry-After");
    rt.advance(Duration::from_secs(28)).await.expect("advance");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "called again before its Retry-After");
    rt.advance(Duration::from_secs(2)).await.expect("advance");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(rt.output::<u32>(&run).expect("output"), Some(7));
}
