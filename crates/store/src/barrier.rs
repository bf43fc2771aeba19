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
            AtomicBool, AtomicU64, AtomicUsize,
            Ordering::{Relaxed, SeqCst},
        },
        mpsc,
    },
    time::{Duration, Instant},
};

use tokio::sync::{OwnedSemaphorePermit, oneshot, watch};

use crate::{backend::Backend, batch::Batch, error::StoreError, lock::Mutex};

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

/// The writer's condition, shared with the store's front door and the watchdog.
pub(crate) struct Health {
    /// `Some(reason)` once the store failed; it never recovers in-process.
    pub failed: watch::Sender<Option<String>>,
    /// Set when the store closes: a parked writer gives up waiting for space.
    pub closing: AtomicBool,
    /// Parked below the free-space floor.
    pub parked: AtomicBool,
    /// Groups applied (or being applied) so far: what a read may have seen.
    pub applied: AtomicU64,
    /// Groups covered by a completed barrier.
    pub durable: watch::Sender<u64>,
    /// Upper bound on how long an `Async` batch stays uncovered, µs: set at open and
    /// changeable later (`Store::set_flush_every`), so the runtime's setting applies to a
    /// store its user opened.
    pub flush_every_us: AtomicU64,
    /// When the engine call in progress started, ms since `epoch`; 0 when idle.
    working_since_ms: AtomicU64,
    epoch: Instant,
}

impl Health {
    pub fn new(flush_every: Duration) -> Self {
        Health {
            flush_every_us: AtomicU64::new(u64::try_from(flush_every.as_micros()).unwrap_or(u64::MAX)),
            failed: watch::Sender::new(None),
            closing: AtomicBool::new(false),
            parked: AtomicBool::new(false),
            applied: AtomicU64::new(0),
            durable: watch::Sender::new(0),
            working_since_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    pub fn failure(&self) -> Option<String> {
        self.failed.borrow().clone()
    }

    pub fn fail(&self, reason: String) {
        self.failed.send_if_modified(|f| {
            if f.is_some() {
                return false;
            }
            tracing::error!(reason, "the store failed; it takes no more writes until the process restarts");
            *f = Some(reason);
            true
        });
    }

    fn since_epoch_ms(&self) -> u64 {
        (self.epoch.elapsed().as_millis() as u64).max(1)
    }

    /// Runs an engine call under the watchdog's eye.
    fn working<T>(&self, f: impl FnOnce() -> T) -> T {
        self.working_since_ms.store(self.since_epoch_ms(), Relaxed);
        let out = f();
        self.working_since_ms.store(0, Relaxed);
        out
    }
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

/// Fails the store when an engine call has run longer than `timeout`. Ends with the store.
fn watchdog(health: &Health, timeout: Duration) {
    let tick = (timeout / 8).clamp(Duration::from_millis(10), Duration::from_millis(500));
    while !health.closing.load(Relaxed) && health.failure().is_none() {
        std::thread::sleep(tick);
        let since = health.working_since_ms.load(Relaxed);
        if since != 0 && health.since_epoch_ms().saturating_sub(since) > timeout.as_millis() as u64 {
            health.fail(format!(
                "a durability barrier has not returned after {} ms (is the disk full or gone?)",
                timeout.as_millis()
            ));
        }
    }
}

/// What the writer does next.
enum Next {
    Command(Cmd),
    /// Async writes wait for their barrier.
    FlushDue,
    /// Nothing came for `QUIET_AFTER`, or nothing at all was due.
    Quiet,
    /// Every sender is gone.
    Closed,
}

/// Tells one task committing in a loop from anything else. Its commits come one to a group,
/// each right after the last was acknowledged, and begin with the same key (a run's stash).
/// For such a task the writer looks for the next commit for `SPIN_FOR` before it sleeps:
/// waking a sleeping thread costs about as much as the task takes between its commits. A
/// burst of alarm deliveries also commits one at a time, but each for another run; there
/// spinning would only take a core from the deliveries. The writer also checks it is not
/// crowded (`crowding::Crowding`) before it spins.
#[derive(Default)]
struct Cadence {
    /// The first key of the last group, when it was one commit.
    last_key: Vec<u8>,
    last_lone: bool,
    looping: bool,
}

impl Cadence {
    /// Takes in a gathered group and how long the writer waited for its first command.
    fn observe(&mut self, group: &Group, waited: Duration) {
        let key = match (group.parts.as_slice(), group.merged.ops.first()) {
            ([_], Some(op)) => Some(op.key()),
            _ => None,
        };
        self.looping = waited < SPIN_FOR && self.last_lone && key == Some(self.last_key.as_slice());
        self.last_lone = key.is_some();
        if let Some(key) = key
            && key != self.last_key.as_slice()
        {
            self.last_key.clear();
            self.last_key.extend_from_slice(key);
        }
    }
}

/// Waits for the next command, for the async flush deadline, or for a quiet spell to end.
/// With neither due it still looks again after `QUIET_AFTER`: a lone commit written on its
/// own thread may have started a quiet spell the thread did not see. `spin`: look for the
/// next command for `SPIN_FOR` before sleeping (see `Cadence`).
fn next_command(
    rx: &mpsc::Receiver<Cmd>,
    flush_due: Option<Instant>,
    quiet_due: Option<Instant>,
    spin: bool,
) -> Next {
    if spin && let Some(until) = Instant::now().checked_add(SPIN_FOR) {
        while Instant::now() < until {
            match rx.try_recv() {
                Ok(cmd) => return Next::Command(cmd),
                Err(mpsc::TryRecvError::Empty) => std::thread::yield_now(),
                Err(mpsc::TryRecvError::Disconnected) => return Next::Closed,
            }
        }
    }
    let until = flush_due.into_iter().chain(quiet_due).min().unwrap_or_else(|| Instant::now() + QUIET_AFTER);
    match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
        Ok(cmd) => Next::Command(cmd),
        Err(mpsc::RecvTimeoutError::Timeout) if flush_due.is_some_and(|due| Instant::now() >= due) => {
            Next::FlushDue
        }
        Err(mpsc::RecvTimeoutError::Timeout) => Next::Quiet,
        Err(mpsc::RecvTimeoutError::Disconnected) => Next::Closed,
    }
}

/// One write of a group: where its ops and absent keys sit in the merged batch, and who
/// waits for it.
struct Part {
    ops: std::ops::Range<usize>,
    absent: std::ops::Range<usize>,
    durability: Durability,
    ack: Ack,
    /// Set when this write alone was refused (see `Group::apply_apart`).
    refused: Option<StoreError>,
}

/// One gathered group: the merged writes and who waits for what.
#[derive(Default)]
struct Group {
    merged: Batch,
    parts: Vec<Part>,
    barrier_acks: Vec<Ack>,
    snapshot_acks: Vec<oneshot::Sender<Result<crate::backend::Entries, StoreError>>>,
    rooms: Vec<OwnedSemaphorePermit>,
}

impl Group {
    /// Everything queued behind `first`: what arrived during the last barrier.
    fn gather(first: Option<Cmd>, rx: &mpsc::Receiver<Cmd>, writer: &Writer) -> Group {
        let mut g = Group::default();
        let mut next = first;
        let mut count = 0usize;
        while let Some(cmd) = next {
            count += 1;
            writer.queued.fetch_sub(1, SeqCst);
            match cmd {
                Cmd::Write { batch, durability, ack, room } => {
                    g.add(batch, durability, ack, &writer.stats);
                    g.rooms.push(room);
                }
                Cmd::Barrier { ack } => g.barrier_acks.push(ack),
                Cmd::Snapshot { ack } => g.snapshot_acks.push(ack),
            }
            next = if count < writer.config.group_batches_max { rx.try_recv().ok() } else { None };
        }
        g
    }

    /// Adds one write to the merged batch.
    fn add(&mut self, batch: Batch, durability: Durability, ack: Ack, stats: &WriterStats) {
        stats.batches.fetch_add(1, Relaxed);
        let (ops, absent) = (self.merged.ops.len(), self.merged.absent.len());
        self.merged.extend(batch);
        self.parts.push(Part {
            ops: ops..self.merged.ops.len(),
            absent: absent..self.merged.absent.len(),
            durability,
            ack,
            refused: None,
        });
    }

    /// After the merged write was refused for one batch's sake (a key that exists, a shard
    /// not owned): applies each write on its own, so only the ones refused fail. Returns
    /// the first engine failure, which ends the group as a whole.
    fn apply_apart(&mut self, backend: &dyn Backend, health: &Health) -> Result<(), StoreError> {
        for part in &mut self.parts {
            let alone = Batch {
                ops: self.merged.ops[part.ops.clone()].to_vec(),
                absent: self.merged.absent[part.absent.clone()].to_vec(),
            };
            match health.working(|| backend.apply(&alone)) {
                Ok(()) => {}
                Err(e) if e.is_batch_refusal() => part.refused = Some(e),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Answers every waiter with `e`.
    fn fail_all(self, e: &StoreError) {
        for ack in self.parts.into_iter().map(|p| p.ack).chain(self.barrier_acks) {
            let _ = ack.send(Err(e.duplicate()));
        }
        for ack in self.snapshot_acks {
            let _ = ack.send(Err(e.duplicate()));
        }
    }

    /// Hands every snapshot waiter the whole keyspace as it stands after this group.
    fn answer_snapshots(&mut self, backend: &dyn Backend) {
        if self.snapshot_acks.is_empty() {
            return;
        }
        let entries = backend.range(&[], &[0xff; 16], usize::MAX);
        for ack in self.snapshot_acks.drain(..) {
            let _ = ack.send(entries.as_ref().map(Clone::clone).map_err(StoreError::duplicate));
        }
    }
}

/// Whether a write's caller has just seen the disk above the free-space floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Space {
    Checked,
    Unchecked,
}

fn below_floor(backend: &dyn Backend, config: &WriterConfig) -> bool {
    backend.free_bytes().is_some_and(|free| free < config.disk_floor_bytes)
}

/// Parks while the disk is below the floor. False when the store closed meanwhile.
fn wait_for_space(backend: &dyn Backend, config: &WriterConfig, health: &Health) -> bool {
    let below = || below_floor(backend, config);
    if !below() {
        return true;
    }
    tracing::warn!(
        floor_bytes = config.disk_floor_bytes,
        "the disk is below the store's floor: writes wait until space returns"
    );
    health.parked.store(true, Relaxed);
    while below() {
        if health.closing.load(Relaxed) {
            health.parked.store(false, Relaxed);
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    health.parked.store(false, Relaxed);
    tracing::info!("space is back: writes resume");
    true
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
        let mut waiting = Vec::new();
        match applied {
            Err(e) => {
                tracing::error!(error = %e, batches = group.parts.len(), "write failed");
                if e.is_engine_failure() {
                    health.fail(format!("the storage engine failed a write: {e}"));
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
                            let flush_every = Duration::from_micros(health.flush_every_us.load(Relaxed));
                            state.flush_due.get_or_insert_with(|| Instant::now() + flush_every);
                        }
                        (None, Durability::Sync) => waiting.push(part.ack),
                    }
                }
            }
        }
        group.answer_snapshots(backend);
        let flush_now = state.flush_due.is_some_and(|due| Instant::now() >= due);
        if waiting.is_empty() && group.barrier_acks.is_empty() && !flush_now {
            return;
        }
        let result = self.barrier(state);
        for ack in waiting.into_iter().chain(group.barrier_acks) {
            let _ = ack.send(result.as_ref().map(|_| ()).map_err(StoreError::duplicate));
        }
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
mod tests {
    use std::{sync::Arc, time::Instant};

    use super::*;
    use crate::{Durability, SimBackend, Store, StoreConfig, tables::keys};

    fn wait_for(what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_writer_with_nothing_to_do_tells_its_backend_once_per_quiet_spell() {
        let sim = SimBackend::new();
        let store = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store");
        // A store that wrote nothing has nothing to move: it is never told.
        std::thread::sleep(QUIET_AFTER * 2);
        assert_eq!(sim.quiet_spells(), 0);
        for spell in 1..=2u64 {
            let mut batch = Batch::new();
            batch.put(keys::meta("quiet"), &spell).expect("encode");
            store.commit_blocking(batch, Durability::Sync).expect("commit");
            wait_for("a quiet spell", || sim.quiet_spells() == spell);
            std::thread::sleep(QUIET_AFTER * 3);
            assert_eq!(sim.quiet_spells(), spell, "told once per spell, not at every wait");
        }
        store.close();
    }

    fn put(store: &Store, key: &str, durability: Durability) {
        let mut batch = Batch::new();
        batch.put(keys::meta(key), &key.to_string()).expect("encode");
        store.commit_blocking(batch, durability).expect("commit");
    }

    fn count(counter: &AtomicU64) -> u64 {
        counter.load(SeqCst)
    }

    #[test]
    fn a_lone_sync_commit_writes_itself_and_still_starts_a_quiet_spell() {
        let sim = SimBackend::new();
        sim.write_inline(true);
        let store = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store");
        put(&store, "lone", Durability::Sync);
        let stats = store.writer_stats();
        assert_eq!((count(&stats.inline), count(&stats.batches), count(&stats.barriers)), (1, 1, 1));
        assert!(sim.durable_len() > 0, "the barrier ran before the commit returned");
        // The writer thread never saw the write, and still tells the backend once it is quiet.
        wait_for("a quiet spell after a write of its own", || sim.quiet_spells() == 1);
        put(&store, "async", Durability::Async);
        assert_eq!(count(&stats.inline), 1, "an async commit is the thread's");
        let mut many = Batch::new();
        for i in 0..=INLINE_OPS_MAX {
            many.put(keys::meta(&format!("many-{i}")), &i).expect("encode");
        }
        store.commit_blocking(many, Durability::Sync).expect("commit");
        assert_eq!(count(&stats.inline), 1, "a commit of many writes is the thread's");
        store.close();
    }

    #[test]
    fn a_commit_that_finds_the_writer_busy_or_the_disk_slow_goes_to_the_thread() {
        let sim = SimBackend::new();
        sim.write_inline(true);
        let store = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store");
        let stats = store.writer_stats();
        // The first commit writes itself and hangs in its barrier, holding the writer.
        sim.stall_barriers(true);
        let first = std::thread::spawn({
            let store = store.clone();
            move || put(&store, "first", Durability::Sync)
        });
        wait_for("the first commit to write itself", || count(&stats.inline) == 1);
        let second = std::thread::spawn({
            let store = store.clone();
            move || put(&store, "second", Durability::Sync)
        });
        wait_for("the second commit to be queued", || store.writer().queued.load(SeqCst) == 1);
        std::thread::sleep(INLINE_BARRIER_MAX * 2);
        sim.stall_barriers(false);
        first.join().expect("first");
        second.join().expect("second");
        assert_eq!(count(&stats.inline), 1, "the writer was busy: the second waited for the thread");
        // A lone commit whose barrier is slow: until a quick one, lone commits go to the thread.
        sim.stall_barriers(true);
        let slow = std::thread::spawn({
            let store = store.clone();
            move || put(&store, "slow", Durability::Sync)
        });
        wait_for("the slow commit to write itself", || count(&stats.inline) == 2);
        std::thread::sleep(INLINE_BARRIER_MAX * 2);
        sim.stall_barriers(false);
        slow.join().expect("slow");
        put(&store, "after a slow barrier", Durability::Sync);
        assert_eq!(count(&stats.inline), 2);
        put(&store, "after a quick one", Durability::Sync);
        assert_eq!(count(&stats.inline), 3);
        assert_eq!(count(&stats.batches), 5);
        store.close();
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_single_threaded_runtime_never_waits_on_the_disk_itself() {
        let sim = SimBackend::new();
        sim.write_inline(true);
        let store = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store");
        let mut batch = Batch::new();
        batch.put(keys::meta("k"), &1u32).expect("encode");
        store.commit(batch, Durability::Sync).await.expect("commit");
        assert_eq!(count(&store.writer_stats().inline), 0);
        store.close();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_commits_on_a_local_disk_write_themselves_or_group_and_all_last() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open_dir(dir.path(), StoreConfig::default()).expect("store");
        let tasks: Vec<_> = (0..16)
            .map(|t| {
                let store = store.clone();
                tokio::spawn(async move {
                    for i in 0..25 {
                        let mut batch = Batch::new();
                        let key = format!("t{t:02}-{i:02}");
                        batch.put(keys::meta(&key), &key).expect("encode");
                        store.commit(batch, Durability::Sync).await.expect("commit");
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("task");
        }
        let stats = store.writer_stats();
        assert_eq!(count(&stats.batches), 16 * 25);
        assert!(count(&stats.barriers) <= count(&stats.batches));
        drop(store);
        let store = Store::open_dir(dir.path(), StoreConfig::default()).expect("reopen");
        for t in 0..16 {
            for i in 0..25 {
                let key = format!("t{t:02}-{i:02}");
                let found: Option<String> = store.get(&keys::meta::<String>(&key)).expect("read");
                assert_eq!(found.as_deref(), Some(key.as_str()));
            }
        }
        store.close();
    }

    /// A group of `commits` commits, each a put of `key`.
    fn group_of(commits: usize, key: &[u8]) -> Group {
        let mut group = Group::default();
        for i in 0..commits {
            group.merged.ops.push(crate::batch::Op::Put { key: key.to_vec(), value: vec![] });
            let (ack, _) = oneshot::channel();
            group.parts.push(Part {
                ops: i..i + 1,
                absent: 0..0,
                durability: Durability::Sync,
                ack,
                refused: None,
            });
        }
        group
    }

    #[test]
    fn the_writer_spins_only_for_one_task_committing_in_a_loop() {
        let soon = SPIN_FOR / 5;
        let mut cadence = Cadence::default();
        let mut looping_after = |commits: usize, key: &[u8], waited: Duration| {
            cadence.observe(&group_of(commits, key), waited);
            cadence.looping
        };
        assert!(!looping_after(1, b"run-a", soon), "one commit is not a loop");
        assert!(looping_after(1, b"run-a", soon), "the same run again, right after its last commit");
        assert!(looping_after(1, b"run-a", soon));
        // One commit at a time, each for another run: a burst of alarm deliveries.
        assert!(!looping_after(1, b"run-b", soon));
        assert!(!looping_after(1, b"run-c", soon));
        assert!(!looping_after(1, b"run-c", SPIN_FOR * 2), "after a pause longer than the spin");
        assert!(looping_after(1, b"run-c", soon));
        // Writers enough to fill groups keep the writer busy without it.
        assert!(!looping_after(2, b"run-c", soon));
        assert!(!looping_after(1, b"run-c", soon), "a loop starts over after a group of many");
        assert!(looping_after(1, b"run-c", soon));
    }
}
