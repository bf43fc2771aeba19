//! The liveness rule (§3.7), checked: every open run is live with a fiber, parked on a
//! durable wait, or holding a wake at a known time. A run that is none of these would wait
//! forever — until the next process start happened to find it.
//!
//! The check reads the open-run index, the registry, the wake queue and the run's alarms
//! and approvals; it changes nothing.

use durafiber_store::RunId;
use std::collections::HashSet;

use durafiber_store::tables::{self, RunStatus, keys};

use crate::{
    error::{LivenessViolation, RuntimeError},
    kernel::shared::Shared,
};

/// Every open run that breaks the rule. Runs whose record cannot be read are left to the
/// corruption path (they are logged where they are read).
pub(crate) fn check(shared: &Shared) -> Result<Vec<LivenessViolation>, RuntimeError> {
    if shared.life.passive {
        return Ok(Vec::new());
    }
    let woken: HashSet<RunId> = shared.timers.wakeups.lock().iter().map(|(_, id)| id.clone()).collect();
    let mut violations = Vec::new();
    let mut after = None;
    loop {
        let (ids, next) = shared.open_runs_page(after.as_ref())?;
        for run_id in ids {
            // Another node's runs are that node's to keep moving.
            if !shared.ownership.owns(&run_id) {
                continue;
            }
            let Ok(run) = shared.load_run(&run_id) else { continue };
            if run.status.is_terminal() || woken.contains(&run_id) {
                continue;
            }
            let live = shared.registry.get(&run_id);
            if live.as_ref().is_some_and(|l| l.cell.fiber_running()) || parked(shared, &run)? {
                continue;
            }
            violations.push(LivenessViolation { run_id, status: run.status, live: live.is_some() });
        }
        match next {
            Some(last) => after = Some(last),
            None => break,
        }
    }
    Ok(violations)
}

/// Parked on a durable wait: an operator's pause, a pending approval, or any alarm (its delivery activates the
/// run, and activation re-enters an interrupted fiber).
fn parked(shared: &Shared, run: &tables::RunRecord) -> Result<bool, RuntimeError> {
    // Held by an operator, who resumes it: a durable wait for a human.
    if matches!(run.status, RunStatus::Paused { .. }) && crate::pause::reason_of(shared, run).is_some() {
        return Ok(true);
    }
    if let RunStatus::WaitingApproval { approval_id } = &run.status {
        let key = keys::approval(&run.run_id, approval_id);
        let pending = shared.store.get(&key)?.is_some_and(|a| a.decision.is_none() && !a.escalated);
        if pending {
            return Ok(true);
        }
    }
    if let RunStatus::WaitingEvent { name } = &run.status {
        let key = keys::event_wait(&run.run_id, name);
        let waiting = shared.store.get(&key)?.is_some_and(|w| w.result.is_none());
        if waiting {
            return Ok(true);
        }
    }
    Ok(!shared.store.scan(&keys::ALARMS.of_run(&run.run_id), None, 1)?.is_empty())
}
