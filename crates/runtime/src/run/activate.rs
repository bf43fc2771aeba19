//! Activation, the only code that spawns a run's actor: it loads the run from the store,
//! builds its cell, spawns the actor into the registry and asks it to start or recover the
//! fiber. Below it, features that need a run re-entered call `Shared::reactivate`, which
//! the runtime points here when it opens.
//!
//! Before: `start`, an alarm, an approval, an event or a recovery asks for a run. After:
//! `actor.rs`.

use parking_lot::Mutex;
use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicU64},
};

use durafiber_store::tables::{self, StashRecord};
use ractor::Actor;
use tokio::sync::watch;

use crate::{
    clock::Stopwatch,
    config::DurabilityMode,
    error::RuntimeError,
    kernel::cell::RunCell,
    kernel::inbox::RunMsg,
    kernel::registry::LiveRun,
    kernel::shared::{BoxFuture, Shared},
    metrics::Metrics,
    run::actor::RunActor,
};

/// The live run, activating it (a cold start) when it has none. `cold` tells which.
async fn live_or_spawn(shared: &Arc<Shared>, run_id: &str) -> Result<(LiveRun, bool), RuntimeError> {
    let registry = &shared.registry;
    if let Some(run) = registry.get(run_id) {
        return Ok((run, false));
    }
    let _one_at_a_time = registry.transition(run_id).await;
    if let Some(run) = registry.get(run_id) {
        return Ok((run, false));
    }
    if shared.shutting_down.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(RuntimeError::ShuttingDown);
    }
    let watch = Stopwatch::start();
    let run = shared.load_run(run_id)?;
    let stash: Option<StashRecord> =
        shared.store.get(tables::STASHES, &tables::STASHES.key(&[run_id.as_bytes()])).unwrap_or(None);
    let durability = match &run.options.durability {
        Some(mode) => DurabilityMode::parse(mode)?,
        None => shared.config.durability,
    };
    let cell = Arc::new(RunCell {
        run_id: run_id.to_string(),
        kind: run.kind.clone(),
        durability,
        fiber_keep_alive: run.options.fiber_keep_alive.unwrap_or(shared.config.fiber_keep_alive),
        seq: AtomicU64::new(stash.map(|s| s.seq).unwrap_or(0)),
        cancel: watch::Sender::new(run.cancel_reason.clone()),
        approval_waiter: Mutex::new(None),
        event_waiter: Mutex::new(None),
        fiber: Mutex::new(None),
        recovering: AtomicBool::new(false),
        evicted: AtomicBool::new(false),
        pending_exit: Mutex::new(None),
        storage_keys: tokio::sync::Mutex::new(None),
    });
    let (actor, _join) = Actor::spawn(None, RunActor { shared: shared.clone() }, cell.clone())
        .await
        .map_err(|e| RuntimeError::Agent(crate::error::AgentError::Runtime(format!("spawn: {e}"))))?;
    let entry = LiveRun { actor, cell };
    registry.insert(run_id, entry.clone());
    let stream = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (&run.kind, &run.key, shared.now_ms()).hash(&mut h);
        h.finish()
    };
    shared.liveness.activated(run_id, shared.now_ms(), stream);
    Metrics::bump(&shared.metrics.activations);
    shared.metrics.cold_start.record_us(watch.elapsed_us());
    shared.event(run_id, "activated", format!("cold start {} µs", watch.elapsed_us()));
    Ok((entry, true))
}

/// Activates `run_id` (a cold start when it has no actor). A cold start also asks the new
/// actor to start or recover the fiber, whatever event caused it: an alarm, a message, a
/// decision or a keep-alive finds an interrupted run and re-enters it (§3.4).
pub(crate) async fn activate(shared: &Arc<Shared>, run_id: &str) -> Result<LiveRun, RuntimeError> {
    let (live, cold) = live_or_spawn(shared, run_id).await?;
    if cold && !shared.passive {
        send_activate(shared, &live, run_id, Stopwatch::start());
    }
    Ok(live)
}

fn send_activate(shared: &Arc<Shared>, live: &LiveRun, run_id: &str, since: Stopwatch) {
    if live.actor.cast(RunMsg::Activate { busy: shared.busy(), since }).is_err() {
        tracing::warn!(run_id, "actor stopped before activation; retrying");
        shared.wake_at(shared.now_ms(), run_id);
    }
}

/// Activates `run_id` and lets its actor start or recover the fiber.
pub(crate) async fn reactivate(shared: &Arc<Shared>, run_id: &str) {
    reactivate_since(shared, run_id, Stopwatch::start()).await
}

/// `reactivate`, with recovery latency counted from `since`.
pub(crate) async fn reactivate_since(shared: &Arc<Shared>, run_id: &str, since: Stopwatch) {
    if shared.passive {
        return;
    }
    match live_or_spawn(shared, run_id).await {
        Ok((live, _)) => {
            shared.liveness.activity(run_id, shared.now_ms());
            send_activate(shared, &live, run_id, since);
        }
        Err(RuntimeError::ShuttingDown | RuntimeError::UnknownRun { .. }) => {}
        Err(e) => {
            // Never leave the run behind: a store that failed now may answer in a second.
            tracing::error!(run_id, error = %e, "could not activate the run; retrying in 1 s");
            shared.wake_at(shared.now_ms().saturating_add(1_000), run_id);
        }
    }
}

/// `reactivate_since` as the kernel holds it ([`Shared::reactivate`]), so that features below
/// the runs can have a run re-entered without importing this module.
pub(crate) fn reactivate_boxed(shared: Arc<Shared>, run_id: String, since: Stopwatch) -> BoxFuture<()> {
    Box::pin(async move { reactivate_since(&shared, &run_id, since).await })
}
