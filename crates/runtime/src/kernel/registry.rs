//! At most one live cell (and actor) per run id: the map of live runs, and the per-run locks
//! that serialize activation, hibernation and eviction. `run/actor.rs` activates into it;
//! hibernation and eviction remove from it.

use durafiber_store::RunId;
use durafiber_store::lock::{Mutex, MutexGuard};
use std::sync::Arc;

use crate::{
    kernel::by_run_id::{ByRunId, HasRunId},
    kernel::cell::{RunCell, lock_stripes, stripe},
    limits,
};

/// A live run: its in-memory cell and, once an inbound event needs one, its actor (the
/// cell's [`Mailbox`](super::mailbox::Mailbox)).
#[derive(Clone)]
pub(crate) struct LiveRun {
    pub cell: Arc<RunCell>,
}

impl HasRunId for LiveRun {
    fn run_id(&self) -> &str {
        &self.cell.run_id
    }
}

impl LiveRun {
    /// A run just activated: no actor yet.
    pub fn new(cell: Arc<RunCell>) -> Self {
        LiveRun { cell }
    }

    /// The run's actor slot.
    pub fn mailbox(&self) -> &super::mailbox::Mailbox {
        self.cell.mailbox()
    }
}

/// The live runs. The map's lock is held only to read or change the map, never across a
/// spawn; activations (and hibernations and evictions) of one run are serialized by its
/// stripe of `transitions`, so activations of different runs proceed side by side.
pub(crate) struct Registry {
    live: Mutex<ByRunId<LiveRun>>,
    transitions: Vec<tokio::sync::Mutex<()>>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            live: Mutex::new(ByRunId::default()),
            transitions: (0..limits::ACTIVATION_STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
        }
    }
}

impl Registry {
    fn map(&self) -> MutexGuard<'_, ByRunId<LiveRun>> {
        self.live.lock()
    }

    pub fn get(&self, run_id: &RunId) -> Option<LiveRun> {
        self.map().get(run_id).cloned()
    }

    pub fn remove(&self, run_id: &RunId) -> Option<LiveRun> {
        self.map().remove(run_id)
    }

    pub fn len(&self) -> usize {
        self.map().len()
    }

    pub fn run_ids(&self) -> Vec<RunId> {
        self.map().values().map(|live| live.cell.run_id.clone()).collect()
    }

    /// Serializes activation, hibernation and eviction of `run_id` while the guard lives.
    pub async fn transition(&self, run_id: &RunId) -> tokio::sync::MutexGuard<'_, ()> {
        self.transitions[stripe(run_id, self.transitions.len())].lock().await
    }

    /// [`Registry::transition`] for many runs at once (see [`lock_stripes`]).
    pub async fn transitions(&self, run_ids: &[impl AsRef<str>]) -> Vec<tokio::sync::MutexGuard<'_, ()>> {
        lock_stripes(&self.transitions, run_ids).await
    }

    /// Adds a run that was just activated, under its cell's run id.
    pub fn insert(&self, run: LiveRun) {
        self.map().insert(run);
    }
}
