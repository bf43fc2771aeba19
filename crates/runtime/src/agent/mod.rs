//! What users write against: the `Agent` trait — typed input, stash, output and messages,
//! and a handful of hooks with safe defaults — and the `Ctx` its hooks are handed: stash,
//! storage, effects, approvals, durable sleeps and events, alarms, keep-alive, cancellation,
//! secrets. Every durable call goes back through the store's group commit. The two refer to
//! each other (`Ctx<A: Agent>`, hooks taking `&mut Ctx<Self>`): `Ctx` is declared here, and
//! what it does is in `ctx.rs`, `waits.rs`, `children.rs` and `secrets.rs`.

use durafiber_api::Timestamp;
use durafiber_store::RunId;
use std::{future::Future, marker::PhantomData};

use serde::{Serialize, de::DeserializeOwned};

mod children;
mod ctx;
mod secrets;
mod waits;

pub use crate::hooks::{AlarmEvent, ExhaustedAction, RecoveryReason};
use crate::{error::AgentError, kernel::shared::RawCtx};

/// What `on_fiber_recovered` is told: everything needed to continue from the last boundary.
#[derive(Debug, Clone)]
pub struct Recovered<A: Agent> {
    /// The run, under the id it always had.
    pub run_id: RunId,
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
    pub created_at: Timestamp,
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
    fn approval_view(
        &self,
        approval_id: &str,
        payload: &serde_json::Value,
    ) -> Option<crate::approval_view::ApprovalView> {
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
