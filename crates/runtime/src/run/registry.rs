//! At most one live actor per run id. Activation loads the run from the store and spawns its
//! actor; hibernation and eviction remove it. The registry is the only place that spawns.
//!
//! Before: `start`, an alarm, an approval or a recovery asks for a run. After: `actor.rs`.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64},
    },
};

use durafiber_store::tables::{self, StashRecord};
use ractor::{Actor, ActorRef};
use tokio::sync::watch;

use crate::{
    clock::Stopwatch,
    config::DurabilityMode,
    error::RuntimeError,
    kernel::cell::{RunCell, stripe},
    kernel::shared::Shared,
    limits,
    metrics::Metrics,
    run::actor::{RunActor, RunMsg},
};

/// A live run: its actor and its in-memory cell.
#[derive(Clone)]
pub(crate) struct LiveRun {
    pub actor: ActorRef<RunMsg>,
    pub cell: Arc<RunCell>,
}

/// The live runs. The map's lock is held only to read or change the map, never across a
/// spawn; activations (and hibernations and evictions) of one run are serialized by its
/// stripe of `transitions`, so activations of different runs proceed side by side.
pub(crate) struct Registry {
    live: Mutex<HashMap<String, LiveRun>>,
    transitions: Vec<tokio::sync::Mutex<()>>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            live: Mutex::new(HashMap::new()),
            transitions: (0..limits::ACTIVATION_STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
        }
    }
}

impl Registry {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, LiveRun>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, run_id: &str) -> Option<LiveRun> {
        self.map().get(run_id).cloned()
    }

    pub fn remove(&self, run_id: &str) -> Option<LiveRun> {
        self.map().remove(run_id)
    }

    pub fn len(&self) -> usize {
        self.map().len()
    }

    pub fn run_ids(&self) -> Vec<String> {
        self.map().keys().cloned().collect()
    }

    /// Serializes activation, hibernation and eviction of `run_id` while the guard lives.
    pub async fn transition(&self, run_id: &str) -> tokio::sync::MutexGuard<'_, ()> {
        self.transitions[stripe(run_id, self.transitions.len())].lock().await
    }

    /// The live run, activating it (a cold start) when it has none. `cold` tells which.
    pub async fn activate(
        &self,
        shared: &Arc<Shared>,
        run_id: &str,
    ) -> Result<(LiveRun, bool), RuntimeError> {
        if let Some(run) = self.get(run_id) {
            return Ok((run, false));
        }
        let _one_at_a_time = self.transition(run_id).await;
        if let Some(run) = self.get(run_id) {
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
            pending_exit: Mutex::new(None),
            storage_keys: tokio::sync::Mutex::new(None),
        });
        let (actor, _join) = Actor::spawn(None, RunActor { shared: shared.clone() }, cell.clone())
            .await
            .map_err(|e| RuntimeError::Agent(crate::error::AgentError::Runtime(format!("spawn: {e}"))))?;
        let entry = LiveRun { actor, cell };
        self.map().insert(run_id.to_string(), entry.clone());
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
}
