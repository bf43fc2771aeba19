//! Durable sleep (§2.4 `Waiting{alarm}`): a fiber waits for a time that is committed as a
//! boundary, so the wait survives eviction, hibernation and restarts.
//!
//! Sleep lifecycle: absent → `SleepRecord{wake_at, done: false}` + the system alarm
//! `sleep:<name>` + state `Waiting{alarm}` (one boundary) → `done: true`, `Running`, alarm
//! removed (one boundary). A fiber still in memory wakes by itself at the time; one that was
//! lost is woken by the alarm, which re-enters the run (reason `resumed`), and the repeated
//! call returns at once: the wake time is the one first recorded, never a fresh duration.

use crate::kernel::commit::{self, After};
use durafiber_api::Timestamp;
use durafiber_store::RunId;
use durafiber_store::{Batch, tables::RunRecord};
use std::sync::Arc;

use durafiber_store::tables::{
    self, AlarmRecord, RunStatus, SleepRecord, SystemAlarm, WakeReason, keys, keys::Journaled,
};

use crate::boundary::Boundary;
use crate::{
    alarm,
    error::{AgentError, RuntimeError},
    kernel::{
        cell::RunCell,
        shared::{RawCtx, Shared},
    },
};

/// The name of the system alarm that wakes sleep `name`.
pub(crate) fn alarm_name(name: &str) -> String {
    format!("sleep:{name}")
}

/// Sleeps until `at` under `name`; see the module's lifecycle.
pub(crate) async fn sleep(raw: &mut RawCtx, name: &str, at: alarm::AlarmAt) -> Result<(), AgentError> {
    tables::check_id("sleep name", name).map_err(AgentError::fail)?;
    let shared = raw.shared.clone();
    let run_id = raw.cell.run_id.clone();
    let key = keys::sleep(&run_id, name);
    let now = shared.now();
    let record = match shared.store.get::<SleepRecord>(&key)? {
        Some(done) if done.done => return Ok(()),
        Some(journaled) => journaled,
        None => SleepRecord {
            run_id: run_id.clone(),
            name: name.to_string(),
            wake_at_ms: alarm::due_at(now, at)?,
            done: false,
        },
    };
    let wake_alarm = AlarmRecord {
        run_id: run_id.clone(),
        name: alarm_name(name),
        due_at_ms: record.wake_at_ms,
        scheduled_at_ms: record.wake_at_ms,
        payload_json: "null".into(),
        every_ms: None,
        attempts_started: 0,
        generation: 1,
        system: Some(SystemAlarm::WakeSleep { name: name.to_string() }),
    };
    if record.wake_at_ms > now {
        let after = After::at((Boundary::AfterSleep, name))
            .progress()
            .alarm_set(wake_alarm.due_at_ms, wake_alarm.name.clone())
            .event("sleep", format!("{name} until {}", record.wake_at_ms));
        let change = |run: &mut RunRecord, batch: &mut Batch| {
            batch.put(key.clone(), &record)?;
            alarm::stage(batch, &wake_alarm)?;
            run.status = RunStatus::WaitingAlarm { name: name.to_string() };
            Ok(true)
        };
        commit::commit_run(raw, change, after).await?;
        // Waiting here is not work: the run may be evicted meanwhile, like a pause.
        shared.fiber_waiting(&run_id, true, now);
        shared.life.parked(raw.in_fiber, shared.time.clock.sleep_until(record.wake_at_ms)).await;
        shared.fiber_waiting(&run_id, false, shared.now());
    }
    let wake_at = record.wake_at_ms;
    woke(&shared, &raw.cell, record, &wake_alarm).await?;
    shared.obs.span(|| {
        raw.span_since("sleep", now)
            .attr("durafiber.sleep.name", name.to_string())
            .attr("durafiber.sleep.wake_at_ms", i64::try_from(wake_at.as_millis()).unwrap_or(i64::MAX))
    });
    Ok(())
}

/// The boundary that ends a sleep: done, `Running`, its alarm removed.
async fn woke(
    shared: &Arc<Shared>,
    cell: &RunCell,
    mut record: SleepRecord,
    wake: &AlarmRecord,
) -> Result<(), RuntimeError> {
    record.done = true;
    let run_id = &cell.run_id;
    let key = keys::sleep(run_id, &record.name);
    let seq = cell.seq.load(std::sync::atomic::Ordering::SeqCst);
    shared
        .update_run_from(cell, |run, batch| {
            batch.put(key, &record)?;
            batch.put(keys::journal_seq(run_id, Journaled::Sleep, &record.name), &seq)?;
            alarm::unstage(batch, run_id, &wake.name, wake.due_at_ms);
            if run.status == (RunStatus::WaitingAlarm { name: record.name.clone() }) {
                run.status = RunStatus::Running;
            }
            // The fiber runs: a wake reason left by the alarm is stale.
            run.wake_reason = None;
            Ok(true)
        })
        .await?;
    shared.timers.scheduler.remove(wake.due_at_ms, run_id, &wake.name);
    shared.event(run_id, "woke", record.name.clone());
    Ok(())
}

/// The wake alarm of sleep `name` fired. A fiber still in memory wakes by itself; a lost one
/// is re-entered (reason `resumed`) and its repeated sleep returns at once.
pub(crate) async fn on_wake_alarm(
    shared: &Arc<Shared>,
    run_id: &RunId,
    name: &str,
    due_at: Timestamp,
) -> Result<bool, RuntimeError> {
    let resumed = shared
        .update_run(run_id, |run, batch| {
            alarm::unstage(batch, run_id, &alarm_name(name), due_at);
            if run.status == (RunStatus::WaitingAlarm { name: name.to_string() }) {
                run.status = RunStatus::Running;
                run.wake_reason = Some(WakeReason::Resumed);
            }
            Ok(true)
        })
        .await?;
    shared.event(run_id, "sleep_alarm", name.to_string());
    Ok(resumed.is_some_and(|run| run.status == RunStatus::Running))
}
