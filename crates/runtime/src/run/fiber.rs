//! Fibers: a run's unit of execution. Activation decides whether a run needs one and
//! registers it durably (state `Running`, attempt counted) before user code runs, from the
//! one read of the run it makes; the fiber's end is one boundary (output, final stash,
//! status).
//!
//! Before: `actor.rs` (a cold start decides here) or the actor's `Activate`. After:
//! `agent/` (`Ctx`) for what user code calls, `fiber_end.rs` for the attempt's end.

use durafiber_store::RunId;
use std::time::Duration;
use std::{
    panic::AssertUnwindSafe,
    sync::{Arc, atomic::Ordering},
};

use durafiber_store::{
    Batch, StoreError,
    tables::{self, RunStatus, keys},
};
use futures::FutureExt;
use tracing::Instrument;

use crate::{
    budget::Budgets,
    clock::Stopwatch,
    error::{AgentError, RuntimeError, panic_text},
    escalation::escalate,
    kernel::busy::BusyGuard,
    kernel::cell::RunCell,
    kernel::hook_gate::HookPermit,
    kernel::inbox::{Activation, FiberMode, Registered},
    kernel::stash_record::StashRead,
    kernel::{
        run_writes::LockedRun,
        shared::{BoxFuture, RawCtx, RawRecovered, Shared},
    },
    limits,
    metrics::Metrics,
    run::attempt_span::AttemptSpan,
    run::fiber_end::{self, FiberResult},
    run::recovery::{self, Plan},
    trace,
};

/// Starts or recovers the fiber if the run needs one. Runs inside the actor, so one at a time.
/// `since` is when the runtime decided to re-enter the run: the start of recovery latency.
/// `decided` is what a cold activation decided from its read of the run; without it the
/// run is read here.
pub(crate) async fn on_activate(
    shared: &Arc<Shared>,
    cell: &Arc<RunCell>,
    since: Stopwatch,
    decided: Option<Activation>,
) {
    if cell.fiber_running() {
        return;
    }
    let decided = match decided {
        Some(decided) => decided,
        None => decide_now(shared, cell).await,
    };
    if let Some(Activation::Escalate(reason)) = begin(shared, cell, since, decided)
        && let Err(e) = escalate(shared, &cell.run_id, &reason, Batch::new()).await
    {
        tracing::error!(run_id = %cell.run_id, error = %e, "could not escalate; retrying in 1 s");
        shared.timers.wake_at(shared.now().saturating_add(Duration::from_secs(1)), &cell.run_id);
    }
}

/// Carries out, without the run's actor, what a cold activation decided: the fiber starts,
/// or the run is woken later. An escalation runs hooks, which the actor runs one event at a
/// time: it is handed back, for the actor.
pub(crate) fn begin(
    shared: &Arc<Shared>,
    cell: &Arc<RunCell>,
    since: Stopwatch,
    decided: Activation,
) -> Option<Activation> {
    match decided {
        Activation::Start(registered) => spawn(shared, cell, registered, since, Tracker::Tell),
        Activation::Later(at_ms) => shared.timers.wake_at(at_ms, &cell.run_id),
        Activation::Nothing => {}
        escalate @ Activation::Escalate(_) => return Some(escalate),
    }
    None
}

/// Reads the run under its lock and decides (see [`decide`]).
async fn decide_now(shared: &Arc<Shared>, cell: &RunCell) -> Activation {
    match shared.lock_run(&cell.run_id).await {
        Ok(mut locked) => {
            let stash = match locked.run.status {
                RunStatus::Running => read_stash(shared, &cell.run_id),
                _ => Ok(None),
            };
            decide(shared, cell, &mut locked, stash).await
        }
        Err(RuntimeError::ShuttingDown) => Activation::Nothing,
        Err(e @ RuntimeError::Store(StoreError::Corrupt { .. } | StoreError::UnknownVersion { .. })) => {
            // Unreadable bytes stay unreadable: the corruption path reports the run.
            tracing::error!(run_id = %cell.run_id, error = %e, "cannot read the run to activate it");
            Activation::Nothing
        }
        Err(e) => {
            // The store may answer in a second: never leave the run behind.
            tracing::error!(run_id = %cell.run_id, error = %e, "cannot read the run to activate it; retrying in 1 s");
            Activation::Later(shared.now().saturating_add(Duration::from_secs(1)))
        }
    }
}

/// The run's last stash; an error (a corrupt record) is kept for the recovery to escalate.
pub(crate) fn read_stash(shared: &Shared, run_id: &RunId) -> StashRead {
    crate::kernel::stash_record::read(&shared.store, run_id)
}

/// Decides what a run without a live fiber needs (`recovery::plan`) and, when a fiber is to
/// run, writes its registration boundary from the record `locked` already holds: `Running`,
/// attempt counted, a recovery counted and backed off — before any user code runs (§1, §3.6).
pub(crate) async fn decide(
    shared: &Shared,
    cell: &RunCell,
    locked: &mut LockedRun<'_>,
    stash: StashRead,
) -> Activation {
    if shared.check_not_evicted(cell).is_err() {
        return Activation::Nothing;
    }
    let mut batch = Batch::new();
    let (mode, hook) = match register(shared, &mut locked.run, &Budgets::Unknown, &mut batch) {
        Ok(registration) => registration,
        Err(other) => return other,
    };
    match shared.write_locked(locked, batch).await {
        Ok(()) => registered(cell, Box::new(Registered { run: locked.run.clone(), mode, stash, hook })),
        Err(RuntimeError::ShuttingDown | RuntimeError::Evicted { .. }) => Activation::Nothing,
        Err(e) => {
            tracing::error!(run_id = %cell.run_id, error = %e, "could not register the fiber; retrying in 1 s");
            Activation::Later(shared.now().saturating_add(Duration::from_secs(1)))
        }
    }
}

/// What a run without a live fiber needs (`recovery::plan`). When a fiber is to run, `run`
/// is changed into its registration — `Running`, attempt counted, a recovery counted and
/// backed off — for the caller to write, with what `batch` gained, before any user code
/// runs; otherwise `run` is left as it was and the decision comes back as the error.
///
/// A recovery takes its place at the hook gate here (`kernel/hook_gate.rs`): a suspect — a
/// run whose last recovery made no progress — is recovered alone, its probe counted in
/// `batch`; while the gate holds a recovery back, it is asked again shortly.
pub(crate) fn register(
    shared: &Shared,
    run: &mut tables::RunRecord,
    budgets: &Budgets,
    batch: &mut Batch,
) -> Result<(FiberMode, Option<HookPermit>), Activation> {
    let mode = match recovery::plan(shared, run, budgets) {
        Plan::Fresh => FiberMode::Fresh,
        Plan::Recover(reason) => FiberMode::Recover(reason),
        Plan::Later(at) => return Err(Activation::Later(at)),
        Plan::Escalate(reason) => return Err(Activation::Escalate(reason)),
        Plan::Nothing => return Err(Activation::Nothing),
    };
    let mut hook = None;
    if let FiberMode::Recover(_) = mode {
        let now = shared.now();
        let suspect = run.recover_attempts > 0;
        let permit = match suspect {
            true => shared.controls.hook_gate.try_probe(now),
            false => shared.controls.hook_gate.try_hook(now),
        };
        let Some(permit) = permit else {
            return Err(Activation::Later(now.saturating_add(limits::HOOK_GATE_RETRY)));
        };
        if permit.is_probe() {
            let deaths = recovery::probe_deaths(shared, &run.run_id).unwrap_or(0);
            let key = keys::hook_probe(&run.run_id);
            if let Err(e) = batch.put(key, &deaths.saturating_add(1)) {
                tracing::error!(run_id = %run.run_id, error = %e, "could not count the probe; retrying in 1 s");
                return Err(Activation::Later(now.saturating_add(Duration::from_secs(1))));
            }
        }
        hook = Some(permit);
        // Counted before the hook runs, so a hook that kills the process is counted too;
        // progress or an interruption the runtime causes gives it back.
        run.recover_attempts = run.recover_attempts.saturating_add(1);
        run.next_recover_at_ms = now.saturating_add(recovery::backoff(run.recover_attempts));
    }
    run.attempt = run.attempt.saturating_add(1);
    run.status = RunStatus::Running;
    run.wake_reason = None;
    Ok((mode, hook))
}

/// A registration that is durable now, as the fiber to start.
pub(crate) fn registered(cell: &RunCell, registered: Box<Registered>) -> Activation {
    Activation::Start(onto_cell(cell, registered))
}

/// Puts what a durable registration decided for the run's live side into its cell.
fn onto_cell(cell: &RunCell, mut registered: Box<Registered>) -> Box<Registered> {
    cell.task.recovering.store(matches!(registered.mode, FiberMode::Recover(_)), Ordering::SeqCst);
    cell.attempt.store(registered.run.attempt, Ordering::SeqCst);
    *cell.task.hook.lock() = registered.hook.take();
    registered
}

/// Starts the fiber of a registration made durable in a recovery's batch, whose activation
/// told the activity tracker that the fiber runs (`actor::activated`).
pub(crate) fn start_registered(
    shared: &Arc<Shared>,
    cell: &Arc<RunCell>,
    registered: Box<Registered>,
    since: Stopwatch,
) {
    spawn(shared, cell, onto_cell(cell, registered), since, Tracker::Told);
}

/// Whether a fiber's start is still to be told to the activity tracker.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tracker {
    Tell,
    Told,
}

fn spawn(
    shared: &Arc<Shared>,
    cell: &Arc<RunCell>,
    registered: Box<Registered>,
    since: Stopwatch,
    tracker: Tracker,
) {
    // The slot stays locked until it holds the task, so the task's own clearing (its last
    // step) can never run before the slot is filled.
    let mut slot = cell.task.fiber.lock();
    if tracker == Tracker::Tell {
        shared.liveness.fiber_started(&cell.run_id, cell.fiber_keep_alive, shared.now());
    }
    let task = tokio::spawn(drive(shared.clone(), cell.clone(), registered, since, shared.life.busy()));
    *slot = Some(task.abort_handle());
}

/// The fiber's task: its attempt, in the run's span. Not async itself, so that what it is
/// handed is held once, by the attempt.
fn drive(
    shared: Arc<Shared>,
    cell: Arc<RunCell>,
    registered: Box<Registered>,
    since: Stopwatch,
    busy: BusyGuard,
) -> impl Future<Output = ()> + Send + 'static {
    let span = tracing::info_span!(
        "fiber",
        run_id = %cell.run_id,
        kind = %cell.kind,
        attempt = registered.run.attempt,
        trace_id = tracing::field::Empty,
    );
    // Its log lines name the run's trace, when there is one to look up.
    if shared.obs.traces.is_on() {
        span.record("trace_id", tracing::field::display(trace::trace_id(&cell.run_id)));
    }
    attempt(shared, cell, registered, since, busy).instrument(span)
}

/// A fiber's attempt. What it holds while the agent's code runs is what every live fiber
/// costs beside the agent's own future, a million waiting fibers a million times: the
/// kernel's handles, the attempt's span and the agent's boxed future. Its entry and its end
/// run once each and are boxed, so their larger state is held only while they run. A block
/// rather than an async fn, which would hold its arguments twice; the entry's early end is
/// boxed, so the entry's result it holds while the agent's future runs is two pointers. Its
/// task fits tokio's 256-byte cell.
#[expect(clippy::manual_async_fn, reason = "an async fn holds its arguments twice")]
fn attempt(
    shared: Arc<Shared>,
    cell: Arc<RunCell>,
    registered: Box<Registered>,
    since: Stopwatch,
    busy: BusyGuard,
) -> impl Future<Output = ()> + Send + 'static {
    async move {
        let mode = registered.mode;
        let run = &registered.run;
        // Boxed: spans are off unless traces are exported, and the attempt holds it throughout.
        let attempt_span =
            AttemptSpan::start(&shared, &cell, run.attempt, mode, run.recover_attempts).map(Box::new);
        let result = match Box::pin(entered(&shared, &cell, registered, since)).await {
            Ok(future) => {
                AssertUnwindSafe(future).catch_unwind().await.map_err(|p| fiber_end::Panicked(panic_text(p)))
            }
            Err(end) => *end,
        };
        Box::pin(fiber_end::ended(&shared, &cell, mode, attempt_span, result, busy)).await;
    }
}

/// The agent's future for the fiber, once an operator's pause lets it start; or the
/// attempt's end, when it cannot (a pause it was cancelled in, input that does not decode,
/// a panic while the future was made), boxed: the attempt holds it while it ends.
async fn entered(
    shared: &Arc<Shared>,
    cell: &Arc<RunCell>,
    registered: Box<Registered>,
    since: Stopwatch,
) -> Result<BoxFuture<Result<String, AgentError>>, Box<FiberResult>> {
    let mut raw = RawCtx::new(shared.clone(), cell.clone(), registered.run.attempt);
    raw.in_fiber = true;
    // A fiber enters at its last stash, and so stands in its stream at that stash's mark:
    // what an earlier attempt in this cell knew is read again.
    *cell.output.stream.lock() = None;
    // An operator's pause holds a run before its fiber's first step.
    if let Err(e) = crate::pause::gate(&raw).await {
        return Err(Box::new(Ok(Err(e))));
    }
    // Making the future runs user code too (decoding the input and stash, upgrading an old
    // stash): a panic there is the fiber's, as one inside it is.
    match std::panic::catch_unwind(AssertUnwindSafe(|| enter(shared, raw, *registered, since))) {
        Ok(Ok(future)) => Ok(future),
        Ok(Err(e)) => Err(Box::new(Ok(Err(e)))),
        Err(panic) => Err(Box::new(Err(fiber_end::Panicked(panic_text(panic))))),
    }
}

/// The agent's future for a registered fiber: `run_fiber`, or `on_fiber_recovered` with the
/// stash. Not async, so that nothing of the registration stays in the fiber's task while
/// the agent's code runs.
fn enter(
    shared: &Arc<Shared>,
    raw: RawCtx,
    registered: Registered,
    since: Stopwatch,
) -> Result<BoxFuture<Result<String, AgentError>>, AgentError> {
    let Registered { run, mode, stash, .. } = registered;
    let agent = shared.agents.agent(&run.kind).map_err(|e| AgentError::escalate(e.to_string()))?;
    Ok(match mode {
        FiberMode::Fresh => agent.run_fiber(raw, run.input_json),
        FiberMode::Recover(reason) => {
            let stash = stash.map_err(|e| AgentError::escalate(format!("corrupt: {e}")))?;
            Metrics::bump(&shared.obs.metrics.recoveries);
            shared.obs.metrics.recover_latency.record_us(since.elapsed_us());
            shared.event(&run.run_id, "recovered", format!("reason {reason:?}, attempt {}", run.attempt));
            agent.recover(
                raw,
                RawRecovered {
                    run_id: run.run_id,
                    kind: run.kind,
                    stash,
                    input_json: run.input_json,
                    attempt: run.attempt,
                    reason,
                    created_at: run.created_at_ms,
                },
            )
        }
    })
}
