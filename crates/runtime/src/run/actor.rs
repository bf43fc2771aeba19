//! A run's actor: how a run is activated and what its actor handles.
//!
//! Activation is the only code that makes a run live. A cold start reads the run from the
//! store once, under its lock, builds the cell from that read, decides and registers the
//! fiber (`fiber::decide`), starts it, and puts the run in the registry. The run's actor is
//! spawned by the first inbound event that needs it (`actor_of`) and stops once it has been
//! idle for `limits::ACTOR_IDLE_GRACE` (`Mailbox::retire_if_idle`). Features below the runs
//! layer that need a run re-entered call `Shared::reactivate`, which the runtime points here
//! when it opens.
//!
//! The actor handles one inbound event at a time; its state is the run's cell. The fiber is
//! a task of its own (`fiber.rs`), so messages and alarms are handled while it awaits; the
//! eviction that kills the actor aborts that task. Before: `start`, an alarm, a decision,
//! an event or a recovery asks for a run. After: `fiber.rs`, `alarm_delivery.rs`.

use durafiber_store::RunId;
use std::time::Duration;
use std::{panic::AssertUnwindSafe, sync::Arc};

use durafiber_store::tables::RunRecord;
use futures::FutureExt;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::Instrument;

use crate::trace;
use crate::{
    clock::{self, Stopwatch},
    config::DurabilityMode,
    error::{AgentError, RuntimeError, panic_text},
    hooks::AlarmEvent,
    kernel::cell::RunCell,
    kernel::inbox::{Activation, RunMsg},
    kernel::registry::LiveRun,
    kernel::shared::{BoxFuture, RawCtx, Shared},
    kernel::stash_record::StashRead,
    limits,
    metrics::Metrics,
    run::fiber,
};

/// The live run, activating it (a cold start) when it has none; `true` for a cold start. A
/// cold start reads the run once, under its lock, and from that read builds the cell and —
/// unless the runtime is passive — decides and registers the fiber and starts it. Only then
/// does the run appear in the registry. No actor is spawned: the first inbound event that
/// needs one does.
async fn live_or_spawn(
    shared: &Arc<Shared>,
    run_id: &RunId,
    since: Stopwatch,
) -> Result<(LiveRun, bool), RuntimeError> {
    let registry = &shared.registry;
    if let Some(run) = registry.get(run_id) {
        return Ok((run, false));
    }
    let _one_at_a_time = registry.transition(run_id).await;
    if let Some(run) = registry.get(run_id) {
        return Ok((run, false));
    }
    let _activating = shared.life.activating()?;
    // Another node runs the runs of shards this one does not own.
    shared.ownership.check(run_id)?;
    // Virtual time waits for the registration write.
    let _busy = shared.life.busy();
    let watch = Stopwatch::start();
    let mut locked = shared.lock_run(run_id).await?;
    let stash = fiber::read_stash(shared, run_id);
    let entry = LiveRun::new(new_cell(shared, &locked.run, &stash)?);
    activated(shared, &locked.run, &watch, None);
    if !shared.life.passive {
        let decided = fiber::decide(shared, &entry.cell, &mut locked, stash).await;
        drop(locked);
        begin(shared, &entry, since, decided).await;
    }
    registry.insert(entry.clone());
    Ok((entry, true))
}

/// The in-memory side of `run` as activation read it, with its last stash.
pub(crate) fn new_cell(
    shared: &Shared,
    run: &RunRecord,
    stash: &StashRead,
) -> Result<Arc<RunCell>, RuntimeError> {
    let durability = match &run.options.durability {
        Some(mode) => DurabilityMode::parse(mode)?,
        None => shared.config.durability,
    };
    let seq = stash.as_ref().ok().and_then(|s| s.as_ref()).map(|s| s.record.seq).unwrap_or(0);
    let cell = RunCell::new(
        &run.run_id,
        &run.kind,
        durability,
        run.options.fiber_keep_alive.unwrap_or(shared.config.fiber_keep_alive),
        run.attempt,
        seq,
        run.cancel_reason.clone(),
    );
    Ok(Arc::new(if crate::kernel::lineage::may_have_parent(&run.key) { cell } else { cell.without_parent() }))
}

/// A cold start told to the activity tracker, the metrics and the event log. Logged before
/// the fiber can start, so the event log's order does not depend on which task the
/// scheduler runs first. `fiber` is the keep-alive of a fiber started with the activation
/// ([`fiber::start_registered`]), which the tracker is told of here.
pub(crate) fn activated(shared: &Shared, run: &RunRecord, watch: &Stopwatch, fiber: Option<bool>) {
    let now_ms = shared.now();
    let stream = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (&run.kind, &run.key, now_ms).hash(&mut h);
        h.finish()
    };
    shared.liveness.activated(&run.run_id, now_ms, stream, fiber);
    Metrics::bump(&shared.obs.metrics.activations);
    shared.obs.metrics.cold_start.record_us(watch.elapsed_us());
    shared.event(&run.run_id, "activated", format!("cold start {} µs", watch.elapsed_us()));
}

/// Carries out what a cold start decided. What needs no actor is done here; an escalation
/// runs hooks, one event at a time, in the actor. Either way before the caller puts the run
/// in the registry, so no `Activate` of another caller can come first, see a registered run
/// without a fiber, and take it for an interrupted one.
pub(crate) async fn begin(shared: &Arc<Shared>, live: &LiveRun, since: Stopwatch, decided: Activation) {
    if let Some(for_actor) = fiber::begin(shared, &live.cell, since, decided) {
        send_activate(shared, live, &live.cell.run_id, since, Some(for_actor)).await;
    }
}

/// Activates `run_id` (a cold start when it is not live). A cold start also starts or
/// recovers the fiber, whatever event caused it: an alarm, a message, a decision or a
/// keep-alive finds an interrupted run and re-enters it (§3.4).
pub(crate) async fn activate(shared: &Arc<Shared>, run_id: &RunId) -> Result<LiveRun, RuntimeError> {
    let (live, _cold) = live_or_spawn(shared, run_id, Stopwatch::start()).await?;
    Ok(live)
}

/// The live run's actor, spawned at its first need (see [`Mailbox`](crate::kernel::mailbox::Mailbox)).
/// An error when the run left memory meanwhile, as when its actor stopped.
pub(crate) async fn actor_of(shared: &Arc<Shared>, live: &LiveRun) -> Result<ActorRef<RunMsg>, RuntimeError> {
    let spawn = async {
        let actor = RunActor { shared: shared.clone() };
        Actor::spawn(None, actor, live.cell.clone())
            .await
            .map(|(actor, _join)| actor)
            .map_err(|e| RuntimeError::Agent(AgentError::Runtime(format!("spawn: {e}"))))
    };
    live.mailbox()
        .actor(spawn)
        .await?
        .ok_or_else(|| RuntimeError::Agent(AgentError::Runtime("the run's actor stopped".into())))
}

async fn send_activate(
    shared: &Arc<Shared>,
    live: &LiveRun,
    run_id: &RunId,
    since: Stopwatch,
    decided: Option<Activation>,
) {
    let sent = match actor_of(shared, live).await {
        Ok(actor) => actor.cast(RunMsg::Activate { busy: shared.life.busy(), since, decided }).is_ok(),
        Err(_) => false,
    };
    if !sent {
        tracing::warn!(%run_id, "actor stopped before activation; retrying");
        shared.timers.wake_at(shared.now(), run_id);
    }
}

/// Activates `run_id` and starts or recovers its fiber: at a cold start itself, for a live
/// run through its actor.
pub(crate) async fn reactivate(shared: &Arc<Shared>, run_id: &RunId) {
    reactivate_since(shared, run_id, Stopwatch::start()).await;
}

/// `reactivate`, with recovery latency counted from `since`.
pub(crate) async fn reactivate_since(shared: &Arc<Shared>, run_id: &RunId, since: Stopwatch) {
    if shared.life.passive {
        return;
    }
    match live_or_spawn(shared, run_id, since).await {
        Ok((live, cold)) => {
            shared.liveness.activity(run_id, shared.now());
            if !cold {
                send_activate(shared, &live, run_id, since, None).await;
            }
        }
        Err(RuntimeError::ShuttingDown | RuntimeError::UnknownRun { .. } | RuntimeError::NotOwner { .. }) => {
        }
        Err(e) => {
            // Never leave the run behind: a store that failed now may answer in a second.
            tracing::error!(%run_id, error = %e, "could not activate the run; retrying in 1 s");
            shared.timers.wake_at(shared.now().saturating_add(Duration::from_secs(1)), run_id);
        }
    }
}

/// `reactivate_since` as the kernel holds it ([`Shared::reactivate`]), so that features below
/// the runs can have a run re-entered without importing this module.
pub(crate) fn reactivate_boxed(shared: Arc<Shared>, run_id: RunId, since: Stopwatch) -> BoxFuture<()> {
    Box::pin(async move { reactivate_since(&shared, &run_id, since).await })
}

/// A live run's actor. It fills the slot of its cell's mailbox: it reports each event
/// handled there, and stops once it has been idle for the grace.
pub(crate) struct RunActor {
    pub shared: Arc<Shared>,
}

impl Actor for RunActor {
    type Msg = RunMsg;
    type State = Arc<RunCell>;
    type Arguments = Arc<RunCell>;

    async fn pre_start(
        &self,
        _me: ActorRef<RunMsg>,
        cell: Arc<RunCell>,
    ) -> Result<Arc<RunCell>, ActorProcessingErr> {
        Ok(cell)
    }

    async fn handle(
        &self,
        me: ActorRef<RunMsg>,
        msg: RunMsg,
        cell: &mut Arc<RunCell>,
    ) -> Result<(), ActorProcessingErr> {
        let attempt = cell.attempt.load(std::sync::atomic::Ordering::SeqCst);
        let span = tracing::info_span!(
            "run_event",
            run_id = %cell.run_id,
            kind = %cell.kind,
            attempt,
            trace_id = tracing::field::Empty,
        );
        if self.shared.obs.traces.is_on() {
            span.record("trace_id", tracing::field::display(trace::trace_id(&cell.run_id)));
        }
        let started_ms = self.shared.now();
        let cause = match &msg {
            RunMsg::Activate { .. } => "activate",
            RunMsg::Message { .. } => "message",
            RunMsg::Request { .. } => "request",
            RunMsg::Alarm { .. } => "alarm",
        };
        // Each event's work is boxed: the actor's task reserves room for `handle`'s future
        // from its spawn, and the largest event's state would otherwise be allocated with
        // every actor (about 2 KB each, in `bench alarms`' burst of fresh actors).
        match msg {
            RunMsg::Activate { busy, since, decided } => {
                Box::pin(fiber::on_activate(&self.shared, cell, since, decided).instrument(span)).await;
                drop(busy);
            }
            RunMsg::Message { json, reply } => {
                let result = Box::pin(self.on_message(cell, json).instrument(span)).await;
                let _ = reply.send(result);
            }
            RunMsg::Request { json, reply } => {
                let result = Box::pin(self.on_request(cell, json).instrument(span)).await;
                let _ = reply.send(result);
            }
            RunMsg::Alarm { event, reply } => {
                let result = Box::pin(self.on_alarm(cell, event).instrument(span)).await;
                let _ = reply.send(result);
            }
        }
        self.shared.obs.span(|| {
            trace::Ended::new(&cell.run_id, &cell.kind, "activation", trace::Parent::Root)
                .times(started_ms, self.shared.now())
                .attr("durafiber.activation.cause", cause)
                .attr("durafiber.attempt", i64::from(attempt))
        });
        if let Some(mark) = cell.mailbox().handled() {
            let cell = cell.clone();
            // Not tracked: it changes no run state, and once the run's mailbox is closed it
            // finds nothing to stop.
            tokio::spawn(async move {
                tokio::time::sleep(limits::ACTOR_IDLE_GRACE).await;
                if cell.mailbox().retire_if_idle(me.get_id(), mark).await {
                    tracing::trace!(run_id = %cell.run_id, "the run's actor was idle for its grace; it stops");
                    me.stop(None);
                }
            });
        }
        Ok(())
    }
}

impl RunActor {
    async fn on_message(&self, cell: &Arc<RunCell>, json: String) -> Result<(), AgentError> {
        let agent = self.shared.agents.agent(&cell.kind).map_err(AgentError::from)?;
        let raw = RawCtx::new(self.shared.clone(), cell.clone(), 0);
        self.under_wall_limit("on_message", agent.on_message(raw, json)).await
    }

    async fn on_request(&self, cell: &Arc<RunCell>, json: String) -> Result<String, AgentError> {
        let agent = self.shared.agents.agent(&cell.kind).map_err(AgentError::from)?;
        let raw = RawCtx::new(self.shared.clone(), cell.clone(), 0);
        self.under_wall_limit("on_request", agent.on_request(raw, json)).await
    }

    /// Runs a message or request handler: a panic or the message wall limit is its failure.
    async fn under_wall_limit<T>(
        &self,
        hook: &str,
        handler: impl std::future::Future<Output = Result<T, AgentError>>,
    ) -> Result<T, AgentError> {
        let handler = AssertUnwindSafe(handler).catch_unwind();
        match clock::timeout(self.shared.time.clock.as_ref(), self.shared.config.message_wall_limit, handler)
            .await
        {
            None => Err(AgentError::fail(format!("{hook} exceeded the message wall limit"))),
            Some(Err(panic)) => Err(AgentError::fail(format!("{hook} panicked: {}", panic_text(panic)))),
            Some(Ok(result)) => result,
        }
    }

    async fn on_alarm(&self, cell: &Arc<RunCell>, event: AlarmEvent) -> Result<(), AgentError> {
        let agent = self.shared.agents.agent(&cell.kind).map_err(AgentError::from)?;
        let raw = RawCtx::new(self.shared.clone(), cell.clone(), 0);
        let handler = AssertUnwindSafe(agent.on_alarm(raw, event)).catch_unwind();
        match clock::timeout(self.shared.time.clock.as_ref(), self.shared.config.alarm_wall_limit, handler)
            .await
        {
            None => Err(AgentError::fail("on_alarm exceeded the alarm wall limit")),
            Some(Err(panic)) => Err(AgentError::fail(format!("on_alarm panicked: {}", panic_text(panic)))),
            Some(Ok(result)) => result,
        }
    }
}
