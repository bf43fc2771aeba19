//! Durable external events: `Runtime::send_event` from outside, `ctx.wait_for_event` in the
//! fiber (a durable wait, `Waiting{event}`).
//!
//! An event is buffered durably first (FIFO per name, bounded), then handed to its waiter.
//! A wait consumes the oldest buffered event of its name in the same boundary that journals
//! the result under the wait's name, so a re-entered fiber gets the same answer without
//! waiting again, and an event is seen once however often the run is interrupted. The same
//! idempotency key twice is a `Duplicate`, delivered once. A timeout is a system alarm, so
//! a wait whose fiber was lost still ends on time.
//!
//! Wait lifecycle: absent → `EventWaitRecord{result: None}` + `Waiting{event}` (+ its timeout
//! alarm) → `result: Some(event or timed out)`, `Running`.

use crate::kernel::commit::{self, After};
use durafiber_api::Timestamp;
use durafiber_store::RunId;
use durafiber_store::tables::RunRecord;
use std::{sync::Arc, time::Duration};

use durafiber_store::{
    Batch,
    tables::{
        self, AlarmRecord, EventRecord, EventWaitRecord, Key, RunStatus, SystemAlarm, WakeReason, keys,
        keys::Journaled,
    },
};
use tokio::sync::oneshot;

use crate::boundary::Boundary;
use crate::{
    alarm,
    alarm::AlarmAt,
    error::{AgentError, RuntimeError},
    json,
    kernel::shared::{RawCtx, Shared},
    limits,
};

pub use durafiber_api::SendOutcome;

fn timeout_alarm_name(name: &str) -> String {
    format!("event:{name}")
}

/// The oldest buffered event of `name`, with its key.
fn oldest(
    shared: &Shared,
    run_id: &RunId,
    name: &str,
) -> Result<Option<(Key<EventRecord>, EventRecord)>, RuntimeError> {
    match shared.store.scan(&keys::events_named(run_id, name), None, 1)?.into_iter().next() {
        Some((key, record)) => Ok(Some((key, record?))),
        None => Ok(None),
    }
}

/// Every buffered event of a run: (count, bytes, the next sequence number for `name`).
fn buffered(shared: &Shared, run_id: &RunId, name: &str) -> Result<(usize, usize, u64), RuntimeError> {
    let prefix = keys::EVENTS.of_run(run_id);
    let same_name = keys::events_named(run_id, name);
    let (mut count, mut bytes, mut next_seq) = (0, 0, 1u64);
    for (key, value) in shared.store.keys_and_sizes(&prefix, limits::EVENT_BUFFER_MAX + 1)? {
        count += 1;
        bytes += value;
        if same_name.holds(&key)
            && let Some(seq) = keys::event_seq(&key)
        {
            next_seq = next_seq.max(seq.saturating_add(1));
        }
    }
    Ok((count, bytes, next_seq))
}

/// Sends an event to a run (see the module's lifecycle).
pub(crate) async fn send(
    shared: &Arc<Shared>,
    run_id: &RunId,
    name: &str,
    payload_json: &str,
    idempotency_key: Option<&str>,
) -> Result<SendOutcome, RuntimeError> {
    let payload_json = checked_payload(name, payload_json, idempotency_key)?;
    // Events and decisions of one run are written one at a time.
    let _one_at_a_time = shared.stripes.inbound(run_id).await;
    let run = shared.load_run(run_id)?;
    // A repeat is answered as a repeat whatever became of the run since: a caller retrying
    // a send it was not sure of must learn it arrived, even if the run has consumed it and
    // finished meanwhile.
    let dedupe_key = idempotency_key.map(|k| keys::event_key(run_id, k));
    if let Some(key) = &dedupe_key
        && shared.store.get(key)?.is_some()
    {
        return Ok(SendOutcome::Duplicate);
    }
    if run.status.is_terminal() {
        return Err(RuntimeError::RunFinished { run_id: run_id.into(), state: run.status.name().into() });
    }
    let (count, bytes, seq) = buffered(shared, run_id, name)?;
    if count >= limits::EVENT_BUFFER_MAX || bytes + payload_json.len() > limits::EVENT_BUFFER_BYTES_MAX {
        return Err(RuntimeError::InvalidInput(format!(
            "run {run_id} already holds {count} undelivered events ({bytes} bytes): the buffer is full"
        )));
    }
    let record = EventRecord {
        payload_json,
        idempotency_key: idempotency_key.map(str::to_string),
        sent_at_ms: shared.now(),
    };
    let waiting = run.status == (RunStatus::WaitingEvent { name: name.to_string() });
    let event_key = keys::event(run_id, name, seq);
    let written = shared
        .update_run(run_id, |run, batch| {
            batch.put(event_key.clone(), &record)?;
            if let Some(key) = &dedupe_key {
                batch.put(key.clone(), &())?;
            }
            if run.status == (RunStatus::WaitingEvent { name: name.to_string() }) {
                run.status = RunStatus::Running;
                run.wake_reason = Some(WakeReason::Resumed);
            }
            Ok(true)
        })
        .await?;
    shared.event(run_id, "event_sent", format!("{name} #{seq}"));
    if written.is_none() {
        return Ok(SendOutcome::Buffered);
    }
    Ok(hand_over(shared, run_id, name, waiting).await)
}

/// An event's payload as stored, once its name, key and size are checked.
fn checked_payload(
    name: &str,
    payload_json: &str,
    idempotency_key: Option<&str>,
) -> Result<String, RuntimeError> {
    tables::check_id("event name", name).map_err(|e| RuntimeError::InvalidInput(e.into()))?;
    if let Some(key) = idempotency_key {
        tables::check_id("event idempotency key", key).map_err(|e| RuntimeError::InvalidInput(e.into()))?;
    }
    if payload_json.len() > limits::PAYLOAD_BYTES_MAX {
        return Err(RuntimeError::InvalidInput(format!(
            "event payload is over {} bytes",
            limits::PAYLOAD_BYTES_MAX
        )));
    }
    json::recanonicalize(payload_json).map_err(|e| RuntimeError::InvalidInput(e.into()))
}

/// A durable event handed to its waiter: the live fiber waiting for `name`, or a run parked
/// on it, re-entered; otherwise it stays buffered for the next wait of that name.
async fn hand_over(shared: &Arc<Shared>, run_id: &RunId, name: &str, waiting: bool) -> SendOutcome {
    if let Some(live) = shared.registry.get(run_id) {
        let mut slot = live.cell.waits.event.lock();
        if slot.as_ref().is_some_and(|waiter| waiter.0 == name)
            && let Some(waiter) = slot.take().map(|waiter| waiter.1)
            && waiter.send(shared.life.wake_token()).is_ok()
        {
            return SendOutcome::Delivered;
        }
    }
    if waiting {
        shared.reactivate(run_id).await;
        return SendOutcome::Delivered;
    }
    SendOutcome::Buffered
}

/// Waits for event `name`; `None` when `timeout` passed first. See the module's lifecycle.
pub(crate) async fn wait(
    raw: &mut RawCtx,
    name: &str,
    timeout: Option<Duration>,
) -> Result<Option<String>, AgentError> {
    tables::check_id("event name", name).map_err(AgentError::fail)?;
    let shared = raw.shared.clone();
    let run_id = raw.cell.run_id.clone();
    let wkey = keys::event_wait(&run_id, name);
    let entered_at = shared.now();
    let journaled: Option<EventWaitRecord> = shared.store.get(&wkey)?;
    if let Some(EventWaitRecord { result: Some(result), .. }) = journaled {
        return Ok(result);
    }
    let timeout_at = match journaled.as_ref().map(|w| w.timeout_at_ms) {
        Some(at) => at,
        None => timeout.map(|d| alarm::due_at(shared.now(), AlarmAt::In(d))).transpose()?,
    };
    let mut announced = journaled.is_some();
    loop {
        if let Some((event_key, event)) = oldest(&shared, &run_id, name)? {
            let got = Some(event.payload_json);
            finish(raw, name, timeout_at, got.clone(), Some(event_key), entered_at).await?;
            return Ok(got);
        }
        if timeout_at.is_some_and(|at| at <= shared.now()) {
            finish(raw, name, timeout_at, None, None, entered_at).await?;
            return Ok(None);
        }
        if !announced {
            park(raw, name, timeout_at).await?;
            announced = true;
        }
        let (tx, rx) = oneshot::channel();
        *raw.cell.waits.event.lock() = Some(Box::new((name.to_string(), tx)));
        // An event may have landed between the look and the waiter's registration.
        if oldest(&shared, &run_id, name)?.is_some() {
            raw.cell.waits.event.lock().take();
            continue;
        }
        shared.fiber_waiting(&run_id, true, shared.now());
        let deadline = timeout_at.unwrap_or(Timestamp::MAX);
        let woken = shared
            .life
            .parked(raw.in_fiber, async {
                tokio::select! {
                    token = rx => token.ok(),
                    () = shared.time.clock.sleep_until(deadline) => None,
                }
            })
            .await;
        // The wake token drops here, after the fiber counts itself busy again.
        drop(woken);
        shared.fiber_waiting(&run_id, false, shared.now());
    }
}

fn timeout_alarm(run_id: &RunId, name: &str, at: Timestamp) -> AlarmRecord {
    AlarmRecord {
        run_id: run_id.into(),
        name: timeout_alarm_name(name),
        due_at_ms: at,
        scheduled_at_ms: at,
        payload_json: "null".into(),
        every_ms: None,
        attempts_started: 0,
        generation: 1,
        system: Some(SystemAlarm::EventTimeout { name: name.to_string() }),
    }
}

/// The boundary that starts a wait: its journal entry, `Waiting{event}`, its timeout alarm.
async fn park(raw: &mut RawCtx, name: &str, timeout_at: Option<Timestamp>) -> Result<(), AgentError> {
    let shared = raw.shared.clone();
    let run_id = raw.cell.run_id.clone();
    let alarm = timeout_at.map(|at| timeout_alarm(&run_id, name, at));
    let record = EventWaitRecord { timeout_at_ms: timeout_at, result: None };
    let mut after = After::at((Boundary::AfterEventWait, name)).progress().event("event_wait", name);
    if let Some(alarm) = &alarm {
        after = after.alarm_set(alarm.due_at_ms, alarm.name.clone());
    }
    let change = |run: &mut RunRecord, batch: &mut Batch| {
        batch.put(keys::event_wait(&run_id, name), &record)?;
        if let Some(alarm) = &alarm {
            alarm::stage(batch, alarm)?;
        }
        // An event sent since the fiber looked is already buffered, its send saw a running
        // run and woke nothing: parked, the run would wait for it forever after a crash. It
        // stays `Running`, and the fiber takes the event next.
        if oldest(&shared, &run_id, name)?.is_none() {
            run.status = RunStatus::WaitingEvent { name: name.to_string() };
        }
        Ok(true)
    };
    commit::commit_run(raw, change, after).await?;
    Ok(())
}

/// The boundary that ends a wait: the result journaled, the event consumed, `Running`.
async fn finish(
    raw: &mut RawCtx,
    name: &str,
    timeout_at: Option<Timestamp>,
    result: Option<String>,
    consumed: Option<Key<EventRecord>>,
    entered_at: Timestamp,
) -> Result<(), AgentError> {
    let shared = raw.shared.clone();
    let run_id = raw.cell.run_id.clone();
    let record = EventWaitRecord { timeout_at_ms: timeout_at, result: Some(result.clone()) };
    let mut extra = Batch::new();
    if let Some(key) = consumed {
        extra.delete(key);
    }
    if let Some(at) = timeout_at {
        alarm::unstage(&mut extra, &run_id, &timeout_alarm_name(name), at);
    }
    let seq = raw.cell.seq.load(std::sync::atomic::Ordering::SeqCst);
    let what = if result.is_some() { "event_received" } else { "event_timed_out" };
    let mut after =
        After::at((Boundary::AfterEvent, name)).progress().event(what, name).span(&shared, || {
            raw.span_since("event.wait", entered_at)
                .attr("durafiber.event.name", name.to_string())
                .attr("durafiber.event.outcome", if result.is_some() { "received" } else { "timed out" })
        });
    if let Some(at) = timeout_at {
        after = after.alarm_gone(at, timeout_alarm_name(name));
    }
    let change = |run: &mut RunRecord, batch: &mut Batch| {
        batch.extend(extra);
        batch.put(keys::event_wait(&run_id, name), &record)?;
        batch.put(keys::journal_seq(&run_id, Journaled::EventWait, name), &seq)?;
        if matches!(run.status, RunStatus::WaitingEvent { .. } | RunStatus::Running) {
            run.status = RunStatus::Running;
            run.wake_reason = None;
        }
        Ok(true)
    };
    commit::commit_run(raw, change, after).await?;
    Ok(())
}

/// A wait's timeout alarm fired: a wait still pending ends as timed out. True when the run
/// is to be re-entered (its fiber was lost); a live fiber ends the wait by itself.
pub(crate) async fn on_timeout_alarm(
    shared: &Arc<Shared>,
    run_id: &RunId,
    name: &str,
    due_at: Timestamp,
) -> Result<bool, RuntimeError> {
    let wkey = keys::event_wait(run_id, name);
    let pending: Option<EventWaitRecord> = shared.store.get(&wkey)?;
    let resumed = shared
        .update_run(run_id, |run, batch| {
            alarm::unstage(batch, run_id, &timeout_alarm_name(name), due_at);
            if let Some(wait) = pending.filter(|w| w.result.is_none()) {
                batch.put(wkey.clone(), &EventWaitRecord { result: Some(None), ..wait })?;
            }
            if run.status == (RunStatus::WaitingEvent { name: name.to_string() }) {
                run.status = RunStatus::Running;
                run.wake_reason = Some(WakeReason::Resumed);
            }
            Ok(true)
        })
        .await?;
    Ok(resumed
        .is_some_and(|run| run.status == RunStatus::Running && run.wake_reason == Some(WakeReason::Resumed)))
}
