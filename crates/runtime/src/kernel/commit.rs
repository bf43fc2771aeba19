//! The one boundary committer, after Restate's partition processor and its action
//! collector. A feature stages a boundary — the writes it makes and how durable they must
//! be — with what follows its commit ([`After`]), and hands it here.
//!
//! [`commit`] writes it in one place: refused once the runtime closed or the cell was
//! evicted; the run's output chunks and spending since its last boundary taken into the same
//! batch; after a recovery, the run's recovery count reset in it (§3.6). A boundary that moves
//! the run's status ([`commit_run`]) is written with the run's record, under its lock. Then the
//! actions after the commit run in one place and in one order: the stream's readers told, the
//! fiber's stream mark kept, a counter and a latency, the event, the span, and last the
//! boundary itself, where a crash hook or seeded chaos may evict the run ([`reached`]).

use durafiber_api::Timestamp;
use std::sync::atomic::Ordering;

use durafiber_store::{
    Batch, Durability,
    tables::{self, keys},
};

use crate::{
    boundary::Boundary,
    clock::Stopwatch,
    error::RuntimeError,
    kernel::{
        cell::RunCell,
        shared::{RawCtx, Shared},
    },
    metrics::{Counter, Histogram, Metrics},
    trace::Ended,
};

/// Which boundary a commit is: the variant that holds its name, and the name. The
/// [`Boundary`] is made only when a crash hook asks.
pub(crate) type At<'a> = (fn(String) -> Boundary, &'a str);

/// A metric of the runtime's, picked from its metrics.
type Pick<T> = fn(&Metrics) -> &T;

/// What follows a boundary's commit, collected by the feature that staged it and run here.
#[derive(Default)]
pub(crate) struct After<'a> {
    at: Option<At<'a>>,
    progress: bool,
    alarm_set: Option<(Timestamp, String)>,
    alarm_gone: Option<(Timestamp, String)>,
    stream_mark: Option<u64>,
    counter: Option<Pick<Counter>>,
    latency: Option<(Pick<Histogram>, Stopwatch)>,
    event: Option<(&'static str, String)>,
    span: Option<Ended<'a>>,
}

impl<'a> After<'a> {
    /// The actions after boundary `at`.
    pub fn at(at: At<'a>) -> Self {
        After { at: Some(at), ..After::default() }
    }

    /// The boundary is the run's progress: it resets the run's recovery count in the same
    /// write (with [`commit_run`]), and the recovery it was in has ended (§3.6).
    pub fn progress(mut self) -> Self {
        self.progress = true;
        self
    }

    /// An alarm the boundary stored, put in the scheduler's window once it is durable.
    pub fn alarm_set(mut self, due_at: Timestamp, name: String) -> Self {
        self.alarm_set = Some((due_at, name));
        self
    }

    /// An alarm the boundary removed, taken out of the scheduler's window.
    pub fn alarm_gone(mut self, due_at: Timestamp, name: String) -> Self {
        self.alarm_gone = Some((due_at, name));
        self
    }

    /// The fiber's place in its output stream, stored with this boundary when it changed.
    pub fn stream_mark(mut self, mark: Option<u64>) -> Self {
        self.stream_mark = mark;
        self
    }

    /// A counter bumped.
    pub fn count(mut self, counter: Pick<Counter>) -> Self {
        self.counter = Some(counter);
        self
    }

    /// A latency recorded, from `since` to the commit.
    pub fn latency(mut self, histogram: Pick<Histogram>, since: Stopwatch) -> Self {
        self.latency = Some((histogram, since));
        self
    }

    /// The run's event: its kind and detail.
    pub fn event(mut self, kind: &'static str, detail: impl Into<String>) -> Self {
        self.event = Some((kind, detail.into()));
        self
    }

    /// The span `make` builds, made only when traces are on.
    pub fn span(mut self, shared: &Shared, make: impl FnOnce() -> Ended<'a>) -> Self {
        if shared.obs.traces.is_on() {
            self.span = Some(make());
        }
        self
    }

    /// Runs the actions, in order, the boundary last.
    async fn run(self, raw: &RawCtx) {
        let shared = &raw.shared;
        let run_id = &raw.cell.run_id;
        if self.progress {
            raw.cell.task.recovering.store(false, Ordering::SeqCst);
        }
        if let Some((due_at, name)) = &self.alarm_set {
            shared.timers.scheduler.insert(*due_at, run_id, name);
            shared.timers.driver_wake.notify_one();
        }
        if let Some((due_at, name)) = &self.alarm_gone {
            shared.timers.scheduler.remove(*due_at, run_id, name);
        }
        if let Some(mark) = self.stream_mark
            && let Some(buffer) = raw.cell.output.stream.lock().as_mut()
        {
            buffer.mark = mark;
        }
        if let Some((histogram, since)) = self.latency {
            histogram(&shared.obs.metrics).record_us(since.elapsed_us());
        }
        if let Some(counter) = self.counter {
            Metrics::bump(counter(&shared.obs.metrics));
        }
        if let Some((kind, detail)) = self.event {
            shared.event(run_id, kind, detail);
        }
        if let Some(span) = self.span {
            shared.obs.traces.send(&shared.obs.secrets, span);
        }
        if let Some(at) = self.at {
            reached(raw, at).await;
        }
    }
}

/// Commits a boundary of the fiber's run: `batch`, as durable as `durability`; then `after`.
pub(crate) async fn commit(
    raw: &RawCtx,
    batch: Batch,
    durability: Durability,
    after: After<'_>,
) -> Result<(), RuntimeError> {
    raw.shared.commit_boundary(&raw.cell, batch, durability).await?;
    after.run(raw).await;
    Ok(())
}

/// Commits a boundary that changes the run's record: `change` under the run's lock (see
/// [`Shared::update_run_from`]); then `after`, when it wrote.
pub(crate) async fn commit_run<F>(
    raw: &RawCtx,
    change: F,
    after: After<'_>,
) -> Result<Option<tables::RunRecord>, RuntimeError>
where
    F: FnOnce(&mut tables::RunRecord, &mut Batch) -> Result<bool, RuntimeError>,
{
    let progress = after.progress;
    let written = raw
        .shared
        .update_run_from(&raw.cell, |run, batch| {
            if progress {
                run.recover_attempts = 0;
                run.next_recover_at_ms = Timestamp::ZERO;
            }
            change(run, batch)
        })
        .await?;
    if written.is_some() {
        after.run(raw).await;
    }
    Ok(written)
}

/// The fiber reached boundary `at`: the crash hook or seeded chaos may evict the run right
/// here, the same point a real eviction or crash could hit.
pub(crate) async fn reached(raw: &RawCtx, (boundary, name): At<'_>) {
    let shared = &raw.shared;
    let run_id = &raw.cell.run_id;
    let hooked = shared.obs.crash_hook.as_ref().is_some_and(|hook| hook(run_id, &boundary(name.to_string())));
    if hooked || (raw.in_fiber && shared.chaos_strikes()) {
        let why = if hooked { "crash point" } else { "chaos" };
        let evicting = (shared.agents.evictor)(shared.clone(), run_id.clone(), why);
        shared.life.spawn_tracked(evicting);
        shared.life.parked(raw.in_fiber, std::future::pending::<()>()).await;
    }
}

impl Shared {
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
            run.next_recover_at_ms = Timestamp::ZERO;
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
}
