//! Starting a run: durably, then its activation beside the caller — for `Runtime::start*`
//! and, through `Shared::starter`, for a fiber starting a child.

use std::sync::Arc;

use durafiber_store::RunId;

use crate::{
    error::RuntimeError,
    kernel::shared::Shared,
    run::actor::reactivate,
    run::start::{self, StartOutcome},
    types::RunOptions,
};
use durafiber_store::tables::RunStatus;

/// Starts a run and, once its handle is durable, lets its activation go on beside the caller.
pub(super) async fn start_and_activate(
    shared: &Arc<Shared>,
    kind: &str,
    key: &str,
    input_json: &str,
    options: RunOptions,
    caller: Option<opentelemetry::trace::SpanContext>,
) -> Result<StartOutcome, RuntimeError> {
    let outcome = start::start(shared, kind, key, input_json, options, caller).await?;
    announce_if_elsewhere(shared, &outcome);
    if outcome.accepted || matches!(outcome.status, RunStatus::Accepted) {
        // The handle is durable: return it now, and let the activation (its registration
        // write, the fiber) go on beside the caller. Virtual time and `settle` wait for it.
        let (activating, run_id) = (shared.clone(), outcome.run_id.clone());
        let busy = shared.life.busy();
        shared.life.spawn_tracked(async move {
            reactivate(&activating, &run_id).await;
            drop(busy);
        });
    }
    Ok(outcome)
}

/// A run just accepted that another node of a shared store runs: that node is told now
/// rather than finding it at its next tick.
pub(super) fn announce_if_elsewhere(shared: &Shared, outcome: &StartOutcome) {
    if outcome.accepted
        && !shared.ownership.owns(outcome.run_id.as_str())
        && let Some(leases) = shared.store.backend().leases()
        && let Err(e) = leases.announce(durafiber_store::shard::of_run(outcome.run_id.as_str()))
    {
        tracing::warn!(run_id = %outcome.run_id, error = %e, "could not tell the run's owner; it finds the run at its next tick");
    }
}

/// [`Shared::starter`]: a child's start, with the runtime's defaults.
pub(super) fn start_boxed(
    shared: Arc<Shared>,
    kind: String,
    key: String,
    input_json: String,
) -> crate::kernel::shared::BoxFuture<Result<RunId, RuntimeError>> {
    Box::pin(async move {
        let outcome =
            start_and_activate(&shared, &kind, &key, &input_json, RunOptions::default(), None).await?;
        Ok(outcome.run_id)
    })
}
