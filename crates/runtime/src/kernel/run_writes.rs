//! The one way a run's record and its boundaries are written: a run's record read and
//! committed under its stripe lock, a fiber's boundary with its pending stream and spending,
//! a recovery hook settled, and the open-run index paged through.

use std::sync::atomic::Ordering;

use durafiber_store::{
    Batch, Durability,
    prefetch::Prefetched,
    tables::{self, Key, keys},
};

use crate::{
    error::RuntimeError,
    kernel::{
        cell::{RunCell, lock_stripes, stripe},
        shared::Shared,
    },
};

/// A run record read under its stripe lock (see [`Shared::lock_run`]).
pub(crate) struct LockedRun<'a> {
    _guard: tokio::sync::MutexGuard<'a, ()>,
    pub run: tables::RunRecord,
}

impl Shared {
    pub fn load_run(&self, run_id: &str) -> Result<tables::RunRecord, RuntimeError> {
        self.load_run_prefetched(run_id, Prefetched::default())
    }

    /// [`Shared::load_run`], from a page's prefetched records when they cover the run and
    /// are still current.
    pub fn load_run_prefetched(
        &self,
        run_id: &str,
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
        run_id: &str,
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
    pub async fn lock_run(&self, run_id: &str) -> Result<LockedRun<'_>, RuntimeError> {
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
        locked.run.updated_at_ms = self.now_ms();
        self.commit_run(&locked.run, batch).await
    }

    /// `update_run` for a write of the run's own fiber: refused once the runtime evicted the
    /// fiber's cell, so a fiber whose abort has not taken effect yet changes nothing.
    pub async fn update_run_from<F>(
        &self,
        cell: &RunCell,
        change: F,
    ) -> Result<Option<tables::RunRecord>, RuntimeError>
    where
        F: FnOnce(&mut tables::RunRecord, &mut Batch) -> Result<bool, RuntimeError>,
    {
        // Checked under the run's lock, so an eviction is either before the write (refused)
        // or after it (as if the fiber had written just before it was evicted).
        let mut streamed = false;
        let probe = cell.task.hook.lock().as_ref().is_some_and(super::hook_gate::HookPermit::is_probe);
        let written = self
            .update_run(&cell.run_id, |run, batch| {
                self.check_not_evicted(cell)?;
                let changed = change(run, batch)?;
                streamed = changed && self.stage_pending(cell, batch)?;
                if changed && probe {
                    batch.delete(keys::hook_probe(&cell.run_id));
                }
                Ok(changed)
            })
            .await;
        self.streamed(cell, streamed, written.is_ok());
        if matches!(written, Ok(Some(_))) {
            // The run's own write: its recovery hook, if one runs, has settled.
            cell.task.hook.lock().take();
        }
        written
    }

    /// A recovery hook that parks on a durable wait without a write has settled: a probe's
    /// count is cleared (`kernel/hook_gate.rs`), and its place at the gate given up.
    pub async fn settle_hook(&self, cell: &RunCell) {
        let probe = match cell.task.hook.lock().as_ref() {
            None => return,
            Some(hook) => hook.is_probe(),
        };
        if probe {
            let mut batch = Batch::new();
            batch.delete(keys::hook_probe(&cell.run_id));
            if let Err(e) = self.store.commit(batch, Durability::Sync).await {
                // Still counted: if the process dies now, the run is suspected once more.
                tracing::warn!(run_id = %cell.run_id, error = %e, "could not clear the recovery's probe");
            }
        }
        cell.task.hook.lock().take();
    }

    /// Refuses a write of an evicted cell's fiber.
    pub fn check_not_evicted(&self, cell: &RunCell) -> Result<(), RuntimeError> {
        if cell.task.evicted.load(Ordering::SeqCst) {
            return Err(RuntimeError::Evicted { run_id: cell.run_id.clone() });
        }
        Ok(())
    }

    /// Commits a boundary of a live run. The first boundary after a recovery is progress:
    /// it resets the run's recovery count in the same write (§3.6).
    pub async fn commit_boundary(
        &self,
        cell: &RunCell,
        batch: Batch,
        durability: Durability,
    ) -> Result<(), RuntimeError> {
        if self.life.is_closed() {
            return Err(RuntimeError::ShuttingDown);
        }
        self.check_not_evicted(cell)?;
        if !cell.task.recovering.load(Ordering::SeqCst) {
            let mut batch = batch;
            let streamed = self.stage_pending(cell, &mut batch)?;
            let committed = self.store.commit(batch, durability).await;
            self.streamed(cell, streamed, committed.is_ok());
            committed?;
            return Ok(());
        }
        // Boxed: once per recovery, and inline its state would be reserved in every
        // boundary's future.
        Box::pin(self.update_run_from(cell, |run, b| {
            run.recover_attempts = 0;
            run.next_recover_at_ms = 0;
            b.extend(batch);
            Ok(true)
        }))
        .await?;
        cell.task.recovering.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Takes the run's output chunks emitted, and what it spent, since its last boundary
    /// into `batch`; true when there were chunks.
    fn stage_pending(&self, cell: &RunCell, batch: &mut Batch) -> Result<bool, RuntimeError> {
        super::spend::stage(&self.store, &cell.run_id, &mut cell.spending.spend.lock(), batch)?;
        match cell.output.stream.lock().as_mut() {
            Some(buffer) => Ok(buffer.stage_into(&cell.run_id, batch)?),
            None => Ok(false),
        }
    }

    /// After a boundary that carried output chunks: readers are told, or, when the commit
    /// failed, the buffer forgets what it counted, so the next emit reads the durable head.
    fn streamed(&self, cell: &RunCell, streamed: bool, committed: bool) {
        if !streamed {
            return;
        }
        if committed {
            self.signals.stream_version.send_modify(|v| *v += 1);
        } else {
            *cell.output.stream.lock() = None;
        }
    }

    /// One page of open run ids after `after` (a previous page's last key): the recovery
    /// scan and the liveness check walk the open-run index with it. The page's last key
    /// comes back for the next call; `None` on the last page.
    pub fn open_runs_page(
        &self,
        after: Option<&Key<()>>,
    ) -> Result<(Vec<String>, Option<Key<()>>), RuntimeError> {
        // A node on a shared store reads only its own shards' runs.
        let page = self.store.keys_in(
            &keys::OPEN_RUNS.all(),
            after,
            crate::limits::RECOVERY_SCAN_PAGE_MAX,
            self.ownership.scan_filter().as_deref(),
        )?;
        let full = page.len() == crate::limits::RECOVERY_SCAN_PAGE_MAX;
        let next = if full { page.last().cloned() } else { None };
        let ids = page.iter().filter_map(|key| key.first_part()).map(str::to_string).collect();
        Ok((ids, next))
    }
}
