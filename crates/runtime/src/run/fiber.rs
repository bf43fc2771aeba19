//! Fibers: a run's unit of execution. A fiber is registered durably (state `Running`, attempt
//! counted) before user code runs, and its end is one boundary (output, final stash, status).
//!
//! Before: the actor's `Activate`. After: `agent.rs` (`Ctx`) for what user code calls.

use std::{panic::AssertUnwindSafe, sync::Arc};

use durafiber_store::{
    Batch, StoreError,
    tables::{self, RunStatus, StashRecord},
};
use futures::FutureExt;
use tracing::Instrument;

use crate::{
    alarm,
    clock::Stopwatch,
    error::{AgentError, RuntimeError, panic_text},
    escalation::{after_escalation, escalate},
    hooks::RecoveryReason,
    kernel::busy::BusyGuard,
    kernel::cell::RunCell,
    kernel::shared::{RawCtx, RawRecovered, Shared},
    metrics::Metrics,
    run::recovery::{self, Plan},
};

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum FiberMode {
    Fresh,
    Recover(RecoveryReason),
}

/// Starts or recovers the fiber if the run needs one. Runs inside the actor, so one at a time.
/// `since` is when the runtime decided to re-enter the run: the start of recovery latency.
pub(crate) async fn on_activate(shared: &Arc<Shared>, cell: &Arc<RunCell>, since: Stopwatch) {
    if cell.fiber_running() {
        return;
    }
    let run = match shared.load_run(&cell.run_id) {
        Ok(run) => run,
        Err(e @ RuntimeError::Store(StoreError::Corrupt { .. } | StoreError::UnknownVersion { .. })) => {
            // Unreadable bytes stay unreadable: the corruption path reports the run.
            tracing::error!(run_id = %cell.run_id, error = %e, "cannot read the run to activate it");
            return;
        }
        Err(e) => {
            // The store may answer in a second: never leave the run behind.
            tracing::error!(run_id = %cell.run_id, error = %e, "cannot read the run to activate it; retrying in 1 s");
            shared.wake_at(shared.now_ms().saturating_add(1_000), &cell.run_id);
            return;
        }
    };
    match recovery::plan(shared, &run) {
        Plan::Fresh => spawn(shared, cell, FiberMode::Fresh, since),
        Plan::Recover(reason) => spawn(shared, cell, FiberMode::Recover(reason), since),
        Plan::Later(at_ms) => shared.wake_at(at_ms, &cell.run_id),
        Plan::Escalate(reason) => {
            if let Err(e) = escalate(shared, &cell.run_id, &reason, Batch::new()).await {
                tracing::error!(run_id = %cell.run_id, error = %e, "could not escalate; retrying in 1 s");
                shared.wake_at(shared.now_ms().saturating_add(1_000), &cell.run_id);
            }
        }
        Plan::Nothing => {}
    }
}

fn spawn(shared: &Arc<Shared>, cell: &Arc<RunCell>, mode: FiberMode, since: Stopwatch) {
    // The slot stays locked until it holds the task, so the task's own clearing (its last
    // step) can never run before the slot is filled.
    let mut slot = cell.fiber.lock();
    shared.liveness.fiber_started(&cell.run_id, cell.fiber_keep_alive, shared.now_ms());
    let task = tokio::spawn(drive(shared.clone(), cell.clone(), mode, since, shared.busy()));
    *slot = Some(task.abort_handle());
}

async fn drive(shared: Arc<Shared>, cell: Arc<RunCell>, mode: FiberMode, since: Stopwatch, busy: BusyGuard) {
    let span = tracing::info_span!("fiber", run_id = %cell.run_id, kind = %cell.kind, attempt = tracing::field::Empty);
    let inner = span.clone();
    async move {
        let retry_at = match register(&shared, &cell, mode).await {
            Ok(Some(run)) => {
                inner.record("attempt", run.attempt);
                let result = call_agent(&shared, &cell, mode, run, since).await;
                match finish(&shared, &cell, mode, result).await {
                    Ok(retry_at) => retry_at,
                    Err(e) => {
                        tracing::error!(error = %e, "could not write the fiber's end; it will be recovered");
                        Some(shared.now_ms().saturating_add(1_000))
                    }
                }
            }
            Ok(None) => None,
            Err(e) => {
                tracing::error!(error = %e, "could not register the fiber; retrying in 1 s");
                Some(shared.now_ms().saturating_add(1_000))
            }
        };
        // An evicted cell's fiber whose abort came too late: the next cell owns the run and
        // its liveness, so it touches neither.
        if cell.evicted.load(std::sync::atomic::Ordering::SeqCst) {
            tracing::debug!("the fiber of an evicted cell ended; it wrote nothing");
            drop(busy);
            return;
        }
        // The fiber is over: clear its slot before anything can wake the run again, so the
        // activation that wake causes sees no fiber and starts one. Then, still counted
        // busy, hand over the wake: virtual time cannot pass it meanwhile.
        cell.fiber.lock().take();
        shared.liveness.fiber_ended(&cell.run_id, shared.now_ms());
        if let Some(at_ms) = retry_at {
            shared.wake_at(at_ms, &cell.run_id);
        }
        drop(busy);
    }
    .instrument(span)
    .await
}

/// The registration boundary: `Running`, attempt counted, recovery counted and backed off.
async fn register(
    shared: &Arc<Shared>,
    cell: &RunCell,
    mode: FiberMode,
) -> Result<Option<tables::RunRecord>, RuntimeError> {
    let now = shared.now_ms();
    shared
        .update_run_from(cell, |run, _| {
            if run.status.is_terminal() {
                return Ok(false);
            }
            run.attempt += 1;
            run.status = RunStatus::Running;
            run.wake_reason = None;
            if let FiberMode::Recover(_) = mode {
                // Counted before the hook runs, so a hook that kills the process is counted
                // too; progress or an interruption the runtime causes gives it back.
                run.recover_attempts = run.recover_attempts.saturating_add(1);
                run.next_recover_at_ms = now.saturating_add(recovery::backoff_ms(run.recover_attempts));
            }
            Ok(true)
        })
        .await
        .inspect(|written| {
            let recovering = written.is_some() && matches!(mode, FiberMode::Recover(_));
            cell.recovering.store(recovering, std::sync::atomic::Ordering::SeqCst);
        })
}

type FiberResult = Result<Result<String, AgentError>, String>;

async fn call_agent(
    shared: &Arc<Shared>,
    cell: &Arc<RunCell>,
    mode: FiberMode,
    run: tables::RunRecord,
    since: Stopwatch,
) -> FiberResult {
    let agent = match shared.agent(&run.kind) {
        Ok(agent) => agent,
        Err(e) => return Ok(Err(AgentError::escalate(e.to_string()))),
    };
    let mut raw = RawCtx::new(shared.clone(), cell.clone(), run.attempt);
    raw.in_fiber = true;
    let future = match mode {
        FiberMode::Fresh => agent.run_fiber(raw, run.input_json),
        FiberMode::Recover(reason) => {
            let stash: Option<StashRecord> =
                match shared.store.get(tables::STASHES, &tables::STASHES.key(&[run.run_id.as_bytes()])) {
                    Ok(stash) => stash,
                    Err(e) => return Ok(Err(AgentError::escalate(format!("corrupt: {e}")))),
                };
            Metrics::bump(&shared.metrics.recoveries);
            shared.metrics.recover_latency.record_us(since.elapsed_us());
            shared.event(&run.run_id, "recovered", format!("reason {reason:?}, attempt {}", run.attempt));
            agent.recover(
                raw,
                RawRecovered {
                    run_id: run.run_id,
                    kind: run.kind,
                    stash: stash.map(|s| (s.stash_json, s.step, s.seq)),
                    input_json: run.input_json,
                    attempt: run.attempt,
                    reason,
                    created_at_ms: run.created_at_ms,
                },
            )
        }
    };
    AssertUnwindSafe(future).catch_unwind().await.map_err(panic_text)
}

/// The fiber's end as one boundary: final stash (exit mode), status, alarms removed. Returns
/// when to wake the run again, if it is to be retried.
async fn finish(
    shared: &Arc<Shared>,
    cell: &RunCell,
    mode: FiberMode,
    result: FiberResult,
) -> Result<Option<u64>, RuntimeError> {
    let pending = cell.pending_exit.lock().take();
    let max_attempts = shared.config.max_recover_attempts;
    let mut retry_at = None;
    let written = shared
        .update_run_from(cell, |run, batch| {
            if run.status.is_terminal() {
                return Ok(false);
            }
            if let Some(stash) = &pending {
                batch.put(tables::STASHES, tables::STASHES.key(&[run.run_id.as_bytes()]), stash)?;
            }
            let error = match &result {
                Ok(Ok(output_json)) => {
                    run.status = RunStatus::Completed { output_json: output_json.clone() };
                    None
                }
                Ok(Err(AgentError::Escalate(reason))) => {
                    run.status = RunStatus::Escalated { reason: reason.clone() };
                    None
                }
                Ok(Err(AgentError::Cancelled(reason))) => {
                    // The reason the requester gave wins over the runtime's own wording.
                    let reason = run.cancel_reason.clone().unwrap_or_else(|| reason.clone());
                    run.status = RunStatus::Cancelled { reason };
                    None
                }
                Ok(Err(e)) => Some(e.to_string()),
                Err(panic) => Some(format!("panic: {panic}")),
            };
            if let Some(error) = error {
                let runtime_fault = matches!(result, Ok(Err(AgentError::Runtime(_))));
                if let Some(reason) = &run.cancel_reason {
                    run.status = RunStatus::Cancelled { reason: reason.clone() };
                } else if runtime_fault {
                    // The store failed under the fiber: the run is interrupted, not failed,
                    // and a recovery it interrupted is not counted (§3.6).
                    if cell.recovering.load(std::sync::atomic::Ordering::SeqCst) {
                        run.recover_attempts = run.recover_attempts.saturating_sub(1);
                        run.next_recover_at_ms = 0;
                    }
                    retry_at = Some(shared.now_ms().saturating_add(1_000));
                } else if mode == FiberMode::Fresh {
                    run.status = RunStatus::Failed { error };
                } else if run.recover_attempts >= max_attempts {
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
                    retry_at = Some(run.next_recover_at_ms);
                }
            }
            if run.status.is_terminal() {
                alarm::delete_all_in(shared, &run.run_id, batch)?;
            }
            Ok(true)
        })
        .await?;
    if let Some(run) = written {
        shared.event(&run.run_id, run.status.name(), format!("attempt {}", run.attempt));
        if let RunStatus::Escalated { reason } = &run.status {
            after_escalation(shared, &run.kind, &run.run_id, reason).await;
        }
    }
    Ok(retry_at)
}
