//! The runtime: the public face of everything in this crate.
//!
//! `Runtime::builder(store)` registers agent kinds and opens the runtime; opening scans for
//! interrupted runs and re-activates them without waiting for a request. On the system clock
//! a driver task wakes at the next deadline (hibernation, eviction, heartbeat, recovery
//! backoff, alarm); on a virtual clock, `advance` walks the same deadlines in order.

use std::{
    collections::{BTreeSet, HashMap},
    marker::PhantomData,
    sync::{Arc, Mutex, atomic::Ordering},
    time::Duration,
};

use durafiber_store::{
    Store,
    tables::{
        self, AlarmRecord, ApprovalRecord, DeadLetter, Decision, LedgerEntry, RunOptions, RunRecord,
        RunStatus, StashRecord,
    },
};
use ractor::rpc::CallResult;
use serde::{Serialize, de::DeserializeOwned};

use crate::{
    agent::Agent,
    alarm,
    alarm::AlarmSpec,
    approval,
    approval::{ApproveOutcome, PendingApproval},
    clock::{Clock, Stopwatch, SystemClock, VirtualClock},
    config::RuntimeConfig,
    error::{LivenessViolation, RuntimeError},
    events::{Event, EventLog},
    eviction::idle,
    eviction::keep_alive::KeepAlive,
    json,
    kernel::activity::{Action, Liveness},
    kernel::inbox::RunMsg,
    kernel::registry::{LiveRun, Registry},
    kernel::shared::{CrashHook, ErasedAgent, Shared},
    limits,
    metrics::{Metrics, MetricsSnapshot},
    rng::SeededRng,
    run::activate::{activate, reactivate, reactivate_boxed},
    run::liveness,
    run::recovery,
    run::start::{self, StartOutcome},
    secret::Secrets,
    typed::Typed,
};

/// Sets up a runtime: its store, clock, configuration, secrets and agent kinds.
pub struct RuntimeBuilder {
    store: Store,
    clock: Arc<dyn Clock>,
    virtual_clock: Option<VirtualClock>,
    config: RuntimeConfig,
    kinds: HashMap<String, Arc<dyn ErasedAgent>>,
    secrets: Secrets,
    crash_hook: Option<CrashHook>,
    passive: bool,
}

impl RuntimeBuilder {
    /// Opens for inspection only: no recovery scan, no driver, no agent code runs. Reads,
    /// decisions and cancellations are durable and picked up by the next serving runtime.
    pub fn passive(mut self) -> Self {
        self.passive = true;
        self
    }

    /// Registers an agent kind under `A::KIND`.
    pub fn agent<A: Agent>(mut self, agent: A) -> Self {
        self.kinds.insert(A::KIND.to_string(), Arc::new(Typed::<A>(Arc::new(agent), PhantomData)));
        self
    }

    /// Replaces the default configuration.
    pub fn config(mut self, config: RuntimeConfig) -> Self {
        self.config = config;
        self
    }

    /// Runs on a virtual clock that moves only through [`Runtime::advance`].
    pub fn virtual_clock(mut self, clock: VirtualClock) -> Self {
        self.clock = Arc::new(clock.clone());
        self.virtual_clock = Some(clock);
        self
    }

    /// Where `Secret` pointers are resolved.
    pub fn secrets(mut self, secrets: Secrets) -> Self {
        self.secrets = secrets;
        self
    }

    /// Called at every named crash point; see [`CrashHook`].
    pub fn crash_hook(mut self, hook: CrashHook) -> Self {
        self.crash_hook = Some(hook);
        self
    }

    /// Opens the runtime: loads the alarm window, re-activates interrupted runs, starts the
    /// driver (system clock only).
    pub async fn open(self) -> Result<Runtime, RuntimeError> {
        self.config.validate()?;
        let seed = self.config.seed;
        let shared = Arc::new(Shared {
            reactivator: reactivate_boxed,
            store: self.store,
            clock: self.clock,
            liveness: Liveness::new(&self.config),
            config: self.config,
            kinds: self.kinds,
            registry: Registry::default(),
            scheduler: Default::default(),
            metrics: Metrics::default(),
            events: EventLog::default(),
            rng_jitter: Mutex::new(SeededRng::new(seed ^ 0x6a69_7474_6572)),
            rng_chaos: Mutex::new(SeededRng::new(seed ^ 0x0063_6861_6f73)),
            secrets: self.secrets,
            crash_hook: self.crash_hook,
            status_version: tokio::sync::watch::Sender::new(0),
            wakeups: Mutex::new(BTreeSet::new()),
            driver_wake: tokio::sync::Notify::new(),
            tracked: Mutex::new(Vec::new()),
            start_locks: (0..64).map(|_| tokio::sync::Mutex::new(())).collect(),
            run_locks: (0..64).map(|_| tokio::sync::Mutex::new(())).collect(),
            inbound_locks: (0..64).map(|_| tokio::sync::Mutex::new(())).collect(),
            opened: Stopwatch::start(),
            alarm_runtime_failures: std::sync::atomic::AtomicU32::new(0),
            shutting_down: std::sync::atomic::AtomicBool::new(false),
            closed: std::sync::atomic::AtomicBool::new(false),
            busy: tokio::sync::watch::Sender::new(0),
            woken: tokio::sync::watch::Sender::new(0),
            passive: self.passive,
        });
        if self.passive {
            return Ok(Runtime {
                shared,
                virtual_clock: self.virtual_clock,
                driver: Arc::new(Mutex::new(None)),
            });
        }
        shared.scheduler.refill(&shared.store)?;
        let interrupted = recovery::scan_and_reactivate(&shared).await?;
        tracing::info!(interrupted, "runtime open");
        let driver = match self.virtual_clock {
            Some(_) => None,
            None => Some(tokio::spawn(drive_system_clock(shared.clone()))),
        };
        Ok(Runtime { shared, virtual_clock: self.virtual_clock, driver: Arc::new(Mutex::new(driver)) })
    }
}

/// A durable runtime. Cheap to clone; every clone is the same runtime.
#[derive(Clone)]
pub struct Runtime {
    shared: Arc<Shared>,
    virtual_clock: Option<VirtualClock>,
    driver: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

/// Everything stored about a run, for inspection. Secrets are pointers by construction.
#[derive(Debug, Clone, Serialize)]
pub struct RunInspection {
    /// The run record.
    pub run: RunRecord,
    /// Its last stash.
    pub stash: Option<StashRecord>,
    /// Its ledger.
    pub ledger: Vec<LedgerEntry>,
    /// Its pending alarms.
    pub alarms: Vec<AlarmRecord>,
    /// Its approvals, pending and decided.
    pub approvals: Vec<ApprovalRecord>,
    /// Its abandoned alarms.
    pub dead_letters: Vec<DeadLetter>,
}

/// Which runs `list` returns.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Only runs in this state (`running`, `completed`, ...).
    pub state: Option<String>,
    /// Only runs of this kind.
    pub kind: Option<String>,
    /// Start after this run id (the previous page's `next`).
    pub after: Option<String>,
    /// Page size, at most [`limits::LIST_PAGE_MAX`].
    pub limit: usize,
}

/// One page of runs.
#[derive(Debug, Clone, Serialize)]
pub struct RunPage {
    /// The runs.
    pub runs: Vec<RunRecord>,
    /// Pass as `after` for the next page; `None` on the last one.
    pub next: Option<String>,
}

/// Every record of `table` that belongs to run `id`.
fn scan_all<T: DeserializeOwned>(
    store: &Store,
    table: tables::Table,
    id: &[u8],
) -> Result<Vec<T>, RuntimeError> {
    let mut out = Vec::new();
    for (_, record) in store.scan(table, &table.prefix_of(&[id]), None, usize::MAX)? {
        out.push(record?);
    }
    Ok(out)
}

/// One pass over every deadline due now. Returns the next deadline.
async fn tick(shared: &Arc<Shared>) -> Option<u64> {
    let now = shared.now_ms();
    let mut heartbeats = Vec::new();
    let actions = shared.liveness.due_actions(now, &shared.metrics, &mut heartbeats);
    heartbeats.sort();
    for run_id in heartbeats {
        shared.event(&run_id, "heartbeat", "keep-alive held");
    }
    for (run_id, action) in actions {
        let shared2 = shared.clone();
        shared.spawn_tracked(async move {
            match action {
                Action::Hibernate => idle::hibernate(&shared2, &run_id).await,
                Action::Evict => idle::evict(&shared2, &run_id, "idle without keep-alive").await,
            }
        });
    }
    let due: Vec<String> = {
        let mut wakeups = shared.wakeups.lock().unwrap_or_else(|p| p.into_inner());
        let later = wakeups.split_off(&(now + 1, String::new()));
        std::mem::replace(&mut *wakeups, later).into_iter().map(|(_, id)| id).collect()
    };
    for run_id in due {
        reactivate(shared, &run_id).await;
    }
    crate::run::alarm_delivery::start_due(shared);
    next_deadline(shared)
}

fn next_deadline(shared: &Shared) -> Option<u64> {
    let wake = shared.wakeups.lock().unwrap_or_else(|p| p.into_inner()).first().map(|(at, _)| *at);
    [shared.liveness.next_deadline_ms(), wake, shared.scheduler.next_due_ms()].into_iter().flatten().min()
}

async fn drive_system_clock(shared: Arc<Shared>) {
    loop {
        if shared.shutting_down.load(Ordering::SeqCst) {
            return;
        }
        let next = tick(&shared).await;
        let now = shared.now_ms();
        // Wake at least once a second, so a missed notification costs a second, not forever.
        let at = next.unwrap_or(u64::MAX).min(now + 1_000).max(now + 1);
        tokio::select! {
            () = shared.clock.sleep_until(at) => {}
            () = shared.driver_wake.notified() => {}
        }
    }
}

impl Runtime {
    /// Starts building a runtime over `store`, on the system clock, with default settings.
    pub fn builder(store: Store) -> RuntimeBuilder {
        RuntimeBuilder {
            store,
            clock: Arc::new(SystemClock),
            virtual_clock: None,
            config: RuntimeConfig::default(),
            kinds: HashMap::new(),
            secrets: Secrets::default(),
            crash_hook: None,
            passive: false,
        }
    }

    /// The store underneath.
    pub fn store(&self) -> &Store {
        &self.shared.store
    }

    /// The configuration in force.
    pub fn config(&self) -> &RuntimeConfig {
        &self.shared.config
    }

    /// The clock's time, ms.
    pub fn now_ms(&self) -> u64 {
        self.shared.now_ms()
    }

    /// Starts a run of agent `A` (§2): durable before anything runs; the same key and input
    /// return the same handle; the same key with another input is `KeyConflict`.
    pub async fn start<A: Agent>(&self, key: &str, input: &A::Input) -> Result<StartOutcome, RuntimeError> {
        let input_json = json::canonical(input).map_err(RuntimeError::InvalidInput)?;
        self.start_json(A::KIND, key, &input_json, RunOptions::default()).await
    }

    /// `start` with an untyped kind and JSON input, and per-run options.
    pub async fn start_json(
        &self,
        kind: &str,
        key: &str,
        input_json: &str,
        options: RunOptions,
    ) -> Result<StartOutcome, RuntimeError> {
        let outcome = start::start(&self.shared, kind, key, input_json, options).await?;
        if outcome.accepted || matches!(outcome.status, RunStatus::Accepted) {
            reactivate(&self.shared, &outcome.run_id).await;
        }
        Ok(outcome)
    }

    /// The run's current state.
    pub fn status(&self, run_id: &str) -> Result<RunStatus, RuntimeError> {
        Ok(self.shared.load_run(run_id)?.status)
    }

    /// The run record.
    pub fn run(&self, run_id: &str) -> Result<RunRecord, RuntimeError> {
        self.shared.load_run(run_id)
    }

    /// Waits until the run is terminal and returns its final state.
    pub async fn wait(&self, run_id: &str) -> Result<RunStatus, RuntimeError> {
        let mut changes = self.shared.status_version.subscribe();
        loop {
            let status = self.status(run_id)?;
            if status.is_terminal() {
                return Ok(status);
            }
            if changes.changed().await.is_err() {
                return Err(RuntimeError::ShuttingDown);
            }
        }
    }

    /// Waits until `pred` holds for the run's state (tests and tools; no polling by time).
    pub async fn wait_for(
        &self,
        run_id: &str,
        pred: impl Fn(&RunStatus) -> bool,
    ) -> Result<RunStatus, RuntimeError> {
        let mut changes = self.shared.status_version.subscribe();
        loop {
            let status = self.status(run_id)?;
            if pred(&status) {
                return Ok(status);
            }
            if changes.changed().await.is_err() {
                return Err(RuntimeError::ShuttingDown);
            }
        }
    }

    /// Lists runs, filtered and paged, in run-id order.
    pub fn list(&self, filter: &ListFilter) -> Result<RunPage, RuntimeError> {
        let limit = filter.limit.clamp(1, limits::LIST_PAGE_MAX);
        let after_key = filter.after.as_ref().map(|a| tables::RUNS.key(&[a.as_bytes()]));
        let mut after = after_key;
        let mut runs = Vec::new();
        loop {
            let page = self.shared.store.scan::<RunRecord>(
                tables::RUNS,
                &[tables::RUNS.prefix],
                after.as_deref(),
                limit,
            )?;
            let exhausted = page.len() < limit;
            for (key, run) in page {
                after = Some(key);
                let run = match run {
                    Ok(run) => run,
                    Err(e) => {
                        tracing::error!(error = %e, "unreadable run record skipped in list");
                        continue;
                    }
                };
                let state_ok = filter.state.as_deref().is_none_or(|s| s == run.status.name());
                let kind_ok = filter.kind.as_deref().is_none_or(|k| k == run.kind);
                if state_ok && kind_ok {
                    runs.push(run);
                    if runs.len() == limit {
                        let next = runs.last().map(|r| r.run_id.clone());
                        return Ok(RunPage { runs, next });
                    }
                }
            }
            if exhausted {
                return Ok(RunPage { runs, next: None });
            }
        }
    }

    /// Everything stored about a run.
    pub fn inspect(&self, run_id: &str) -> Result<RunInspection, RuntimeError> {
        let store = &self.shared.store;
        let run = self.shared.load_run(run_id)?;
        let id = run_id.as_bytes();
        Ok(RunInspection {
            stash: store.get(tables::STASHES, &tables::STASHES.key(&[id]))?,
            ledger: scan_all(store, tables::LEDGER, id)?,
            alarms: scan_all(store, tables::ALARMS, id)?,
            approvals: scan_all(store, tables::APPROVALS, id)?,
            dead_letters: scan_all(store, tables::DEAD_LETTERS, id)?,
            run,
        })
    }

    /// Asks a run to stop (§2.3). The fiber sees the signal; no new effect starts after it.
    /// A run that is not executing (waiting, or not live) is cancelled at once.
    pub async fn cancel(&self, run_id: &str, reason: &str) -> Result<RunStatus, RuntimeError> {
        let live = self.shared.registry.get(run_id);
        // A fiber parked on a durable wait (a human, an event, a durable sleep) is not
        // executing: the run is cancelled at once instead of waiting for the wait to end.
        let fiber_live = live.as_ref().is_some_and(|l| {
            l.cell.fiber_running()
                && l.cell.approval_waiter.lock().unwrap_or_else(|p| p.into_inner()).is_none()
                && l.cell.event_waiter.lock().unwrap_or_else(|p| p.into_inner()).is_none()
        });
        let written = self
            .shared
            .update_run(run_id, |run, batch| {
                if run.status.is_terminal() {
                    return Ok(false);
                }
                let fiber_live = fiber_live && !matches!(run.status, RunStatus::WaitingAlarm { .. });
                run.cancel_reason = Some(reason.to_string());
                if !fiber_live {
                    run.status = RunStatus::Cancelled { reason: reason.to_string() };
                    alarm::delete_all_in(&self.shared, run_id, batch)?;
                }
                Ok(true)
            })
            .await?;
        if let Some(run) = written {
            self.shared.event(run_id, "cancel_requested", reason.to_string());
            if let Some(live) = live {
                live.cell.cancel.send_replace(Some(reason.to_string()));
                if run.status.is_terminal() {
                    if let Some(fiber) = live.cell.fiber.lock().unwrap_or_else(|p| p.into_inner()).take() {
                        fiber.abort();
                    }
                    self.shared.liveness.fiber_ended(run_id, self.now_ms());
                }
            }
        }
        self.status(run_id)
    }

    /// Sends a typed message to a run; handled by `on_message`, one at a time.
    pub async fn send<A: Agent>(&self, run_id: &str, message: &A::Message) -> Result<(), RuntimeError> {
        let json = json::canonical(message).map_err(RuntimeError::InvalidInput)?;
        self.send_json(run_id, &json).await
    }

    /// `send` with a JSON message.
    pub async fn send_json(&self, run_id: &str, message_json: &str) -> Result<(), RuntimeError> {
        let live = self.inbound(run_id, message_json).await?;
        let json = message_json.to_string();
        match live.actor.call(|reply| RunMsg::Message { json, reply }, None).await {
            Ok(CallResult::Success(result)) => Ok(result?),
            _ => {
                Err(RuntimeError::Agent(crate::error::AgentError::Runtime("the run's actor stopped".into())))
            }
        }
    }

    /// Sends a typed request to a run and returns `on_request`'s reply, typed.
    pub async fn request<A: Agent, R: DeserializeOwned>(
        &self,
        run_id: &str,
        message: &A::Message,
    ) -> Result<R, RuntimeError> {
        let json = json::canonical(message).map_err(RuntimeError::InvalidInput)?;
        let reply = self.request_json(run_id, &json).await?;
        json::parse(&reply).map_err(|e| RuntimeError::Agent(crate::error::AgentError::Serialization(e)))
    }

    /// `request` with JSON in and out.
    pub async fn request_json(&self, run_id: &str, message_json: &str) -> Result<String, RuntimeError> {
        let live = self.inbound(run_id, message_json).await?;
        let json = message_json.to_string();
        match live.actor.call(|reply| RunMsg::Request { json, reply }, None).await {
            Ok(CallResult::Success(result)) => Ok(result?),
            _ => {
                Err(RuntimeError::Agent(crate::error::AgentError::Runtime("the run's actor stopped".into())))
            }
        }
    }

    /// Checks a message or request for a run and activates the run to take it.
    async fn inbound(&self, run_id: &str, message_json: &str) -> Result<LiveRun, RuntimeError> {
        if self.shared.passive {
            return Err(RuntimeError::InvalidInput(
                "messages need a serving runtime; this one only inspects".into(),
            ));
        }
        let run = self.shared.load_run(run_id)?;
        if run.status.is_terminal() {
            return Err(RuntimeError::RunFinished { run_id: run_id.into(), state: run.status.name().into() });
        }
        if message_json.len() > limits::PAYLOAD_BYTES_MAX {
            return Err(RuntimeError::InvalidInput("message is over the payload limit".into()));
        }
        self.shared.agent(&run.kind)?.check_message(message_json).map_err(RuntimeError::InvalidInput)?;
        let live = activate(&self.shared, run_id).await?;
        self.shared.liveness.activity(run_id, self.now_ms());
        Ok(live)
    }

    /// One page of a run's storage under `prefix`, in key order, after `start_after`: keys
    /// and values as JSON text. For inspection; the run itself reads `ctx.storage()`.
    pub fn storage_list(
        &self,
        run_id: &str,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, String)>, RuntimeError> {
        self.shared.load_run(run_id)?;
        crate::storage::list_json(&self.shared.store, run_id, prefix, start_after, limit)
    }

    /// Sends the external event `name` to a run (durably buffered, FIFO per name); a repeat
    /// with the same `idempotency_key` is a `Duplicate`, delivered once.
    pub async fn send_event<T: Serialize>(
        &self,
        run_id: &str,
        name: &str,
        payload: &T,
        idempotency_key: Option<&str>,
    ) -> Result<crate::event::SendOutcome, RuntimeError> {
        let json = json::canonical(payload).map_err(RuntimeError::InvalidInput)?;
        self.send_event_json(run_id, name, &json, idempotency_key).await
    }

    /// `send_event` with a JSON payload.
    pub async fn send_event_json(
        &self,
        run_id: &str,
        name: &str,
        payload_json: &str,
        idempotency_key: Option<&str>,
    ) -> Result<crate::event::SendOutcome, RuntimeError> {
        crate::event::send(&self.shared, run_id, name, payload_json, idempotency_key).await
    }

    /// Records a human's decision (§6.2). Accepted only for a pending pause with exactly this
    /// payload hash; the same decision twice is a no-op, a different one `AlreadyDecided`.
    pub async fn approve(
        &self,
        run_id: &str,
        approval_id: &str,
        payload_hash: &str,
        decision: Decision,
    ) -> Result<ApproveOutcome, RuntimeError> {
        approval::approve(&self.shared, run_id, approval_id, payload_hash, decision).await
    }

    /// Pending approvals, with the payload the run showed and its hash; of one run or all.
    pub fn pending_approvals(&self, run_id: Option<&str>) -> Result<Vec<PendingApproval>, RuntimeError> {
        approval::pending(&self.shared, run_id)
    }

    /// Sets (or replaces) a run's alarm from outside. Refused with `StorageFull` while the
    /// disk is below its reserve.
    pub async fn set_alarm(&self, run_id: &str, name: &str, spec: AlarmSpec) -> Result<(), RuntimeError> {
        self.shared.store.check_room()?;
        alarm::set(&self.shared, run_id, name, spec, None, None).await
    }

    /// Cancels a run's alarm; true when it existed.
    pub async fn cancel_alarm(&self, run_id: &str, name: &str) -> Result<bool, RuntimeError> {
        alarm::cancel(&self.shared, run_id, name).await
    }

    /// A run's pending alarms.
    pub fn alarms(&self, run_id: &str) -> Result<Vec<AlarmRecord>, RuntimeError> {
        self.shared.load_run(run_id)?;
        alarm::list(&self.shared, run_id)
    }

    /// Holds `run_id` live (activating it) until the guard is released or dropped.
    pub async fn keep_alive(&self, run_id: &str) -> Result<KeepAlive, RuntimeError> {
        activate(&self.shared, run_id).await?;
        Ok(KeepAlive::acquire(self.shared.clone(), run_id))
    }

    /// Hibernates a run now, if it is hibernateable.
    pub async fn hibernate(&self, run_id: &str) {
        idle::hibernate(&self.shared, run_id).await
    }

    /// Evicts a run now, wherever it is.
    pub async fn evict(&self, run_id: &str) {
        idle::evict(&self.shared, run_id, "forced").await
    }

    /// Whether the run has a live actor.
    pub async fn is_live(&self, run_id: &str) -> bool {
        self.shared.registry.get(run_id).is_some()
    }

    /// Number of live actors.
    pub async fn live_count(&self) -> usize {
        self.shared.registry.len()
    }

    /// Counters and histograms.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.shared.metrics.snapshot()
    }

    /// The in-memory event log, oldest first.
    pub fn events(&self) -> Vec<Event> {
        self.shared.events.snapshot()
    }

    /// Alarms the scheduler holds in memory (bounded whatever the number pending).
    pub fn alarm_window_len(&self) -> usize {
        self.shared.scheduler.window_len()
    }

    /// Waits until the runtime is quiet: the work the supervisor and scheduler started is
    /// done, and every fiber is parked (on the clock, a human, or cancellation) or finished.
    /// On a virtual clock, a fiber must wait only through its `Ctx`, or this waits for it.
    pub async fn settle(&self) {
        let mut busy = self.shared.busy.subscribe();
        let mut handed = self.shared.woken.subscribe();
        loop {
            if let Some(clock) = &self.virtual_clock {
                clock.woken_resumed().await;
            }
            if handed.wait_for(|n| *n == 0).await.is_err() {
                return;
            }
            let handles: Vec<_> =
                std::mem::take(&mut *self.shared.tracked.lock().unwrap_or_else(|p| p.into_inner()));
            for h in handles {
                let _ = h.await;
            }
            if busy.wait_for(|n| *n == 0).await.is_err() {
                return;
            }
            tokio::task::yield_now().await;
            let quiet = *busy.borrow() == 0
                && self.shared.tracked.lock().unwrap_or_else(|p| p.into_inner()).is_empty();
            if quiet {
                return;
            }
        }
    }

    /// Moves the virtual clock forward by `d`, handling every deadline on the way in order.
    pub async fn advance(&self, d: Duration) -> Result<(), RuntimeError> {
        let clock = self.virtual_clock.as_ref().ok_or(RuntimeError::NotVirtual)?;
        let target = clock.now_ms() + d.as_millis() as u64;
        self.settle().await;
        // Bounded: each step handles at least one deadline, and deadlines are finite.
        for _ in 0..1_000_000 {
            let runtime_next = next_deadline(&self.shared).filter(|at| *at > clock.now_ms());
            let due_now = next_deadline(&self.shared).is_some_and(|at| at <= clock.now_ms());
            if due_now {
                tick(&self.shared).await;
                self.settle().await;
                continue;
            }
            let next = [runtime_next, clock.next_wake_ms()].into_iter().flatten().min();
            match next {
                Some(at) if at <= target => {
                    clock.set(at);
                    tick(&self.shared).await;
                    self.settle().await;
                }
                _ => break,
            }
        }
        clock.set(target);
        tick(&self.shared).await;
        self.settle().await;
        let violations = self.check_liveness()?;
        if !violations.is_empty() {
            return Err(RuntimeError::LivenessViolation { violations });
        }
        Ok(())
    }

    /// Every open run that breaks the liveness rule (§3.7): neither live with a fiber, nor
    /// parked on a durable wait (an approval, an alarm), nor holding a wake at a known time.
    /// Cheap: one pass over the open runs. On a virtual clock, [`Runtime::advance`] checks it
    /// after every call and fails with [`RuntimeError::LivenessViolation`].
    pub fn check_liveness(&self) -> Result<Vec<LivenessViolation>, RuntimeError> {
        liveness::check(&self.shared)
    }

    /// Stops the driver and every actor, then makes the store durable. Runs stay as stored:
    /// a run that was executing is recovered by the next runtime, as after a deploy.
    pub async fn shutdown(&self) {
        self.shared.shutting_down.store(true, Ordering::SeqCst);
        self.shared.driver_wake.notify_one();
        if let Some(driver) = self.driver.lock().unwrap_or_else(|p| p.into_inner()).take() {
            driver.abort();
        }
        for run_id in self.shared.registry.run_ids() {
            if let Some(live) = self.shared.registry.remove(&run_id) {
                if let Some(fiber) = live.cell.fiber.lock().unwrap_or_else(|p| p.into_inner()).take() {
                    fiber.abort();
                }
                let _ = live.actor.kill_and_wait(None).await;
                // A deploy is an interruption the runtime chose: a recovery it cut short is
                // not a failed one (§3.6).
                idle::give_back_recovery(&self.shared, &live.cell, None).await;
            }
        }
        let _ = self.shared.store.barrier().await;
        self.shared.closed.store(true, Ordering::SeqCst);
    }

    /// Runs re-activated at open, for recovery benchmarks: the time since open, µs.
    pub fn since_open_us(&self) -> u64 {
        self.shared.opened.elapsed_us()
    }

    /// Decodes a run's output once it is `Completed`.
    pub fn output<T: DeserializeOwned>(&self, run_id: &str) -> Result<Option<T>, RuntimeError> {
        match self.status(run_id)? {
            RunStatus::Completed { output_json } => {
                Ok(Some(json::parse(&output_json).map_err(RuntimeError::InvalidInput)?))
            }
            _ => Ok(None),
        }
    }
}
