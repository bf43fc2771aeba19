//! Activation, the only code that spawns a run's actor: it reads the run from the store once,
//! builds its cell, spawns the actor into the registry, decides and registers the fiber
//! (`fiber::decide`) and hands that decision to the actor, which starts or recovers it. Below it, features that need a run re-entered call `Shared::reactivate`, which
//! the runtime points here when it opens.
//!
//! Before: `start`, an alarm, an approval, an event or a recovery asks for a run. After:
//! `actor.rs`.

use parking_lot::Mutex;
use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicU32, AtomicU64},
};

use ractor::Actor;
use tokio::sync::watch;

use crate::{
    clock::Stopwatch,
    config::DurabilityMode,
    error::RuntimeError,
    kernel::cell::RunCell,
    kernel::inbox::{Activation, RunMsg},
    kernel::registry::LiveRun,
    kernel::shared::{BoxFuture, Shared},
    metrics::Metrics,
    run::{actor::RunActor, fiber},
};

/// The live run, activating it (a cold start) when it has none. A cold start reads the run
/// once, under its lock, and from that read builds the cell and — unless the runtime is
/// passive — decides and registers the fiber; the decision comes back for the actor.
async fn live_or_spawn(
    shared: &Arc<Shared>,
    run_id: &str,
) -> Result<(LiveRun, Option<Activation>), RuntimeError> {
    let registry = &shared.registry;
    if let Some(run) = registry.get(run_id) {
        return Ok((run, None));
    }
    let _one_at_a_time = registry.transition(run_id).await;
    if let Some(run) = registry.get(run_id) {
        return Ok((run, None));
    }
    if shared.shutting_down.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(RuntimeError::ShuttingDown);
    }
    // Virtual time waits for the registration write.
    let _busy = shared.busy();
    let watch = Stopwatch::start();
    let mut locked = shared.lock_run(run_id).await?;
    let stash = fiber::read_stash(shared, run_id);
    let run = &locked.run;
    let durability = match &run.options.durability {
        Some(mode) => DurabilityMode::parse(mode)?,
        None => shared.config.durability,
    };
    let seq = stash.as_ref().ok().and_then(|s| s.as_ref()).map(|s| s.seq).unwrap_or(0);
    let cell = Arc::new(RunCell {
        run_id: run_id.to_string(),
        kind: run.kind.clone(),
        durability,
        fiber_keep_alive: run.options.fiber_keep_alive.unwrap_or(shared.config.fiber_keep_alive),
        attempt: AtomicU32::new(run.attempt),
        seq: AtomicU64::new(seq),
        cancel: watch::Sender::new(run.cancel_reason.clone()),
        approval_waiter: Mutex::new(None),
        event_waiter: Mutex::new(None),
        fiber: Mutex::new(None),
        recovering: AtomicBool::new(false),
        evicted: AtomicBool::new(false),
        pending_exit: Mutex::new(None),
        storage_keys: tokio::sync::Mutex::new(None),
    });
    let stream = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (&run.kind, &run.key, shared.now_ms()).hash(&mut h);
        h.finish()
    };
    let (actor, _join) = Actor::spawn(None, RunActor { shared: shared.clone() }, cell.clone())
        .await
        .map_err(|e| RuntimeError::Agent(crate::error::AgentError::Runtime(format!("spawn: {e}"))))?;
    let entry = LiveRun { actor, cell };
    registry.insert(run_id, entry.clone());
    shared.liveness.activated(run_id, shared.now_ms(), stream);
    let decided = match shared.passive {
        true => None,
        false => Some(fiber::decide(shared, &entry.cell, &mut locked, stash).await),
    };
    drop(locked);
    Metrics::bump(&shared.metrics.activations);
    shared.metrics.cold_start.record_us(watch.elapsed_us());
    shared.event(run_id, "activated", format!("cold start {} µs", watch.elapsed_us()));
    Ok((entry, decided))
}

/// Activates `run_id` (a cold start when it has no actor). A cold start also has the new
/// actor start or recover the fiber, whatever event caused it: an alarm, a message, a
/// decision or a keep-alive finds an interrupted run and re-enters it (§3.4).
pub(crate) async fn activate(shared: &Arc<Shared>, run_id: &str) -> Result<LiveRun, RuntimeError> {
    let (live, decided) = live_or_spawn(shared, run_id).await?;
    if let Some(decided) = decided {
        send_activate(shared, &live, run_id, Stopwatch::start(), Some(decided));
    }
    Ok(live)
}

fn send_activate(
    shared: &Arc<Shared>,
    live: &LiveRun,
    run_id: &str,
    since: Stopwatch,
    decided: Option<Activation>,
) {
    if live.actor.cast(RunMsg::Activate { busy: shared.busy(), since, decided }).is_err() {
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
        Ok((live, decided)) => {
            shared.liveness.activity(run_id, shared.now_ms());
            send_activate(shared, &live, run_id, since, decided);
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
