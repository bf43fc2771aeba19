//! The trait users implement. Writing an agent reads like writing one actor: typed input,
//! typed stash, typed output, typed messages, and a handful of hooks with safe defaults.
//!
//! The runtime stores every user value as canonical JSON, so the erased side of this module
//! (`Typed`, the kernel's `ErasedAgent`) moves JSON text between the store and the typed hooks.

use std::{future::Future, marker::PhantomData, sync::Arc};

use serde::{Serialize, de::DeserializeOwned};

pub use crate::hooks::{AlarmEvent, ExhaustedAction, RecoveryReason};
use crate::{
    error::AgentError,
    fiber::ctx::Ctx,
    json,
    kernel::shared::{BoxFuture, ErasedAgent, RawCtx, RawRecovered},
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

    /// Decides what an abandoned alarm does to the run. Default: escalate.
    fn on_alarm_exhausted(&self, run_id: &str, alarm: &AlarmEvent) -> ExhaustedAction {
        let _ = (run_id, alarm);
        ExhaustedAction::Escalate
    }

    /// Runs once when the run enters `Escalated` (approval timeout, exhausted alarm, ...).
    fn on_escalate(&self, run_id: &str, reason: &str) -> impl Future<Output = ()> + Send {
        let _ = (run_id, reason);
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

pub(crate) struct Typed<A: Agent>(pub Arc<A>, pub PhantomData<fn() -> A>);

fn decode<T: DeserializeOwned>(what: &str, text: &str) -> Result<T, AgentError> {
    json::parse(text).map_err(|e| AgentError::Serialization(format!("{what}: {e}")))
}

fn encode<T: Serialize>(what: &str, value: &T) -> Result<String, AgentError> {
    json::canonical(value).map_err(|e| AgentError::Serialization(format!("{what}: {e}")))
}

impl<A: Agent> ErasedAgent for Typed<A> {
    fn check_input(&self, input_json: &str) -> Result<(), String> {
        json::parse::<A::Input>(input_json).map(|_| ())
    }

    fn check_message(&self, message_json: &str) -> Result<(), String> {
        json::parse::<A::Message>(message_json).map(|_| ())
    }

    fn run_fiber(&self, raw: RawCtx, input_json: String) -> BoxFuture<Result<String, AgentError>> {
        let agent = self.0.clone();
        Box::pin(async move {
            let input: A::Input = decode("input", &input_json)?;
            let mut ctx = Ctx::<A>::new(raw);
            let output = agent.run_fiber(&mut ctx, input).await?;
            encode("output", &output)
        })
    }

    fn recover(&self, raw: RawCtx, r: RawRecovered) -> BoxFuture<Result<String, AgentError>> {
        let agent = self.0.clone();
        Box::pin(async move {
            let (stash, step, seq) = match r.stash {
                Some((json, step, seq)) => (Some(decode::<A::Stash>("stash", &json)?), Some(step), seq),
                None => (None, None, 0),
            };
            let recovered = Recovered::<A> {
                run_id: r.run_id,
                kind: r.kind,
                stash,
                step,
                seq,
                input: decode("input", &r.input_json)?,
                attempt: r.attempt,
                reason: r.reason,
                created_at_ms: r.created_at_ms,
            };
            let mut ctx = Ctx::<A>::new(raw);
            let output = agent.on_fiber_recovered(&mut ctx, recovered).await?;
            encode("output", &output)
        })
    }

    fn on_alarm(&self, raw: RawCtx, alarm: AlarmEvent) -> BoxFuture<Result<(), AgentError>> {
        let agent = self.0.clone();
        Box::pin(async move {
            let mut ctx = Ctx::<A>::new(raw);
            agent.on_alarm(&mut ctx, alarm).await
        })
    }

    fn on_message(&self, raw: RawCtx, message_json: String) -> BoxFuture<Result<(), AgentError>> {
        let agent = self.0.clone();
        Box::pin(async move {
            let message: A::Message = decode("message", &message_json)?;
            let mut ctx = Ctx::<A>::new(raw);
            agent.on_message(&mut ctx, message).await
        })
    }

    fn on_request(&self, raw: RawCtx, message_json: String) -> BoxFuture<Result<String, AgentError>> {
        let agent = self.0.clone();
        Box::pin(async move {
            let message: A::Message = decode("request", &message_json)?;
            let mut ctx = Ctx::<A>::new(raw);
            let reply = agent.on_request(&mut ctx, message).await?;
            encode("reply", &reply)
        })
    }

    fn on_alarm_exhausted(&self, run_id: &str, alarm: &AlarmEvent) -> ExhaustedAction {
        self.0.on_alarm_exhausted(run_id, alarm)
    }

    fn on_escalate(&self, run_id: String, reason: String) -> BoxFuture<()> {
        let agent = self.0.clone();
        Box::pin(async move { agent.on_escalate(&run_id, &reason).await })
    }
}
