//! An agent's typed hooks behind the kernel's erased interface: the runtime stores every
//! user value as canonical JSON, and `Typed` moves JSON text between the store and the
//! typed hooks of [`Agent`].

use std::{marker::PhantomData, sync::Arc};

use serde::{Serialize, de::DeserializeOwned};

use crate::{
    agent::{Agent, Ctx, Recovered},
    approval_view::ApprovalView,
    error::AgentError,
    hooks::{AlarmEvent, ExhaustedAction},
    json,
    kernel::shared::{BoxFuture, ErasedAgent, RawCtx, RawRecovered},
};

pub(crate) struct Typed<A: Agent>(pub Arc<A>, pub PhantomData<fn() -> A>);

/// The typed recovery of a stored one: its stash decoded (upgraded from an older version if
/// need be) and its input.
fn recovered<A: Agent>(r: RawRecovered) -> Result<Recovered<A>, AgentError> {
    let (stash, step, seq) = match &r.stash {
        Some(stored) => (
            Some(crate::stash::decode_versioned(stored, A::STASH_VERSION, A::upgrade_stash)?),
            Some(stored.record.step.clone()),
            stored.record.seq,
        ),
        None => (None, None, 0),
    };
    // Retrying cannot make an input decode: a human must look at once.
    let input = json::parse(&r.input_json).map_err(|e| {
        AgentError::escalate(format!("input: the stored input does not decode as this code's Input: {e}"))
    })?;
    Ok(Recovered::<A> {
        run_id: r.run_id,
        kind: r.kind,
        stash,
        step,
        seq,
        input,
        attempt: r.attempt,
        reason: r.reason,
        created_at: r.created_at,
    })
}

/// The value, its box freed now rather than when the future that held it ends.
#[allow(clippy::boxed_local)] // The box is the point: the future holds it, not the value.
fn unboxed<T>(boxed: Box<T>) -> T {
    *boxed
}

fn decode<T: DeserializeOwned>(what: &str, text: &str) -> Result<T, AgentError> {
    json::parse(text).map_err(|e| AgentError::Serialization(format!("{what}: {e}")))
}

fn encode<T: Serialize>(what: &str, value: &T) -> Result<String, AgentError> {
    json::canonical(value).map_err(|e| AgentError::Serialization(format!("{what}: {e}")))
}

impl<A: Agent> ErasedAgent for Typed<A> {
    fn check_input(&self, input: &serde_json::Value) -> Result<(), serde_json::Error> {
        <A::Input as serde::Deserialize>::deserialize(input).map(|_| ())
    }

    fn check_stash(&self, stored: &crate::kernel::stash_record::Stored) -> Result<(), AgentError> {
        crate::stash::decode_versioned(stored, A::STASH_VERSION, A::upgrade_stash).map(|_: A::Stash| ())
    }

    fn check_message(&self, message_json: &str) -> Result<(), serde_json::Error> {
        serde_json::from_str::<A::Message>(message_json).map(|_| ())
    }

    fn run_fiber(&self, raw: RawCtx, input_json: String) -> BoxFuture<Result<String, AgentError>> {
        // Decoded before the future is made: a fiber's future holds only what the agent's
        // code needs, for as long as the fiber lives.
        let input: A::Input = match decode("input", &input_json) {
            Ok(input) => input,
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        // Boxed until the call: the agent's future holds the input, and a block that held it
        // too would reserve its size twice for the fiber's whole life.
        let input = Box::new(input);
        let agent = self.0.clone();
        Box::pin(async move {
            let mut ctx = Ctx::<A>::new(raw);
            let output = agent.run_fiber(&mut ctx, unboxed(input)).await?;
            encode("output", &output)
        })
    }

    fn recover(&self, raw: RawCtx, r: RawRecovered) -> BoxFuture<Result<String, AgentError>> {
        let recovered = match recovered::<A>(r) {
            Ok(recovered) => recovered,
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        // Boxed until the call, as `run_fiber`'s input is.
        let recovered = Box::new(recovered);
        let agent = self.0.clone();
        Box::pin(async move {
            let mut ctx = Ctx::<A>::new(raw);
            let output = agent.on_fiber_recovered(&mut ctx, unboxed(recovered)).await?;
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

    fn on_alarm_exhausted(&self, raw: RawCtx, alarm: &AlarmEvent) -> ExhaustedAction {
        self.0.on_alarm_exhausted(&Ctx::<A>::new(raw), alarm)
    }

    fn on_escalate(&self, raw: RawCtx, reason: String) -> BoxFuture<()> {
        let agent = self.0.clone();
        Box::pin(async move { agent.on_escalate(&mut Ctx::<A>::new(raw), &reason).await })
    }

    fn approval_view(&self, approval_id: &str, payload: &serde_json::Value) -> Option<ApprovalView> {
        self.0.approval_view(approval_id, payload)
    }

    fn input_schema(&self) -> Option<serde_json::Value> {
        A::input_schema()
    }
}
