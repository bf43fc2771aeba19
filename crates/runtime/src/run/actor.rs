//! The run's actor: one per live run, one inbound event at a time.
//!
//! Its state is the run's cell, built by activation from the one read of the run it makes.
//! The actor owns its fiber's lifecycle: it spawns the fiber as a task of its own (see
//! `fiber.rs`), so messages and alarms are handled while the fiber awaits, and the eviction
//! that kills the actor aborts that task. Before: `activate.rs` spawns it. After: `fiber.rs`, `alarm_delivery.rs`.

use std::{panic::AssertUnwindSafe, sync::Arc};

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

impl Actor for RunActor {
    type Msg = RunMsg;
    type State = Arc<RunCell>;
    type Arguments = Arc<RunCell>;

    async fn pre_start(
        &self,
        _me: ActorRef<RunMsg>,
        cell: Arc<RunCell>,
    ) -> Result<Arc<RunCell>, ActorProcessingErr> {
        Ok(cell)
    }

    async fn handle(
        &self,
        _me: ActorRef<RunMsg>,
        msg: RunMsg,
        cell: &mut Arc<RunCell>,
    ) -> Result<(), ActorProcessingErr> {
        let attempt = cell.attempt.load(std::sync::atomic::Ordering::SeqCst);
        let span = tracing::info_span!("run_event", run_id = %cell.run_id, kind = %cell.kind, attempt);
        match msg {
            RunMsg::Activate { busy, since, decided } => {
                fiber::on_activate(&self.shared, cell, since, decided).instrument(span).await;
                drop(busy);
            }
            RunMsg::Message { json, reply } => {
                let result = self.on_message(cell, json).instrument(span).await;
                let _ = reply.send(result);
            }
            RunMsg::Request { json, reply } => {
                let result = self.on_request(cell, json).instrument(span).await;
                let _ = reply.send(result);
            }
            RunMsg::Alarm { event, reply } => {
                let result = self.on_alarm(cell, event).instrument(span).await;
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
