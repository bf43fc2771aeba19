//! The kill switch: an operator pauses a kind of agent, or one run. A paused run parks at
//! its next effect or at its fiber's start — state `Paused{reason}`, durable, the same run
//! id — new starts are accepted and park the same way, and its alarms are held. A resume lets
//! all of it continue, in the order it was paused. The pauses themselves are stored, so a
//! restart keeps them.

use std::sync::Arc;

use durafiber_store::{
    Batch, Durability,
    tables::{self, Key, PauseRecord, RunRecord, RunStatus, WakeReason, keys},
};

use crate::{
    error::{AgentError, RuntimeError},
    kernel::shared::{RawCtx, Shared},
};

/// Before an effect and before a fiber's first step: waits, parked and `Paused`, while the
/// run or its kind is paused.
pub(crate) async fn gate(raw: &RawCtx) -> Result<(), AgentError> {
    let Some(reason) = raw.shared.pause_reason(&raw.cell.kind, &raw.cell.run_id) else { return Ok(()) };
    // Boxed: the hold is rare, and inline its state would be reserved in every fiber's and
    // every effect's future.
    Box::pin(hold(raw, reason)).await
}

/// Holds the run, `Paused`, until its pause is lifted.
async fn hold(raw: &RawCtx, reason: String) -> Result<(), AgentError> {
    let shared = &raw.shared;
    let (run_id, kind) = (raw.cell.run_id.as_str(), raw.cell.kind.as_str());
    let paused = RunStatus::Paused { reason: reason.clone() };
    shared
        .update_run_from(&raw.cell, |run, _| match run.status {
            RunStatus::Running => {
                run.status = paused.clone();
                Ok(true)
            }
            _ => Ok(false),
        })
        .await?;
    shared.event(run_id, "paused", reason);
    let mut versions = shared.pause_version.subscribe();
    loop {
        versions.borrow_and_update();
        if shared.pause_reason(kind, run_id).is_none() {
            break;
        }
        if let Some(reason) = raw.cell.cancel.reason() {
            return Err(AgentError::Cancelled(reason));
        }
        let changed = async {
            tokio::select! {
                _ = versions.changed() => {}
                _ = raw.cell.cancel.requested() => {}
            }
        };
        shared.parked(raw.in_fiber, changed).await;
    }
    shared
        .update_run_from(&raw.cell, |run, _| match run.status {
            RunStatus::Paused { .. } => {
                run.status = RunStatus::Running;
                Ok(true)
            }
            _ => Ok(false),
        })
        .await?;
    shared.event(run_id, "resumed", String::new());
    Ok(())
}

/// Holds a due alarm of a paused run until its resume; true when it is held.
pub(crate) fn hold_alarm(shared: &Shared, kind: &str, run_id: &str, due_name: &str) -> bool {
    let mut pauses = shared.pauses.lock();
    if pauses.reason(kind, run_id).is_none() {
        return false;
    }
    pauses.held_alarms.insert((run_id.to_string(), due_name.to_string()));
    true
}

/// Re-enters a run left `Paused` whose pause is lifted, unless its fiber is held in memory
/// (that one goes on by itself): a run paused before its first fiber starts fresh, any other
/// is recovered from its last boundary.
pub(crate) async fn reenter(shared: &Arc<Shared>, run_id: &str) -> Result<(), RuntimeError> {
    let held_in_memory = shared.registry.get(run_id).is_some_and(|live| live.cell.fiber_running());
    if held_in_memory {
        return Ok(());
    }
    let written = shared
        .update_run(run_id, |run, _| match run.status {
            RunStatus::Paused { .. } if shared.pause_reason(&run.kind, &run.run_id).is_none() => {
                if run.attempt == 0 {
                    run.status = RunStatus::Accepted;
                } else {
                    run.status = RunStatus::Running;
                    run.wake_reason = Some(WakeReason::Resumed);
                }
                Ok(true)
            }
            _ => Ok(false),
        })
        .await?;
    if written.is_some() {
        shared.reactivate(run_id).await;
    }
    Ok(())
}

/// What is paused: a kind, or one run.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target<'a> {
    Kind(&'a str),
    Run(&'a str),
}

impl Target<'_> {
    fn key(&self) -> Key<PauseRecord> {
        match self {
            Target::Kind(kind) => keys::paused_kind(kind),
            Target::Run(run_id) => keys::paused_run(run_id),
        }
    }

    fn covers(&self, run: &RunRecord) -> bool {
        match self {
            Target::Kind(kind) => run.kind == *kind,
            Target::Run(run_id) => run.run_id == *run_id,
        }
    }

    fn check(&self, shared: &Shared) -> Result<(), RuntimeError> {
        match self {
            Target::Kind(kind) => shared.agent(kind).map(drop),
            Target::Run(run_id) => {
                let run = shared.load_run(run_id)?;
                if run.status.is_terminal() {
                    return Err(RuntimeError::RunFinished {
                        run_id: run.run_id,
                        state: run.status.name().into(),
                    });
                }
                Ok(())
            }
        }
    }
}

/// Pauses `target` durably; its runs park at their next effect or start.
pub(crate) async fn pause(
    shared: &Arc<Shared>,
    target: Target<'_>,
    reason: &str,
) -> Result<(), RuntimeError> {
    target.check(shared)?;
    tables::check_id("pause reason", reason).map_err(RuntimeError::InvalidInput)?;
    let record = PauseRecord { reason: reason.to_string(), paused_at_ms: shared.now_ms() };
    let mut batch = Batch::new();
    batch.put(target.key(), &record)?;
    shared.store.commit(batch, Durability::Sync).await?;
    {
        let mut pauses = shared.pauses.lock();
        match target {
            Target::Kind(kind) => pauses.kinds.insert(kind.to_string(), record),
            Target::Run(run_id) => pauses.runs.insert(run_id.to_string(), record),
        };
    }
    shared.pause_version.send_modify(|v| *v += 1);
    tracing::info!(?target, reason, "paused");
    Ok(())
}

/// Resumes `target`: held fibers go on, parked runs are re-entered in the order they were
/// paused, held alarms fall due. False when it was not paused.
pub(crate) async fn resume(shared: &Arc<Shared>, target: Target<'_>) -> Result<bool, RuntimeError> {
    let key = target.key();
    if shared.store.get(&key)?.is_none() {
        return Ok(false);
    }
    let mut batch = Batch::new();
    batch.delete(key);
    shared.store.commit(batch, Durability::Sync).await?;
    {
        let mut pauses = shared.pauses.lock();
        match target {
            Target::Kind(kind) => pauses.kinds.remove(kind),
            Target::Run(run_id) => pauses.runs.remove(run_id),
        };
    }
    // Fibers held in memory look again and go on by themselves.
    shared.pause_version.send_modify(|v| *v += 1);
    // Runs parked with no fiber in memory (paused before a restart) are re-entered.
    let mut parked = Vec::new();
    let mut after = None;
    loop {
        let (ids, next) = shared.open_runs_page(after.as_ref())?;
        for run_id in ids {
            let run = shared.load_run(&run_id)?;
            if matches!(run.status, RunStatus::Paused { .. })
                && target.covers(&run)
                && shared.pause_reason(&run.kind, &run.run_id).is_none()
            {
                parked.push(run);
            }
        }
        match next {
            Some(key) => after = Some(key),
            None => break,
        }
    }
    parked.sort_by_key(|run| run.updated_at_ms);
    for run in &parked {
        reenter(shared, &run.run_id).await?;
    }
    let held: Vec<(String, String)> = {
        let mut pauses = shared.pauses.lock();
        let released: Vec<_> = pauses
            .held_alarms
            .iter()
            .filter(|(run_id, _)| match target {
                Target::Run(id) => run_id == id,
                Target::Kind(_) => true,
            })
            .cloned()
            .collect();
        for entry in &released {
            pauses.held_alarms.remove(entry);
        }
        released
    };
    let now = shared.now_ms();
    for (run_id, due_name) in held {
        // Delivery looks at the pause again: an alarm still held (by the other pause) waits on.
        shared.scheduler.insert(now, &run_id, &due_name);
    }
    shared.driver_wake.notify_one();
    tracing::info!(?target, runs = parked.len(), "resumed");
    Ok(true)
}
