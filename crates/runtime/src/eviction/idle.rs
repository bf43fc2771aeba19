//! The supervisor's decisions carried out (§7.2–§7.3): hibernation, a graceful stop; a
//! park, which lets a fiber waiting on a durable wait go;
//! eviction, which drops a fiber's future mid-await exactly as a process death would; the
//! recovery count given back after an interruption the runtime caused; and the eviction a
//! crash hook or seeded chaos asks for at a boundary (`kernel/commit.rs`).
//! `kernel/activity.rs` decides when.

use durafiber_api::Timestamp;
use durafiber_store::RunId;
use std::sync::{Arc, atomic::Ordering};
use std::time::Duration;

use durafiber_store::tables::{RunStatus, WakeReason};

use crate::trace::{Ended, Parent};
use crate::{
    kernel::{
        cell::RunCell,
        registry::LiveRun,
        shared::{BoxFuture, Shared},
    },
    metrics::Metrics,
};

/// Hibernates an idle run: a graceful stop; durable state stays, memory goes.
pub(crate) async fn hibernate(shared: &Arc<Shared>, run_id: &RunId) {
    let _one_at_a_time = shared.registry.transition(run_id).await;
    if !shared.liveness.is_hibernateable(run_id) {
        shared.liveness.reopen(run_id);
        return;
    }
    let Some(live) = shared.registry.remove(run_id) else {
        shared.liveness.remove(run_id);
        return;
    };
    shared.liveness.remove(run_id);
    if let Some(actor) = live.mailbox().close().await {
        let _ = actor.stop_and_wait(Some("hibernated".into()), None).await;
    }
    Metrics::bump(&shared.obs.metrics.hibernations);
    shared.event(run_id, "hibernated", "idle");
}

/// Takes `run_id` out of memory as a process death would: its actor is killed wherever it
/// is and its fiber's future dropped; nothing is written. The run as it was, if it was live.
/// The caller holds the run's transition lock.
pub(crate) async fn kill(shared: &Arc<Shared>, run_id: &RunId) -> Option<LiveRun> {
    let live = shared.registry.remove(run_id);
    if let Some(live) = &live {
        live.cell.task.evicted.store(true, Ordering::SeqCst);
        if let Some(fiber) = live.cell.task.fiber.lock().take() {
            fiber.abort();
        }
        live.cell.waits.approval.lock().take();
        live.cell.waits.event.lock().take();
        if let Some(actor) = live.mailbox().close().await {
            let _ = actor.kill_and_wait(None).await;
        }
    }
    shared.liveness.remove(run_id);
    live
}

/// Parks a run whose fiber waits on a durable wait: the fiber's future and the actor leave
/// memory, and the wait's end (a decision, an event, the wake's alarm) re-enters the run
/// from its journal, as after an eviction. A wait that ended just before the park has left
/// the run `Running`: it is woken at once.
pub(crate) async fn park(shared: &Arc<Shared>, run_id: &RunId) {
    let _one_at_a_time = shared.registry.transition(run_id).await;
    if !shared.liveness.is_parkable(run_id) {
        shared.liveness.reopen(run_id);
        return;
    }
    let Some(live) = kill(shared, run_id).await else { return };
    Metrics::bump(&shared.obs.metrics.parks);
    shared.event(run_id, "parked", "waiting");
    left_memory(shared, &live.cell, "park", "waiting on a durable wait");
    give_back_recovery(shared, &live.cell, Some(WakeReason::Resumed)).await;
}

/// Evicts a run: its actor is killed wherever it is and its fiber's future dropped.
pub(crate) async fn evict(shared: &Arc<Shared>, run_id: &RunId, why: &str) {
    // Held until the run is marked, so no activation comes between the kill and the mark.
    let _one_at_a_time = shared.registry.transition(run_id).await;
    let Some(live) = kill(shared, run_id).await else { return };
    Metrics::bump(&shared.obs.metrics.evictions);
    shared.event(run_id, "evicted", why.to_string());
    left_memory(shared, &live.cell, "evict", why);
    // An evicted fiber leaves an interrupted run: mark why, and re-activate it by ourselves.
    give_back_recovery(shared, &live.cell, Some(WakeReason::Evicted)).await;
}

/// The span of a run taken out of memory by the runtime (an eviction, a park).
fn left_memory(shared: &Shared, cell: &RunCell, what: &'static str, why: &str) {
    let now = shared.now();
    shared.obs.span(|| {
        Ended::new(&cell.run_id, &cell.kind, what, Parent::Root)
            .times(now, now)
            .attr("durafiber.attempt", i64::from(cell.attempt.load(Ordering::SeqCst)))
            .attr("durafiber.reason", why.to_string())
    });
}

/// Drops a run whose shard another node owns now: killed as by an eviction, but nothing is
/// written — the new owner writes the run from now on, and recovers it.
pub(crate) async fn disown(shared: &Arc<Shared>, run_id: &RunId) {
    let _one_at_a_time = shared.registry.transition(run_id).await;
    if kill(shared, run_id).await.is_some() {
        tracing::warn!(%run_id, "run dropped from memory: its shard is another node's now");
        shared.event(run_id, "disowned", "its shard moved to another node");
    }
}

/// After an interruption the runtime itself caused (an eviction, a shutdown): a recovery
/// that was cut short before any boundary is not counted as failed (§3.6), `reason` marks
/// why the run will be re-entered, and an interrupted run is woken at once.
pub(crate) async fn give_back_recovery(shared: &Arc<Shared>, cell: &RunCell, reason: Option<WakeReason>) {
    let counted = cell.task.recovering.swap(false, Ordering::SeqCst);
    let run_id = &cell.run_id;
    let marked = shared
        .update_run(run_id, |run, _| {
            let interrupted = matches!(run.status, RunStatus::Accepted | RunStatus::Running);
            if !interrupted {
                return Ok(false);
            }
            if run.status == RunStatus::Running && reason.is_some() {
                run.wake_reason = reason;
            }
            if counted {
                run.recover_attempts = run.recover_attempts.saturating_sub(1);
                run.next_recover_at_ms = Timestamp::ZERO;
            }
            Ok(reason.is_some() || counted)
        })
        .await;
    match marked {
        Ok(Some(_)) if reason.is_some() => shared.timers.wake_at(shared.now(), run_id),
        Ok(_) => {}
        Err(e) => {
            tracing::error!(%run_id, error = %e, "could not mark the interrupted run; retrying in 1 s");
            shared.timers.wake_at(shared.now().saturating_add(Duration::from_secs(1)), run_id);
        }
    }
}

/// [`Agents::evictor`](crate::kernel::shared::Agents::evictor): an eviction from inside the
/// run's own fiber (a crash hook, chaos), run as its own task.
pub(crate) fn evict_boxed(shared: Arc<Shared>, run_id: RunId, why: &'static str) -> BoxFuture<()> {
    Box::pin(async move { evict(&shared, &run_id, why).await })
}
