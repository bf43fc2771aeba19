//! The state every part of one runtime shares: handles to the store and clock, the agent
//! kinds, the live runs, and the bookkeeping of the supervisor and scheduler.
//!
//! RAM here is never the source of truth: everything in it is rebuilt from the store at
//! start-up, and losing it (a crash) only costs re-activations.

use durafiber_api::Timestamp;
use std::{
    collections::HashMap,
    future::Future,
    sync::{Arc, atomic::Ordering},
};

use durafiber_store::{RunId, Store};

pub(crate) use super::observe::CrashHook;
use crate::{
    clock::{Stopwatch, Time},
    config::RuntimeConfig,
    error::{AgentError, RuntimeError},
    hooks::{AlarmEvent, ExhaustedAction, RecoveryReason},
    kernel::{
        activity::Liveness, cell::RunCell, controls::Controls, lifecycle::Lifecycle, observe::Observability,
        registry::Registry, signals::Signals, stripes::Stripes, timers::Timers,
    },
    trace::{Ended, Parent},
};

/// A runtime's services, each owning its state: a feature takes the one it needs.
pub(crate) struct Shared {
    pub store: Store,
    pub time: Time,
    pub config: RuntimeConfig,
    pub agents: Agents,
    pub registry: Registry,
    pub liveness: Liveness,
    pub timers: Timers,
    /// The runs this runtime may run: all of them, or its shards' on a shared store.
    pub ownership: super::ownership::Ownership,
    pub obs: Observability,
    pub signals: Signals,
    pub life: Lifecycle,
    pub stripes: Stripes,
    pub controls: Controls,
}

impl Shared {
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
        self.timers.scheduler.refill(&self.store, shards.as_deref(), |run_id| self.ownership.owns(run_id))
    }

    /// Re-enters `run_id` (see [`Agents::reactivator`]).
    pub async fn reactivate(self: &Arc<Self>, run_id: &RunId) {
        self.reactivate_since(run_id, Stopwatch::start()).await;
    }

    /// `reactivate`, with recovery latency counted from `since`.
    pub async fn reactivate_since(self: &Arc<Self>, run_id: &RunId, since: Stopwatch) {
        (self.agents.reactivator)(self.clone(), run_id.clone(), since).await;
    }

    pub fn now(&self) -> Timestamp {
        self.time.now()
    }

    pub fn event(&self, run_id: &RunId, kind: &'static str, detail: impl Into<String>) {
        self.obs.events.push(self.now(), run_id, kind, self.obs.redact(detail.into()));
    }

    /// Sends the span of attempt `attempt` of a run, an attempt that did not end by itself
    /// (`run/attempt_span.rs`): the process that ran it knew neither when it would end nor
    /// how, so it is sent as a moment, now.
    pub fn send_unfinished_attempt(&self, run_id: &RunId, kind: &str, attempt: u32, outcome: &'static str) {
        if attempt == 0 {
            return;
        }
        let now = self.now();
        self.obs.span(|| {
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
        self.obs.span(|| {
            Ended::new(&run.run_id, &run.kind, "run.settle", Parent::Root)
                .times(run.created_at_ms, self.now())
                .attr("durafiber.run.state", run.status.name())
                .attr("durafiber.attempts", i64::from(run.attempt))
                .error(error)
        });
    }

    pub fn chaos_strikes(&self) -> bool {
        self.controls.chaos_strikes(self.config.chaos_evict_rate)
    }

    /// The run's fiber starts or stops waiting on a durable wait; the driver is woken when
    /// too many wait in memory, to park the longest waiting.
    pub fn fiber_waiting(&self, run_id: &RunId, waiting: bool, now: Timestamp) {
        if self.liveness.fiber_waiting(run_id, waiting, now) {
            self.timers.driver_wake.notify_one();
        }
    }

    /// The context of a hook that runs outside the fiber (`on_escalate`,
    /// `on_alarm_exhausted`): the live run's cell, or, for a run not live in memory — an
    /// escalated run is finished and is not activated again for its hook — a cell of its own.
    pub fn hook_ctx(self: &Arc<Self>, run_id: &RunId, kind: &str) -> RawCtx {
        let cell = match self.registry.get(run_id) {
            Some(live) => live.cell,
            None => {
                // At the run's last boundary, as a live fiber's would be: what the hook
                // writes comes after every boundary, and a fork from one does not see it.
                let seq = super::stash_record::read(&self.store, run_id)
                    .ok()
                    .flatten()
                    .map_or(0, |stored| stored.record.seq);
                Arc::new(RunCell::new(
                    run_id,
                    kind,
                    self.config.durability,
                    self.config.fiber_keep_alive,
                    0,
                    seq,
                    None,
                ))
            }
        };
        RawCtx::new(self.clone(), cell, 0)
    }

    pub fn next_seq(&self, cell: &RunCell) -> u64 {
        cell.seq.fetch_add(1, Ordering::SeqCst) + 1
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

    /// A span of this run from `start` to now: under the fiber's attempt in a fiber,
    /// under the run's root in an event handler.
    pub fn span_since(&self, name: impl Into<std::borrow::Cow<'static, str>>, start: Timestamp) -> Ended<'_> {
        let parent = match self.in_fiber && self.attempt > 0 {
            true => Parent::Attempt(self.attempt),
            false => Parent::Root,
        };
        Ended::new(&self.cell.run_id, &self.cell.kind, name, parent).times(start, self.shared.now())
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

/// The agent kinds a runtime hosts, with their types erased to JSON, and the ways the kernel
/// and a feature below the runs layer have a run entered — re-activated, or started as a
/// child — or evicted.
pub(crate) struct Agents {
    pub kinds: HashMap<String, Arc<dyn ErasedAgent>>,
    /// Re-enters a run: activates it and lets its actor start or recover the fiber. The
    /// runtime points it at the runs layer (`run/actor.rs`) when it opens, so that a
    /// feature below that layer can have a run re-entered without importing it.
    pub reactivator: Reactivator,
    /// Starts a run as a start through the runtime does — durably, idempotent by its key,
    /// then activated — for a fiber starting a child (`Ctx::start_child`); pointed at the
    /// runs layer as `reactivator` is.
    pub starter: Starter,
    /// Evicts a run as its own task, for a crash hook or chaos at a boundary
    /// (`kernel/commit.rs`); pointed at `eviction/idle.rs` as `reactivator` is at the runs.
    pub evictor: Evictor,
}

/// See [`Agents::reactivator`].
pub(crate) type Reactivator = fn(Arc<Shared>, RunId, Stopwatch) -> BoxFuture<()>;

/// See [`Agents::starter`]: (kind, idempotency key, input JSON) → the run's id.
pub(crate) type Starter = fn(Arc<Shared>, String, String, String) -> BoxFuture<Result<RunId, RuntimeError>>;

/// See [`Agents::evictor`]: (run id, why).
pub(crate) type Evictor = fn(Arc<Shared>, RunId, &'static str) -> BoxFuture<()>;

impl Agents {
    pub fn agent(&self, kind: &str) -> Result<Arc<dyn ErasedAgent>, RuntimeError> {
        self.kinds.get(kind).cloned().ok_or_else(|| RuntimeError::UnknownKind { kind: kind.to_string() })
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
    pub created_at: Timestamp,
}

/// An agent with its types erased to JSON, so one runtime can host many kinds.
pub(crate) trait ErasedAgent: Send + Sync + 'static {
    /// Whether `input` is the agent's `Input`; why not otherwise.
    fn check_input(&self, input: &serde_json::Value) -> Result<(), serde_json::Error>;
    /// Whether `stored` decodes as the agent's `Stash`, upgraded when older, as a recovery
    /// would decode it; the reason it would escalate otherwise.
    fn check_stash(&self, stored: &super::stash_record::Stored) -> Result<(), AgentError>;
    fn check_message(&self, message_json: &str) -> Result<(), serde_json::Error>;
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
