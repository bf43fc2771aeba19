//! Recovery: what to do with a run found without a live fiber (§3.4–§3.6), and the scan at
//! start-up that re-activates every interrupted run without waiting for a request.

use std::sync::Arc;

use durafiber_store::tables::{RunRecord, RunStatus, WakeReason};

use crate::{error::RuntimeError, hooks::RecoveryReason, kernel::shared::Shared, limits};

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

/// Finds every interrupted run and re-activates it, up to `RECOVERY_ACTIVATIONS_MAX` at a
/// time: each activation writes its fiber's registration, and side by side those writes
/// share group commits instead of waiting for a barrier each. Returns how many were found.
pub(crate) async fn scan_and_reactivate(shared: &Arc<Shared>) -> Result<usize, RuntimeError> {
    reactivate_interrupted(shared, &|run_id| shared.ownership.owns(run_id)).await
}

/// Re-activates the interrupted runs among those `keep` accepts: the runs of shards a node
/// just acquired, or runs another node accepted into its shards and has not seen live.
pub(crate) async fn reactivate_interrupted(
    shared: &Arc<Shared>,
    keep: &(dyn Fn(&str) -> bool + Sync),
) -> Result<usize, RuntimeError> {
    let mut after: Option<Vec<u8>> = None;
    let mut found = 0;
    let mut activations = tokio::task::JoinSet::new();
    loop {
        let (ids, next) = shared.open_runs_page(after.as_deref())?;
        for run_id in ids {
            if !keep(&run_id) {
                continue;
            }
            match shared.load_run(&run_id) {
                Ok(run) if matches!(run.status, RunStatus::Accepted | RunStatus::Running) => {
                    found += 1;
                    if activations.len() >= limits::RECOVERY_ACTIVATIONS_MAX {
                        let _ = activations.join_next().await;
                    }
                    let shared = shared.clone();
                    activations.spawn(async move { shared.reactivate_since(&run_id, shared.opened).await });
                }
                // Paused, but its pause was lifted by a resume the process died in: no run
                // is left behind.
                Ok(run)
                    if matches!(run.status, RunStatus::Paused { .. })
                        && shared.pause_reason(&run.kind, &run.run_id).is_none() =>
                {
                    found += 1;
                    crate::pause::reenter(shared, &run.run_id).await?;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(run_id, error = %e, "run record unreadable; the run cannot continue");
                    shared.event(&run_id, "corrupt", e.to_string());
                }
            }
        }
        match next {
            Some(last) => after = Some(last),
            None => break,
        }
    }
    while activations.join_next().await.is_some() {}
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
