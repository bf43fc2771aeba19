//! A run's last stash as stored: the record and the `STASH_VERSION` of the agent that
//! wrote it. The version lives beside the stash in `stash_versions`, written only when it
//! is not 1: stores of agents that never bump it hold exactly what they held before versions
//! existed, and read as version 1.

use durafiber_store::RunId;
use durafiber_store::{
    Batch, Store, StoreError,
    prefetch::Prefetched,
    tables::{HistoryRecord, StashRecord, keys},
};

/// A run's last stash as read: an error (a corrupt record) is kept for the recovery to
/// escalate with.
pub(crate) type StashRead = Result<Option<Stored>, StoreError>;

/// A stash as stored: the record and the agent's stash version that wrote it.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub record: StashRecord,
    pub version: u32,
    /// The fiber's place in its output stream, to store with the stash when it changed
    /// (`keys::STREAM_MARKS`); `None` when read back or unchanged.
    pub stream_mark: Option<u64>,
}

impl Stored {
    /// Puts the stash, its version when it is not 1 and its stream mark when it changed,
    /// into `batch`; and into the run's history, over the entry `history_max` boundaries
    /// back (none is kept when it is 0): two writes a stash, none of them a delete.
    pub fn stage(&self, batch: &mut Batch, history_max: u32) -> Result<(), StoreError> {
        let run = &self.record.run_id;
        batch.put(keys::stash(run), &self.record)?;
        if self.version != 1 {
            batch.put(keys::stash_version(run), &self.version)?;
        }
        if let Some(mark) = self.stream_mark {
            batch.put(keys::stream_mark(run), &mark)?;
        }
        if history_max > 0 {
            let seq = self.record.seq;
            let entry = HistoryRecord {
                stash: self.record.clone(),
                version: self.version,
                stream_mark: self.stream_mark,
            };
            batch.put(keys::history(run, seq, history_max), &entry)?;
        }
        Ok(())
    }
}

/// The boundaries a run's history keeps, oldest first: those of its ring's entries within
/// `history_max` of the newest. The ring may also hold older entries, none of them current: those
/// of a larger `history_max` before, or of stores that keyed the history by boundary; they
/// are left out. With `history_max` 0 no history is written, and what an earlier one
/// left is all listed.
pub(crate) fn history(
    store: &Store,
    run_id: &RunId,
    history_max: u32,
) -> Result<Vec<HistoryRecord>, StoreError> {
    let scanned = store.scan(&keys::HISTORY.of_run(run_id), None, usize::MAX)?;
    let mut entries =
        scanned.into_iter().map(|(_, entry)| entry).collect::<Result<Vec<HistoryRecord>, _>>()?;
    entries.sort_by_key(|e| e.stash.seq);
    entries.dedup_by_key(|e| e.stash.seq);
    if let Some(newest) = entries.last().map(|e| e.stash.seq)
        && history_max > 0
    {
        let oldest_kept = newest.saturating_sub(u64::from(history_max));
        entries.retain(|e| e.stash.seq > oldest_kept);
    }
    Ok(entries)
}

/// The run's last stash with its version (1 when none is recorded); `None` before the first.
pub(crate) fn read(store: &Store, run_id: &RunId) -> Result<Option<Stored>, StoreError> {
    read_prefetched(store, run_id, Prefetched::default(), Prefetched::default())
}

/// [`read`], from the stashes and versions prefetched with the run's page where they cover
/// it and are still current.
pub(crate) fn read_prefetched(
    store: &Store,
    run_id: &RunId,
    stash: Prefetched,
    version: Prefetched,
) -> Result<Option<Stored>, StoreError> {
    let key = keys::stash(run_id);
    let Some(record) = store.get_prefetched::<StashRecord>(&key, stash)? else {
        return Ok(None);
    };
    let key = keys::stash_version(run_id);
    let version = store.get_prefetched::<u32>(&key, version)?.unwrap_or(1);
    Ok(Some(Stored { record, version, stream_mark: None }))
}
