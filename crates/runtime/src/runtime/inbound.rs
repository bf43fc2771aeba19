//! What reaches a run from outside: cancellation, messages, requests, events, decisions,
//! alarms set or cancelled, keep-alive.

use durafiber_store::RunId;
use durafiber_store::tables::{Decision, PauseRecord, RunStatus};
use ractor::rpc::CallResult;
use serde::{Serialize, de::DeserializeOwned};

use super::handle::Runtime;
use crate::{
    agent::Agent,
    alarm,
    alarm::AlarmSpec,
    approval,
    approval::ApproveOutcome,
    approval_quorum::Decider,
    error::RuntimeError,
    eviction::keep_alive::KeepAlive,
    json,
    kernel::inbox::RunMsg,
    kernel::registry::LiveRun,
    limits, pause,
    run::actor::{activate, actor_of},
};

/// What operators hold now ([`Runtime::paused`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PausedNow {
    /// Paused kinds, by name.
    pub kinds: std::collections::BTreeMap<String, PauseRecord>,
    /// Runs paused one by one, by id.
    pub runs: std::collections::BTreeMap<String, PauseRecord>,
}

impl Runtime {
    /// Asks a run to stop (§2.3). The fiber sees the signal; no new effect starts after it.
    /// A run that is not executing (waiting, or not live) is cancelled at once.
    pub async fn cancel(&self, run_id: &RunId, reason: &str) -> Result<RunStatus, RuntimeError> {
        let live = self.shared.registry.get(run_id);
        // A fiber parked on a durable wait (a human, an event, a durable sleep) is not
        // executing: the run is cancelled at once instead of waiting for the wait to end.
        let fiber_live = live.as_ref().is_some_and(|l| {
            l.cell.fiber_running()
                && l.cell.waits.approval.lock().is_none()
                && l.cell.waits.event.lock().is_none()
        });
        let written = self
            .shared
            .update_run(run_id, |run, batch| {
                if run.status.is_terminal() {
                    return Ok(false);
                }
                let fiber_live = fiber_live && !matches!(run.status, RunStatus::WaitingAlarm { .. });
                run.cancel_reason = Some(reason.to_string());
                if !fiber_live {
                    run.status = RunStatus::Cancelled { reason: reason.to_string() };
                    alarm::delete_all_in(&self.shared, run_id, batch)?;
                }
                Ok(true)
            })
            .await?;
        if let Some(run) = written {
            self.shared.event(run_id, "cancel_requested", reason.to_string());
            if run.status.is_terminal() {
                // Cancelled without its fiber's help: the last attempt did not end by itself.
                self.shared.send_unfinished_attempt(run_id, &run.kind, run.attempt, "cancelled");
                crate::child::settled(&self.shared, &run);
            }
            self.cancel_children(run_id, reason).await;
            if let Some(live) = live {
                live.cell.cancel.request(reason);
                if run.status.is_terminal() {
                    if let Some(fiber) = live.cell.task.fiber.lock().take() {
                        fiber.abort();
                    }
                    self.shared.liveness.fiber_ended(run_id, self.now());
                }
            }
        }
        self.status(run_id)
    }

    /// Sends a typed message to a run; handled by `on_message`, one at a time.
    pub async fn send<A: Agent>(&self, run_id: &RunId, message: &A::Message) -> Result<(), RuntimeError> {
        let json = json::canonical(message).map_err(|e| RuntimeError::InvalidInput(e.into()))?;
        self.send_json(run_id, &json).await
    }

    /// `send` with a JSON message.
    pub async fn send_json(&self, run_id: &RunId, message_json: &str) -> Result<(), RuntimeError> {
        let live = self.inbound(run_id, message_json).await?;
        let json = message_json.to_string();
        match actor_of(&self.shared, &live).await?.call(|reply| RunMsg::Message { json, reply }, None).await {
            Ok(CallResult::Success(result)) => Ok(result?),
            _ => {
                Err(RuntimeError::Agent(crate::error::AgentError::Runtime("the run's actor stopped".into())))
            }
        }
    }

    /// Sends a typed request to a run and returns `on_request`'s reply, typed.
    pub async fn request<A: Agent, R: DeserializeOwned>(
        &self,
        run_id: &RunId,
        message: &A::Message,
    ) -> Result<R, RuntimeError> {
        let json = json::canonical(message).map_err(|e| RuntimeError::InvalidInput(e.into()))?;
        let reply = self.request_json(run_id, &json).await?;
        json::parse(&reply)
            .map_err(|e| RuntimeError::Agent(crate::error::AgentError::Serialization(e.into())))
    }

    /// `request` with JSON in and out.
    pub async fn request_json(&self, run_id: &RunId, message_json: &str) -> Result<String, RuntimeError> {
        let live = self.inbound(run_id, message_json).await?;
        let json = message_json.to_string();
        match actor_of(&self.shared, &live).await?.call(|reply| RunMsg::Request { json, reply }, None).await {
            Ok(CallResult::Success(result)) => Ok(result?),
            _ => {
                Err(RuntimeError::Agent(crate::error::AgentError::Runtime("the run's actor stopped".into())))
            }
        }
    }

    /// Checks a message or request for a run and activates the run to take it.
    async fn inbound(&self, run_id: &RunId, message_json: &str) -> Result<LiveRun, RuntimeError> {
        if self.shared.life.passive {
            return Err(RuntimeError::InvalidInput(
                "messages need a serving runtime; this one only inspects".into(),
            ));
        }
        let run = self.shared.load_run(run_id)?;
        if run.status.is_terminal() {
            return Err(RuntimeError::RunFinished { run_id: run_id.into(), state: run.status.name().into() });
        }
        if message_json.len() > limits::PAYLOAD_BYTES_MAX {
            return Err(RuntimeError::InvalidInput("message is over the payload limit".into()));
        }
        self.shared.agents.agent(&run.kind)?.check_message(message_json).map_err(|reason| {
            RuntimeError::WrongMessage { kind: run.kind.clone(), reason: reason.to_string() }
        })?;
        let live = activate(&self.shared, run_id).await?;
        self.shared.liveness.activity(run_id, self.now());
        Ok(live)
    }

    /// Sends the external event `name` to a run (durably buffered, FIFO per name); a repeat
    /// with the same `idempotency_key` is a `Duplicate`, delivered once.
    pub async fn send_event<T: Serialize>(
        &self,
        run_id: &RunId,
        name: &str,
        payload: &T,
        idempotency_key: Option<&str>,
    ) -> Result<crate::event::SendOutcome, RuntimeError> {
        let json = json::canonical(payload).map_err(|e| RuntimeError::InvalidInput(e.into()))?;
        self.send_event_json(run_id, name, &json, idempotency_key).await
    }

    /// `send_event` with a JSON payload.
    pub async fn send_event_json(
        &self,
        run_id: &RunId,
        name: &str,
        payload_json: &str,
        idempotency_key: Option<&str>,
    ) -> Result<crate::event::SendOutcome, RuntimeError> {
        crate::event::send(&self.shared, run_id, name, payload_json, idempotency_key).await
    }

    /// Records a human's decision (§6.2). Accepted only for a pending pause with exactly this
    /// payload hash; the same decision twice is a no-op, a different one `AlreadyDecided`.
    pub async fn approve(
        &self,
        run_id: &RunId,
        approval_id: &str,
        payload_hash: &str,
        decision: Decision,
    ) -> Result<ApproveOutcome, RuntimeError> {
        approval::approve(&self.shared, run_id, approval_id, payload_hash, decision, None).await
    }

    /// `approve`, saying who decides. A pause requested with a rule
    /// (`ctx.request_approval_with`) takes one decision from each person: it is decided by
    /// the decision that meets the rule, and answers `AlreadyVoted` to a second, different
    /// decision by the same person and `NotAReviewer` to someone the rule leaves out. The
    /// decision's span in the run's trace names who decided. The server passes its caller.
    pub async fn approve_as(
        &self,
        run_id: &RunId,
        approval_id: &str,
        payload_hash: &str,
        decision: Decision,
        by: &Decider,
    ) -> Result<ApproveOutcome, RuntimeError> {
        approval::approve(&self.shared, run_id, approval_id, payload_hash, decision, Some(by)).await
    }

    /// Sets (or replaces) a run's alarm from outside. Refused with `StorageFull` while the
    /// disk is below its reserve.
    pub async fn set_alarm(&self, run_id: &RunId, name: &str, spec: AlarmSpec) -> Result<(), RuntimeError> {
        self.shared.store.check_room()?;
        alarm::set(&self.shared, run_id, name, spec, None, None).await
    }

    /// Deletes a settled run and every record it owns — its record and idempotency key,
    /// stash, ledger, approvals, alarms, output stream, events, sleeps, storage, budget — in
    /// batches of at most [`DELETE_BATCH_MAX`](crate::DELETE_BATCH_MAX) keys, its record last.
    /// The audit trail keeps its entries about the run. A later start with the run's
    /// idempotency key starts a new run. A crash part-way leaves the run settled with fewer
    /// records; deleting it again finishes.
    ///
    /// # Errors
    ///
    /// [`RuntimeError::RunOpen`] for a run that is not settled (cancel it first),
    /// [`RuntimeError::UnknownRun`], [`RuntimeError::NotOwner`] on a node that does not own
    /// the run, and the store's errors.
    pub async fn delete_run(&self, run_id: &RunId) -> Result<crate::retention::RunDeleted, RuntimeError> {
        crate::retention::delete(&self.shared, run_id).await
    }

    /// Cancels every open child of a cancelled run (and theirs, in turn).
    async fn cancel_children(&self, run_id: &RunId, reason: &str) {
        let children = match crate::kernel::lineage::own_children_of(&self.shared, run_id) {
            Ok(children) => children,
            Err(e) => {
                tracing::warn!(%run_id, error = %e, "could not read a cancelled run's children");
                return;
            }
        };
        for (name, child) in children {
            let why = format!("its parent {run_id} was cancelled: {reason}");
            match Box::pin(self.cancel(&child.child_run_id, &why)).await {
                Ok(_) | Err(RuntimeError::RunFinished { .. }) => {}
                Err(e) => {
                    tracing::warn!(%run_id, child = %child.child_run_id, name, error = %e, "could not cancel a child");
                }
            }
        }
    }

    /// Cancels a run's alarm; true when it existed.
    pub async fn cancel_alarm(&self, run_id: &RunId, name: &str) -> Result<bool, RuntimeError> {
        alarm::cancel(&self.shared, run_id, name).await
    }

    /// The kill switch for a kind of agent: its runs park at their next effect or their
    /// fiber's start (`Paused{reason}`, durable, the same run id), new starts are accepted and
    /// park, alarms are held; [`Runtime::resume_kind`] lets all of it continue in order. The
    /// pause is stored: a restart keeps it.
    ///
    /// ```no_run
    /// # async fn f(runtime: durafiber_runtime::Runtime) -> Result<(), durafiber_runtime::RuntimeError> {
    /// runtime.pause_kind("researcher", "runaway model spend, INC-4411").await?;
    /// // ... fix, deploy ...
    /// runtime.resume_kind("researcher").await?;
    /// # Ok(()) }
    /// ```
    pub async fn pause_kind(&self, kind: &str, reason: &str) -> Result<(), RuntimeError> {
        pause::pause(&self.shared, pause::Target::Kind(kind), reason).await
    }

    /// Lifts [`Runtime::pause_kind`]; false when the kind was not paused.
    pub async fn resume_kind(&self, kind: &str) -> Result<bool, RuntimeError> {
        pause::resume(&self.shared, pause::Target::Kind(kind)).await
    }

    /// [`Runtime::pause_kind`] for one run.
    pub async fn pause_run(&self, run_id: &RunId, reason: &str) -> Result<(), RuntimeError> {
        pause::pause(&self.shared, pause::Target::Run(run_id), reason).await
    }

    /// Lifts [`Runtime::pause_run`]; false when the run was not paused by itself.
    pub async fn resume_run(&self, run_id: &RunId) -> Result<bool, RuntimeError> {
        pause::resume(&self.shared, pause::Target::Run(run_id)).await
    }

    /// The kinds and the runs that are paused now, with why and since when.
    pub fn paused(&self) -> PausedNow {
        let pauses = self.shared.controls.pauses.lock();
        PausedNow {
            kinds: pauses.kinds.iter().map(|(k, p)| (k.clone(), p.clone())).collect(),
            runs: pauses.runs.iter().map(|(r, p)| (r.clone(), p.clone())).collect(),
        }
    }

    /// Holds `run_id` live (activating it) until the guard is released or dropped.
    pub async fn keep_alive(&self, run_id: &RunId) -> Result<KeepAlive, RuntimeError> {
        activate(&self.shared, run_id).await?;
        Ok(KeepAlive::acquire(self.shared.clone(), run_id))
    }
}
