//! Delivering due alarms, at least once (§8.3–§8.5).
//!
//! The attempt count is persisted *before* the handler runs, together with the time of the
//! next retry, so a handler that kills the process is retried on schedule after the restart
//! and cannot loop forever. Retry n waits 2 s × 2^(n-1) plus up to 25% jitter; after the
//! seventh failed attempt the alarm is dead-lettered.

use durafiber_api::Timestamp;
use durafiber_store::RunId;
use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use durafiber_store::{
    Batch, Durability,
    tables::{AlarmRecord, CronRecord, DeadLetter, RunRecord, SystemAlarm, keys},
};

use crate::trace::{Ended, Parent};
use crate::{
    approval,
    error::{AgentError, RuntimeError},
    escalation, event,
    hooks::{AlarmEvent, ExhaustedAction},
    kernel::inbox::RunMsg,
    kernel::shared::Shared,
    limits,
    metrics::Metrics,
    pause,
    run::actor,
    sleep,
};

/// Delay before retry `n` (1-based): 2 s × 2^(n-1), plus up to 25% jitter.
pub(crate) fn retry_delay(shared: &Shared, n: u32) -> Duration {
    let base = (shared.config.alarm_retry_base.as_millis() as u64) << n.saturating_sub(1).min(20);
    Duration::from_millis(base + shared.controls.jitter_between(0, base / 4))
}

/// Starts a delivery for every alarm due by now; returns how many started.
pub(crate) fn start_due(shared: &Arc<Shared>) -> usize {
    let room = limits::ALARM_DELIVERIES_IN_FLIGHT_MAX.saturating_sub(shared.timers.scheduler.in_flight());
    let due = shared.timers.scheduler.take_due(shared.now(), room);
    let n = due.len();
    // Read the next alarms in, so the driver knows when to wake instead of guessing.
    refill_if_low(shared);
    // One task per run, delivering that run's alarms one after another in due order; runs
    // are delivered concurrently.
    let mut per_run: Vec<(RunId, Vec<(Timestamp, String)>)> = Vec::new();
    for (due_at, run_id, name) in due {
        match per_run.iter_mut().find(|(r, _)| *r == run_id) {
            Some((_, alarms)) => alarms.push((due_at, name)),
            None => per_run.push((RunId::from(run_id), vec![(due_at, name)])),
        }
    }
    for (run_id, alarms) in per_run {
        let shared2 = shared.clone();
        shared.life.spawn_tracked(async move {
            for (due_at, name) in alarms {
                match deliver(&shared2, &run_id, &name, due_at).await {
                    Ok(()) => shared2.timers.alarm_runtime_failures.store(0, Ordering::Relaxed),
                    Err(e) => runtime_failure(&shared2, &run_id, &name, &e),
                }
                shared2.timers.scheduler.delivered(&run_id, &name);
            }
        });
    }
    n
}

/// Reads the next alarms from the store's index when the window has run low. On the system
/// clock the read runs beside the driver, which it wakes when done: a refill reads
/// thousands of keys, and held up every pick-up due meanwhile by milliseconds (`bench
/// alarms`). On a virtual clock it runs in place, so a test's tick sees its result.
fn refill_if_low(shared: &Arc<Shared>) {
    if !shared.timers.scheduler.wants_refill() {
        return;
    }
    let refill = |shared: &Shared| {
        if let Err(e) = shared.refill_alarms() {
            tracing::error!(error = %e, "could not read the alarm index");
        }
    };
    if shared.time.clock.is_virtual() {
        return refill(shared);
    }
    let shared = shared.clone();
    tokio::task::spawn_blocking(move || {
        refill(&shared);
        shared.timers.driver_wake.notify_one();
    });
}

/// The runtime's own failure (a store write): not the handler's, so it is not counted. The
/// backoff doubles per consecutive failure of the runtime, capped at 1024 s.
fn runtime_failure(shared: &Shared, run_id: &RunId, name: &str, e: &RuntimeError) {
    let n = shared.timers.alarm_runtime_failures.fetch_add(1, Ordering::Relaxed).min(10);
    let delay = Duration::from_secs(1u64 << n).min(limits::ALARM_RUNTIME_BACKOFF_MAX);
    tracing::error!(%run_id, alarm = name, error = %e, delay_ms = delay.as_millis(), "alarm delivery failed in the runtime");
    shared.timers.scheduler.insert(shared.now().saturating_add(delay), run_id, name);
    shared.timers.driver_wake.notify_one();
}

/// Where the alarm being delivered lives: its own record, or a failed occurrence of a
/// periodic or cron alarm retried beside the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Schedule,
    Retry { scheduled_at: Timestamp },
}

impl Slot {
    fn of(due_name: &str) -> (&str, Slot) {
        match keys::parse_due_name(due_name) {
            (name, Some(scheduled_at)) => (name, Slot::Retry { scheduled_at }),
            (name, None) => (name, Slot::Schedule),
        }
    }

    fn read(self, shared: &Shared, run_id: &RunId, name: &str) -> Result<Option<AlarmRecord>, RuntimeError> {
        Ok(match self {
            Slot::Schedule => shared.store.get(&keys::alarm(run_id, name))?,
            Slot::Retry { scheduled_at } => {
                shared.store.get(&keys::alarm_retry(run_id, name, scheduled_at))?
            }
        })
    }

    fn stage(self, batch: &mut Batch, alarm: &AlarmRecord) -> Result<(), RuntimeError> {
        match self {
            Slot::Schedule => crate::alarm::stage(batch, alarm),
            Slot::Retry { .. } => crate::alarm::stage_retry(batch, alarm),
        }
    }

    fn unstage(self, batch: &mut Batch, alarm: &AlarmRecord) {
        match self {
            Slot::Schedule => crate::alarm::unstage(batch, &alarm.run_id, &alarm.name, alarm.due_at_ms),
            Slot::Retry { .. } => crate::alarm::unstage_retry(batch, alarm),
        }
    }

    fn due_name(self, name: &str) -> String {
        match self {
            Slot::Schedule => name.to_string(),
            Slot::Retry { scheduled_at } => keys::retry_due_name(name, scheduled_at),
        }
    }
}

async fn deliver(
    shared: &Arc<Shared>,
    run_id: &RunId,
    due_name: &str,
    due_key: Timestamp,
) -> Result<(), RuntimeError> {
    let (name, slot) = Slot::of(due_name);
    let Some(mut alarm) = slot.read(shared, run_id, name)? else { return Ok(()) };
    let now = shared.now();
    if alarm.due_at_ms > now {
        if alarm.due_at_ms != due_key {
            shared.timers.scheduler.insert(alarm.due_at_ms, run_id, due_name);
        }
        return Ok(());
    }
    shared.obs.metrics.alarm_lateness.record(now.saturating_since(alarm.due_at_ms));
    let run = shared.load_run(run_id)?;
    if run.status.is_terminal() {
        let mut batch = Batch::new();
        slot.unstage(&mut batch, &alarm);
        shared.store.commit(batch, Durability::Sync).await?;
        return Ok(());
    }
    if let Some(system) = &alarm.system {
        return system_alarm(shared, run_id, system, alarm.due_at_ms).await;
    }
    if pause::hold_alarm(shared, &run, due_name) {
        shared.event(run_id, "alarm_held", format!("{name}: the run is paused"));
        return Ok(());
    }
    let cron = crate::alarm::cron_of(shared, run_id, name)?;
    if let Slot::Retry { .. } = slot {
        // A retried occurrence outlives neither its alarm nor a re-set of it.
        let schedule = Slot::Schedule.read(shared, run_id, name)?;
        if schedule.is_none_or(|s| s.generation != alarm.generation) {
            let mut batch = Batch::new();
            slot.unstage(&mut batch, &alarm);
            return shared.store.commit(batch, Durability::Sync).await.map_err(Into::into);
        }
    }
    let recurring = alarm.every_ms.is_some() || cron.is_some();
    let attempt = alarm.attempts_started + 1;
    if attempt > limits::ALARM_ATTEMPTS_MAX {
        let why = "the process died during the last attempt".to_string();
        return exhausted(shared, &run.kind, slot, alarm, cron.as_ref(), why).await;
    }
    let old_due = alarm.due_at_ms;
    let result = attempt_once(shared, &run, (slot, due_name), &mut alarm, recurring, now).await?;
    let current = slot.read(shared, run_id, name)?;
    let Some(current) = current.filter(|c| c.generation == alarm.generation) else {
        // The handler re-set (or cancelled) its own alarm: the new time stands.
        shared.event(run_id, "alarm_reset", format!("{name}: re-set by its handler"));
        return Ok(());
    };
    let e = match result {
        Ok(()) => return succeeded(shared, slot, current, cron.as_ref()).await,
        Err(e) if attempt >= limits::ALARM_ATTEMPTS_MAX => {
            return exhausted(shared, &run.kind, slot, current, cron.as_ref(), e.to_string()).await;
        }
        Err(e) => e,
    };
    Metrics::bump(&shared.obs.metrics.alarm_retries);
    shared.event(run_id, "alarm_failed", format!("{name} attempt {attempt}: {e}"));
    retry_later(shared, (slot, due_name), current, cron.as_ref(), (now, old_due), recurring).await
}

/// A delivery of a runtime's own alarm (an approval's escalation, an event wait's timeout,
/// a sleep's wake), which reaches the feature that set it.
async fn system_alarm(
    shared: &Arc<Shared>,
    run_id: &RunId,
    system: &SystemAlarm,
    due_at: Timestamp,
) -> Result<(), RuntimeError> {
    let woken = match system {
        SystemAlarm::EscalateApproval { approval_id } => {
            return approval::on_escalation_alarm(shared, run_id, approval_id).await;
        }
        SystemAlarm::EventTimeout { name } => event::on_timeout_alarm(shared, run_id, name, due_at).await?,
        SystemAlarm::WakeSleep { name } => sleep::on_wake_alarm(shared, run_id, name, due_at).await?,
    };
    if woken {
        actor::reactivate(shared, run_id).await;
    }
    Ok(())
}

/// One attempt of an alarm's handler: the attempt persisted first, with the retry's due time
/// should it never report back; then the handler called, and its span sent.
async fn attempt_once(
    shared: &Arc<Shared>,
    run: &RunRecord,
    (slot, due_name): (Slot, &str),
    alarm: &mut AlarmRecord,
    recurring: bool,
    now: Timestamp,
) -> Result<Result<(), AgentError>, RuntimeError> {
    let (run_id, name) = (&run.run_id, alarm.name.clone());
    let attempt = alarm.attempts_started + 1;
    let old_due = alarm.due_at_ms;
    alarm.attempts_started = attempt;
    alarm.due_at_ms = now.saturating_add(retry_delay(shared, attempt));
    let mut batch = Batch::new();
    batch.delete(keys::alarm_due(old_due, run_id, due_name));
    slot.stage(&mut batch, alarm)?;
    shared.store.commit(batch, Durability::Sync).await?;
    let event = AlarmEvent {
        name: name.clone(),
        payload_json: alarm.payload_json.clone(),
        scheduled_time_ms: alarm.scheduled_at_ms,
        retry_count: attempt - 1,
        is_retry: attempt > 1,
        recurring,
        delivery_id: AlarmEvent::delivery_id(run_id, &name, alarm.scheduled_at_ms, alarm.generation),
    };
    shared.event(run_id, "alarm_attempt", format!("{name} attempt {attempt}"));
    shared.liveness.activity(run_id, now);
    let result = call_handler(shared, run_id, event).await;
    shared.obs.span(|| {
        Ended::new(run_id, &run.kind, format!("alarm {name}"), Parent::Root)
            .times(now, shared.now())
            .attr("durafiber.alarm.name", name.clone())
            .attr("durafiber.alarm.attempt", i64::from(attempt))
            .attr(
                "durafiber.alarm.scheduled_at_ms",
                i64::try_from(alarm.scheduled_at_ms.as_millis()).unwrap_or(i64::MAX),
            )
            .attr("durafiber.alarm.outcome", if result.is_ok() { "delivered" } else { "failed" })
            .error(result.as_ref().err().map(ToString::to_string))
    });
    Ok(result)
}

/// A failed attempt that has attempts left: retried after its delay (from the failure, for a
/// slow handler); a periodic or cron alarm's schedule goes on beside the retry.
async fn retry_later(
    shared: &Arc<Shared>,
    (slot, due_name): (Slot, &str),
    mut current: AlarmRecord,
    cron: Option<&CronRecord>,
    (now, old_due): (Timestamp, Timestamp),
    recurring: bool,
) -> Result<(), RuntimeError> {
    let (run_id, name) = (current.run_id.clone(), current.name.clone());
    let run_id = &run_id;
    let name = name.as_str();
    let failed_at = shared.now();
    let mut batch = Batch::new();
    let mut moved = false;
    if failed_at > now {
        // A slow handler: the retry's delay counts from its failure.
        slot.unstage(&mut batch, &current);
        current.due_at_ms = failed_at.saturating_add(current.due_at_ms.saturating_since(now));
        moved = true;
    }
    let mut next_schedule = None;
    if slot == Slot::Schedule && recurring {
        // The schedule goes on; the failed occurrence is retried beside it.
        if !moved {
            slot.unstage(&mut batch, &current);
        }
        crate::alarm::stage_retry(&mut batch, &current)?;
        let next = advance(shared, &mut batch, &current, cron)?;
        next_schedule = next;
        shared.timers.scheduler.remove(old_due, run_id, name);
        shared.timers.scheduler.insert(
            current.due_at_ms,
            run_id,
            &Slot::Retry { scheduled_at: current.scheduled_at_ms }.due_name(name),
        );
    } else if moved {
        slot.stage(&mut batch, &current)?;
        shared.timers.scheduler.insert(current.due_at_ms, run_id, due_name);
    } else {
        shared.timers.scheduler.insert(current.due_at_ms, run_id, due_name);
    }
    if !batch.is_empty() {
        shared.store.commit(batch, Durability::Sync).await?;
    }
    if let Some(due) = next_schedule {
        shared.timers.scheduler.insert(due, run_id, name);
    }
    shared.timers.driver_wake.notify_one();
    Ok(())
}

/// Stages the next occurrence of a periodic or cron alarm whose current one is done (or is
/// being retried apart); returns its due time, `None` for a one-off alarm.
fn advance(
    shared: &Shared,
    batch: &mut Batch,
    done: &AlarmRecord,
    cron: Option<&CronRecord>,
) -> Result<Option<Timestamp>, RuntimeError> {
    let Some(due) = crate::alarm::next_occurrence(done, cron, shared.now())? else { return Ok(None) };
    let next = AlarmRecord { due_at_ms: due, scheduled_at_ms: due, attempts_started: 0, ..done.clone() };
    crate::alarm::stage(batch, &next)?;
    Ok(Some(due))
}

async fn call_handler(shared: &Arc<Shared>, run_id: &RunId, event: AlarmEvent) -> Result<(), AgentError> {
    let live = actor::activate(shared, run_id).await.map_err(AgentError::from)?;
    let actor = actor::actor_of(shared, &live).await.map_err(AgentError::from)?;
    match actor.call(|reply| RunMsg::Alarm { event, reply }, None).await {
        Ok(ractor::rpc::CallResult::Success(result)) => result,
        Ok(_) | Err(_) => Err(AgentError::fail("the run's actor stopped during the handler")),
    }
}

async fn succeeded(
    shared: &Arc<Shared>,
    slot: Slot,
    alarm: AlarmRecord,
    cron: Option<&CronRecord>,
) -> Result<(), RuntimeError> {
    let mut batch = Batch::new();
    slot.unstage(&mut batch, &alarm);
    let next = match slot {
        Slot::Schedule => advance(shared, &mut batch, &alarm, cron)?,
        Slot::Retry { .. } => None,
    };
    shared.store.commit(batch, Durability::Sync).await?;
    if let Some(due) = next {
        shared.timers.scheduler.insert(due, &alarm.run_id, &alarm.name);
        // The next period may come before the driver's next wake-up (a sub-second period).
        shared.timers.driver_wake.notify_one();
    }
    shared.event(&alarm.run_id, "alarm_done", alarm.name.clone());
    Ok(())
}

/// An occurrence whose attempts ran out: dead-lettered by itself. A periodic or cron alarm's
/// schedule goes on; what the run does is `on_alarm_exhausted`'s to say.
async fn exhausted(
    shared: &Arc<Shared>,
    kind: &str,
    slot: Slot,
    alarm: AlarmRecord,
    cron: Option<&CronRecord>,
    last_error: String,
) -> Result<(), RuntimeError> {
    let mut batch = Batch::new();
    slot.unstage(&mut batch, &alarm);
    let recurring = alarm.every_ms.is_some() || cron.is_some();
    let next = match slot {
        Slot::Schedule if recurring => advance(shared, &mut batch, &alarm, cron)?,
        Slot::Schedule | Slot::Retry { .. } => None,
    };
    let (run_id, name) = (alarm.run_id.clone(), alarm.name.clone());
    dead_letter(shared, kind, batch, alarm, recurring, last_error).await?;
    if let Some(due) = next {
        shared.timers.scheduler.insert(due, &run_id, &name);
        shared.timers.driver_wake.notify_one();
    }
    Ok(())
}

/// Commits `batch` with the dead letter of `alarm`, then asks the agent what the run does.
async fn dead_letter(
    shared: &Arc<Shared>,
    kind: &str,
    mut batch: Batch,
    alarm: AlarmRecord,
    recurring: bool,
    last_error: String,
) -> Result<(), RuntimeError> {
    let now = shared.now();
    let key = keys::dead_letter(&alarm.run_id, &alarm.name, now);
    let event = AlarmEvent {
        name: alarm.name.clone(),
        payload_json: alarm.payload_json.clone(),
        scheduled_time_ms: alarm.scheduled_at_ms,
        retry_count: alarm.attempts_started.saturating_sub(1),
        is_retry: true,
        recurring,
        delivery_id: AlarmEvent::delivery_id(
            &alarm.run_id,
            &alarm.name,
            alarm.scheduled_at_ms,
            alarm.generation,
        ),
    };
    let run_id = alarm.run_id.clone();
    batch.put(key, &DeadLetter { alarm, last_error: last_error.clone(), dead_at_ms: now })?;
    shared.store.commit(batch, Durability::Sync).await?;
    Metrics::bump(&shared.obs.metrics.dead_letters);
    shared.event(&run_id, "alarm_dead_lettered", format!("{}: {last_error}", event.name));
    let action = shared
        .agents
        .agent(kind)
        .map(|a| a.on_alarm_exhausted(shared.hook_ctx(&run_id, kind), &event))
        .unwrap_or(ExhaustedAction::Escalate);
    if action == ExhaustedAction::Escalate {
        escalation::escalate(shared, &run_id, &format!("alarm_exhausted:{}", event.name), Batch::new())
            .await?;
    }
    Ok(())
}
