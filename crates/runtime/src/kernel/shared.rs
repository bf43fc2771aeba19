//! The state every part of one runtime shares: handles to the store and clock, the agent
//! kinds, the live runs, and the bookkeeping of the supervisor and scheduler.
//!
//! RAM here is never the source of truth: everything in it is rebuilt from the store at
//! start-up, and losing it (a crash) only costs re-activations.

use durafiber_store::RunId;
use durafiber_store::lock::Mutex;
use std::{
    collections::{BTreeSet, HashMap},
    future::Future,
    sync::{Arc, atomic::Ordering},
};

use durafiber_store::Store;
use serde::Serialize;
use tokio::sync::{Notify, watch};

use crate::{
    boundary::Boundary,
    clock::{Clock, Stopwatch},
    config::RuntimeConfig,
    error::{AgentError, RuntimeError},
    events::EventLog,
    hooks::{AlarmEvent, ExhaustedAction, RecoveryReason},
    json,
    kernel::activity::Liveness,
    kernel::alarm_window::Scheduler,
    kernel::busy::{BusyGuard, Parked, Tally, WakeToken},
    kernel::cell::RunCell,
    kernel::registry::Registry,
    metrics::Metrics,
    rng::SeededRng,
    secret::Secrets,
    trace::{Ended, Parent},
};

/// Called at every committed boundary of a fiber with the run's id and the [`Boundary`].
/// Returning `true` evicts the run right there. Tests evict or crash at an exact boundary;
/// the drill's server stops at one to be killed.
pub type CrashHook = Arc<dyn Fn(&RunId, &Boundary) -> bool + Send + Sync>;

pub(crate) struct Shared {
    pub store: Store,
    /// The runtime's time: on a store several nodes share, [`Shared::agreed`].
    pub clock: Arc<dyn Clock>,
    /// On a store several nodes share (and a clock that is not virtual): the time base the
    /// nodes agree on, the database's clock, which `clock` reads.
    pub agreed: Option<Arc<crate::clock::AgreedClock>>,
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
    /// Where the runs' spans go (nowhere unless traces are configured).
    pub traces: crate::trace::Traces,
    pub crash_hook: Option<CrashHook>,
    /// Bumped on every status change, so `wait` can sleep until something moved.
    pub status_version: watch::Sender<u64>,
    /// Bumped whenever output chunks become durable, so stream readers sleep until then.
    pub stream_version: watch::Sender<u64>,
    /// Bumped when a streaming effect's call begins on this node: a run's readers look for
    /// its partial chunks then (see `kernel/live_stream.rs`).
    pub live_version: watch::Sender<u64>,
    /// The named limits effects' calls wait their turn in.
    pub limiters: super::limiters::Limiters,
    /// Kinds and runs operators paused, and the alarms held for them.
    pub pauses: Mutex<super::pauses::Pauses>,
    /// Bumped on every pause and resume, so a held fiber wakes to look again.
    pub pause_version: watch::Sender<u64>,
    /// Runs to re-activate at a time (recovery backoff, re-activation after eviction).
    pub wakeups: Mutex<BTreeSet<(u64, String)>>,
    /// Wakes the system-clock driver when a deadline moved earlier.
    pub driver_wake: Notify,
    /// When the next retention sweep is due, ms; `u64::MAX` while one runs, or for ever
    /// when nothing is to be deleted (`retention.rs`).
    pub retention_due_ms: std::sync::atomic::AtomicU64,
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
    /// Starts a run as a start through the runtime does — durably, idempotent by its key,
    /// then activated — for a fiber starting a child (`Ctx::start_child`); pointed at the
    /// runs layer as `reactivator` is.
    pub starter: Starter,
    /// The runs this runtime may run: all of them, or its shards' on a shared store.
    pub ownership: super::ownership::Ownership,
}

/// See [`Shared::reactivator`].
pub(crate) type Reactivator = fn(Arc<Shared>, String, Stopwatch) -> BoxFuture<()>;

/// See [`Shared::starter`]: (kind, idempotency key, input JSON) → the run's id.
pub(crate) type Starter = fn(Arc<Shared>, String, String, String) -> BoxFuture<Result<RunId, RuntimeError>>;

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
        self.reactivate_since(run_id, Stopwatch::start()).await;
    }

    /// `reactivate`, with recovery latency counted from `since`.
    pub async fn reactivate_since(self: &Arc<Self>, run_id: &str, since: Stopwatch) {
        (self.reactivator)(self.clone(), run_id.to_string(), since).await;
    }

    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The runtime's time `at_ms` on this machine's own clock.
    pub fn to_local_ms(&self, at_ms: u64) -> u64 {
        self.agreed.as_ref().map_or(at_ms, |a| a.to_local_ms(at_ms))
    }

    pub fn agent(&self, kind: &str) -> Result<Arc<dyn ErasedAgent>, RuntimeError> {
        self.kinds.get(kind).cloned().ok_or_else(|| RuntimeError::UnknownKind { kind: kind.to_string() })
    }

    pub fn event(&self, run_id: &str, kind: &'static str, detail: impl Into<String>) {
        self.events.push(self.now_ms(), run_id, kind, self.redact(detail.into()));
    }

    /// Sends the span `span` makes, secrets redacted; when traces are off, nothing is made.
    pub fn span<'a>(&self, span: impl FnOnce() -> Ended<'a>) {
        if self.traces.is_on() {
            self.traces.send(&self.secrets, span());
        }
    }

    /// Sends the span of attempt `attempt` of a run, an attempt that did not end by itself
    /// (`run/attempt_span.rs`): the process that ran it knew neither when it would end nor
    /// how, so it is sent as a moment, now.
    pub fn send_unfinished_attempt(&self, run_id: &str, kind: &str, attempt: u32, outcome: &'static str) {
        if attempt == 0 {
            return;
        }
        let now = self.now_ms();
        self.span(|| {
            Ended::new(run_id, kind, "fiber.attempt", Parent::Root)
                .id(crate::trace::attempt_span_id(run_id, attempt))
                .times(now, now)
                .attr("durafiber.attempt", i64::from(attempt))
                .attr("durafiber.outcome", outcome)
                .attr("durafiber.unfinished", true)
        });
    }

    /// Sends the run's last span, `run.settle`: how it settled, from its acceptance to now.
    pub fn send_settled(&self, run: &durafiber_store::tables::RunRecord) {
        use durafiber_store::tables::RunStatus;
        let error = match &run.status {
            RunStatus::Failed { error } => Some(error.clone()),
            RunStatus::Cancelled { reason } | RunStatus::Escalated { reason } => Some(reason.clone()),
            _ => None,
        };
        self.span(|| {
            Ended::new(&run.run_id, &run.kind, "run.settle", Parent::Root)
                .times(run.created_at_ms, self.now_ms())
                .attr("durafiber.run.state", run.status.name())
                .attr("durafiber.attempts", i64::from(run.attempt))
                .error(error)
        });
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

    /// The run's fiber starts or stops waiting on a durable wait; the driver is woken when
    /// too many wait in memory, to park the longest waiting.
    pub fn fiber_waiting(&self, run_id: &str, waiting: bool, now_ms: u64) {
        if self.liveness.fiber_waiting(run_id, waiting, now_ms) {
            self.driver_wake.notify_one();
        }
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

    /// The context of a hook that runs outside the fiber (`on_escalate`,
    /// `on_alarm_exhausted`): the live run's cell, or, for a run not live in memory — an
    /// escalated run is finished and is not activated again for its hook — a cell of its own.
    pub fn hook_ctx(self: &Arc<Self>, run_id: &RunId, kind: &str) -> RawCtx {
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

    /// A span of this run from `start_ms` to now: under the fiber's attempt in a fiber,
    /// under the run's root in an event handler.
    pub fn span_since(&self, name: impl Into<std::borrow::Cow<'static, str>>, start_ms: u64) -> Ended<'_> {
        let parent = match self.in_fiber && self.attempt > 0 {
            true => Parent::Attempt(self.attempt),
            false => Parent::Root,
        };
        Ended::new(&self.cell.run_id, &self.cell.kind, name, parent).times(start_ms, self.shared.now_ms())
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
    pub run_id: RunId,
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
    /// Whether `stored` decodes as the agent's `Stash`, upgraded when older, as a recovery
    /// would decode it; the reason it would escalate otherwise.
    fn check_stash(&self, stored: &super::stash_record::Stored) -> Result<(), String>;
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
