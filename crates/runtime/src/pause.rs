//! The kill switch: an operator pauses a kind of agent, or one run. A paused run parks at
//! its next effect or at its fiber's start — state `Paused{reason}`, durable, the same run
//! id — new starts are accepted and park the same way, and its alarms are held. A resume lets
//! all of it continue, in the order it was paused. The pauses themselves are stored, so a
//! restart keeps them. A pause of a run or of its kind holds the runs it started too (and
//! theirs): a paused parent's sub-agents do not go on without it.

use durafiber_store::RunId;
use std::sync::Arc;

use durafiber_store::{
    Batch, Durability,
    tables::{self, Key, PauseRecord, RunRecord, RunStatus, WakeReason, keys},
};

use crate::{
    error::{AgentError, RuntimeError},
    kernel::{
        cell::Ancestor,
        lineage,
        shared::{RawCtx, Shared},
    },
};

/// Why a run of `kind` is held, if it is: its own pause, its kind's, or those of a run
/// above it. `above` lists the runs above, asked only while something is paused.
fn held_by(
    shared: &Shared,
    kind: &str,
    run_id: &RunId,
    above: impl FnOnce() -> Result<Vec<Ancestor>, RuntimeError>,
) -> Result<Option<String>, RuntimeError> {
    {
        let pauses = shared.controls.pauses.lock();
        if pauses.is_empty() {
            return Ok(None);
        }
        if let Some(reason) = pauses.reason(kind, run_id) {
            return Ok(Some(reason));
        }
    }
    let above = above()?;
    let pauses = shared.controls.pauses.lock();
    Ok(above.iter().find_map(|a| {
        pauses
            .reason(&a.kind, &a.run_id)
            .map(|reason| format!("{reason} (run {} above it is paused)", a.run_id))
    }))
}

/// Why the live run of `raw` is held, if it is.
fn live_reason(raw: &RawCtx) -> Result<Option<String>, RuntimeError> {
    held_by(&raw.shared, &raw.cell.kind, &raw.cell.run_id, || {
        Ok(lineage::of_cell(&raw.shared, &raw.cell)?.to_vec())
    })
}

/// Why `run` is held, if it is. A lineage that cannot be read leaves the run's own pause
/// and its kind's to decide: a run is not left behind for a read that failed.
pub(crate) fn reason_of(shared: &Shared, run: &RunRecord) -> Option<String> {
    let above = || lineage::ancestors(shared, &run.run_id, &run.key);
    held_by(shared, &run.kind, &run.run_id, above).unwrap_or_else(|e| {
        tracing::warn!(run_id = %run.run_id, error = %e, "could not read the runs above a run; only its own pauses hold it");
        shared.controls.pauses.lock().reason(&run.kind, &run.run_id)
    })
}

/// Before an effect and before a fiber's first step: waits, parked and `Paused`, while the
/// run, its kind, or a run above it (or its kind) is paused.
pub(crate) async fn gate(raw: &RawCtx) -> Result<(), AgentError> {
    let Some(reason) = live_reason(raw)? else { return Ok(()) };
    // Boxed: the hold is rare, and inline its state would be reserved in every fiber's and
    // every effect's future.
    Box::pin(hold(raw, reason)).await
}

/// Holds the run, `Paused`, until its pause is lifted.
async fn hold(raw: &RawCtx, reason: String) -> Result<(), AgentError> {
    let shared = &raw.shared;
    let run_id = &raw.cell.run_id;
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
    let mut versions = shared.signals.pause_version.subscribe();
    loop {
        versions.borrow_and_update();
        if live_reason(raw)?.is_none() {
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
        shared.life.parked(raw.in_fiber, changed).await;
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
pub(crate) fn hold_alarm(shared: &Shared, run: &RunRecord, due_name: &str) -> bool {
    if reason_of(shared, run).is_none() {
        return false;
    }
    shared.controls.pauses.lock().held_alarms.insert((run.run_id.clone(), due_name.to_string()));
    true
}

/// Re-enters a run left `Paused` whose pause is lifted, unless its fiber is held in memory
/// (that one goes on by itself): a run paused before its first fiber starts fresh, any other
/// is recovered from its last boundary.
pub(crate) async fn reenter(shared: &Arc<Shared>, run_id: &RunId) -> Result<(), RuntimeError> {
    let held_in_memory = shared.registry.get(run_id).is_some_and(|live| live.cell.fiber_running());
    if held_in_memory {
        return Ok(());
    }
    let written = shared
        .update_run(run_id, |run, _| match run.status {
            RunStatus::Paused { .. } if reason_of(shared, run).is_none() => {
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
    Run(&'a RunId),
}

impl Target<'_> {
    fn key(&self) -> Key<PauseRecord> {
        match self {
            Target::Kind(kind) => keys::paused_kind(kind),
            Target::Run(run_id) => keys::paused_run(run_id),
        }
    }

    /// Whether the pause held `run`: a run of the kind or the run itself, or a run below one.
    fn covers(&self, shared: &Shared, run: &RunRecord) -> bool {
        let matches = |kind: &str, run_id: &RunId| match self {
            Target::Kind(k) => kind == *k,
            Target::Run(id) => run_id == *id,
        };
        matches(&run.kind, &run.run_id)
            || lineage::ancestors(shared, &run.run_id, &run.key)
                .is_ok_and(|above| above.iter().any(|a| matches(&a.kind, &a.run_id)))
    }

    fn check(&self, shared: &Shared) -> Result<(), RuntimeError> {
        match self {
            Target::Kind(kind) => shared.agents.agent(kind).map(drop),
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
    tables::check_id("pause reason", reason).map_err(|e| RuntimeError::InvalidInput(e.into()))?;
    let record = PauseRecord { reason: reason.to_string(), paused_at_ms: shared.now() };
    let mut batch = Batch::new();
    batch.put(target.key(), &record)?;
    shared.store.commit(batch, Durability::Sync).await?;
    {
        let mut pauses = shared.controls.pauses.lock();
        match target {
            Target::Kind(kind) => pauses.kinds.insert(kind.to_string(), record),
            Target::Run(run_id) => pauses.runs.insert(run_id.to_string(), record),
        };
    }
    shared.signals.pause_version.send_modify(|v| *v += 1);
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
        let mut pauses = shared.controls.pauses.lock();
        match target {
            Target::Kind(kind) => pauses.kinds.remove(kind),
            Target::Run(run_id) => pauses.runs.remove(run_id.as_str()),
        };
    }
    // Fibers held in memory look again and go on by themselves.
    shared.signals.pause_version.send_modify(|v| *v += 1);
    // Runs parked with no fiber in memory (paused before a restart) are re-entered.
    let mut parked = Vec::new();
    let mut after = None;
    loop {
        let (ids, next) = shared.open_runs_page(after.as_ref())?;
        for run_id in ids {
            let run = shared.load_run(&run_id)?;
            if matches!(run.status, RunStatus::Paused { .. })
                && target.covers(shared, &run)
                && reason_of(shared, &run).is_none()
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
    // Every held alarm: one of a run below the resumed one was held by its pause too.
    let held = std::mem::take(&mut shared.controls.pauses.lock().held_alarms);
    let now = shared.now();
    for (run_id, due_name) in held {
        // Delivery looks at the pause again: an alarm still held (by the other pause) waits on.
        shared.timers.scheduler.insert(now, &run_id, &due_name);
    }
    shared.timers.driver_wake.notify_one();
    tracing::info!(?target, runs = parked.len(), "resumed");
    Ok(true)
}
