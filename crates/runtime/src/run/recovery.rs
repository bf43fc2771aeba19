//! Recovery: what to do with a run found without a live fiber (§3.4–§3.6). The scan that
//! finds them at start-up is `rescan.rs`; which hooks run at once, and so which deaths count
//! against a run, is `kernel/hook_gate.rs`.

use durafiber_api::Timestamp;
use durafiber_store::RunId;
use durafiber_store::tables::{RunRecord, RunStatus, WakeReason, keys};
use std::time::Duration;

use crate::{budget::Budgets, hooks::RecoveryReason, kernel::shared::Shared, limits};

/// The decision for a run that has no live fiber.
#[derive(Debug, PartialEq)]
pub(crate) enum Plan {
    /// Never started: run `run_fiber`.
    Fresh,
    /// Interrupted: call `on_fiber_recovered`.
    Recover(RecoveryReason),
    /// Interrupted, but its backoff has not elapsed.
    Later(Timestamp),
    /// Too old, or its hook failed too often: a human must look.
    Escalate(String),
    /// Waiting, or finished: nothing to run.
    Nothing,
}

/// What `run` needs; `budgets` says which runs may have a budget record to read.
pub(crate) fn plan(shared: &Shared, run: &RunRecord, budgets: &Budgets) -> Plan {
    match run.status {
        RunStatus::Accepted => Plan::Fresh,
        RunStatus::Running => {
            let now = shared.now();
            let reason = match run.wake_reason {
                Some(WakeReason::Evicted) => RecoveryReason::Evicted,
                Some(WakeReason::Resumed) => RecoveryReason::Resumed,
                None => RecoveryReason::Crash,
            };
            // A run re-entered for a decision or a wake it waited for was not found
            // interrupted: its age is the wait's, not a sign that it is stuck.
            if reason != RecoveryReason::Resumed
                && now.saturating_since(run.created_at_ms) > shared.config.max_age
            {
                Plan::Escalate("max_age".into())
            } else if reason != RecoveryReason::Resumed
                && crate::budget::recoveries_crossed(shared, run, budgets).unwrap_or_else(|e| {
                    tracing::error!(run_id = %run.run_id, error = %e, "budget unreadable; recovering");
                    false
                })
            {
                Plan::Escalate("budget: recoveries".into())
            } else if let Some(deaths) = (run.recover_attempts > 0)
                .then(|| probe_deaths(shared, &run.run_id).unwrap_or(0))
                .filter(|deaths| *deaths >= shared.config.max_recover_attempts)
            {
                // A failing hook is escalated where it fails; what is left here are hooks the
                // process died in while they ran alone (`kernel/hook_gate.rs`).
                Plan::Escalate(format!(
                    "its recovery hook ended the process {deaths} times in a row, each time running alone"
                ))
            } else if run.next_recover_at_ms > now {
                Plan::Later(run.next_recover_at_ms)
            } else {
                Plan::Recover(reason)
            }
        }
        _ => Plan::Nothing,
    }
}

/// How many lone recoveries of `run_id` in a row the process died in (`tables::HOOK_PROBES`).
pub(crate) fn probe_deaths(shared: &Shared, run_id: &RunId) -> Result<u32, durafiber_store::StoreError> {
    let key = keys::hook_probe(run_id);
    Ok(shared.store.get::<u32>(&key)?.unwrap_or(0))
}

/// Delay before recovery attempt `n + 1` after `n` failed ones: 1 s doubling, capped at 5 min.
pub(crate) fn backoff(failed: u32) -> Duration {
    let shift = failed.saturating_sub(1).min(20);
    (limits::RECOVER_BACKOFF_BASE * (1u32 << shift)).min(limits::RECOVER_BACKOFF_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_backoff_doubles_from_one_second_to_five_minutes() {
        let delays: Vec<u64> = (1..=10).map(|n| backoff(n).as_millis() as u64).collect();
        assert_eq!(&delays[..5], &[1_000, 2_000, 4_000, 8_000, 16_000]);
        assert_eq!(backoff(30), Duration::from_secs(300));
    }
}
