//! The replay before a deploy: every open run re-entered from its last boundary by this
//! binary's code, in a sandbox — a copy of the store in memory, a virtual clock stopped at
//! now, effects answered from the ledger's receipts and every call the ledger does not hold
//! stopped before it leaves (`RuntimeConfig::stop_calls`) — and, per run, what the new code
//! does differently from what the store holds: an escalation (an effect called with other
//! arguments, an approval asked with another payload, a stash it cannot upgrade, a recovery
//! hook that fails), a wait it no longer reaches, a call it would make, a chunk of its output
//! it emits otherwise. The store checked is only read.
//!
//! A waiting run is re-entered as a wait's end re-enters it (its record set running and
//! resumed, in the copy), so its fiber runs from its last stash to its wait again. Time does
//! not move: a sleep not yet due stays asleep, an alarm not yet due does not fire.

use std::{sync::Arc, time::Duration};

use durafiber_store::{
    Batch, Durability, RunId, SimBackend, Store, StoreConfig,
    tables::{ReemissionRecord, RunRecord, RunStatus, TableInfo, WakeReason, decode_sealed, keys},
};
use serde::Serialize;

use super::handle::Runtime;
use crate::{clock::VirtualClock, config::RuntimeConfig, error::RuntimeError};

/// Records copied into the sandbox per commit.
const COPY_BATCH: usize = 1_000;

/// How long the sandbox may take to bring every re-entered run to a wait, on the real clock:
/// this much, plus [`REPLAY_TIME_PER_RUN`] for each open run.
const REPLAY_TIME_BASE: Duration = Duration::from_secs(60);
const REPLAY_TIME_PER_RUN: Duration = Duration::from_millis(10);

/// What the new code does differently with one open run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunReplay {
    /// The run.
    pub run_id: RunId,
    /// Its kind.
    pub kind: String,
    /// Whether the run would escalate: the only finding `check-deploy` fails for.
    pub escalates: bool,
    /// Each difference, one line each.
    pub findings: Vec<String>,
}

/// The whole replay.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplayReport {
    /// Open runs re-entered.
    pub replayed: usize,
    /// The runs the new code treats differently, in run id order; runs it carries as they
    /// are are not listed.
    pub runs: Vec<RunReplay>,
    /// How long the replay took (`took_ms` in JSON).
    #[serde(rename = "took_ms", with = "durafiber_api::time::millis_duration")]
    pub took: std::time::Duration,
}

impl ReplayReport {
    /// How many runs would escalate.
    pub fn escalating(&self) -> usize {
        self.runs.iter().filter(|r| r.escalates).count()
    }
}

impl Runtime {
    /// Re-enters every open run from its last boundary with this runtime's agents, in a
    /// sandbox — a copy of the store in memory, a virtual clock stopped at now, effects
    /// answered from the ledger and every new call stopped before it leaves — and reports
    /// what each would do differently: an escalation, a wait it no longer reaches, a call it
    /// would make, a chunk it re-emits otherwise. A waiting run is re-entered as its wait's
    /// end would re-enter it. Reads this runtime's store only; open the runtime
    /// [`passive`](crate::RuntimeBuilder::passive)ly.
    ///
    /// # Errors
    ///
    /// A store that cannot be read, or a sandbox that does not open.
    pub async fn replay_open_runs(&self) -> Result<ReplayReport, RuntimeError> {
        let began = std::time::Instant::now();
        let (sim, copy, before) = self.copy_into_sandbox().await?;
        let config = RuntimeConfig {
            stop_calls: true,
            // A recovery hook that fails once fails every time in a sandbox whose time does
            // not move: what the runtime would do after its attempts, at once.
            max_recover_attempts: 1,
            ..self.shared.config.clone()
        };
        let clock = VirtualClock::new(self.shared.now());
        let mut builder = Runtime::builder(copy).config(config).virtual_clock(clock);
        builder.kinds = self.shared.agents.kinds.clone();
        let sandbox = builder.open().await?;
        let limit = REPLAY_TIME_BASE.saturating_add(REPLAY_TIME_PER_RUN.saturating_mul(before.len() as u32));
        let settled = tokio::time::timeout(limit, sandbox.settle()).await.is_ok();
        let mut report = ReplayReport { replayed: before.len(), ..ReplayReport::default() };
        for run in &before {
            let replay = compare(&self.shared, &sandbox, run, settled)?;
            if !replay.findings.is_empty() {
                report.runs.push(replay);
            }
        }
        sandbox.shutdown().await;
        drop(sim);
        report.took = began.elapsed();
        tracing::info!(
            replayed = report.replayed,
            differ = report.runs.len(),
            escalate = report.escalating(),
            took_ms = report.took.as_millis(),
            "open runs replayed"
        );
        Ok(report)
    }

    /// A consistent copy of this runtime's store in memory, each waiting run in it set running
    /// and resumed (as a wait's end re-enters it); the open runs as the copy held them.
    async fn copy_into_sandbox(&self) -> Result<(SimBackend, Store, Vec<RunRecord>), RuntimeError> {
        let sim = SimBackend::new();
        let copy = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default())?;
        let mut open = std::collections::HashSet::new();
        let mut before = Vec::new();
        let mut batch = Batch::new();
        // Key order puts `open_runs` before `runs`: an open run's record is read from the same
        // snapshot that says it is open.
        for (key, sealed) in self.shared.store.snapshot().await? {
            match TableInfo::of_key(&key) {
                Some(t) if t.prefix == keys::OPEN_RUNS.prefix() => {
                    open.extend(keys::run_of_key(&key).map(str::to_string));
                }
                Some(t)
                    if t.prefix == keys::RUNS.prefix()
                        && keys::run_of_key(&key).is_some_and(|id| open.contains(id)) =>
                {
                    before.push(decode_sealed::<RunRecord>(t, &key, &sealed)?);
                }
                _ => {}
            }
            batch.put_sealed(key, sealed);
            if batch.len() >= COPY_BATCH {
                copy.commit(std::mem::take(&mut batch), Durability::Async).await?;
            }
        }
        for run in before.iter().filter(|run| waits(&run.status)) {
            let resumed = RunRecord {
                status: RunStatus::Running,
                wake_reason: Some(WakeReason::Resumed),
                ..run.clone()
            };
            batch.put(keys::run(&run.run_id), &resumed)?;
        }
        copy.commit(batch, Durability::Sync).await?;
        Ok((sim, copy, before))
    }
}

/// Whether a run in `status` waits for something outside its fiber.
fn waits(status: &RunStatus) -> bool {
    matches!(
        status,
        RunStatus::WaitingApproval { .. } | RunStatus::WaitingAlarm { .. } | RunStatus::WaitingEvent { .. }
    )
}

/// A wait as a finding names it.
fn wait_name(status: &RunStatus) -> String {
    match status {
        RunStatus::WaitingApproval { approval_id } => format!("approval {approval_id:?}"),
        RunStatus::WaitingAlarm { name } => format!("sleep or alarm {name:?}"),
        RunStatus::WaitingEvent { name } => format!("event {name:?}"),
        other => other.name().to_string(),
    }
}

/// What the sandbox made of `run`, against what the store holds.
fn compare(
    live: &crate::kernel::shared::Shared,
    sandbox: &Runtime,
    run: &RunRecord,
    settled: bool,
) -> Result<RunReplay, RuntimeError> {
    let mut after = sandbox.shared.load_run(&run.run_id)?.status;
    // A fiber re-entered at an event wait it had journaled waits again without a boundary
    // (the store still says running): what it waits for, and the chunks it re-emitted
    // differently, are in its cell.
    let mut unwritten = Vec::new();
    let still_live = sandbox.shared.registry.get(&run.run_id);
    if let Some(cell) = still_live.as_ref().map(|live| &live.cell) {
        if let Some(waiter) = cell.waits.event.lock().as_ref() {
            after = RunStatus::WaitingEvent { name: waiter.0.clone() };
        }
        if let Some(buffer) = cell.output.stream.lock().as_ref() {
            unwritten.extend(buffer.reemissions.iter().cloned());
        }
    }
    let stuck = !settled || still_live.is_some();
    let mut findings: Vec<String> = status_finding(&run.status, &after, stuck).into_iter().collect();
    let held: Vec<u64> = reemissions(live, &run.run_id)?.iter().map(|r| r.seq).collect();
    for reemission in reemissions(&sandbox.shared, &run.run_id)?.into_iter().chain(unwritten) {
        if !held.contains(&reemission.seq) {
            findings.push(format!(
                "chunk {} re-emitted differently (the durable chunk stands): {}",
                reemission.seq, reemission.emitted_json
            ));
        }
    }
    Ok(RunReplay {
        run_id: run.run_id.clone(),
        kind: run.kind.clone(),
        escalates: matches!(after, RunStatus::Escalated { .. }),
        findings,
    })
}

/// What a run ending the replay in `after`, having been in `before`, does differently; `stuck`
/// when its fiber still ran when the replay ended.
fn status_finding(before: &RunStatus, after: &RunStatus, stuck: bool) -> Option<String> {
    match after {
        RunStatus::Escalated { reason } => Some(format!("would escalate: {reason}")),
        RunStatus::Cancelled { reason } if reason.starts_with("replay stopped") => Some(reason.clone()),
        RunStatus::Cancelled { reason } => Some(format!("would end cancelled: {reason}")),
        RunStatus::Failed { error } => Some(format!("would fail: {error}")),
        RunStatus::Completed { .. } if waits(before) => {
            Some(format!("no longer waits on its {}: it would complete", wait_name(before)))
        }
        status if waits(before) && waits(status) && status != before => Some(format!(
            "no longer waits on its {}: it would wait on {}",
            wait_name(before),
            wait_name(status)
        )),
        RunStatus::Running | RunStatus::Accepted if stuck => {
            Some("did not reach a wait or an end within the replay's time".into())
        }
        _ => None,
    }
}

/// The chunks `shared`'s store records as re-emitted differently for a run.
fn reemissions(
    shared: &crate::kernel::shared::Shared,
    run_id: &RunId,
) -> Result<Vec<ReemissionRecord>, RuntimeError> {
    let scanned =
        shared.store.scan::<ReemissionRecord>(&keys::STREAM_REEMISSIONS.of_run(run_id), None, usize::MAX)?;
    Ok(scanned.into_iter().map(|(_, r)| r).collect::<Result<_, _>>()?)
}
