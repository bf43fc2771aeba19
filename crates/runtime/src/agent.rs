//! What users write against: the `Agent` trait — typed input, stash, output and messages,
//! and a handful of hooks with safe defaults — and the `Ctx` its hooks are handed: stash,
//! storage, effects, approvals, durable sleeps and events, alarms, keep-alive, cancellation,
//! secrets. Every durable call goes back through the store's group commit. The two refer to
//! each other (`Ctx<A: Agent>`, hooks taking `&mut Ctx<Self>`), so they share this file.

use std::{future::Future, marker::PhantomData, time::Duration};

use durafiber_store::{access, tables::Decision};
use serde::{Serialize, de::DeserializeOwned};

pub use crate::hooks::{AlarmEvent, ExhaustedAction, RecoveryReason};
use crate::{
    alarm::{self, AlarmSpec},
    approval, budget, clock,
    effect::{self, EffectError, EffectOptions},
    error::AgentError,
    eviction::keep_alive::KeepAlive,
    json,
    kernel::shared::RawCtx,
    secret::{Secret, SecretRefusal},
    stash,
    storage::Storage,
    stream,
};

/// What `on_fiber_recovered` is told: everything needed to continue from the last boundary.
#[derive(Debug, Clone)]
pub struct Recovered<A: Agent> {
    /// The run, under the id it always had.
    pub run_id: String,
    /// The agent kind.
    pub kind: String,
    /// The last durable stash, if any was written.
    pub stash: Option<A::Stash>,
    /// The step named with that stash.
    pub step: Option<String>,
    /// The stash's sequence number (0 when there is none).
    pub seq: u64,
    /// The original input.
    pub input: A::Input,
    /// This fiber attempt's number, from 1.
    pub attempt: u32,
    /// Why the run is re-entered.
    pub reason: RecoveryReason,
    /// When the run was accepted.
    pub created_at_ms: u64,
}

/// A durable agent: one trait impl.
///
/// ```
/// use durafiber_runtime::{Agent, AgentError, Ctx};
/// use serde::{Deserialize, Serialize};
///
/// struct Counter;
///
/// #[derive(Serialize, Deserialize, Clone)]
/// struct Progress { done: u32 }
///
/// impl Agent for Counter {
///     const KIND: &'static str = "counter";
///     type Input = u32;
///     type Stash = Progress;
///     type Output = u32;
///     type Message = ();
///
///     async fn run_fiber(&self, ctx: &mut Ctx<Self>, target: u32) -> Result<u32, AgentError> {
///         count(ctx, Progress { done: 0 }, target).await
///     }
///
///     async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, r: durafiber_runtime::Recovered<Self>)
///         -> Result<u32, AgentError> {
///         count(ctx, r.stash.unwrap_or(Progress { done: 0 }), r.input).await
///     }
/// }
///
/// async fn count(ctx: &mut Ctx<Counter>, mut p: Progress, target: u32) -> Result<u32, AgentError> {
///     while p.done < target {
///         p.done += 1;
///         ctx.stash("counting", &p).await?;
///     }
///     Ok(p.done)
/// }
/// ```
pub trait Agent: Send + Sync + Sized + 'static {
    /// The kind name runs are started with.
    const KIND: &'static str;
    /// What `start` is given.
    type Input: Serialize + DeserializeOwned + Clone + Send + Sync + 'static;
    /// The typed snapshot `stash` writes.
    type Stash: Serialize + DeserializeOwned + Clone + Send + Sync + 'static;
    /// What a completed run returns.
    type Output: Serialize + DeserializeOwned + Send + 'static;
    /// Messages sent to a run from outside, handled one at a time.
    type Message: Serialize + DeserializeOwned + Send + 'static;

    /// The shape of [`Agent::Stash`], stored with every stash. Bump it when a deploy changes
    /// the type in a way old stashes do not decode as (a field without a serde default, a
    /// renamed or retyped field), and teach [`Agent::upgrade_stash`] the old shape.
    const STASH_VERSION: u32 = 1;

    /// Turns a stash stored by an older version of this agent (`from_version`, as JSON) into
    /// this version's `Stash`. Called when a run is recovered (and by `Ctx::last_stash`)
    /// with a stash older than [`Agent::STASH_VERSION`]; the stored stash itself is replaced
    /// at the run's next stash. The default has no upgrade: the run escalates with a reason
    /// that names both versions, so a human decides — never a panic, never a silent default.
    ///
    /// ```
    /// # use durafiber_runtime::AgentError;
    /// # #[derive(serde::Deserialize)] struct V1 { done: u32 }
    /// # struct Progress { done: u32, retries: u32 }
    /// // Version 2 added `retries`: a version 1 stash starts it at 0.
    /// fn upgrade_stash(from_version: u32, old: serde_json::Value) -> Result<Progress, AgentError> {
    ///     match from_version {
    ///         1 => {
    ///             let v1: V1 = serde_json::from_value(old).map_err(|e| AgentError::fail(e.to_string()))?;
    ///             Ok(Progress { done: v1.done, retries: 0 })
    ///         }
    ///         v => Err(AgentError::escalate(format!("stash_version: no upgrade from {v}"))),
    ///     }
    /// }
    /// # assert_eq!(upgrade_stash(1, serde_json::json!({"done": 3})).map(|p| (p.done, p.retries)).ok(), Some((3, 0)));
    /// ```
    fn upgrade_stash(from_version: u32, old: serde_json::Value) -> Result<Self::Stash, AgentError> {
        let _ = old;
        Err(AgentError::escalate(format!(
            "stash_version: the stored stash is version {from_version}, this code is version {} and has no upgrade from it",
            Self::STASH_VERSION
        )))
    }

    /// The job's entry point; runs once per run unless the run is interrupted.
    fn run_fiber(
        &self,
        ctx: &mut Ctx<Self>,
        input: Self::Input,
    ) -> impl Future<Output = Result<Self::Output, AgentError>> + Send;

    /// Continues an interrupted run from its last stash. The default never guesses: it
    /// escalates, so that a human looks.
    fn on_fiber_recovered(
        &self,
        ctx: &mut Ctx<Self>,
        recovered: Recovered<Self>,
    ) -> impl Future<Output = Result<Self::Output, AgentError>> + Send {
        let _ = (ctx, recovered);
        async { Err(AgentError::escalate("no recovery hook: a human must look")) }
    }

    /// Handles a due alarm. An error (or a panic, or the wall limit) counts one retry.
    fn on_alarm(
        &self,
        ctx: &mut Ctx<Self>,
        alarm: AlarmEvent,
    ) -> impl Future<Output = Result<(), AgentError>> + Send {
        let _ = (ctx, alarm);
        async { Ok(()) }
    }

    /// Decides what an abandoned alarm does to the run. Default: a one-off alarm escalates
    /// the run; an occurrence of a periodic or cron alarm (`alarm.recurring`) is dead-lettered
    /// by itself and the run and the schedule go on. `ctx` reads the run (its id, storage,
    /// alarms) to decide.
    fn on_alarm_exhausted(&self, ctx: &Ctx<Self>, alarm: &AlarmEvent) -> ExhaustedAction {
        let _ = ctx;
        if alarm.recurring { ExhaustedAction::Ignore } else { ExhaustedAction::Escalate }
    }

    /// The JSON Schema of [`Agent::Input`], for the server's OpenAPI document: with one, the
    /// document shows the start body of this kind; without one (the default), its input is
    /// free JSON. With the feature `schemars` and an input that derives
    /// `schemars::JsonSchema`, it is one line:
    ///
    /// ```ignore
    /// fn input_schema() -> Option<serde_json::Value> {
    ///     Some(durafiber::input_schema_of::<Claim>())
    /// }
    /// ```
    fn input_schema() -> Option<serde_json::Value> {
        None
    }

    /// How the console shows the payload of approval `approval_id` to a reviewer: a title,
    /// a one-line summary and labelled, formatted fields. `payload` is exactly what
    /// `request_approval` stored (secrets redacted). `None`, the default, shows the payload's
    /// own fields with their names as labels. The decision always quotes the exact payload's
    /// hash, whatever this shows.
    fn approval_view(&self, approval_id: &str, payload: &serde_json::Value) -> Option<crate::ApprovalView> {
        let _ = (approval_id, payload);
        None
    }

    /// Runs once when the run enters `Escalated` (approval timeout, exhausted alarm, ...),
    /// outside the fiber: tell a human through `ctx.effect`, whose idempotency key keeps the
    /// notice single however often the hook is re-entered, or note it in `ctx.storage()`.
    fn on_escalate(&self, ctx: &mut Ctx<Self>, reason: &str) -> impl Future<Output = ()> + Send {
        let _ = (ctx, reason);
        async {}
    }

    /// Handles a message from outside. The default refuses it.
    fn on_message(
        &self,
        ctx: &mut Ctx<Self>,
        message: Self::Message,
    ) -> impl Future<Output = Result<(), AgentError>> + Send {
        let _ = (ctx, message);
        async { Err(AgentError::fail("this agent takes no messages")) }
    }

    /// Answers a request from outside (`Runtime::request`): like `on_message` — one at a
    /// time, beside the fiber, under the message wall limit — but the caller gets the reply.
    /// A request is not durable: a caller that got no answer asks again. The default
    /// refuses it.
    fn on_request(
        &self,
        ctx: &mut Ctx<Self>,
        message: Self::Message,
    ) -> impl Future<Output = Result<serde_json::Value, AgentError>> + Send {
        let _ = (ctx, message);
        async { Err(AgentError::fail("this agent takes no requests")) }
    }
}

/// What an agent's hooks are handed. Typed by the agent, so `stash` takes its `Stash` type.
pub struct Ctx<A: Agent> {
    pub(crate) raw: RawCtx,
    _agent: PhantomData<fn() -> A>,
}

impl<A: Agent> Ctx<A> {
    pub(crate) fn new(raw: RawCtx) -> Self {
        Ctx { raw, _agent: PhantomData }
    }

    /// The run's id, the same before and after every crash.
    pub fn run_id(&self) -> &str {
        &self.raw.cell.run_id
    }

    /// This fiber attempt's number, from 1 (0 in `on_alarm` and `on_message`).
    pub fn attempt(&self) -> u32 {
        self.raw.attempt
    }

    /// The runtime clock's time, ms since the epoch.
    pub fn now_ms(&self) -> u64 {
        self.raw.shared.now_ms()
    }

    /// Persists the run's snapshot at a named step, replacing the last one. In `sync`
    /// durability it returns once the stash is on disk.
    /// Only the fiber stashes: a handler gets [`AgentError::StashFromHandler`] and writes
    /// [`Ctx::storage`] instead.
    pub async fn stash(&mut self, step: &str, value: &A::Stash) -> Result<(), AgentError> {
        if !self.raw.in_fiber {
            return Err(AgentError::StashFromHandler);
        }
        self.raw.refuse_if_cancelled("stash")?;
        let text = json::canonical(value).map_err(AgentError::Serialization)?;
        budget::check(&self.raw)?;
        // Boxed, as every durable call here is: its state lives while it runs, not in the
        // agent's future for the whole of the fiber's life.
        Box::pin(stash::write(&mut self.raw, step, text, A::STASH_VERSION)).await
    }

    /// Appends `chunk` to the run's durable output stream (model tokens, progress lines) and
    /// returns its sequence number. It becomes durable with the run's next boundary — a
    /// stash, an effect, a wait, the fiber's end — in the same write. Readers
    /// (`Runtime::stream`, `GET /runs/{id}/stream`) see only durable chunks, so nothing they
    /// were shown is ever taken back.
    ///
    /// **The stream is exactly what an uninterrupted run would emit.** Each stash records the
    /// fiber's place in the stream. A fiber re-entered at its last stash (after a crash, an
    /// eviction, a wait) stands at that place again: a chunk it emits where the stream already
    /// holds one is matched with it — not stored, not shown again, its sequence number
    /// returned — and the first chunk past the stream's end continues it. So write the fiber
    /// plainly, with no guard against repeats; a re-entered fiber that emits a *different*
    /// chunk at a place the stream holds gets [`AgentError::StreamDiverged`] and the run is
    /// escalated (its code or inputs changed since). Past `stream_bytes_max` it is
    /// [`AgentError::StreamFull`]. Fiber only.
    ///
    /// ```no_run
    /// # use durafiber_runtime::{Agent, AgentError, Ctx, Recovered};
    /// struct Writer;
    /// impl Agent for Writer {
    ///     const KIND: &'static str = "writer";
    ///     type Input = u32;
    ///     type Stash = u32;
    ///     type Output = ();
    ///     type Message = ();
    ///     async fn run_fiber(&self, ctx: &mut Ctx<Self>, lines: u32) -> Result<(), AgentError> {
    ///         write_from(ctx, 0, lines).await
    ///     }
    ///     async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, r: Recovered<Self>) -> Result<(), AgentError> {
    ///         write_from(ctx, r.stash.unwrap_or(0), r.input).await
    ///     }
    /// }
    /// async fn write_from(ctx: &mut Ctx<Writer>, from: u32, lines: u32) -> Result<(), AgentError> {
    ///     for line in from..lines {
    ///         ctx.emit(&format!("line {line}"))?;
    ///         ctx.stash("line", &(line + 1)).await?; // the line and the progress, in one write
    ///     }
    ///     Ok(())
    /// }
    /// ```
    pub fn emit<T: Serialize + ?Sized>(&self, chunk: &T) -> Result<u64, AgentError> {
        stream::emit(&self.raw, chunk)
    }

    /// [`Ctx::emit`], durable before it returns: one commit per chunk (group commit shares
    /// the barrier among runs). A crash then loses no chunk, and a fiber re-entered at its
    /// last stash emits again as [`Ctx::emit`] says: what the stream holds is matched, not
    /// repeated.
    pub async fn emit_sync<T: Serialize + ?Sized>(&mut self, chunk: &T) -> Result<u64, AgentError> {
        self.raw.refuse_if_cancelled("emit_sync")?;
        Box::pin(stream::emit_sync(&self.raw, chunk)).await
    }

    /// The sequence number the fiber's next chunk gets: its place in the output stream. After
    /// a re-entry, the place recorded with the stash it re-entered, which may be behind the
    /// stream's end while the fiber emits again what the stream holds (see [`Ctx::emit`]).
    pub fn stream_len(&self) -> Result<u64, AgentError> {
        stream::next_seq(&self.raw)
    }

    /// The run's last durable stash, with its step and sequence number; `None` before the
    /// first. Readable from the fiber and from handlers (`on_alarm`, `on_message`): the fiber
    /// owns the stash, a handler reads what it last committed.
    /// A stash of an older [`Agent::STASH_VERSION`] is upgraded as recovery upgrades it.
    pub fn last_stash(&self) -> Result<Option<(A::Stash, String, u64)>, AgentError> {
        let Some(stored) = stash::read(&self.raw.shared.store, &self.raw.cell.run_id)? else {
            return Ok(None);
        };
        let stash = stash::decode_versioned(&stored, A::STASH_VERSION, A::upgrade_stash)?;
        Ok(Some((stash, stored.record.step, stored.record.seq)))
    }

    /// The run's own key-value storage, in the fiber and in handlers alike; see [`Storage`].
    /// A write is durable with the run's next boundary, or at `storage().sync()`.
    pub fn storage(&self) -> Storage<'_> {
        Storage::new(&self.raw.shared, &self.raw.cell)
    }

    /// Performs one side effect exactly once per `(run, effect_id)` (§5). `f` gets the
    /// idempotency key, minted once and persisted before the first call, and the arguments.
    /// A committed effect returns its stored receipt without calling `f`.
    pub async fn effect<Args, R, F, Fut, E>(
        &mut self,
        effect_id: &str,
        args: Args,
        f: F,
    ) -> Result<R, AgentError>
    where
        Args: Serialize + Clone + Send,
        R: Serialize + DeserializeOwned + Send,
        F: FnMut(String, Args) -> Fut + Send,
        Fut: Future<Output = Result<R, E>> + Send,
        E: std::fmt::Display,
    {
        self.raw.refuse_if_cancelled(&format!("effect {effect_id}"))?;
        let mut f = f;
        let call = move |key, args| {
            let answer = f(key, args);
            async move { answer.await.map_err(|e| EffectError::Retryable(e.to_string())) }
        };
        Box::pin(effect::perform(&mut self.raw, effect_id, args, EffectOptions::default(), call)).await
    }

    /// [`Ctx::effect`] with its own retry policy, and errors that say whether to retry:
    /// `f` answers [`EffectError::Permanent`] for a refusal (it reaches the fiber at once as
    /// [`AgentError::EffectRejected`]) and [`EffectError::Retryable`] for the rest (tried
    /// again per `options`, then [`AgentError::EffectFailed`]). `?` on any error is retryable.
    ///
    /// What a fiber does with an effect that failed is its choice, made in code:
    /// - return the error: a rejected effect fails the run; an exhausted one re-enters the run
    ///   through recovery, like an interruption, with the same key (counted against
    ///   `max_recover_attempts`, then escalated);
    /// - `AgentError::escalate(..)`: a human looks at once;
    /// - park and try later: `ctx.sleep_for("retry-charge", Duration::from_secs(600))`, then
    ///   call the effect again; its key is the same, its attempts start over.
    ///
    /// ```no_run
    /// # use durafiber_runtime::{Agent, AgentError, Ctx, EffectError, EffectOptions};
    /// # use std::time::Duration;
    /// # async fn post(key: &str, cents: u64) -> std::io::Result<(u16, String)> { Ok((200, String::new())) }
    /// # async fn charge<A: Agent>(ctx: &mut Ctx<A>) -> Result<String, AgentError> {
    /// let policy = EffectOptions { attempts: 5, timeout: Some(Duration::from_secs(10)), ..Default::default() };
    /// ctx.effect_with("charge", 1250u64, policy, |key, cents| async move {
    ///     let (status, body) = post(&key, cents).await?; // an I/O error: retryable
    ///     if status >= 400 {
    ///         return Err(EffectError::from_status(status, body)); // a 4xx: permanent
    ///     }
    ///     Ok(body)
    /// })
    /// .await
    /// # }
    /// ```
    pub async fn effect_with<Args, R, F, Fut>(
        &mut self,
        effect_id: &str,
        args: Args,
        options: EffectOptions,
        f: F,
    ) -> Result<R, AgentError>
    where
        Args: Serialize + Clone + Send,
        R: Serialize + DeserializeOwned + Send,
        F: FnMut(String, Args) -> Fut + Send,
        Fut: Future<Output = Result<R, EffectError>> + Send,
    {
        self.raw.refuse_if_cancelled(&format!("effect {effect_id}"))?;
        Box::pin(effect::perform(&mut self.raw, effect_id, args, options, f)).await
    }

    /// Pauses for a human (§6): writes the pause bound to the payload's hash, then waits.
    /// Re-entered after a crash with the same payload, it returns the recorded decision.
    pub async fn request_approval<P: Serialize>(
        &mut self,
        approval_id: &str,
        payload: &P,
    ) -> Result<Decision, AgentError> {
        self.raw.refuse_if_cancelled(&format!("approval {approval_id}"))?;
        // What a reviewer is shown never holds a secret value.
        let (payload_json, payload_hash) =
            self.raw.shared.redacted_with_hash(payload).map_err(AgentError::Serialization)?;
        budget::check(&self.raw)?;
        Box::pin(approval::request(&mut self.raw, approval_id, payload_json, payload_hash)).await
    }

    /// Sets (or replaces) the run's alarm called `name`.
    pub async fn set_alarm(&self, name: &str, spec: AlarmSpec) -> Result<(), AgentError> {
        let raw = &self.raw;
        alarm::set(&raw.shared, &raw.cell.run_id, name, spec, None, Some(&raw.cell))
            .await
            .map_err(AgentError::from)
    }

    /// Cancels the run's alarm called `name`; true when there was one.
    pub async fn cancel_alarm(&self, name: &str) -> Result<bool, AgentError> {
        alarm::cancel(&self.raw.shared, &self.raw.cell.run_id, name).await.map_err(AgentError::from)
    }

    /// The run's pending alarms, by name, each with its next due time, its cron schedule and
    /// its failed occurrences being retried. The runtime's own (an approval's escalation, a
    /// durable sleep's wake, an event wait's timeout) are among them, marked by
    /// `AlarmRecord::system`; only the others are the agent's to cancel.
    pub fn alarms(&self) -> Result<Vec<alarm::Alarm>, AgentError> {
        alarm::list(&self.raw.shared, &self.raw.cell.run_id).map_err(AgentError::from)
    }

    /// Keeps the run from hibernation and eviction while the guard lives.
    pub fn keep_alive(&self) -> KeepAlive {
        KeepAlive::acquire(self.raw.shared.clone(), &self.raw.cell.run_id)
    }

    /// Runs `fut` holding a keep-alive.
    pub async fn keep_alive_while<F: Future>(&self, fut: F) -> F::Output {
        let _guard = self.keep_alive();
        fut.await
    }

    /// Whether the run was asked to stop.
    pub fn is_cancelled(&self) -> bool {
        self.raw.cell.cancel.is_requested()
    }

    /// Completes when the run is asked to stop.
    pub async fn cancelled(&self) {
        if self.raw.in_fiber {
            // A fiber that waits here has nothing more to do: its recovery has settled.
            self.raw.shared.settle_hook(&self.raw.cell).await;
        }
        self.raw.shared.parked(self.raw.in_fiber, self.raw.cell.cancel.requested()).await;
    }

    /// Sleeps durably for `d` under `name` (§2.4): the wake time is committed as a boundary
    /// and the run is `Waiting{alarm}` until then — it may be evicted or hibernated, and it
    /// survives restarts. Names are journaled: re-entered after a recovery, a sleep whose
    /// time has passed returns at once and a pending one keeps its original wake time. Use
    /// a new name for each sleep of a run (`"poll:3"`, not `"poll"` in a loop).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use durafiber_runtime::{Agent, AgentError, Ctx};
    /// # struct Reminder;
    /// # impl Agent for Reminder {
    /// #     const KIND: &'static str = "reminder";
    /// #     type Input = ();
    /// #     type Stash = ();
    /// #     type Output = ();
    /// #     type Message = ();
    /// async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<(), AgentError> {
    ///     ctx.sleep_for("cool-off", Duration::from_secs(3 * 24 * 3600)).await?; // three days
    ///     Ok(())
    /// }
    /// # }
    /// ```
    pub async fn sleep_for(&mut self, name: &str, d: Duration) -> Result<(), AgentError> {
        self.raw.refuse_if_cancelled(&format!("sleep {name}"))?;
        budget::check(&self.raw)?;
        Box::pin(crate::sleep::sleep(&mut self.raw, name, crate::alarm::AlarmAt::In(d))).await
    }

    /// Sleeps durably under `name` until the clock reads `at_ms`; see [`Ctx::sleep_for`].
    pub async fn sleep_until(&mut self, name: &str, at_ms: u64) -> Result<(), AgentError> {
        self.raw.refuse_if_cancelled(&format!("sleep {name}"))?;
        budget::check(&self.raw)?;
        Box::pin(crate::sleep::sleep(&mut self.raw, name, crate::alarm::AlarmAt::AtMs(at_ms))).await
    }

    /// Waits durably for the external event `name` (sent with `Runtime::send_event`): the run
    /// is `Waiting{event}` meanwhile and may be evicted. `None` when `timeout` passes first.
    /// The result is journaled under `name`: re-entered, the call returns it again at once,
    /// so give each wait of a run its own name (`"payment:2"`).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use durafiber_runtime::{Agent, AgentError, Ctx};
    /// # struct Checkout;
    /// # impl Agent for Checkout {
    /// #     const KIND: &'static str = "checkout";
    /// #     type Input = ();
    /// #     type Stash = ();
    /// #     type Output = bool;
    /// #     type Message = ();
    /// async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<bool, AgentError> {
    ///     let paid: Option<String> = ctx.wait_for_event("paid", Some(Duration::from_secs(3600))).await?;
    ///     Ok(paid.is_some())
    /// }
    /// # }
    /// ```
    pub async fn wait_for_event<T: DeserializeOwned>(
        &mut self,
        name: &str,
        timeout: Option<Duration>,
    ) -> Result<Option<T>, AgentError> {
        self.raw.refuse_if_cancelled(&format!("wait for event {name}"))?;
        budget::check(&self.raw)?;
        match Box::pin(crate::event::wait(&mut self.raw, name, timeout)).await? {
            Some(payload) => Ok(Some(json::parse(&payload).map_err(AgentError::Serialization)?)),
            None => Ok(None),
        }
    }

    /// Records `units` of cost (model tokens, API credits — whatever the run's budget counts)
    /// spent on `what`. Durable with the run's next boundary; once the run's charges pass its
    /// `cost_units_max`, it stops at that boundary with `Escalated{reason: "budget:
    /// cost_units"}` and starts no new effect.
    ///
    /// ```no_run
    /// # use durafiber_runtime::{Agent, AgentError, Ctx};
    /// # struct Researcher;
    /// # impl Agent for Researcher {
    /// #     const KIND: &'static str = "researcher";
    /// #     type Input = ();
    /// #     type Stash = u32;
    /// #     type Output = ();
    /// #     type Message = ();
    /// async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<(), AgentError> {
    ///     for turn in 1.. {
    ///         let tokens_used = 1_200; // what the model call reported
    ///         ctx.charge(tokens_used, "model turn");
    ///         ctx.stash("turn", &turn).await?; // stops here once the budget is spent
    ///     }
    ///     Ok(())
    /// }
    /// # }
    /// ```
    pub fn charge(&self, units: u64, what: &str) {
        budget::charge(&self.raw, units, what)
    }

    /// Sleeps on the runtime's clock, in memory only: an interruption loses the wait, and
    /// recovery re-enters the last boundary. [`Ctx::sleep_for`] is the durable one.
    pub async fn sleep_in_memory(&self, d: Duration) {
        let sleep = clock::sleep(self.raw.shared.clock.as_ref(), d);
        self.raw.shared.parked(self.raw.in_fiber, sleep).await
    }

    /// The value behind a secret pointer, to be sent to `url`: handed over only when `url`'s
    /// scheme, host and port are among the secret's destinations
    /// (`DURAFIBER_SECRET_<NAME>_HOSTS`, or [`crate::Secrets::bind`]). Anything else is
    /// `AgentError::SecretRefused`, and the run's event log says where it would have gone:
    /// a run whose input names the URL cannot send the key to a server of its caller's.
    ///
    /// ```no_run
    /// # use durafiber_runtime::{Agent, AgentError, Ctx, Secret};
    /// # async fn pay<A: Agent>(ctx: &Ctx<A>, url: &str) -> Result<(), AgentError> {
    /// let key = ctx.secret_for(&Secret::named("stripe_key"), url)?; // only to api.stripe.com
    /// # Ok(()) }
    /// ```
    pub fn secret_for(&self, secret: &Secret, url: &str) -> Result<String, AgentError> {
        let shared = &self.raw.shared;
        shared.secrets.resolve_for(secret, url).map_err(|refusal| {
            let destination = match refusal {
                SecretRefusal::Unknown => "(not configured)".to_string(),
                SecretRefusal::Destination(d) => d,
            };
            let run_id = &self.raw.cell.run_id;
            tracing::warn!(run_id, secret = %secret.secret, destination, "a secret was refused for a destination it is not bound to");
            let detail = format!("{} to {destination}", secret.secret);
            shared.event(run_id, "secret_refused", detail.clone());
            // Into the audit trail too, beside what callers asked for: by the run itself.
            let (store, run, now) = (shared.store.clone(), run_id.clone(), shared.now_ms());
            shared.spawn_tracked(async move {
                let actor = format!("run:{run}");
                if let Err(e) = access::append(&store, &actor, "secret_refused", Some(&run), &detail, now).await {
                    tracing::error!(run_id = %run, error = %e, "could not audit a refused secret");
                }
            });
            AgentError::SecretRefused { name: secret.secret.clone(), destination }
        })
    }

    /// The value behind a secret pointer, resolved now and never stored — for a use inside
    /// the process (signing, say). A value sent anywhere goes through [`Ctx::secret_for`].
    pub fn secret(&self, secret: &Secret) -> Result<String, AgentError> {
        self.raw
            .shared
            .secrets
            .resolve(secret)
            .ok_or_else(|| AgentError::fail(format!("secret {} is not configured", secret.secret)))
    }
}
