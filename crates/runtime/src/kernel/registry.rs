//! At most one live cell (and actor) per run id: the map of live runs, and the per-run locks
//! that serialize activation, hibernation and eviction. `run/actor.rs` activates into it;
//! hibernation and eviction remove from it.

use durafiber_store::lock::{Mutex, MutexGuard};
use std::sync::Arc;

use ractor::ActorRef;

use crate::{
    kernel::cell::{RunCell, lock_stripes, stripe},
    kernel::inbox::RunMsg,
    limits,
};

/// A live run: its in-memory cell and, once an inbound event needs one, its actor.
#[derive(Clone)]
pub(crate) struct LiveRun {
    pub cell: Arc<RunCell>,
    pub mailbox: Arc<Mailbox>,
}

impl LiveRun {
    /// A run just activated: no actor yet.
    pub fn new(cell: Arc<RunCell>) -> Self {
        LiveRun { cell, mailbox: Arc::new(Mailbox::default()) }
    }
}

/// A live run's actor, spawned by the first inbound event that needs one (a message, a
/// request, an alarm, an activation of a live run). A run that only runs its fiber — most
/// recovered runs — never pays for an actor: a ractor actor costs more memory and time
/// than the whole rest of an activation. Closed when the run leaves memory, so an event
/// that still holds the old [`LiveRun`] cannot spawn an actor for a run that is gone.
#[derive(Default)]
pub(crate) struct Mailbox(tokio::sync::Mutex<Slot>);

#[derive(Default)]
enum Slot {
    #[default]
    Empty,
    Open(ActorRef<RunMsg>),
    Closed,
}

impl Mailbox {
    /// The actor, spawned by `spawn` if there is none yet; `None` once the run left memory.
    /// `spawn` is not polled when the actor exists.
    pub async fn actor<E>(
        &self,
        spawn: impl std::future::Future<Output = Result<ActorRef<RunMsg>, E>>,
    ) -> Result<Option<ActorRef<RunMsg>>, E> {
        let mut slot = self.0.lock().await;
        match &*slot {
            Slot::Open(actor) => Ok(Some(actor.clone())),
            Slot::Closed => Ok(None),
            Slot::Empty => {
                let actor = spawn.await?;
                *slot = Slot::Open(actor.clone());
                Ok(Some(actor))
            }
        }
    }

    /// Closes the mailbox for good; the actor to stop, if one was spawned.
    pub async fn close(&self) -> Option<ActorRef<RunMsg>> {
        match std::mem::replace(&mut *self.0.lock().await, Slot::Closed) {
            Slot::Open(actor) => Some(actor),
            Slot::Empty | Slot::Closed => None,
        }
    }
}

/// The live runs. The map's lock is held only to read or change the map, never across a
/// spawn; activations (and hibernations and evictions) of one run are serialized by its
/// stripe of `transitions`, so activations of different runs proceed side by side.
pub(crate) struct Registry {
    live: Mutex<super::RunMap<String, LiveRun>>,
    transitions: Vec<tokio::sync::Mutex<()>>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            live: Mutex::new(super::RunMap::default()),
            transitions: (0..limits::ACTIVATION_STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
        }
    }
}

impl Registry {
    fn map(&self) -> MutexGuard<'_, super::RunMap<String, LiveRun>> {
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

    /// [`Registry::transition`] for many runs at once (see [`lock_stripes`]).
    pub async fn transitions(&self, run_ids: &[String]) -> Vec<tokio::sync::MutexGuard<'_, ()>> {
        lock_stripes(&self.transitions, run_ids).await
    }

    /// Adds a run that was just activated.
    pub fn insert(&self, run_id: &str, run: LiveRun) {
        self.map().insert(run_id.to_string(), run);
    }
}
