//! Escalation (§3.6, §6.1, §8.4): a run that needs a human goes to `Escalated{reason}` in
//! one boundary with its alarms removed, its fiber stops, a waiting approval is told, and
//! the agent's `on_escalate` runs once.

use durafiber_store::RunId;
use std::sync::Arc;

use durafiber_store::{Batch, tables::RunStatus};

use crate::trace::{Ended, Parent};
use crate::{
    alarm,
    error::RuntimeError,
    kernel::{cell::ApprovalOutcome, shared::Shared},
    metrics::Metrics,
};

pub(crate) async fn after_escalation(shared: &Arc<Shared>, kind: &str, run_id: &RunId, reason: &str) {
    Metrics::bump(&shared.obs.metrics.escalations);
    let now = shared.now();
    shared.obs.span(|| {
        Ended::new(run_id, kind, "escalate", Parent::Root)
            .times(now, now)
            .attr("durafiber.escalation.reason", reason.to_string())
            .error(Some(reason.to_string()))
    });
    if let Ok(agent) = shared.agents.agent(kind) {
        agent.on_escalate(shared.hook_ctx(run_id, kind), reason.to_string()).await;
    }
}

/// Moves a run to `Escalated{reason}`, stops its fiber and runs `on_escalate`. No-op on a
/// finished run. `extra` joins the same boundary.
pub(crate) async fn escalate(
    shared: &Arc<Shared>,
    run_id: &RunId,
    reason: &str,
    extra: Batch,
) -> Result<(), RuntimeError> {
    let written = shared
        .update_run(run_id, |run, batch| {
            if run.status.is_terminal() {
                return Ok(false);
            }
            batch.extend(extra);
            run.status = RunStatus::Escalated { reason: reason.to_string() };
            alarm::delete_all_in(shared, run_id, batch)?;
            Ok(true)
        })
        .await?;
    let Some(run) = written else { return Ok(()) };
    shared.event(run_id, "escalated", reason);
    // Its last attempt did not end by itself, and no other follows.
    shared.send_unfinished_attempt(run_id, &run.kind, run.attempt, "escalated");
    crate::child::settled(shared, &run);
    if let Some(live) = shared.registry.get(run_id) {
        if let Some(waiter) = live.cell.waits.approval.lock().take().map(|waiter| waiter.1) {
            let _ = waiter.send(ApprovalOutcome::Escalated);
        }
        if let Some(fiber) = live.cell.task.fiber.lock().take() {
            fiber.abort();
        }
        shared.liveness.fiber_ended(run_id, shared.now());
    }
    after_escalation(shared, &run.kind, &run.run_id, reason).await;
    Ok(())
}
