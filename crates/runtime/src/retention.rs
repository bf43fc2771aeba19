//! Deleting a settled run and everything it owns: its record and idempotency key, stash,
//! ledger, approvals, alarms, output stream, events and their keys, event waits, sleeps,
//! storage, dead letters, budget. The audit trail keeps its entries about the run: it has
//! its own retention.
//!
//! The owned records go first, in batches of at most [`DELETE_BATCH_MAX`] keys, each its own
//! commit, so that a run with a long stream never makes one write the store must take whole;
//! the run's record and key go last, in one commit. A crash between batches leaves the run
//! settled with fewer records, and deleting it again finishes the job: the run is gone once
//! its record is. A start with the deleted run's idempotency key starts a new run.

use std::sync::Arc;

use durafiber_store::{
    Batch, Durability, RunId,
    tables::{Key, Prefix, RunRecord, keys},
};
use serde::Serialize;

use crate::{alarm, error::RuntimeError, eviction, kernel::shared::Shared};

/// Most keys one commit of a deletion removes.
pub const DELETE_BATCH_MAX: usize = 1_000;

/// What [`Runtime::delete_run`](crate::Runtime::delete_run) removed.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunDeleted {
    /// The run, which no longer exists.
    pub run_id: RunId,
    /// How many stored records went with it, its own record included (its alarms, which a
    /// settled run rarely keeps, aside).
    pub records: usize,
}

/// Deletes `run_id`, which must be settled (see the module's documentation).
pub(crate) async fn delete(shared: &Arc<Shared>, run_id: &str) -> Result<RunDeleted, RuntimeError> {
    shared.ownership.check(run_id)?;
    // The transition lock first, as an activation takes it: no activation comes between.
    let _one_at_a_time = shared.registry.transition(run_id).await;
    settled(&shared.load_run(run_id)?)?;
    // Out of memory before the run's lock is taken: its actor may be waiting for that lock.
    eviction::idle::kill(shared, run_id).await;
    let locked = shared.lock_run(run_id).await?;
    let run = &locked.run;
    settled(run)?;
    let mut records = 0;
    records += drain(shared, &keys::LEDGER.of_run(run_id)).await?;
    records += drain(shared, &keys::APPROVALS.of_run(run_id)).await?;
    records += drain(shared, &keys::STREAM.of_run(run_id)).await?;
    records += drain(shared, &keys::EVENTS.of_run(run_id)).await?;
    records += drain(shared, &keys::EVENT_KEYS.of_run(run_id)).await?;
    records += drain(shared, &keys::EVENT_WAITS.of_run(run_id)).await?;
    records += drain(shared, &keys::SLEEPS.of_run(run_id)).await?;
    records += drain(shared, &keys::STORAGE.of_run(run_id)).await?;
    records += drain(shared, &keys::DEAD_LETTERS.of_run(run_id)).await?;
    // The run's own records, one key each, and its alarms (a settled run keeps none unless
    // it was escalated or cancelled while they were set) with their due-index entries.
    let mut last = Batch::new();
    alarm::delete_all_in(shared, run_id, &mut last)?;
    records += gone(shared, &mut last, keys::run_by_key(&run.kind, &run.key))?;
    records += gone(shared, &mut last, keys::open_run(run_id))?;
    records += gone(shared, &mut last, keys::stash(run_id))?;
    records += gone(shared, &mut last, keys::stash_version(run_id))?;
    records += gone(shared, &mut last, keys::stream_head(run_id))?;
    records += gone(shared, &mut last, keys::stream_mark(run_id))?;
    records += gone(shared, &mut last, keys::hook_probe(run_id))?;
    records += gone(shared, &mut last, keys::budget(run_id))?;
    records += gone(shared, &mut last, keys::paused_run(run_id))?;
    records += gone(shared, &mut last, keys::run(run_id))?;
    shared.store.commit(last, Durability::Sync).await?;
    drop(locked);
    shared.status_changed();
    tracing::info!(run_id, records, "run deleted");
    shared.event(run_id, "deleted", format!("{records} records"));
    Ok(RunDeleted { run_id: run_id.into(), records })
}

/// Only a settled run may go.
fn settled(run: &RunRecord) -> Result<(), RuntimeError> {
    match run.status.is_terminal() {
        true => Ok(()),
        false => Err(RuntimeError::RunOpen { run_id: run.run_id.clone(), state: run.status.name().into() }),
    }
}

/// Adds the removal of `key` to `batch`; 1 when it is stored (read without decoding it).
fn gone<V>(shared: &Shared, batch: &mut Batch, key: Key<V>) -> Result<usize, RuntimeError> {
    let stored = shared.store.keys_from_to(&key, &key, 1)?.len();
    batch.delete(key);
    Ok(stored)
}

/// Removes every key under `prefix`, [`DELETE_BATCH_MAX`] to a commit. How many it removed.
async fn drain<V>(shared: &Shared, prefix: &Prefix<V>) -> Result<usize, RuntimeError> {
    let mut removed = 0;
    loop {
        let found = shared.store.keys_in(prefix, None, DELETE_BATCH_MAX, None)?;
        if found.is_empty() {
            return Ok(removed);
        }
        removed += found.len();
        let mut batch = Batch::new();
        for key in found {
            batch.delete(key);
        }
        shared.store.commit(batch, Durability::Sync).await?;
    }
}
