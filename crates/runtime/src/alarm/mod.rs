//! Durable, named alarms per run (§8): set, cancel, list. Each alarm is one record plus one
//! entry in the store's due-time index; the scheduler ([`schedule`]) keeps only a bounded
//! window of the index in memory, and [`deliver`] runs handlers with retries.

use std::{sync::Arc, time::Duration};

use durafiber_store::{
    Batch,
    tables::{self, AlarmRecord},
};
use serde::Serialize;

use crate::{error::RuntimeError, json, kernel::cell::RunCell, kernel::shared::Shared, limits};

/// When an alarm is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlarmAt {
    /// This long from now.
    In(Duration),
    /// At this clock time, ms since the epoch.
    AtMs(u64),
}

/// What to set: when, with what payload, and whether it repeats.
///
/// A human-in-the-loop escalation: page someone if the case is still open in four hours.
///
/// ```
/// use std::time::Duration;
/// use durafiber_runtime::{Agent, AgentError, AlarmEvent, AlarmSpec, Ctx};
///
/// struct Case;
///
/// impl Agent for Case {
///     const KIND: &'static str = "case";
///     type Input = String;
///     type Stash = ();
///     type Output = ();
///     type Message = ();
///
///     async fn run_fiber(&self, ctx: &mut Ctx<Self>, case_id: String) -> Result<(), AgentError> {
///         ctx.set_alarm("escalate", AlarmSpec::after(Duration::from_secs(4 * 3600), &case_id)?).await?;
///         ctx.cancelled().await; // the run stays open while the case is
///         Ok(())
///     }
///
///     async fn on_alarm(&self, _ctx: &mut Ctx<Self>, alarm: AlarmEvent) -> Result<(), AgentError> {
///         if alarm.name == "escalate" {
///             let case_id: String = alarm.payload()?;
///             println!("paging on-call about {case_id}");
///         }
///         Ok(())
///     }
/// }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct AlarmSpec {
    /// When it is first due.
    pub at: AlarmAt,
    /// Handed to `on_alarm`, as JSON.
    pub payload_json: String,
    /// A periodic alarm repeats this often; setting it again with the same period is a no-op.
    pub every: Option<Duration>,
}

impl AlarmSpec {
    /// Due after `delay`, with a payload.
    pub fn after<P: Serialize>(delay: Duration, payload: &P) -> Result<Self, RuntimeError> {
        Ok(AlarmSpec {
            at: AlarmAt::In(delay),
            payload_json: json::canonical(payload).map_err(RuntimeError::InvalidInput)?,
            every: None,
        })
    }

    /// Due at `at_ms`, with a payload.
    pub fn at_ms<P: Serialize>(at_ms: u64, payload: &P) -> Result<Self, RuntimeError> {
        Ok(AlarmSpec {
            at: AlarmAt::AtMs(at_ms),
            payload_json: json::canonical(payload).map_err(RuntimeError::InvalidInput)?,
            every: None,
        })
    }

    /// Due every `period`, first after one period.
    pub fn every<P: Serialize>(period: Duration, payload: &P) -> Result<Self, RuntimeError> {
        Ok(AlarmSpec { every: Some(period), ..AlarmSpec::after(period, payload)? })
    }
}

/// The due time of `at`, seen at `now_ms`: never past [`limits::ALARM_HORIZON_MAX`], so no
/// arithmetic on it can wrap.
pub(crate) fn due_at(now_ms: u64, at: AlarmAt) -> Result<u64, RuntimeError> {
    let horizon_ms = limits::ALARM_HORIZON_MAX.as_millis() as u64;
    let latest = now_ms.saturating_add(horizon_ms);
    let due = match at {
        AlarmAt::In(d) => u64::try_from(d.as_millis()).ok().and_then(|d| now_ms.checked_add(d)),
        AlarmAt::AtMs(ms) => Some(ms),
    };
    due.filter(|due| *due <= latest).ok_or_else(|| {
        RuntimeError::InvalidInput(format!(
            "alarm due time is more than {} ahead",
            humantime::format_duration(limits::ALARM_HORIZON_MAX)
        ))
    })
}

/// A periodic alarm's period in ms: at least 1 ms, at most the horizon.
fn check_period(every: Duration) -> Result<u64, RuntimeError> {
    let ms = u64::try_from(every.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 || every > limits::ALARM_HORIZON_MAX {
        return Err(RuntimeError::InvalidInput(format!(
            "alarm period must be between 1ms and {}",
            humantime::format_duration(limits::ALARM_HORIZON_MAX)
        )));
    }
    Ok(ms)
}

fn alarm_key(run_id: &str, name: &str) -> Vec<u8> {
    tables::ALARMS.key(&[run_id.as_bytes(), name.as_bytes()])
}

/// Adds an alarm's record and its due-index entry to `batch`.
pub(crate) fn stage(batch: &mut Batch, alarm: &AlarmRecord) -> Result<(), RuntimeError> {
    batch.put(tables::ALARMS, alarm_key(&alarm.run_id, &alarm.name), alarm)?;
    batch.put(tables::ALARM_DUE, tables::alarm_due_key(alarm.due_at_ms, &alarm.run_id, &alarm.name), &())?;
    Ok(())
}

/// Adds the removal of an alarm's record and due-index entry to `batch`.
pub(crate) fn unstage(batch: &mut Batch, run_id: &str, name: &str, due_at_ms: u64) {
    batch.delete(alarm_key(run_id, name));
    batch.delete(tables::alarm_due_key(due_at_ms, run_id, name));
}

/// Removes every alarm of a finishing run, in the finishing boundary.
pub(crate) fn delete_all_in(shared: &Shared, run_id: &str, batch: &mut Batch) -> Result<(), RuntimeError> {
    for alarm in list(shared, run_id)? {
        unstage(batch, run_id, &alarm.name, alarm.due_at_ms);
        shared.scheduler.remove(alarm.due_at_ms, run_id, &alarm.name);
    }
    Ok(())
}

/// Every alarm of a run.
pub(crate) fn list(shared: &Shared, run_id: &str) -> Result<Vec<AlarmRecord>, RuntimeError> {
    let prefix = tables::ALARMS.prefix_of(&[run_id.as_bytes()]);
    let mut out = Vec::new();
    for (_, alarm) in shared.store.scan::<AlarmRecord>(tables::ALARMS, &prefix, None, usize::MAX)? {
        out.push(alarm?);
    }
    Ok(out)
}

/// Sets (or replaces) alarm `name` of `run_id`. `system` marks the runtime's own alarms;
/// `cell` is the live run setting its own alarm, for which the alarm is a boundary (§3.6).
pub(crate) async fn set(
    shared: &Arc<Shared>,
    run_id: &str,
    name: &str,
    spec: AlarmSpec,
    system: Option<tables::SystemAlarm>,
    cell: Option<&RunCell>,
) -> Result<(), RuntimeError> {
    tables::check_id("alarm name", name).map_err(RuntimeError::InvalidInput)?;
    if spec.payload_json.len() > limits::PAYLOAD_BYTES_MAX {
        return Err(RuntimeError::InvalidInput(format!(
            "alarm payload is over {} bytes",
            limits::PAYLOAD_BYTES_MAX
        )));
    }
    let payload_json = json::recanonicalize(&spec.payload_json).map_err(RuntimeError::InvalidInput)?;
    let run = shared.load_run(run_id)?;
    if run.status.is_terminal() {
        return Err(RuntimeError::RunFinished { run_id: run_id.into(), state: run.status.name().into() });
    }
    let existing: Option<AlarmRecord> = shared.store.get(tables::ALARMS, &alarm_key(run_id, name))?;
    let every_ms = spec.every.map(check_period).transpose()?;
    if let Some(old) = &existing
        && every_ms.is_some()
        && old.every_ms == every_ms
        && old.payload_json == payload_json
    {
        return Ok(());
    }
    let due_at_ms = due_at(shared.now_ms(), spec.at)?;
    let alarm = AlarmRecord {
        run_id: run_id.to_string(),
        name: name.to_string(),
        due_at_ms,
        scheduled_at_ms: due_at_ms,
        payload_json,
        every_ms,
        attempts_started: 0,
        generation: existing.as_ref().map(|a| a.generation + 1).unwrap_or(1),
        system,
    };
    let mut batch = Batch::new();
    if let Some(old) = &existing {
        unstage(&mut batch, run_id, name, old.due_at_ms);
    }
    stage(&mut batch, &alarm)?;
    match cell {
        Some(cell) => shared.commit_boundary(cell, batch, durafiber_store::Durability::Sync).await?,
        None => shared.store.commit(batch, durafiber_store::Durability::Sync).await?,
    }
    if let Some(old) = &existing {
        shared.scheduler.remove(old.due_at_ms, run_id, name);
    }
    shared.scheduler.insert(due_at_ms, run_id, name);
    shared.driver_wake.notify_one();
    shared.event(run_id, "alarm_set", format!("{name} due at {due_at_ms}"));
    Ok(())
}

/// Cancels alarm `name` of `run_id`; true when it existed.
pub(crate) async fn cancel(shared: &Arc<Shared>, run_id: &str, name: &str) -> Result<bool, RuntimeError> {
    // Checked as `set` checks it, so a name is refused the same way whatever is asked.
    tables::check_id("alarm name", name).map_err(RuntimeError::InvalidInput)?;
    let Some(old) = shared.store.get::<AlarmRecord>(tables::ALARMS, &alarm_key(run_id, name))? else {
        return Ok(false);
    };
    let mut batch = Batch::new();
    unstage(&mut batch, run_id, name, old.due_at_ms);
    shared.store.commit(batch, durafiber_store::Durability::Sync).await?;
    shared.scheduler.remove(old.due_at_ms, run_id, name);
    shared.event(run_id, "alarm_cancelled", name.to_string());
    Ok(true)
}
