//! A fiber attempt's end: what it returned written as one boundary (output, final stash in
//! `exit` mode, status, alarms removed), then its span sent, its task slot cleared and its
//! retry woken. Which ends are failures, which are retried through recovery and which are a
//! human's to look at is decided here.
//!
//! Before: `fiber.rs` (the attempt that ran the agent's future).

use durafiber_api::Timestamp;
use std::sync::{Arc, atomic::Ordering};
use std::time::Duration;

use durafiber_store::tables::{self, RunStatus};

use crate::{
    alarm,
    error::{AgentError, RuntimeError},
    escalation::after_escalation,
    hooks::RecoveryReason,
    kernel::busy::BusyGuard,
    kernel::cell::RunCell,
    kernel::inbox::FiberMode,
    kernel::shared::Shared,
    limits,
    run::attempt_span::AttemptSpan,
};

/// The attempt's end: its boundary written, its span sent, its slot cleared, its wake set.
pub(super) async fn ended(
    shared: &Arc<Shared>,
    cell: &Arc<RunCell>,
    mode: FiberMode,
    attempt_span: Option<Box<AttemptSpan>>,
    result: FiberResult,
    busy: BusyGuard,
) {
    let (outcome, error) = outcome_of(&result);
    let retry_at = match finish(shared, cell, mode, result).await {
        Ok(End { retry_at, span_left_to_retry }) => {
            if let Some(span) = attempt_span.filter(|_| !span_left_to_retry) {
                span.end(outcome, error);
            }
            retry_at
        }
        Err(e) => {
            // The run is recovered, and its next attempt sends this one's span.
            tracing::error!(error = %e, "could not write the fiber's end; it will be recovered");
            Some(shared.now().saturating_add(Duration::from_secs(1)))
        }
    };
    // An evicted cell's fiber whose abort came too late: the next cell owns the run and
    // its liveness, so it touches neither.
    if cell.task.evicted.load(Ordering::SeqCst) {
        tracing::debug!("the fiber of an evicted cell ended; it wrote nothing");
        drop(busy);
        return;
    }
    // The fiber is over: clear its slot before anything can wake the run again, so the
    // activation that wake causes sees no fiber and starts one. Then, still counted
    // busy, hand over the wake: virtual time cannot pass it meanwhile.
    cell.task.fiber.lock().take();
    // A hook that ended has settled, whatever its end wrote.
    cell.task.hook.lock().take();
    shared.liveness.fiber_ended(&cell.run_id, shared.now());
    if let Some(at) = retry_at {
        shared.timers.wake_at(at, &cell.run_id);
    }
    drop(busy);
}

pub(super) type FiberResult = Result<Result<String, AgentError>, Panicked>;

/// A fiber that panicked, with what it said.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Panicked(pub String);

/// How a fiber's attempt ended, for its span: a short name, and the error if it failed.
fn outcome_of(result: &FiberResult) -> (&'static str, Option<String>) {
    match result {
        Ok(Ok(_)) => ("completed", None),
        Ok(Err(AgentError::Escalate(reason))) => ("escalated", Some(reason.clone())),
        Ok(Err(AgentError::Cancelled(reason))) => ("cancelled", Some(reason.clone())),
        Ok(Err(e)) => ("failed", Some(e.to_string())),
        Err(panic) => ("panicked", Some(panic.0.clone())),
    }
}

/// What a fiber's end wrote: when to wake the run again, if it is to be retried, and
/// whether the retry sends this attempt's span (`attempt_span.rs`).
struct End {
    retry_at: Option<Timestamp>,
    span_left_to_retry: bool,
}

/// The run's status for an attempt that settled it (completed, escalated, cancelled); the
/// error's text, redacted, for one that failed.
fn settled_status(shared: &Shared, run: &mut tables::RunRecord, result: &FiberResult) -> Option<String> {
    match result {
        Ok(Ok(output_json)) => {
            run.status = RunStatus::Completed { output_json: shared.obs.redact(output_json.clone()) };
            None
        }
        Ok(Err(AgentError::Escalate(reason))) => {
            run.status = RunStatus::Escalated { reason: shared.obs.redact(reason.clone()) };
            None
        }
        // A fiber that does not emit what its stream holds would do so again on every
        // re-entry: a human must look at the code.
        Ok(Err(diverged @ AgentError::StreamDiverged { .. })) => {
            run.status = RunStatus::Escalated { reason: diverged.to_string() };
            None
        }
        // A replay's sandbox stopped a call: the run ends there, saying which.
        Ok(Err(stopped @ AgentError::CallStopped { .. })) => {
            run.status = RunStatus::Cancelled { reason: stopped.to_string() };
            None
        }
        Ok(Err(AgentError::Cancelled(reason))) => {
            // The reason the requester gave wins over the runtime's own wording.
            let reason = run.cancel_reason.clone().unwrap_or_else(|| reason.clone());
            run.status = RunStatus::Cancelled { reason };
            None
        }
        Ok(Err(e)) => Some(shared.obs.redact(e.to_string())),
        Err(panic) => Some(shared.obs.redact(format!("panic: {panic}"))),
    }
}

/// A failed attempt: cancelled when asked, re-entered after a fault of the runtime's or an
/// outage, failed, or escalated once its recoveries are spent; when to wake it again.
fn after_error(
    shared: &Shared,
    cell: &RunCell,
    run: &mut tables::RunRecord,
    mode: FiberMode,
    result: &FiberResult,
    error: String,
) -> End {
    let runtime_fault = matches!(result, Ok(Err(AgentError::Runtime(_))));
    if let Some(reason) = &run.cancel_reason {
        run.status = RunStatus::Cancelled { reason: reason.clone() };
    } else if runtime_fault {
        // The store failed under the fiber: the run is interrupted, not failed,
        // and a recovery it interrupted is not counted (§3.6).
        if cell.task.recovering.load(Ordering::SeqCst) {
            run.recover_attempts = run.recover_attempts.saturating_sub(1);
            run.next_recover_at_ms = Timestamp::ZERO;
        }
        return End {
            retry_at: Some(shared.now().saturating_add(Duration::from_secs(1))),
            span_left_to_retry: true,
        };
    } else if matches!(result, Ok(Err(AgentError::EffectRejected { .. }))) {
        // A refusal: re-entering the run would only hear it again.
        run.status = RunStatus::Failed { error };
    } else if mode == FiberMode::Fresh && matches!(result, Ok(Err(AgentError::EffectFailed { .. }))) {
        // An effect that ran out of calls is an outage, not an answer: the run is
        // re-entered through recovery with the same key, exactly as it would be had
        // the outage come after a recovery (then counted, then escalated).
        tracing::warn!(run_id = %run.run_id, error, "effect exhausted; the run will be recovered");
        run.wake_reason = Some(tables::WakeReason::Resumed);
        let at = shared.now().saturating_add(limits::EFFECT_BACKOFF_MAX);
        return End { retry_at: Some(at), span_left_to_retry: true };
    } else if mode == FiberMode::Fresh {
        run.status = RunStatus::Failed { error };
    } else if run.recover_attempts >= shared.config.max_recover_attempts {
        run.status = RunStatus::Escalated {
            reason: format!("recovery hook failed {} times: {error}", run.recover_attempts),
        };
    } else {
        tracing::warn!(run_id = %run.run_id, error, attempts = run.recover_attempts, "recovery hook failed");
        // The next attempt recovers from the same interruption, for the same reason.
        run.wake_reason = match mode {
            FiberMode::Recover(RecoveryReason::Evicted) => Some(tables::WakeReason::Evicted),
            FiberMode::Recover(RecoveryReason::Resumed) => Some(tables::WakeReason::Resumed),
            _ => None,
        };
        return End { retry_at: Some(run.next_recover_at_ms), span_left_to_retry: false };
    }
    End { retry_at: None, span_left_to_retry: false }
}

/// The fiber's end as one boundary: final stash (exit mode), status, alarms removed.
async fn finish(
    shared: &Arc<Shared>,
    cell: &RunCell,
    mode: FiberMode,
    result: FiberResult,
) -> Result<End, RuntimeError> {
    let pending = cell.pending_exit.lock().take().map(|stash| *stash);
    let mut retry_at = None;
    // A retry that is not a recovery hook's: its registration takes this attempt for one
    // that did not end, and sends its span.
    let mut span_left_to_retry = false;
    let written = shared
        .update_run_from(cell, |run, batch| {
            if run.status.is_terminal() {
                return Ok(false);
            }
            if let Some(stash) = &pending {
                stash.stage(batch, shared.config.history_max)?;
            }
            if let Some(error) = settled_status(shared, run, &result) {
                let again = after_error(shared, cell, run, mode, &result, error);
                (retry_at, span_left_to_retry) = (again.retry_at, again.span_left_to_retry);
            }
            if run.status.is_terminal() {
                alarm::delete_all_in(shared, &run.run_id, batch)?;
            }
            Ok(true)
        })
        .await?;
    if let Some(run) = written {
        shared.event(&run.run_id, run.status.name(), format!("attempt {}", run.attempt));
        if run.status.is_terminal() {
            crate::child::settled(shared, &run);
        }
        if let RunStatus::Escalated { reason } = &run.status {
            after_escalation(shared, &run.kind, &run.run_id, reason).await;
        }
    }
    Ok(End { retry_at, span_left_to_retry })
}
