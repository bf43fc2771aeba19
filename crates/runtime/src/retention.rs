//! Deleting a settled run and everything it owns: its record and idempotency key, stash,
//! ledger, approvals, alarms, output stream, events and their keys, event waits, sleeps,
//! storage, dead letters, budget. The audit trail keeps its entries about the run: it has
//! its own retention.
//!
//! The records go in commits of at most about [`DELETE_BATCH_MAX`] keys, so that a run with a
//! long stream never makes one write the store must take whole, and the writer takes them
//! between everyone else's; the run's own record goes last, in a commit no earlier than any
//! record it owns. A crash between commits leaves the run settled with fewer records, and
//! deleting it again finishes the job: the run is gone once its record is. A start with the
//! deleted run's idempotency key starts a new run.
//!
//! A child run (a sub-agent) goes with its parent, whose `join` may read it at any time: it
//! is not deleted by itself while its parent exists (retention drops its index entry), and
//! deleting the parent deletes its settled children, and theirs. A child still open then
//! stays, on its own: it is no one's child any more, and goes by retention as any run.
//!
//! Retention ([`crate::Retention`]) deletes runs once they have been settled for as long as
//! the config keeps their kind: a sweep every [`SWEEP_EVERY`] (or every half of the shortest
//! retention, when that is shorter) walks the settled index (`keys::SETTLED`, by how and when
//! each run settled) from its oldest entry and deletes at most [`SWEEP_RUNS_MAX`] runs, a
//! hundred at a time sharing their commits, and comes back a second later while more are
//! due. It forgets audit entries past their time too.

use durafiber_api::Timestamp;
use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use durafiber_store::{
    Batch, Durability, RunId, access,
    tables::{Key, Prefix, RunRecord, keys, keys::Settled},
};
use serde::Serialize;

use crate::{
    alarm,
    config::Retention,
    error::RuntimeError,
    eviction,
    kernel::{lineage, shared::Shared},
};

/// Keys one commit of a deletion removes at most, but for a settled run's alarms (rare), which
/// go in the commit of its own record.
pub const DELETE_BATCH_MAX: usize = 1_000;

/// How often retention looks for runs past their time, while none are left over and no
/// retention is shorter than twice this.
pub const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Runs one sweep deletes at most (and audit entries it forgets); more due are swept a
/// second later.
pub const SWEEP_RUNS_MAX: usize = 1_000;

/// Runs a sweep deletes together, their records in shared commits.
const SWEEP_GROUP_MAX: usize = 100;

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
pub(crate) async fn delete(shared: &Arc<Shared>, run_id: &RunId) -> Result<RunDeleted, RuntimeError> {
    shared.ownership.check(run_id)?;
    let mut outcomes = delete_together(shared, &[run_id]).await?;
    outcomes.pop().unwrap_or_else(|| Err(RuntimeError::UnknownRun { run_id: run_id.into() }))
}

/// Deletes the settled runs among `run_ids` together, their records gathered into shared
/// commits of at most about [`DELETE_BATCH_MAX`] keys, each run's own record in a commit no
/// earlier than any record it owns. Each run's outcome, in order: an open or unknown run is
/// its own error; a store that fails is the error of them all.
async fn delete_together(
    shared: &Arc<Shared>,
    run_ids: &[&RunId],
) -> Result<Vec<Result<RunDeleted, RuntimeError>>, RuntimeError> {
    // The transition locks first, as an activation takes them: no activation comes between.
    let _one_at_a_time = shared.registry.transitions(run_ids).await;
    let mut outcomes: Vec<Result<RunDeleted, RuntimeError>> = run_ids
        .iter()
        .map(|id| {
            deletable(shared, &shared.load_run(id)?)?;
            Ok(RunDeleted { run_id: (*id).clone(), records: 0 })
        })
        .collect();
    // Out of memory before the runs' locks are taken: an actor may be waiting for one.
    for (id, outcome) in run_ids.iter().zip(&outcomes) {
        if outcome.is_ok() {
            eviction::idle::kill(shared, id).await;
        }
    }
    let _locks = shared.lock_runs(run_ids).await?;
    let mut deleter = Deleter::default();
    for (id, outcome) in run_ids.iter().zip(outcomes.iter_mut()) {
        let Ok(deleted) = outcome else { continue };
        match shared.load_run(id).and_then(|run| deletable(shared, &run).map(|()| run)) {
            Ok(run) => deleted.records = deleter.run(shared, &run).await?,
            Err(e) => *outcome = Err(e),
        }
    }
    deleter.flush(shared).await?;
    shared.signals.status_changed();
    for deleted in outcomes.iter().flatten() {
        let (run_id, records) = (&deleted.run_id, deleted.records);
        crate::metrics::Metrics::bump(&shared.obs.metrics.runs_deleted);
        tracing::info!(%run_id, records, "run deleted");
        shared.event(run_id, "deleted", format!("{records} records"));
    }
    Ok(outcomes)
}

/// Only a settled run may go.
fn settled(run: &RunRecord) -> Result<(), RuntimeError> {
    match run.status.is_terminal() {
        true => Ok(()),
        false => Err(RuntimeError::RunOpen { run_id: run.run_id.clone(), state: run.status.name().into() }),
    }
}

/// A settled run that is no child of a run that still exists: that one's deletion takes it.
fn deletable(shared: &Shared, run: &RunRecord) -> Result<(), RuntimeError> {
    settled(run)?;
    if !lineage::may_have_parent(&run.key) {
        return Ok(());
    }
    match lineage::parent_of(shared, &run.run_id)? {
        Some(p) if shared.store.get(&keys::run(&p.parent_run_id))?.is_some() => {
            Err(RuntimeError::KeptWithParent { run_id: run.run_id.clone(), parent: p.parent_run_id })
        }
        _ => Ok(()),
    }
}

/// The removals of one or more runs' records, committed [`DELETE_BATCH_MAX`] keys at a time.
#[derive(Default)]
struct Deleter {
    batch: Batch,
}

impl Deleter {
    /// Adds every record `run` owns, its own record last; how many are stored.
    async fn run(&mut self, shared: &Shared, run: &RunRecord) -> Result<usize, RuntimeError> {
        let run_id = &run.run_id;
        let mut records = 0;
        records += self.drain(shared, &keys::LEDGER.of_run(run_id)).await?;
        records += self.drain(shared, &keys::APPROVALS.of_run(run_id)).await?;
        records += self.drain(shared, &keys::APPROVAL_RULES.of_run(run_id)).await?;
        records += self.drain(shared, &keys::APPROVAL_VOTES.of_run(run_id)).await?;
        records += self.drain(shared, &keys::HISTORY.of_run(run_id)).await?;
        records += self.drain(shared, &keys::JOURNAL_SEQS.of_run(run_id)).await?;
        records += self.drain(shared, &keys::STREAM.of_run(run_id)).await?;
        records += self.drain(shared, &keys::STREAM_REEMISSIONS.of_run(run_id)).await?;
        records += self.drain(shared, &keys::EVENTS.of_run(run_id)).await?;
        records += self.drain(shared, &keys::EVENT_KEYS.of_run(run_id)).await?;
        records += self.drain(shared, &keys::EVENT_WAITS.of_run(run_id)).await?;
        records += self.drain(shared, &keys::SLEEPS.of_run(run_id)).await?;
        records += self.drain(shared, &keys::STORAGE.of_run(run_id)).await?;
        records += self.drain(shared, &keys::STORAGE_UNDO.of_run(run_id)).await?;
        records += self.drain(shared, &keys::DEAD_LETTERS.of_run(run_id)).await?;
        records += Box::pin(self.children(shared, run_id)).await?;
        // The run's own records, one key each, and its alarms (a settled run keeps none unless
        // it was escalated or cancelled while they were set) with their due-index entries:
        // room for them in this commit, or the next.
        if self.batch.len() + OWN_KEYS > DELETE_BATCH_MAX {
            self.flush(shared).await?;
        }
        alarm::delete_all_in(shared, run_id, &mut self.batch)?;
        records += self.gone(shared, keys::run_by_key(&run.kind, &run.key))?;
        records += self.gone(shared, keys::open_run(run_id))?;
        records += self.gone(shared, keys::stash(run_id))?;
        records += self.gone(shared, keys::stash_version(run_id))?;
        records += self.gone(shared, keys::stream_head(run_id))?;
        records += self.gone(shared, keys::stream_mark(run_id))?;
        records += self.gone(shared, keys::hook_probe(run_id))?;
        records += self.gone(shared, keys::budget(run_id))?;
        records += self.gone(shared, keys::paused_run(run_id))?;
        records += self.gone(shared, keys::fork(run_id))?;
        records += self.gone(shared, keys::storage_log(run_id))?;
        records += self.gone(shared, keys::parent_of(run_id))?;
        records += self.drain(shared, &keys::CHILDREN.of_run(run_id)).await?;
        records += self.drain(shared, &keys::FORK_PARENTS.of_run(run_id)).await?;
        if let Some(how) = Settled::of(&run.status) {
            records += self.gone(shared, keys::settled(how, run.updated_at_ms, run_id))?;
        }
        records += self.gone(shared, keys::run(run_id))?;
        Ok(records)
    }

    /// Adds the records of `run_id`'s settled children (and theirs); an open child is
    /// left, no one's child now. How many records.
    async fn children(&mut self, shared: &Shared, run_id: &RunId) -> Result<usize, RuntimeError> {
        let mut records = 0;
        for (_, link) in lineage::own_children_of(shared, run_id)? {
            let child = match shared.load_run(&link.child_run_id) {
                Ok(child) => child,
                Err(RuntimeError::UnknownRun { .. }) => continue,
                Err(e) => return Err(e),
            };
            if child.status.is_terminal() {
                records += self.run(shared, &child).await?;
            } else {
                records += self.gone(shared, keys::parent_of(&child.run_id))?;
            }
        }
        Ok(records)
    }

    /// Adds the removal of `key`; 1 when it is stored (read without decoding it).
    fn gone<V>(&mut self, shared: &Shared, key: Key<V>) -> Result<usize, RuntimeError> {
        let stored = shared.store.keys_from_to(&key, &key, 1)?.len();
        self.batch.delete(key);
        Ok(stored)
    }

    /// Adds the removal of every key under `prefix`, committing as the batch fills. How many.
    async fn drain<V>(&mut self, shared: &Shared, prefix: &Prefix<V>) -> Result<usize, RuntimeError> {
        let mut removed = 0;
        let mut after = None;
        loop {
            let room = DELETE_BATCH_MAX.saturating_sub(self.batch.len()).max(1);
            let found = shared.store.keys_in(prefix, after.as_ref(), room, None)?;
            let done = found.len() < room;
            removed += found.len();
            after = found.last().cloned();
            for key in found {
                self.batch.delete(key);
            }
            if self.batch.len() >= DELETE_BATCH_MAX {
                self.flush(shared).await?;
            }
            if done {
                return Ok(removed);
            }
        }
    }

    async fn flush(&mut self, shared: &Shared) -> Result<(), RuntimeError> {
        if !self.batch.is_empty() {
            shared.store.commit(std::mem::take(&mut self.batch), Durability::Sync).await?;
        }
        Ok(())
    }
}

/// The keys of a run's own records [`Deleter::run`] adds after its tables' (alarms aside).
const OWN_KEYS: usize = 12;

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
    /// When the next sweep is due, after one that ended at `now`.
    pub fn next_at(&self, retention: &Retention, now: Timestamp) -> Timestamp {
        let after = if self.more { SWEEP_AGAIN } else { sweep_every(retention) };
        now.saturating_add(after)
    }
}

/// Every [`SWEEP_EVERY`], or every half of the shortest retention when that is shorter (but
/// not more often than every [`SWEEP_AGAIN`]): a run is never kept much past its time.
fn sweep_every(retention: &Retention) -> Duration {
    let shortest = retention.settings().into_iter().filter_map(|(_, kept)| kept).min().unwrap_or(SWEEP_EVERY);
    (shortest / 2).clamp(SWEEP_AGAIN, SWEEP_EVERY)
}

/// Starts a retention sweep when one is due and none runs; it sets the next one's time
/// when it ends. The driver asks at every tick.
pub(crate) fn start_due(shared: &Arc<Shared>) {
    let due = shared.timers.retention_due_ms.load(Ordering::SeqCst);
    if due > shared.now().as_millis()
        || shared
            .timers
            .retention_due_ms
            .compare_exchange(due, u64::MAX, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
    {
        return;
    }
    let shared2 = shared.clone();
    shared.life.spawn_tracked(async move {
        let shared = shared2;
        let next = match sweep(&shared).await {
            Ok(swept) => swept.next_at(&shared.config.retention, shared.now()),
            Err(e) => {
                tracing::warn!(error = %e, "retention sweep failed; it is tried again later");
                Swept::default().next_at(&shared.config.retention, shared.now())
            }
        };
        shared.timers.retention_due_ms.store(next.as_millis(), Ordering::SeqCst);
        shared.timers.driver_wake.notify_one();
    });
}

/// One retention sweep (see the module's documentation): the runs this node owns that
/// settled longer ago than the config keeps them, and the audit entries past their time.
pub(crate) async fn sweep(shared: &Arc<Shared>) -> Result<Swept, RuntimeError> {
    let retention = shared.config.retention;
    let now = shared.now();
    let mut swept = Swept::default();
    if Settled::ALL.iter().any(|how| retention.of(*how).is_some()) {
        index_settled_runs(shared).await?;
    }
    for how in Settled::ALL {
        let Some(until) = retention.of(how).and_then(|keep| before(now, keep)) else { continue };
        let left = SWEEP_RUNS_MAX.saturating_sub(swept.runs);
        let (deleted, more) = sweep_settled(shared, how, until, left).await?;
        swept.runs += deleted;
        swept.more |= more;
    }
    if let Some(until) = retention.audit.and_then(|keep| before(now, keep)) {
        swept.audit_entries = access::forget_before(&shared.store, until, SWEEP_RUNS_MAX).await?;
        crate::metrics::Metrics::add(&shared.obs.metrics.audit_entries_deleted, swept.audit_entries as u64);
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

/// The time `keep` before `now`; `None` before the clock's start.
fn before(now: Timestamp, keep: Duration) -> Option<Timestamp> {
    let keep = u64::try_from(keep.as_millis()).ok()?;
    now.as_millis().checked_sub(keep).map(Timestamp::from_millis)
}

/// What a sweep does with an entry of the settled index.
enum Judged {
    /// Its run goes now.
    Due(RunId),
    /// The entry no longer matches its run (gone, written again since, or kept with its
    /// parent): the entry goes.
    Stale,
    /// Its run could not be read: both stay, for the next sweep.
    Kept,
}

/// The entry of `run_id`, which the index says settled `how` at `at`.
fn judge(shared: &Shared, how: Settled, at: Timestamp, run_id: RunId) -> Judged {
    match shared.load_run(&run_id) {
        Ok(run) if Settled::of(&run.status) == Some(how) && run.updated_at_ms == at => {
            match deletable(shared, &run) {
                // It goes with its parent: its entry is not looked at again.
                Err(RuntimeError::KeptWithParent { .. }) => Judged::Stale,
                _ => Judged::Due(run_id),
            }
        }
        Ok(_) | Err(RuntimeError::UnknownRun { .. }) => Judged::Stale,
        Err(e) => {
            tracing::warn!(%run_id, error = %e, "retention could not read the run");
            Judged::Kept
        }
    }
}

/// Deletes up to `left` runs that settled `how` at `until` or before, oldest first.
/// Entries that no longer match their run (it is gone, or its record was written again
/// since) are dropped. Returns how many runs went and whether more may be due.
async fn sweep_settled(
    shared: &Arc<Shared>,
    how: Settled,
    until: Timestamp,
    left: usize,
) -> Result<(usize, bool), RuntimeError> {
    let index = keys::settled_of(how);
    let shards = shared.ownership.scan_filter();
    let mut after = None;
    let mut deleted = 0;
    while deleted < left {
        let page = shared.store.keys_in(
            &index,
            after.as_ref(),
            (left - deleted).min(SWEEP_GROUP_MAX),
            shards.as_deref(),
        )?;
        let Some(last) = page.last().cloned() else { return Ok((deleted, false)) };
        let mut stale = Deleter::default();
        let mut due = Vec::new();
        let mut past = false;
        for key in page {
            let Some((at, run_id)) = keys::parse_settled(&key) else {
                stale.batch.delete(key);
                continue;
            };
            if at > until {
                past = true;
                break;
            }
            if !shared.ownership.owns(run_id) {
                continue;
            }
            match judge(shared, how, at, RunId::from(run_id)) {
                Judged::Due(run_id) => due.push(run_id),
                Judged::Stale => {
                    stale.batch.delete(key.clone());
                }
                Judged::Kept => {}
            }
        }
        stale.flush(shared).await?;
        let due: Vec<&RunId> = due.iter().collect();
        for (run_id, outcome) in due.iter().zip(delete_together(shared, &due).await?) {
            match outcome {
                Ok(_) => {
                    deleted += 1;
                    crate::metrics::Metrics::bump(&shared.obs.metrics.runs_deleted_by_retention);
                }
                // Tried again at the next sweep; the others went meanwhile.
                Err(e) => tracing::warn!(%run_id, error = %e, "retention could not delete the run"),
            }
        }
        if past {
            return Ok((deleted, false));
        }
        after = Some(last);
    }
    Ok((deleted, true))
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
