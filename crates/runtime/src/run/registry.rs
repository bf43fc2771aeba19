//! At most one live actor per run id. Activation loads the run from the store and spawns its
//! actor; hibernation and eviction remove it. The registry is the only place that spawns.
//!
//! Before: `start`, an alarm, an approval or a recovery asks for a run. After: `actor.rs`.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, atomic::AtomicU64},
};

use durafiber_store::tables::{self, StashRecord};
use ractor::{Actor, ActorRef};
use tokio::sync::watch;

use crate::{
    RuntimeError,
    clock::Stopwatch,
    config::DurabilityMode,
    metrics::Metrics,
    run::actor::{RunActor, RunMsg},
    shared::{RunCell, Shared},
};

/// A live run: its actor and its in-memory cell.
#[derive(Clone)]
pub(crate) struct LiveRun {
    pub actor: ActorRef<RunMsg>,
    pub cell: Arc<RunCell>,
}

#[derive(Default)]
pub(crate) struct Registry {
    live: tokio::sync::Mutex<HashMap<String, LiveRun>>,
}

impl Registry {
    pub async fn get(&self, run_id: &str) -> Option<LiveRun> {
        self.live.lock().await.get(run_id).cloned()
    }

    pub async fn remove(&self, run_id: &str) -> Option<LiveRun> {
        self.live.lock().await.remove(run_id)
    }

    pub async fn len(&self) -> usize {
        self.live.lock().await.len()
    }

    pub async fn run_ids(&self) -> Vec<String> {
        self.live.lock().await.keys().cloned().collect()
    }

    /// The live run, activating it (a cold start) when it has none.
    pub async fn activate(&self, shared: &Arc<Shared>, run_id: &str) -> Result<LiveRun, RuntimeError> {
        let mut live = self.live.lock().await;
        if let Some(run) = live.get(run_id) {
            return Ok(run.clone());
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
            fiber: Mutex::new(None),
            pending_exit: Mutex::new(None),
        });
        let (actor, _join) = Actor::spawn(None, RunActor { shared: shared.clone() }, cell.clone())
            .await
            .map_err(|e| RuntimeError::Agent(crate::AgentError::Runtime(format!("spawn: {e}"))))?;
        let entry = LiveRun { actor, cell };
        live.insert(run_id.to_string(), entry.clone());
        drop(live);
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
        Ok(entry)
    }
}
