//! The run's actor: one per live run, one inbound event at a time.
//!
//! It holds read-only handles; `pre_start` reads the run back from the store. The fiber runs
//! as its own task beside the actor (see `fiber.rs`), so messages and alarms are handled while
//! a fiber awaits. Before: `activate.rs` spawns it. After: `fiber.rs`, `alarm_delivery.rs`.

use std::{panic::AssertUnwindSafe, sync::Arc};

use durafiber_store::tables::RunRecord;
use futures::FutureExt;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::Instrument;

use crate::{
    clock,
    error::{AgentError, panic_text},
    hooks::AlarmEvent,
    kernel::cell::RunCell,
    kernel::inbox::RunMsg,
    kernel::shared::{RawCtx, Shared},
    run::fiber,
};

pub(crate) struct RunActor {
    pub shared: Arc<Shared>,
}

pub(crate) struct RunActorState {
    cell: Arc<RunCell>,
    /// The run as it was when the actor started, for the span's fields.
    run: RunRecord,
}

impl Actor for RunActor {
    type Msg = RunMsg;
    type State = RunActorState;
    type Arguments = Arc<RunCell>;

    async fn pre_start(
        &self,
        _me: ActorRef<RunMsg>,
        cell: Arc<RunCell>,
    ) -> Result<RunActorState, ActorProcessingErr> {
        let run = self.shared.load_run(&cell.run_id)?;
        Ok(RunActorState { cell, run })
    }

    async fn handle(
        &self,
        _me: ActorRef<RunMsg>,
        msg: RunMsg,
        state: &mut RunActorState,
    ) -> Result<(), ActorProcessingErr> {
        let span = tracing::info_span!("run_event", run_id = %state.cell.run_id, kind = %state.run.kind, attempt = state.run.attempt);
        match msg {
            RunMsg::Activate { busy, since } => {
                fiber::on_activate(&self.shared, &state.cell, since).instrument(span).await;
                drop(busy);
            }
            RunMsg::Message { json, reply } => {
                let result = self.on_message(&state.cell, json).instrument(span).await;
                let _ = reply.send(result);
            }
            RunMsg::Request { json, reply } => {
                let result = self.on_request(&state.cell, json).instrument(span).await;
                let _ = reply.send(result);
            }
            RunMsg::Alarm { event, reply } => {
                let result = self.on_alarm(&state.cell, event).instrument(span).await;
                let _ = reply.send(result);
            }
        }
        Ok(())
    }
}

impl RunActor {
    async fn on_message(&self, cell: &Arc<RunCell>, json: String) -> Result<(), AgentError> {
        let agent = self.shared.agent(&cell.kind).map_err(AgentError::from)?;
        let raw = RawCtx::new(self.shared.clone(), cell.clone(), 0);
        self.under_wall_limit("on_message", agent.on_message(raw, json)).await
    }

    async fn on_request(&self, cell: &Arc<RunCell>, json: String) -> Result<String, AgentError> {
        let agent = self.shared.agent(&cell.kind).map_err(AgentError::from)?;
        let raw = RawCtx::new(self.shared.clone(), cell.clone(), 0);
        self.under_wall_limit("on_request", agent.on_request(raw, json)).await
    }

    /// Runs a message or request handler: a panic or the message wall limit is its failure.
    async fn under_wall_limit<T>(
        &self,
        hook: &str,
        handler: impl std::future::Future<Output = Result<T, AgentError>>,
    ) -> Result<T, AgentError> {
        let handler = AssertUnwindSafe(handler).catch_unwind();
        match clock::timeout(self.shared.clock.as_ref(), self.shared.config.message_wall_limit, handler).await
        {
            None => Err(AgentError::fail(format!("{hook} exceeded the message wall limit"))),
            Some(Err(panic)) => Err(AgentError::fail(format!("{hook} panicked: {}", panic_text(panic)))),
            Some(Ok(result)) => result,
        }
    }

    async fn on_alarm(&self, cell: &Arc<RunCell>, event: AlarmEvent) -> Result<(), AgentError> {
        let agent = self.shared.agent(&cell.kind).map_err(AgentError::from)?;
        let raw = RawCtx::new(self.shared.clone(), cell.clone(), 0);
        let handler = AssertUnwindSafe(agent.on_alarm(raw, event)).catch_unwind();
        match clock::timeout(self.shared.clock.as_ref(), self.shared.config.alarm_wall_limit, handler).await {
            None => Err(AgentError::fail("on_alarm exceeded the alarm wall limit")),
            Some(Err(panic)) => Err(AgentError::fail(format!("on_alarm panicked: {}", panic_text(panic)))),
            Some(Ok(result)) => result,
        }
    }
}
