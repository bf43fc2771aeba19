//! Durable, named alarms per run (§8): set, cancel, list. Each alarm is one record plus one
//! entry in the store's due-time index; the scheduler (`kernel/alarm_window.rs`) keeps only a
//! bounded window of the index in memory, and `run/alarm_delivery.rs` runs handlers with
//! retries. A periodic or cron alarm keeps its schedule when an occurrence fails: the failed
//! occurrence is retried as a record of its own (`alarm_retries`) beside the schedule.

mod cron;

use durafiber_api::Timestamp;
use durafiber_store::RunId;
use std::{sync::Arc, time::Duration};

use durafiber_store::{
    Batch,
    tables::{self, AlarmRecord, CronRecord, keys},
};
use serde::Serialize;

pub use cron::CronSchedule;

pub(crate) use cron::next_after as next_cron;
pub use durafiber_api::Alarm;

use crate::{error::RuntimeError, json, kernel::cell::RunCell, kernel::shared::Shared, limits};

/// When an alarm is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlarmAt {
    /// This long from now.
    In(Duration),
    /// At this time on the runtime's clock.
    At(Timestamp),
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
    /// A cron alarm fires on this schedule (and `at` is not used); setting it again with the
    /// same schedule is a no-op.
    pub cron: Option<CronSchedule>,
}

impl AlarmSpec {
    /// Due after `delay`, with a payload.
    pub fn after<P: Serialize>(delay: Duration, payload: &P) -> Result<Self, RuntimeError> {
        Ok(AlarmSpec {
            at: AlarmAt::In(delay),
            payload_json: json::canonical(payload).map_err(|e| RuntimeError::InvalidInput(e.into()))?,
            every: None,
            cron: None,
        })
    }

    /// Due at `at`, with a payload.
    pub fn at<P: Serialize>(at: Timestamp, payload: &P) -> Result<Self, RuntimeError> {
        Ok(AlarmSpec {
            at: AlarmAt::At(at),
            payload_json: json::canonical(payload).map_err(|e| RuntimeError::InvalidInput(e.into()))?,
            every: None,
            cron: None,
        })
    }

    /// Due every `period`, first after one period.
    pub fn every<P: Serialize>(period: Duration, payload: &P) -> Result<Self, RuntimeError> {
        Ok(AlarmSpec { every: Some(period), ..AlarmSpec::after(period, payload)? })
    }

    /// Due whenever cron expression `expr` fires, in UTC: `"0 9 * * MON-FRI"` is nine o'clock
    /// on weekdays. Five fields (minute hour day-of-month month day-of-week), or six with
    /// seconds first. An expression that does not parse, or never fires, is refused here.
    ///
    /// ```
    /// use durafiber_runtime::AlarmSpec;
    ///
    /// let standup = AlarmSpec::cron("0 9 * * MON-FRI", &"standup")?.in_time_zone("Europe/Berlin")?;
    /// assert_eq!(standup.cron.as_ref().map(|c| c.expr()), Some("0 9 * * MON-FRI"));
    /// assert!(AlarmSpec::cron("0 9 * * SOMEDAY", &()).is_err());
    /// # Ok::<(), durafiber_runtime::RuntimeError>(())
    /// ```
    pub fn cron<P: Serialize>(expr: &str, payload: &P) -> Result<Self, RuntimeError> {
        Ok(AlarmSpec { cron: Some(CronSchedule::parse(expr)?), ..AlarmSpec::after(Duration::ZERO, payload)? })
    }

    /// A cron alarm read in IANA time zone `zone` instead of UTC, so that local time is kept
    /// across daylight saving. Refused for an alarm that is not a cron alarm.
    pub fn in_time_zone(self, zone: &str) -> Result<Self, RuntimeError> {
        let Some(cron) = self.cron else {
            return Err(RuntimeError::InvalidInput("only a cron alarm has a time zone".into()));
        };
        Ok(AlarmSpec { cron: Some(cron.in_time_zone(zone)?), ..self })
    }
}

/// The due time of `at`, seen at `now`: never past [`limits::ALARM_HORIZON_MAX`], so no
/// arithmetic on it can wrap.
pub(crate) fn due_at(now: Timestamp, at: AlarmAt) -> Result<Timestamp, RuntimeError> {
    let latest = now.saturating_add(limits::ALARM_HORIZON_MAX);
    let due = match at {
        AlarmAt::In(d) => now.checked_add(d),
        AlarmAt::At(at) => Some(at),
    };
    due.filter(|due| *due <= latest).ok_or_else(|| {
        RuntimeError::InvalidInput(format!(
            "alarm due time is more than {} ahead",
            humantime::format_duration(limits::ALARM_HORIZON_MAX)
        ))
    })
}

/// A periodic alarm's period in ms: at least [`limits::ALARM_PERIOD_MIN`], at most the horizon.
fn check_period(every: Duration) -> Result<u64, RuntimeError> {
    let ms = u64::try_from(every.as_millis()).unwrap_or(u64::MAX);
    if every < limits::ALARM_PERIOD_MIN || every > limits::ALARM_HORIZON_MAX {
        return Err(RuntimeError::InvalidInput(format!(
            "alarm period must be between {} (limits::ALARM_PERIOD_MIN) and {}",
            humantime::format_duration(limits::ALARM_PERIOD_MIN),
            humantime::format_duration(limits::ALARM_HORIZON_MAX)
        )));
    }
    Ok(ms)
}

/// A cron alarm's schedule; `None` for every other alarm.
pub(crate) fn cron_of(
    shared: &Shared,
    run_id: &RunId,
    name: &str,
) -> Result<Option<CronRecord>, RuntimeError> {
    Ok(shared.store.get(&keys::alarm_cron(run_id, name))?)
}

/// When a periodic or cron alarm whose occurrence at `scheduled_at_ms` is done fires next, seen
/// at `now`: occurrences missed while the process was down are skipped, not made up.
/// `None` for a one-off alarm.
pub(crate) fn next_occurrence(
    alarm: &AlarmRecord,
    cron: Option<&CronRecord>,
    now: Timestamp,
) -> Result<Option<Timestamp>, RuntimeError> {
    if let Some(cron) = cron {
        return next_cron(cron, alarm.scheduled_at_ms.max(now)).map(Some);
    }
    let Some(every) = alarm.every_ms.filter(|e| *e > 0) else { return Ok(None) };
    let mut due = alarm.scheduled_at_ms.as_millis().saturating_add(every);
    if due <= now.as_millis() {
        let missed = (now.as_millis() - due) / every + 1;
        due = due.saturating_add(missed.saturating_mul(every));
    }
    Ok(Some(Timestamp::from_millis(due)))
}

/// Adds a failed occurrence's retry record and its due-index entry to `batch`.
pub(crate) fn stage_retry(batch: &mut Batch, occurrence: &AlarmRecord) -> Result<(), RuntimeError> {
    let (run_id, name, at) = (&occurrence.run_id, &occurrence.name, occurrence.scheduled_at_ms);
    batch.put(keys::alarm_retry(run_id, name, at), occurrence)?;
    let due_name = keys::retry_due_name(name, at);
    batch.put(keys::alarm_due(occurrence.due_at_ms, run_id, &due_name), &())?;
    Ok(())
}

/// Adds the removal of a retried occurrence to `batch`.
pub(crate) fn unstage_retry(batch: &mut Batch, occurrence: &AlarmRecord) {
    let (run_id, name, at) = (&occurrence.run_id, &occurrence.name, occurrence.scheduled_at_ms);
    batch.delete(keys::alarm_retry(run_id, name, at));
    batch.delete(keys::alarm_due(occurrence.due_at_ms, run_id, &keys::retry_due_name(name, at)));
}

/// The failed occurrences of alarm `name` still being retried; every alarm's with `None`.
fn retries(shared: &Shared, run_id: &RunId, name: Option<&str>) -> Result<Vec<AlarmRecord>, RuntimeError> {
    let mut out = Vec::new();
    for (_, retry) in shared.store.scan(&keys::alarm_retries_of(run_id, name), None, usize::MAX)? {
        out.push(retry?);
    }
    Ok(out)
}

/// Adds to `batch` the end of alarm `name`'s schedule and of its retried occurrences; returns
/// what to take out of the scheduler's window once the batch is durable.
fn forget(
    shared: &Shared,
    batch: &mut Batch,
    run_id: &RunId,
    name: &str,
    due_at: Timestamp,
) -> Result<Vec<(Timestamp, String)>, RuntimeError> {
    unstage(batch, run_id, name, due_at);
    batch.delete(keys::alarm_cron(run_id, name));
    let mut unscheduled = vec![(due_at, name.to_string())];
    for retry in retries(shared, run_id, Some(name))? {
        unstage_retry(batch, &retry);
        unscheduled.push((retry.due_at_ms, keys::retry_due_name(name, retry.scheduled_at_ms)));
    }
    Ok(unscheduled)
}

fn unschedule(shared: &Shared, run_id: &RunId, entries: Vec<(Timestamp, String)>) {
    for (due_at, due_name) in entries {
        shared.timers.scheduler.remove(due_at, run_id, &due_name);
    }
}

/// Adds an alarm's record and its due-index entry to `batch`.
pub(crate) fn stage(batch: &mut Batch, alarm: &AlarmRecord) -> Result<(), RuntimeError> {
    batch.put(keys::alarm(&alarm.run_id, &alarm.name), alarm)?;
    batch.put(keys::alarm_due(alarm.due_at_ms, &alarm.run_id, &alarm.name), &())?;
    Ok(())
}

/// Adds the removal of an alarm's record and due-index entry to `batch`.
pub(crate) fn unstage(batch: &mut Batch, run_id: &RunId, name: &str, due_at: Timestamp) {
    batch.delete(keys::alarm(run_id, name));
    batch.delete(keys::alarm_due(due_at, run_id, name));
}

/// Removes every alarm of a finishing run, in the finishing boundary.
pub(crate) fn delete_all_in(shared: &Shared, run_id: &RunId, batch: &mut Batch) -> Result<(), RuntimeError> {
    // One scan of each table: the alarms with their schedules, then every retried occurrence.
    let mut unscheduled = Vec::new();
    for alarm in records(shared, run_id)? {
        unstage(batch, run_id, &alarm.name, alarm.due_at_ms);
        batch.delete(keys::alarm_cron(run_id, &alarm.name));
        unscheduled.push((alarm.due_at_ms, alarm.name));
    }
    for retry in retries(shared, run_id, None)? {
        unstage_retry(batch, &retry);
        unscheduled.push((retry.due_at_ms, keys::retry_due_name(&retry.name, retry.scheduled_at_ms)));
    }
    unschedule(shared, run_id, unscheduled);
    Ok(())
}

/// The alarm records of a run.
fn records(shared: &Shared, run_id: &RunId) -> Result<Vec<AlarmRecord>, RuntimeError> {
    let prefix = keys::ALARMS.of_run(run_id);
    let mut out = Vec::new();
    for (_, alarm) in shared.store.scan::<AlarmRecord>(&prefix, None, usize::MAX)? {
        out.push(alarm?);
    }
    Ok(out)
}

/// Every alarm of a run, with its cron schedule and its occurrences being retried.
pub(crate) fn list(shared: &Shared, run_id: &RunId) -> Result<Vec<Alarm>, RuntimeError> {
    list_page(shared, run_id, None, usize::MAX)
}

/// At most `limit` alarms of a run in the order of their names, after alarm `after`, each
/// with its cron schedule and its occurrences being retried.
pub(crate) fn list_page(
    shared: &Shared,
    run_id: &RunId,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<Alarm>, RuntimeError> {
    let after = after.map(|name| keys::alarm(run_id, name));
    let mut out = Vec::new();
    for (_, record) in
        shared.store.scan::<AlarmRecord>(&keys::ALARMS.of_run(run_id), after.as_ref(), limit)?
    {
        let record = record?;
        let cron = cron_of(shared, run_id, &record.name)?;
        let retrying = retries(shared, run_id, Some(&record.name))?;
        out.push(Alarm { record, cron, retrying });
    }
    Ok(out)
}

/// The alarm's payload as stored, once its name and size are checked.
fn checked_payload(name: &str, spec: &AlarmSpec) -> Result<String, RuntimeError> {
    tables::check_id("alarm name", name).map_err(|e| RuntimeError::InvalidInput(e.into()))?;
    if spec.payload_json.len() > limits::PAYLOAD_BYTES_MAX {
        return Err(RuntimeError::InvalidInput(format!(
            "alarm payload is over {} bytes",
            limits::PAYLOAD_BYTES_MAX
        )));
    }
    json::recanonicalize(&spec.payload_json).map_err(|e| RuntimeError::InvalidInput(e.into()))
}

/// Sets (or replaces) alarm `name` of `run_id`. `system` marks the runtime's own alarms;
/// `cell` is the live run setting its own alarm, for which the alarm is a boundary (§3.6).
pub(crate) async fn set(
    shared: &Arc<Shared>,
    run_id: &RunId,
    name: &str,
    spec: AlarmSpec,
    system: Option<tables::SystemAlarm>,
    cell: Option<&RunCell>,
) -> Result<(), RuntimeError> {
    let payload_json = checked_payload(name, &spec)?;
    let run = shared.load_run(run_id)?;
    if run.status.is_terminal() {
        return Err(RuntimeError::RunFinished { run_id: run_id.into(), state: run.status.name().into() });
    }
    let existing: Option<AlarmRecord> = shared.store.get(&keys::alarm(run_id, name))?;
    let cron = spec.cron.as_ref().map(CronSchedule::record);
    let every_ms = if cron.is_some() { None } else { spec.every.map(check_period).transpose()? };
    if let Some(old) = &existing
        && (every_ms.is_some() || cron.is_some())
        && old.every_ms == every_ms
        && old.payload_json == payload_json
        && cron_of(shared, run_id, name)? == cron
    {
        return Ok(());
    }
    let now = shared.now();
    let due = match &cron {
        Some(cron) => next_cron(cron, now)?,
        None => due_at(now, spec.at)?,
    };
    // Checked as every other due time is, so no arithmetic on it can wrap.
    due_at(now, AlarmAt::At(due))?;
    let alarm = AlarmRecord {
        run_id: run_id.into(),
        name: name.to_string(),
        due_at_ms: due,
        scheduled_at_ms: due,
        payload_json,
        every_ms,
        attempts_started: 0,
        generation: existing.as_ref().map(|a| a.generation + 1).unwrap_or(1),
        system,
    };
    let mut batch = Batch::new();
    let unscheduled = match &existing {
        Some(old) => forget(shared, &mut batch, run_id, name, old.due_at_ms)?,
        None => Vec::new(),
    };
    stage(&mut batch, &alarm)?;
    if let Some(cron) = &cron {
        batch.put(keys::alarm_cron(run_id, name), cron)?;
    }
    match cell {
        Some(cell) => shared.commit_boundary(cell, batch, durafiber_store::Durability::Sync).await?,
        None => shared.store.commit(batch, durafiber_store::Durability::Sync).await?,
    }
    unschedule(shared, run_id, unscheduled);
    shared.timers.scheduler.insert(due, run_id, name);
    shared.timers.driver_wake.notify_one();
    shared.event(run_id, "alarm_set", format!("{name} due at {due}"));
    Ok(())
}

/// Cancels alarm `name` of `run_id`; true when it existed.
pub(crate) async fn cancel(shared: &Arc<Shared>, run_id: &RunId, name: &str) -> Result<bool, RuntimeError> {
    // Checked as `set` checks it, so a name is refused the same way whatever is asked.
    tables::check_id("alarm name", name).map_err(|e| RuntimeError::InvalidInput(e.into()))?;
    let Some(old) = shared.store.get::<AlarmRecord>(&keys::alarm(run_id, name))? else {
        return Ok(false);
    };
    let mut batch = Batch::new();
    let unscheduled = forget(shared, &mut batch, run_id, name, old.due_at_ms)?;
    shared.store.commit(batch, durafiber_store::Durability::Sync).await?;
    unschedule(shared, run_id, unscheduled);
    shared.event(run_id, "alarm_cancelled", name.to_string());
    Ok(true)
}
