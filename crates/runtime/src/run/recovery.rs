//! Recovery: what to do with a run found without a live fiber (§3.4–§3.6), and the scan at
//! start-up that re-activates every interrupted run without waiting for a request, in
//! batches that share one registration write.

use std::sync::Arc;

use durafiber_store::{
    Batch, Durability,
    tables::{self, RunRecord, RunStatus, WakeReason},
};

use crate::{
    clock::Stopwatch,
    error::RuntimeError,
    hooks::RecoveryReason,
    kernel::inbox::Activation,
    kernel::registry::LiveRun,
    kernel::shared::Shared,
    limits,
    run::{actor, fiber},
};

/// The decision for a run that has no live fiber.
#[derive(Debug, PartialEq)]
pub(crate) enum Plan {
    /// Never started: run `run_fiber`.
    Fresh,
    /// Interrupted: call `on_fiber_recovered`.
    Recover(RecoveryReason),
    /// Interrupted, but its backoff has not elapsed.
    Later(u64),
    /// Too old, or its hook failed too often: a human must look.
    Escalate(String),
    /// Waiting, or finished: nothing to run.
    Nothing,
}

pub(crate) fn plan(shared: &Shared, run: &RunRecord) -> Plan {
    match run.status {
        RunStatus::Accepted => Plan::Fresh,
        RunStatus::Running => {
            let now = shared.now_ms();
            let reason = match run.wake_reason {
                Some(WakeReason::Evicted) => RecoveryReason::Evicted,
                Some(WakeReason::Resumed) => RecoveryReason::Resumed,
                None => RecoveryReason::Crash,
            };
            let max_age_ms = u64::try_from(shared.config.max_age.as_millis()).unwrap_or(u64::MAX);
            // A run re-entered for a decision or a wake it waited for was not found
            // interrupted: its age is the wait's, not a sign that it is stuck.
            if reason != RecoveryReason::Resumed && now.saturating_sub(run.created_at_ms) > max_age_ms {
                Plan::Escalate("max_age".into())
            } else if reason != RecoveryReason::Resumed
                && crate::budget::recoveries_crossed(shared, run).unwrap_or_else(|e| {
                    tracing::error!(run_id = %run.run_id, error = %e, "budget unreadable; recovering");
                    false
                })
            {
                Plan::Escalate("budget: recoveries".into())
            } else if run.recover_attempts >= shared.config.max_recover_attempts {
                // A failing hook is escalated where it fails; what is left here are recoveries
                // the process died in, with no boundary committed since.
                Plan::Escalate(format!("interrupted {} times without progress", run.recover_attempts))
            } else if run.next_recover_at_ms > now {
                Plan::Later(run.next_recover_at_ms)
            } else {
                Plan::Recover(reason)
            }
        }
        _ => Plan::Nothing,
    }
}

/// Delay before recovery attempt `n + 1` after `n` failed ones: 1 s doubling, capped at 5 min.
pub(crate) fn backoff_ms(failed: u32) -> u64 {
    let base = limits::RECOVER_BACKOFF_BASE.as_millis() as u64;
    let shift = failed.saturating_sub(1).min(20);
    (base << shift).min(limits::RECOVER_BACKOFF_MAX.as_millis() as u64)
}

/// Finds every interrupted run and re-activates it. Returns how many were found.
pub(crate) async fn scan_and_reactivate(shared: &Arc<Shared>) -> Result<usize, RuntimeError> {
    reactivate_interrupted(shared, &|run_id| shared.ownership.owns(run_id)).await
}

/// Re-activates the interrupted runs among those `keep` accepts: every one at start-up, the
/// runs of shards a node just acquired, or runs another node accepted into its shards and
/// has not seen live. The open-run index is read a page at a time and re-activated in
/// batches of `RECOVERY_BATCH_MAX`, up to `RECOVERY_ACTIVATIONS_MAX` runs side by side.
pub(crate) async fn reactivate_interrupted(
    shared: &Arc<Shared>,
    keep: &(dyn Fn(&str) -> bool + Sync),
) -> Result<usize, RuntimeError> {
    let mut after: Option<Vec<u8>> = None;
    let mut found = 0;
    let mut batches = tokio::task::JoinSet::new();
    let in_flight_max = (limits::RECOVERY_ACTIVATIONS_MAX / limits::RECOVERY_BATCH_MAX).max(1);
    loop {
        let (ids, next) = shared.open_runs_page(after.as_deref())?;
        let ids: Vec<String> = ids.into_iter().filter(|id| keep(id)).collect();
        for batch in ids.chunks(limits::RECOVERY_BATCH_MAX) {
            if batches.len() >= in_flight_max {
                found += joined(batches.join_next().await)?;
            }
            let (shared, batch) = (shared.clone(), batch.to_vec());
            batches.spawn(async move { reactivate_batch(&shared, batch).await });
        }
        match next {
            Some(last) => after = Some(last),
            None => break,
        }
    }
    while let Some(done) = batches.join_next().await {
        found += joined(Some(done))?;
    }
    Ok(found)
}

fn joined(
    done: Option<Result<Result<usize, RuntimeError>, tokio::task::JoinError>>,
) -> Result<usize, RuntimeError> {
    match done {
        Some(Ok(found)) => found,
        Some(Err(e)) => {
            Err(RuntimeError::Agent(crate::error::AgentError::Runtime(format!("recovery task: {e}"))))
        }
        None => Ok(0),
    }
}

/// Re-activates the interrupted runs among `run_ids` together: one read of each record,
/// under the runs' transition and record locks, and every fiber's registration in one
/// boundary — the same writes, decisions and order as one activation each (`actor.rs`), at
/// the cost of one barrier for the batch. A run that needs more (an escalation, a pause
/// lifted by a resume the process died in) is re-entered alone after the batch. Each run of
/// the batch is made live as a cold start would: its cell, its fiber, then its place in the
/// registry. Returns how many runs were found interrupted.
async fn reactivate_batch(shared: &Arc<Shared>, run_ids: Vec<String>) -> Result<usize, RuntimeError> {
    if shared.passive {
        return Ok(0);
    }
    let Ok(_activating) = shared.activating() else { return Ok(0) };
    // Virtual time waits for the registration write.
    let _busy = shared.busy();
    let since = shared.opened;
    let watch = Stopwatch::start();
    let transitions = shared.registry.transitions(&run_ids).await;
    // A run already live was activated by an event meanwhile; its actor re-enters it.
    let run_ids: Vec<String> = run_ids
        .into_iter()
        .filter(|id| shared.registry.get(id).is_none() && shared.ownership.owns(id))
        .collect();
    let Ok(locks) = shared.lock_runs(&run_ids).await else { return Ok(0) };
    let mut found = 0;
    let mut writes = Batch::new();
    let mut registered = Vec::new();
    let mut alone = Vec::new();
    let mut lifted = Vec::new();
    for run_id in run_ids {
        let mut run = match shared.load_run(&run_id) {
            Ok(run) => run,
            Err(e) => {
                tracing::error!(run_id, error = %e, "run record unreadable; the run cannot continue");
                shared.event(&run_id, "corrupt", e.to_string());
                continue;
            }
        };
        match run.status {
            RunStatus::Accepted | RunStatus::Running => found += 1,
            // Paused, but its pause was lifted by a resume the process died in: no run is
            // left behind.
            RunStatus::Paused { .. } if shared.pause_reason(&run.kind, &run.run_id).is_none() => {
                found += 1;
                lifted.push(run_id);
                continue;
            }
            _ => continue,
        }
        match fiber::register(shared, &mut run) {
            Ok(mode) => {
                run.updated_at_ms = shared.now_ms();
                let stash = fiber::read_stash(shared, &run_id);
                // Only the record: the run stays in the open-run index it was found in. A
                // run whose cell cannot be built is left for the single activation to report.
                let key = tables::RUNS.key(&[run.run_id.as_bytes()]);
                match actor::new_cell(shared, &run, &stash) {
                    Ok(cell) if writes.put(tables::RUNS, key, &run).is_ok() => {
                        registered.push((run, mode, cell, stash))
                    }
                    _ => alone.push(run_id),
                }
            }
            Err(Activation::Later(at_ms)) => shared.wake_at(at_ms, &run_id),
            Err(Activation::Nothing) => {}
            Err(_) => alone.push(run_id),
        }
    }
    if !registered.is_empty() {
        match shared.store.commit(writes, Durability::Sync).await {
            Ok(()) => {
                shared.status_changed();
                for (run, mode, cell, stash) in registered {
                    let live = LiveRun::new(cell);
                    actor::activated(shared, &run, &watch);
                    let run_id = run.run_id.clone();
                    let decided = fiber::registered(&live.cell, run, mode, stash);
                    actor::begin(shared, &live, since, decided).await;
                    shared.registry.insert(&run_id, live);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, runs = registered.len(), "could not register the fibers; retrying in 1 s");
                let at_ms = shared.now_ms().saturating_add(1_000);
                for (run, ..) in registered {
                    shared.wake_at(at_ms, &run.run_id);
                }
            }
        }
    }
    drop(locks);
    drop(transitions);
    for run_id in alone {
        shared.reactivate_since(&run_id, since).await;
    }
    for run_id in lifted {
        crate::pause::reenter(shared, &run_id).await?;
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_backoff_doubles_from_one_second_to_five_minutes() {
        let delays: Vec<u64> = (1..=10).map(backoff_ms).collect();
        assert_eq!(&delays[..5], &[1_000, 2_000, 4_000, 8_000, 16_000]);
        assert_eq!(backoff_ms(30), 300_000);
    }
}
