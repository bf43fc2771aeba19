//! Deleting a settled run and everything it owns: its record and idempotency key, stash,
//! ledger, approvals, alarms, output stream, events and their keys, event waits, sleeps,
//! storage, dead letters, budget. The audit trail keeps its entries about the run: it has
//! its own retention.
//!
//! Retention ([`crate::Retention`]) deletes runs once they have been settled for as long as
//! the config keeps their kind: a sweep every [`SWEEP_EVERY`] walks the settled index
//! (`keys::SETTLED`, by how and when each run settled) from its oldest entry, deletes at most
//! [`SWEEP_RUNS_MAX`] runs one after another — each in commits of at most
//! [`DELETE_BATCH_MAX`] keys, so the writer takes them between everyone else's — and comes
//! back a second later while more are due. It forgets audit entries past their time too.
//!
//! The owned records go first, in batches of at most [`DELETE_BATCH_MAX`] keys, each its own
//! commit, so that a run with a long stream never makes one write the store must take whole;
//! the run's record and key go last, in one commit. A crash between batches leaves the run
//! settled with fewer records, and deleting it again finishes the job: the run is gone once
//! its record is. A start with the deleted run's idempotency key starts a new run.

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use durafiber_store::{
    Batch, Durability, RunId, access,
    tables::{Key, Prefix, RunRecord, keys, keys::Settled},
};
use serde::Serialize;

use crate::{alarm, error::RuntimeError, eviction, kernel::shared::Shared};

/// Most keys one commit of a deletion removes.
pub const DELETE_BATCH_MAX: usize = 1_000;

/// How often retention looks for runs past their time, while none are left over.
pub const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Runs one sweep deletes at most (and audit entries it forgets); more due are swept a
/// second later.
pub const SWEEP_RUNS_MAX: usize = 1_000;

/// How soon a sweep that left runs due comes back.
const SWEEP_AGAIN: Duration = Duration::from_secs(1);

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
    if let Some(how) = Settled::of(&run.status) {
        records += gone(shared, &mut last, keys::settled(how, run.updated_at_ms, run_id))?;
    }
    records += gone(shared, &mut last, keys::run(run_id))?;
    shared.store.commit(last, Durability::Sync).await?;
    drop(locked);
    shared.status_changed();
    crate::metrics::Metrics::bump(&shared.metrics.runs_deleted);
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

/// What one retention sweep did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Swept {
    /// Runs deleted.
    pub runs: usize,
    /// Audit entries forgotten.
    pub audit_entries: usize,
    /// Whether it stopped at its bound with more due.
    pub more: bool,
}

impl Swept {
    /// When the next sweep is due, after one that ended at `now_ms`.
    pub fn next_at_ms(&self, now_ms: u64) -> u64 {
        let after = if self.more { SWEEP_AGAIN } else { SWEEP_EVERY };
        now_ms.saturating_add(u64::try_from(after.as_millis()).unwrap_or(u64::MAX))
    }
}

/// Starts a retention sweep when one is due and none runs; it sets the next one's time
/// when it ends. The driver asks at every tick.
pub(crate) fn start_due(shared: &Arc<Shared>) {
    let due = shared.retention_due_ms.load(Ordering::SeqCst);
    if due > shared.now_ms()
        || shared
            .retention_due_ms
            .compare_exchange(due, u64::MAX, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
    {
        return;
    }
    let shared2 = shared.clone();
    shared.spawn_tracked(async move {
        let shared = shared2;
        let next = match sweep(&shared).await {
            Ok(swept) => swept.next_at_ms(shared.now_ms()),
            Err(e) => {
                tracing::warn!(error = %e, "retention sweep failed; it is tried again later");
                Swept::default().next_at_ms(shared.now_ms())
            }
        };
        shared.retention_due_ms.store(next, Ordering::SeqCst);
        shared.driver_wake.notify_one();
    });
}

/// One retention sweep (see the module's documentation): the runs this node owns that
/// settled longer ago than the config keeps them, and the audit entries past their time.
pub(crate) async fn sweep(shared: &Arc<Shared>) -> Result<Swept, RuntimeError> {
    let retention = shared.config.retention;
    let now_ms = shared.now_ms();
    let mut swept = Swept::default();
    if Settled::ALL.iter().any(|how| retention.of(*how).is_some()) {
        index_settled_runs(shared).await?;
    }
    for how in Settled::ALL {
        let Some(until_ms) = retention.of(how).and_then(|keep| before(now_ms, keep)) else { continue };
        let left = SWEEP_RUNS_MAX.saturating_sub(swept.runs);
        let (deleted, more) = sweep_settled(shared, how, until_ms, left).await?;
        swept.runs += deleted;
        swept.more |= more;
    }
    if let Some(until_ms) = retention.audit.and_then(|keep| before(now_ms, keep)) {
        swept.audit_entries = access::forget_before(&shared.store, until_ms, SWEEP_RUNS_MAX).await?;
        crate::metrics::Metrics::add(&shared.metrics.audit_entries_deleted, swept.audit_entries as u64);
        swept.more |= swept.audit_entries == SWEEP_RUNS_MAX;
    }
    if swept.runs > 0 || swept.audit_entries > 0 {
        tracing::info!(
            runs = swept.runs,
            audit_entries = swept.audit_entries,
            more = swept.more,
            "retention swept"
        );
    }
    Ok(swept)
}

/// The time `keep` before `now_ms`; `None` before the clock's start.
fn before(now_ms: u64, keep: Duration) -> Option<u64> {
    now_ms.checked_sub(u64::try_from(keep.as_millis()).ok()?)
}

/// Deletes up to `left` runs that settled `how` at `until_ms` or before, oldest first.
/// Entries that no longer match their run (it is gone, or its record was written again
/// since) are dropped. Returns how many runs went and whether more may be due.
async fn sweep_settled(
    shared: &Arc<Shared>,
    how: Settled,
    until_ms: u64,
    left: usize,
) -> Result<(usize, bool), RuntimeError> {
    let index = keys::settled_of(how);
    let shards = shared.ownership.scan_filter();
    let mut after = None;
    let mut deleted = 0;
    while deleted < left {
        let page = shared.store.keys_in(&index, after.as_ref(), left - deleted, shards.as_deref())?;
        let Some(last) = page.last().cloned() else { return Ok((deleted, false)) };
        let mut stale = Batch::new();
        for key in page {
            let Some((at_ms, run_id)) = keys::parse_settled(&key) else {
                stale.delete(key);
                continue;
            };
            if at_ms > until_ms {
                commit_stale(shared, stale).await?;
                return Ok((deleted, false));
            }
            if !shared.ownership.owns(run_id) {
                continue;
            }
            match shared.load_run(run_id) {
                Ok(run) if Settled::of(&run.status) == Some(how) && run.updated_at_ms == at_ms => {
                    match delete(shared, run_id).await {
                        Ok(_) => {
                            deleted += 1;
                            crate::metrics::Metrics::bump(&shared.metrics.runs_deleted_by_retention);
                        }
                        // Tried again at the next sweep; the others go meanwhile.
                        Err(e) => tracing::warn!(run_id, error = %e, "retention could not delete the run"),
                    }
                }
                Ok(_) | Err(RuntimeError::UnknownRun { .. }) => {
                    stale.delete(key.clone());
                }
                Err(e) => tracing::warn!(run_id, error = %e, "retention could not read the run"),
            }
        }
        commit_stale(shared, stale).await?;
        after = Some(last);
    }
    Ok((deleted, true))
}

async fn commit_stale(shared: &Shared, stale: Batch) -> Result<(), RuntimeError> {
    if !stale.is_empty() {
        shared.store.commit(stale, Durability::Sync).await?;
    }
    Ok(())
}

/// Enters every settled run in the settled index, once per store: runs that settled before
/// the index existed have no entry. Read a page at a time, each page's entries one commit.
async fn index_settled_runs(shared: &Shared) -> Result<(), RuntimeError> {
    let complete = keys::settled_index_complete();
    if shared.store.get(&complete)?.is_some() {
        return Ok(());
    }
    let mut after = None;
    let mut indexed = 0usize;
    loop {
        let page = shared.store.scan(&keys::RUNS.all(), after.as_ref(), DELETE_BATCH_MAX)?;
        let Some((last, _)) = page.last() else { break };
        let next = last.clone();
        let mut batch = Batch::new();
        for (_, run) in page {
            // A record that does not decode is `store verify`'s to report; it is not deleted.
            let Ok(run) = run else { continue };
            if let Some(how) = Settled::of(&run.status) {
                batch.put(keys::settled(how, run.updated_at_ms, &run.run_id), &())?;
                indexed += 1;
            }
        }
        if !batch.is_empty() {
            shared.store.commit(batch, Durability::Sync).await?;
        }
        after = Some(next);
    }
    let mut batch = Batch::new();
    batch.put(complete, &1u64)?;
    shared.store.commit(batch, Durability::Sync).await?;
    tracing::info!(runs = indexed, "settled runs entered in the settled index");
    Ok(())
}
