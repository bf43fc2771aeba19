//! The state every part of one runtime shares: handles to the store and clock, the agent
//! kinds, the live runs, and the bookkeeping of the supervisor and scheduler.
//!
//! RAM here is never the source of truth: everything in it is rebuilt from the store at
//! start-up, and losing it (a crash) only costs re-activations.

use durafiber_store::lock::Mutex;
use std::{
    collections::{BTreeSet, HashMap},
    future::Future,
    sync::{Arc, atomic::Ordering},
};

use durafiber_store::{
    Batch, Durability, Store,
    prefetch::Prefetched,
    tables::{self, Key, keys},
};
use serde::Serialize;
use tokio::sync::{Notify, watch};

use crate::{
    clock::{Clock, Stopwatch},
    config::RuntimeConfig,
    error::{AgentError, RuntimeError},
    events::EventLog,
    hooks::{AlarmEvent, ExhaustedAction, RecoveryReason},
    json,
    kernel::activity::Liveness,
    kernel::alarm_window::Scheduler,
    kernel::busy::{BusyGuard, Parked, Tally, WakeToken},
    kernel::cell::{RunCell, lock_stripes, stripe},
    kernel::registry::Registry,
    metrics::Metrics,
    rng::SeededRng,
    secret::Secrets,
};

/// Called at every boundary of a fiber with `(run_id, point)`, where point names the
/// boundary: `after_stash:<step>`, `after_effect_prepare:<id>`, `after_effect_call:<id>`,
/// `after_effect_commit:<id>`, `after_approval_request:<id>`. Returning `true` evicts the run
/// right there. Tests evict or crash at an exact boundary; the drill's server stops at one to
/// be killed.
pub type CrashHook = Arc<dyn Fn(&str, &str) -> bool + Send + Sync>;

pub(crate) struct Shared {
    pub store: Store,
    pub clock: Arc<dyn Clock>,
    pub config: RuntimeConfig,
    pub kinds: HashMap<String, Arc<dyn ErasedAgent>>,
    pub registry: Registry,
    pub liveness: Liveness,
    pub scheduler: Scheduler,
    /// Which recovery hooks may run at once (`kernel/hook_gate.rs`).
    pub hook_gate: Arc<super::hook_gate::HookGate>,
    pub metrics: Metrics,
    pub events: EventLog,
    /// Jitter of retries and backoffs.
    pub rng_jitter: Mutex<SeededRng>,
    /// Chaos eviction draws, apart from jitter so that each sequence repeats on its own.
    pub rng_chaos: Mutex<SeededRng>,
    pub secrets: Secrets,
    pub crash_hook: Option<CrashHook>,
    /// Bumped on every status change, so `wait` can sleep until something moved.
    pub status_version: watch::Sender<u64>,
    /// Bumped whenever output chunks become durable, so stream readers sleep until then.
    pub stream_version: watch::Sender<u64>,
    /// Kinds and runs operators paused, and the alarms held for them.
    pub pauses: Mutex<super::pauses::Pauses>,
    /// Bumped on every pause and resume, so a held fiber wakes to look again.
    pub pause_version: watch::Sender<u64>,
    /// Runs to re-activate at a time (recovery backoff, re-activation after eviction).
    pub wakeups: Mutex<BTreeSet<(u64, String)>>,
    /// Wakes the system-clock driver when a deadline moved earlier.
    pub driver_wake: Notify,
    /// Work started by the supervisor or scheduler, awaited by `settle`.
    pub tracked: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Serializes `start` per idempotency key stripe, so two starts never both mint a run.
    pub start_locks: Vec<tokio::sync::Mutex<()>>,
    /// Serializes read-modify-write of run records per run id stripe.
    pub run_locks: Vec<tokio::sync::Mutex<()>>,
    /// Serializes what arrives from outside (decisions, events) per run id stripe, so two
    /// approvals or two sends of one run never both write.
    pub inbound_locks: Vec<tokio::sync::Mutex<()>>,
    /// When the runtime opened: the recovery latency of runs found by the start-up scan.
    pub opened: crate::clock::Stopwatch,
    /// Consecutive failures of the runtime itself while delivering alarms (§8.4).
    pub alarm_runtime_failures: std::sync::atomic::AtomicU32,
    pub shutting_down: std::sync::atomic::AtomicBool,
    /// Activations past their shutdown check and not yet registered: `shutdown` waits for
    /// them, so that its stop of every registered run misses none ([`Activating`]).
    pub activating: std::sync::atomic::AtomicU64,
    /// Set when `shutdown` has finished: a task of this runtime still in flight (a timer that
    /// fires later, an aborted fiber between two polls) writes nothing after it.
    pub closed: std::sync::atomic::AtomicBool,
    /// Work in progress that virtual time must wait for: fibers not parked on the clock or
    /// a human, and events on their way to an actor.
    pub busy: Arc<Tally>,
    /// Events handed to parked fibers that have not resumed yet (see [`WakeToken`]).
    pub woken: Arc<Tally>,
    /// An inspection handle (the command line on a bare data directory): it reads and
    /// records decisions but never runs agent code; the next serving runtime does.
    pub passive: bool,
    /// Re-enters a run: activates it and lets its actor start or recover the fiber. The
    /// runtime points it at the runs layer (`run/actor.rs`) when it opens, so that a
    /// feature below that layer can have a run re-entered without importing it.
    pub reactivator: Reactivator,
    /// The runs this runtime may run: all of them, or its shards' on a shared store.
    pub ownership: super::ownership::Ownership,
}

/// A run record read under its stripe lock (see [`Shared::lock_run`]).
pub(crate) struct LockedRun<'a> {
    _guard: tokio::sync::MutexGuard<'a, ()>,
    pub run: tables::RunRecord,
}

/// See [`Shared::reactivator`].
pub(crate) type Reactivator = fn(Arc<Shared>, String, Stopwatch) -> BoxFuture<()>;

impl Shared {
    pub fn wake_token(&self) -> WakeToken {
        WakeToken::count(&self.woken)
    }

    pub fn busy(&self) -> BusyGuard {
        BusyGuard::count(&self.busy)
    }

    /// Awaits `fut` as parked work: waiting on the clock or a human is not work in progress,
    /// so virtual time may move meanwhile. Only the fiber's own waits are parked.
    pub async fn parked<F: Future>(&self, in_fiber: bool, fut: F) -> F::Output {
        if !in_fiber {
            return fut.await;
        }
        Parked::new(fut, &self.busy).await
    }

    /// Sleeps for the poll of a waiter on a store several nodes share, where another node's
    /// writes wake nothing here; never returns alone on the store, where every write does.
    pub async fn foreign_writes_poll(&self) {
        match self.store.backend().leases() {
            Some(_) => tokio::time::sleep(crate::limits::SHARED_STORE_POLL).await,
            None => std::future::pending().await,
        }
    }

    /// Reads the next alarms of this node's runs into the scheduler's window.
    pub fn refill_alarms(&self) -> Result<(), durafiber_store::StoreError> {
        let shards = self.ownership.scan_filter();
        self.scheduler.refill(&self.store, shards.as_deref(), |run_id| self.ownership.owns(run_id))
    }

    /// Re-enters `run_id` (see [`Shared::reactivator`]).
    pub async fn reactivate(self: &Arc<Self>, run_id: &str) {
        self.reactivate_since(run_id, Stopwatch::start()).await
    }

    /// `reactivate`, with recovery latency counted from `since`.
    pub async fn reactivate_since(self: &Arc<Self>, run_id: &str, since: Stopwatch) {
        (self.reactivator)(self.clone(), run_id.to_string(), since).await
    }

    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    pub fn agent(&self, kind: &str) -> Result<Arc<dyn ErasedAgent>, RuntimeError> {
        self.kinds.get(kind).cloned().ok_or_else(|| RuntimeError::UnknownKind { kind: kind.to_string() })
    }

    pub fn event(&self, run_id: &str, kind: &str, detail: impl Into<String>) {
        self.events.push(self.now_ms(), run_id, kind, self.redact(detail.into()));
    }

    /// `text` with every configured secret value replaced: what the runtime stores, logs
    /// and shows never holds one, even when an upstream echoes it back.
    pub fn redact(&self, text: String) -> String {
        if self.secrets.is_empty() { text } else { self.secrets.redact(&text) }
    }

    /// The canonical JSON of `value`, secrets redacted, and its hash: what a receipt or an
    /// approval payload is stored as. Serialized once when no secret is in it.
    pub fn redacted_with_hash<T: Serialize + ?Sized>(&self, value: &T) -> Result<(String, String), String> {
        let value = serde_json::to_value(value).map_err(|e| e.to_string())?;
        if !self.secrets.is_empty() {
            let text = serde_json::to_string(&value).map_err(|e| e.to_string())?;
            let redacted = self.secrets.redact(&text);
            if redacted != text {
                let value: serde_json::Value = json::parse(&redacted)?;
                return json::canonical_with_hash(&value);
            }
        }
        json::canonical_with_hash(&value)
    }

    /// Why a run of `kind` is held by an operator, if it is.
    pub fn pause_reason(&self, kind: &str, run_id: &str) -> Option<String> {
        self.pauses.lock().reason(kind, run_id)
    }

    pub fn status_changed(&self) {
        self.status_version.send_modify(|v| *v += 1);
    }

    pub fn jitter_between(&self, lo: u64, hi: u64) -> u64 {
        self.rng_jitter.lock().between(lo, hi)
    }

    pub fn chaos_strikes(&self) -> bool {
        let rate = self.config.chaos_evict_rate;
        rate > 0.0 && self.rng_chaos.lock().chance(rate)
    }

    /// Re-activates `run_id` at `at_ms`.
    pub fn wake_at(&self, at_ms: u64, run_id: &str) {
        tracing::debug!(run_id, at_ms, "wake scheduled");
        self.wakeups.lock().insert((at_ms, run_id.to_string()));
        self.driver_wake.notify_one();
    }

    /// Counts an activation under way, unless the runtime is shutting down. The count comes
    /// before the check: `shutdown` sets its flag before it reads the count, so either it
    /// sees this activation counted or this activation sees the flag.
    pub fn activating(&self) -> Result<Activating<'_>, crate::error::RuntimeError> {
        self.activating.fetch_add(1, Ordering::SeqCst);
        let guard = Activating { count: &self.activating };
        if self.shutting_down.load(Ordering::SeqCst) {
            return Err(crate::error::RuntimeError::ShuttingDown);
        }
        Ok(guard)
    }

    /// Spawns work that `settle` waits for.
    pub fn spawn_tracked<F: Future<Output = ()> + Send + 'static>(&self, fut: F) {
        let handle = tokio::spawn(fut);
        let mut tracked = self.tracked.lock();
        tracked.retain(|h| !h.is_finished());
        tracked.push(handle);
    }

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
            .ok_or_else(|| RuntimeError::UnknownRun { run_id: run_id.to_string() })
    }

    /// Writes a run record (and whatever else is in `batch`) as one sync boundary.
    pub async fn commit_run(&self, run: &tables::RunRecord, mut batch: Batch) -> Result<(), RuntimeError> {
        let key = keys::run(&run.run_id);
        batch.put(key, run)?;
        let open_key = keys::open_run(&run.run_id);
        if run.status.is_terminal() {
            batch.delete(open_key);
        } else {
            batch.put(open_key, &())?;
        }
        self.store.commit(batch, Durability::Sync).await?;
        self.status_changed();
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
        let guard = self.run_locks[stripe(run_id, self.run_locks.len())].lock().await;
        if self.closed.load(Ordering::SeqCst) {
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
        let guards = lock_stripes(&self.run_locks, run_ids).await;
        if self.closed.load(Ordering::SeqCst) {
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
        let probe = cell.hook.lock().as_ref().is_some_and(|hook| hook.is_probe());
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
            cell.hook.lock().take();
        }
        written
    }

    /// A recovery hook that parks on a durable wait without a write has settled: a probe's
    /// count is cleared (`kernel/hook_gate.rs`), and its place at the gate given up.
    pub async fn settle_hook(&self, cell: &RunCell) {
        let probe = match cell.hook.lock().as_ref() {
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
        cell.hook.lock().take();
    }

    /// Refuses a write of an evicted cell's fiber.
    pub fn check_not_evicted(&self, cell: &RunCell) -> Result<(), RuntimeError> {
        if cell.evicted.load(Ordering::SeqCst) {
            return Err(RuntimeError::Evicted { run_id: cell.run_id.clone() });
        }
        Ok(())
    }

    /// The lock that serializes decisions and events of `run_id`.
    pub async fn inbound_lock(&self, run_id: &str) -> tokio::sync::MutexGuard<'_, ()> {
        self.inbound_locks[stripe(run_id, self.inbound_locks.len())].lock().await
    }

    /// Commits a boundary of a live run. The first boundary after a recovery is progress:
    /// it resets the run's recovery count in the same write (§3.6).
    pub async fn commit_boundary(
        &self,
        cell: &RunCell,
        batch: Batch,
        durability: Durability,
    ) -> Result<(), RuntimeError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(RuntimeError::ShuttingDown);
        }
        self.check_not_evicted(cell)?;
        if !cell.recovering.load(Ordering::SeqCst) {
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
        cell.recovering.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Takes the run's output chunks emitted, and what it spent, since its last boundary
    /// into `batch`; true when there were chunks.
    fn stage_pending(&self, cell: &RunCell, batch: &mut Batch) -> Result<bool, RuntimeError> {
        super::spend::stage(&self.store, &cell.run_id, &mut cell.spend.lock(), batch)?;
        match cell.stream.lock().as_mut() {
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
            self.stream_version.send_modify(|v| *v += 1);
        } else {
            *cell.stream.lock() = None;
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

    /// The context of a hook that runs outside the fiber (`on_escalate`,
    /// `on_alarm_exhausted`): the live run's cell, or, for a run not live in memory — an
    /// escalated run is finished and is not activated again for its hook — a cell of its own.
    pub fn hook_ctx(self: &Arc<Self>, run_id: &str, kind: &str) -> RawCtx {
        let cell = match self.registry.get(run_id) {
            Some(live) => live.cell,
            None => Arc::new(RunCell::new(
                run_id,
                kind,
                self.config.durability,
                self.config.fiber_keep_alive,
                0,
                0,
                None,
            )),
        };
        RawCtx::new(self.clone(), cell, 0)
    }

    pub fn next_seq(&self, cell: &RunCell) -> u64 {
        cell.seq.fetch_add(1, Ordering::SeqCst) + 1
    }
}

/// An activation under way (see [`Shared::activating`]); uncounted when dropped.
pub(crate) struct Activating<'a> {
    count: &'a std::sync::atomic::AtomicU64,
}

impl Drop for Activating<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The untyped context behind `Ctx`: what agent code reaches the runtime through.
pub(crate) struct RawCtx {
    pub shared: Arc<Shared>,
    pub cell: Arc<RunCell>,
    /// The fiber attempt, or 0 for an event handler.
    pub attempt: u32,
    /// A fiber (as opposed to an event handler): its waits are parked work.
    pub in_fiber: bool,
}

impl RawCtx {
    pub fn new(shared: Arc<Shared>, cell: Arc<RunCell>, attempt: u32) -> Self {
        RawCtx { shared, cell, attempt, in_fiber: false }
    }

    /// The cooperative cancel (§2.3): once the run was asked to stop, the fiber's next
    /// boundary (`what`) is refused with `AgentError::Cancelled`, and a fiber that returns it
    /// ends the run `Cancelled` there.
    pub fn refuse_if_cancelled(&self, what: &str) -> Result<(), AgentError> {
        if !self.in_fiber {
            return Ok(());
        }
        match self.cell.cancel.reason() {
            Some(reason) => Err(AgentError::Cancelled(format!("{what} not started: cancelled ({reason})"))),
            None => Ok(()),
        }
    }
}

pub(crate) type BoxFuture<T> = std::pin::Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// What the runtime needs to recover a run, as stored.
pub(crate) struct RawRecovered {
    pub run_id: String,
    pub kind: String,
    pub stash: Option<super::stash_record::Stored>,
    pub input_json: String,
    pub attempt: u32,
    pub reason: RecoveryReason,
    pub created_at_ms: u64,
}

/// An agent with its types erased to JSON, so one runtime can host many kinds.
pub(crate) trait ErasedAgent: Send + Sync + 'static {
    fn check_input(&self, input_json: &str) -> Result<(), String>;
    fn check_message(&self, message_json: &str) -> Result<(), String>;
    fn run_fiber(&self, ctx: RawCtx, input_json: String) -> BoxFuture<Result<String, AgentError>>;
    fn recover(&self, ctx: RawCtx, recovered: RawRecovered) -> BoxFuture<Result<String, AgentError>>;
    fn on_alarm(&self, ctx: RawCtx, alarm: AlarmEvent) -> BoxFuture<Result<(), AgentError>>;
    fn on_message(&self, ctx: RawCtx, message_json: String) -> BoxFuture<Result<(), AgentError>>;
    fn on_request(&self, ctx: RawCtx, message_json: String) -> BoxFuture<Result<String, AgentError>>;
    fn on_alarm_exhausted(&self, ctx: RawCtx, alarm: &AlarmEvent) -> ExhaustedAction;
    fn on_escalate(&self, ctx: RawCtx, reason: String) -> BoxFuture<()>;
    fn approval_view(
        &self,
        approval_id: &str,
        payload: &serde_json::Value,
    ) -> Option<crate::approval_view::ApprovalView>;
    fn input_schema(&self) -> Option<serde_json::Value>;
}
