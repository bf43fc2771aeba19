//! The one way a run's record is written: read and committed under its stripe lock, and
//! the open-run index paged through. A fiber's boundaries go through `kernel/commit.rs`.

use durafiber_store::RunId;
use durafiber_store::{
    Batch, Durability,
    prefetch::Prefetched,
    tables::{self, Key, keys},
};

use crate::{
    error::RuntimeError,
    kernel::{
        cell::{lock_stripes, stripe},
        shared::Shared,
    },
};

/// A run record read under its stripe lock (see [`Shared::lock_run`]).
pub(crate) struct LockedRun<'a> {
    _guard: tokio::sync::MutexGuard<'a, ()>,
    pub run: tables::RunRecord,
}

impl Shared {
    pub fn load_run(&self, run_id: &RunId) -> Result<tables::RunRecord, RuntimeError> {
        self.load_run_prefetched(run_id, Prefetched::default())
    }

    /// [`Shared::load_run`], from a page's prefetched records when they cover the run and
    /// are still current.
    pub fn load_run_prefetched(
        &self,
        run_id: &RunId,
        prefetched: Prefetched,
    ) -> Result<tables::RunRecord, RuntimeError> {
        self.store
            .get_prefetched(&keys::run(run_id), prefetched)?
            .ok_or_else(|| RuntimeError::UnknownRun { run_id: run_id.into() })
    }

    /// Writes a run record (and whatever else is in `batch`) as one sync boundary.
    pub async fn commit_run(&self, run: &tables::RunRecord, mut batch: Batch) -> Result<(), RuntimeError> {
        let key = keys::run(&run.run_id);
        batch.put(key, run)?;
        let open_key = keys::open_run(&run.run_id);
        match keys::Settled::of(&run.status) {
            Some(how) => {
                batch.delete(open_key);
                // Retention finds it here; an entry left by an earlier write of the settled
                // record names another time, and retention drops it as stale.
                batch.put(keys::settled(how, run.updated_at_ms, &run.run_id), &())?;
            }
            None => {
                batch.put(open_key, &())?;
            }
        }
        self.store.commit(batch, Durability::Sync).await?;
        self.signals.status_changed();
        Ok(())
    }

    /// Reads, changes and writes a run record under its stripe lock. `change` returns whether
    /// anything is to be written; it may add other writes to the same boundary.
    pub async fn update_run<F>(
        &self,
        run_id: &RunId,
        change: F,
    ) -> Result<Option<tables::RunRecord>, RuntimeError>
    where
        F: FnOnce(&mut tables::RunRecord, &mut Batch) -> Result<bool, RuntimeError>,
    {
        let mut locked = self.lock_run(run_id).await?;
        let mut batch = Batch::new();
        if !change(&mut locked.run, &mut batch)? {
            return Ok(None);
        }
        self.write_locked(&mut locked, batch).await?;
        Ok(Some(locked.run))
    }

    /// Reads a run record under its stripe lock, which is held until the [`LockedRun`] is
    /// dropped: activation reads a run once and writes its registration from that read.
    pub async fn lock_run(&self, run_id: &RunId) -> Result<LockedRun<'_>, RuntimeError> {
        let guard = self.stripes.runs[stripe(run_id, self.stripes.runs.len())].lock().await;
        if self.life.is_closed() {
            return Err(RuntimeError::ShuttingDown);
        }
        let run = self.load_run(run_id)?;
        Ok(LockedRun { _guard: guard, run })
    }

    /// Locks the records of `run_ids` until the guards are dropped: [`Shared::lock_run`] for
    /// many runs at once, without the reads. Stripes are taken in order, each once, so two
    /// callers never wait on each other in a circle.
    pub async fn lock_runs(
        &self,
        run_ids: &[impl AsRef<str>],
    ) -> Result<Vec<tokio::sync::MutexGuard<'_, ()>>, RuntimeError> {
        let guards = lock_stripes(&self.stripes.runs, run_ids).await;
        if self.life.is_closed() {
            return Err(RuntimeError::ShuttingDown);
        }
        Ok(guards)
    }

    /// Writes a locked run record, changed in place, with `batch` as one sync boundary.
    pub async fn write_locked(&self, locked: &mut LockedRun<'_>, batch: Batch) -> Result<(), RuntimeError> {
        locked.run.updated_at_ms = self.now();
        self.commit_run(&locked.run, batch).await
    }

    /// One page of open run ids after `after` (a previous page's last key): the recovery
    /// scan and the liveness check walk the open-run index with it. The page's last key
    /// comes back for the next call; `None` on the last page.
    pub fn open_runs_page(
        &self,
        after: Option<&Key<()>>,
    ) -> Result<(Vec<RunId>, Option<Key<()>>), RuntimeError> {
        // A node on a shared store reads only its own shards' runs.
        let page = self.store.keys_in(
            &keys::OPEN_RUNS.all(),
            after,
            crate::limits::RECOVERY_SCAN_PAGE_MAX,
            self.ownership.scan_filter().as_deref(),
        )?;
        let full = page.len() == crate::limits::RECOVERY_SCAN_PAGE_MAX;
        let next = if full { page.last().cloned() } else { None };
        let ids = page.iter().filter_map(|key| key.first_part()).map(RunId::from).collect();
        Ok((ids, next))
    }
}
