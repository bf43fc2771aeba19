//! Group commit: one writer thread gathers the batches that arrive while a barrier is in
//! progress, applies them as one atomic write, covers them with one barrier, then
//! acknowledges each.
//!
//! Throughput therefore grows with the number of concurrent writers instead of being capped at
//! one `fsync` per boundary. A `Sync` batch is acknowledged only after the barrier that covers
//! it has returned; an `Async` batch right after it is applied, with a barrier due within
//! `flush_every`. Merging a group into one engine write keeps every batch atomic (the group
//! is all or nothing, which is stronger) and costs the engine one log entry instead of many.
//!
//! The writer is also where disk faults are contained. Below the free-space floor it parks
//! (writes wait, none fails) until space returns or the store closes. An engine i/o error,
//! or a barrier that has not returned after `barrier_timeout` (seen by a watchdog thread),
//! marks the store failed: every waiting and later write fails at once with
//! [`StoreError::Failed`], and the process must restart to reopen the store — sled 0.34
//! cannot be trusted in-process after a failed flush.
//!
//! A lone `Sync` commit that finds the writer idle and nothing queued writes itself: it
//! takes the writer's state and applies and syncs its batch on its own thread, as the
//! writer thread would have (`Writer::write_inline`). A task that commits now and then is
//! then not woken twice per commit; whoever holds the state writes, so groups and lone
//! commits never interleave. Only a local backend's commits do, and only while its syncs
//! are quick: the committer's thread, often an async runtime's worker, waits out the sync.
//!
//! A writer whose last commits came from one task committing in a loop looks for the next
//! for `SPIN_FOR` before it sleeps (see `Cadence`): waking it would cost that task about as
//! much as its own work between commits. Only while it has not been waiting for a core
//! (`crowding`): beside busy threads, spinning takes a core from the very task it waits for.
//!
//! A writer that has had nothing to do for `QUIET_AFTER` tells the backend so
//! ([`Backend::quiet`]): the sled backend checkpoints then, rather than in the middle of the
//! next burst of writes.

use std::{
    sync::{
        Arc,
        atomic::{
            AtomicU64, AtomicUsize,
            Ordering::{Relaxed, SeqCst},
        },
        mpsc,
    },
    time::{Duration, Instant},
};

use tokio::sync::{OwnedSemaphorePermit, oneshot};

use crate::{backend::Backend, batch::Batch, error::StoreError, lock::Mutex};

mod group;
mod health;

#[cfg(test)]
use group::Part;
use group::{Cadence, Group, Next, next_command};
pub(crate) use health::Health;
use health::{Space, below_floor, wait_for_space, watchdog};

/// How long the writer waits with nothing to do before it tells the backend it is quiet.
const QUIET_AFTER: Duration = Duration::from_millis(200);

/// How long the writer looks for a looping task's next commit before it sleeps.
const SPIN_FOR: Duration = Duration::from_micros(100);

/// A lone commit is written on its committer's thread only while the last barrier took at
/// most this long: a disk that syncs slowly keeps its waits on the writer thread.
const INLINE_BARRIER_MAX: Duration = Duration::from_millis(2);

/// A commit of more writes than this goes to the writer thread even when it is idle: a
/// step, a delivery or a start is a few writes, while a recovery batch registers hundreds
/// of runs, and its committer's worker has other work to do than wait out a long write.
const INLINE_OPS_MAX: usize = 32;

/// How durable a batch must be before `commit` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Durability {
    /// Return after a barrier covered the batch: it survives a crash and a power loss.
    Sync,
    /// Return once the batch is applied; a barrier covers it within `flush_every`.
    Async,
}

pub(crate) type Ack = oneshot::Sender<Result<(), StoreError>>;

pub(crate) enum Cmd {
    /// `room` is the write's place in the bounded queue, given back once it is applied.
    Write {
        batch: Batch,
        durability: Durability,
        ack: Ack,
        room: OwnedSemaphorePermit,
    },
    Barrier {
        ack: Ack,
    },
    /// Every entry, read between two groups: a consistent copy for backups.
    Snapshot {
        ack: oneshot::Sender<Result<crate::backend::Entries, StoreError>>,
    },
    /// Look at the writes sent ahead of the queue (`Writer::send_ahead`).
    Wake,
}

/// Settings of the writer thread. `flush_every` lives in the writer's health, where
/// `Store::set_flush_every` changes it.
#[derive(Debug, Clone, Copy)]
pub struct WriterConfig {
    /// Most batches gathered into one group.
    pub group_batches_max: usize,
    /// Below this many free bytes the writer parks until space returns.
    pub disk_floor_bytes: u64,
    /// A barrier (or apply) running longer than this fails the store.
    pub barrier_timeout: Duration,
}

/// What the writer has done, for tests and figures: group commit shows as fewer barriers
/// than batches.
#[derive(Debug, Default)]
pub struct WriterStats {
    /// Batches applied.
    pub batches: AtomicU64,
    /// Barriers run.
    pub barriers: AtomicU64,
    /// Batches written on their committer's thread, not the writer's (lone `Sync` commits).
    pub inline: AtomicU64,
}

/// The writer's bookkeeping, held by whoever writes: the writer thread for each group it
/// gathered, or a lone committer on its own thread ([`Writer::write_inline`]).
struct State {
    /// Set while async writes are applied but not yet covered by a barrier.
    flush_due: Option<Instant>,
    /// Set by each applied group: a writer that then gets nothing for `QUIET_AFTER` tells
    /// the backend it is quiet (a moment to checkpoint), once.
    quiet_due: Option<Instant>,
    /// Every group also writes its sequence number, atomically with it (see `witness`).
    /// Only a store with a data directory keeps a witness to compare it with; a shared
    /// database would make the sequence one row every node's commits queue on.
    witnessed: bool,
    commit_seq: u64,
    /// Groups applied, for `Health::applied` and `Health::durable`.
    groups: u64,
    /// How long the last barrier took: after a slow one, lone commits go to the thread.
    last_barrier: Duration,
    /// The thread has closed the store: nothing more is written.
    closed: bool,
}

/// The store's one writer: what it writes to, its settings and its state. Its thread
/// gathers what is queued into groups; a lone `Sync` commit may write itself.
pub(crate) struct Writer {
    backend: Arc<dyn Backend>,
    config: WriterConfig,
    stats: Arc<WriterStats>,
    health: Arc<Health>,
    state: Mutex<State>,
    /// Commands sent to the thread and not yet gathered: a commit that finds any joins them.
    queued: AtomicUsize,
    /// `Sync` writes that go ahead of the queue: the next group takes them first.
    ahead: Mutex<Vec<(Batch, Ack)>>,
}

/// A writer with its thread running: the thread takes what is sent on `tx`.
pub(crate) struct Spawned {
    pub writer: Arc<Writer>,
    pub tx: mpsc::Sender<Cmd>,
    pub thread: std::thread::JoinHandle<()>,
}

pub(crate) fn spawn_writer(
    backend: Arc<dyn Backend>,
    config: WriterConfig,
    stats: Arc<WriterStats>,
    health: Arc<Health>,
) -> Result<Spawned, StoreError> {
    let witnessed = backend.data_dir().is_some();
    let commit_seq = if witnessed { crate::witness::stored_seq(backend.as_ref()).unwrap_or(0) } else { 0 };
    let writer = Arc::new(Writer {
        backend,
        config,
        stats,
        health: health.clone(),
        state: Mutex::new(State {
            flush_due: None,
            quiet_due: None,
            witnessed,
            commit_seq,
            groups: 0,
            last_barrier: Duration::ZERO,
            closed: false,
        }),
        queued: AtomicUsize::new(0),
        ahead: Mutex::new(Vec::new()),
    });
    let (tx, rx) = mpsc::channel();
    let thread_writer = writer.clone();
    let handle = std::thread::Builder::new()
        .name("durafiber-writer".into())
        .spawn(move || writer_loop(&thread_writer, &rx))
        .map_err(|source| StoreError::Io { path: "writer thread".into(), source })?;
    std::thread::Builder::new()
        .name("durafiber-watchdog".into())
        .spawn(move || watchdog(&health, config.barrier_timeout))
        .map_err(|source| StoreError::Io { path: "watchdog thread".into(), source })?;
    Ok(Spawned { writer, tx, thread: handle })
}

impl Writer {
    /// Sends `cmd` to the thread, counted as queued until it is gathered.
    pub(crate) fn queue(&self, tx: &mpsc::Sender<Cmd>, cmd: Cmd) -> Result<(), StoreError> {
        self.queued.fetch_add(1, SeqCst);
        tx.send(cmd).map_err(|_| {
            self.queued.fetch_sub(1, SeqCst);
            StoreError::Closed
        })
    }

    /// Hands a `Sync` write to the writer ahead of everything queued: the next group takes
    /// it first, whatever waits in the queue or for room in it. For a few writes that must
    /// not wait behind many (a recovery's registrations behind the commits of the runs it
    /// already recovered); their senders bound how many there are at once.
    pub(crate) fn send_ahead(
        &self,
        tx: &mpsc::Sender<Cmd>,
        batch: Batch,
        ack: Ack,
    ) -> Result<(), StoreError> {
        self.ahead.lock().push((batch, ack));
        self.queue(tx, Cmd::Wake)
    }

    /// The writes sent ahead since the last group, taken.
    fn take_ahead(&self) -> Vec<(Batch, Ack)> {
        std::mem::take(&mut *self.ahead.lock())
    }

    /// Writes a lone `Sync` batch on the calling thread, when the writer thread is idle and
    /// nothing is queued for it. Handing a commit to the thread and being woken by it cost
    /// a task that commits now and then — a step, its wait, the next step — two wake-ups
    /// of an idle core, together about half a sync of this project's disk again (`bench
    /// steps`, sequential steps). The caller's thread then waits out the barrier, as the
    /// writer thread would have: that is why only a backend whose writes are local and
    /// quick writes inline ([`Backend::writes_inline`]), and only while its last barrier
    /// took at most `INLINE_BARRIER_MAX`. Anything else — a queue to join, a batch of more
    /// than `INLINE_OPS_MAX` writes, a failed or closed store, a disk below the floor — is
    /// the thread's: the batch comes back.
    pub(crate) fn write_inline(&self, batch: Batch) -> Result<Result<(), StoreError>, Batch> {
        if !self.backend.writes_inline() || batch.ops.len() > INLINE_OPS_MAX || self.queued.load(SeqCst) != 0
        {
            return Err(batch);
        }
        let Some(mut state) = self.state.try_lock() else { return Err(batch) };
        if state.closed
            || state.last_barrier > INLINE_BARRIER_MAX
            || self.queued.load(SeqCst) != 0
            || self.health.failure().is_some()
            || below_floor(self.backend.as_ref(), &self.config)
        {
            return Err(batch);
        }
        self.stats.inline.fetch_add(1, Relaxed);
        let (ack, mut done) = oneshot::channel();
        let mut group = Group::default();
        group.add(batch, Durability::Sync, ack, &self.stats);
        // Above the floor a moment ago: asking the filesystem again would cost as much as
        // the rest of the write.
        self.write(&mut state, group, Space::Checked);
        drop(state);
        Ok(done.try_recv().unwrap_or(Err(StoreError::Closed)))
    }

    /// When the thread's wait ran out: after `QUIET_AFTER` with nothing written, tells the
    /// backend it is quiet, once per spell.
    fn quiet(&self) {
        let mut state = self.state.lock();
        if state.quiet_due.is_none_or(|due| Instant::now() < due) {
            return;
        }
        state.quiet_due = None;
        // Not below the free-space floor: a checkpoint writes sled, and sled must not meet
        // a full disk.
        if self.health.failure().is_none() && !below_floor(self.backend.as_ref(), &self.config) {
            match self.health.working(|| self.backend.quiet()) {
                // Still quiet then, the backend is told again (a checkpoint on a timer).
                Ok(Some(after)) => state.quiet_due = Instant::now().checked_add(after),
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "could not start a checkpoint while quiet"),
            }
        }
    }

    /// Every sender is gone: a last checkpoint, and nothing is written after it.
    fn close(&self) {
        let mut state = self.state.lock();
        state.closed = true;
        if self.health.failure().is_none() {
            let _ = self.health.working(|| self.backend.checkpoint());
        }
    }

    /// Runs one barrier; on success everything applied so far is durable.
    fn barrier(&self, state: &mut State) -> Result<(), StoreError> {
        let started = Instant::now();
        let result = self.health.working(|| self.backend.barrier());
        state.last_barrier = started.elapsed();
        self.stats.barriers.fetch_add(1, Relaxed);
        match &result {
            Ok(()) => {
                state.flush_due = None;
                self.health.durable.send_replace(state.groups);
            }
            Err(e) => {
                tracing::error!(error = %e, "durability barrier failed");
                if e.is_engine_failure() {
                    self.health.fail(format!("a durability barrier failed: {e}"));
                }
            }
        }
        result
    }

    /// Applies `group` as one write, covers it with a barrier if it needs one, and answers
    /// every waiter. Below the free-space floor it first parks, unless `space` says the
    /// caller just found the disk above it.
    fn write(&self, state: &mut State, mut group: Group, space: Space) {
        let (backend, config, health) = (self.backend.as_ref(), &self.config, self.health.as_ref());
        if let Some(reason) = health.failure() {
            group.fail_all(&StoreError::Failed { reason });
            return;
        }
        // Async writes applied earlier are covered before the writer parks, so that what
        // readers saw is durable however long the disk stays full.
        let check_space = space == Space::Unchecked && !group.merged.is_empty();
        if check_space && state.flush_due.is_some() && below_floor(backend, config) {
            let _ = self.barrier(state);
        }
        if check_space && !wait_for_space(backend, config, health) {
            let free_bytes = backend.free_bytes().unwrap_or(0);
            let reserve_bytes = config.disk_floor_bytes;
            group.fail_all(&StoreError::StorageFull { path: backend.location(), free_bytes, reserve_bytes });
            return;
        }
        if state.witnessed && !group.merged.is_empty() {
            state.commit_seq += 1;
            if let Err(e) = group.merged.put(crate::witness::seq_key(), &state.commit_seq) {
                group.fail_all(&e);
                return;
            }
        }
        if !group.merged.is_empty() {
            state.quiet_due = Some(Instant::now() + QUIET_AFTER);
            // Counted before the apply: a reader that sees the group's writes (sled's own
            // synchronisation orders them after this store) also sees it counted.
            state.groups += 1;
            health.applied.store(state.groups, SeqCst);
        }
        let mut applied =
            if group.merged.is_empty() { Ok(()) } else { health.working(|| backend.apply(&group.merged)) };
        if let Err(e) = &applied
            && e.is_batch_refusal()
        {
            applied = group.apply_apart(backend, health);
        }
        // Applied (or refused): the queue has room again while the barrier runs.
        drop(std::mem::take(&mut group.rooms));
        let waiting = self.answer_applied(state, &mut group, applied);
        group.answer_snapshots(backend);
        let flush_now = state.flush_due.is_some_and(|due| Instant::now() >= due);
        if waiting.is_empty() && group.barrier_acks.is_empty() && !flush_now {
            // No barrier is due. With no async write waiting for one either, this group
            // wrote nothing (every batch refused, or the write failed), and everything
            // applied before it is durable: readers that settle must not wait for a
            // barrier no write will bring.
            if state.flush_due.is_none() {
                self.health.durable.send_replace(state.groups);
            }
            return;
        }
        let result = self.barrier(state);
        for ack in waiting.into_iter().chain(group.barrier_acks) {
            let _ = ack.send(result.as_ref().map(|_| ()).map_err(StoreError::duplicate));
        }
    }

    /// Answers the group's batches once it is applied (or refused): a refusal or a failure at
    /// once, an async write at once with its flush due; the sync writes to answer after the
    /// barrier.
    fn answer_applied(
        &self,
        state: &mut State,
        group: &mut Group,
        applied: Result<(), StoreError>,
    ) -> Vec<Ack> {
        let mut waiting = Vec::new();
        match applied {
            Err(e) => {
                tracing::error!(error = %e, batches = group.parts.len(), "write failed");
                if e.is_engine_failure() {
                    self.health.fail(format!("the storage engine failed a write: {e}"));
                }
                for part in group.parts.drain(..) {
                    let _ = part.ack.send(Err(e.duplicate()));
                }
            }
            Ok(()) => {
                for part in group.parts.drain(..) {
                    match (part.refused, part.durability) {
                        (Some(e), _) => {
                            let _ = part.ack.send(Err(e));
                        }
                        (None, Durability::Async) => {
                            let _ = part.ack.send(Ok(()));
                            let flush_every = Duration::from_micros(self.health.flush_every_us.load(Relaxed));
                            state.flush_due.get_or_insert_with(|| Instant::now() + flush_every);
                        }
                        (None, Durability::Sync) => waiting.push(part.ack),
                    }
                }
            }
        }
        waiting
    }

    /// When the thread's next wait ends: the async flush deadline and the quiet spell's end.
    fn dues(&self) -> (Option<Instant>, Option<Instant>) {
        let state = self.state.lock();
        (state.flush_due, state.quiet_due)
    }
}

fn writer_loop(writer: &Writer, rx: &mpsc::Receiver<Cmd>) {
    let mut cadence = Cadence::default();
    let mut crowding = crate::crowding::Crowding::of_this_thread();
    loop {
        let idle_from = Instant::now();
        let spin = cadence.looping && !crowding.crowded(idle_from);
        let (flush_due, quiet_due) = writer.dues();
        let first = match next_command(rx, flush_due, quiet_due, spin) {
            Next::Command(cmd) => Some(cmd),
            Next::FlushDue => None,
            Next::Quiet => {
                // Nothing came for a while: whatever loop there was has ended.
                cadence.looping = false;
                writer.quiet();
                continue;
            }
            Next::Closed => {
                writer.close();
                return;
            }
        };
        let waited = idle_from.elapsed();
        let mut state = writer.state.lock();
        let group = Group::gather(first, rx, writer);
        cadence.observe(&group, waited);
        writer.write(&mut state, group, Space::Unchecked);
    }
}

#[cfg(test)]
mod tests;
