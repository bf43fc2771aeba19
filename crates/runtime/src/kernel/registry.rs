//! At most one live actor per run id: the map of live runs, and the per-run locks that
//! serialize activation, hibernation and eviction. `run/actor.rs` spawns into it;
//! hibernation and eviction remove from it.

use parking_lot::Mutex;
use std::{collections::HashMap, sync::Arc};

use ractor::ActorRef;

use crate::{
    kernel::cell::{RunCell, stripe},
    kernel::inbox::RunMsg,
    limits,
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
    fn map(&self) -> parking_lot::MutexGuard<'_, HashMap<String, LiveRun>> {
        self.live.lock()
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

    /// Adds a run that was just activated.
    pub fn insert(&self, run_id: &str, run: LiveRun) {
        self.map().insert(run_id.to_string(), run);
    }
}
