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
    tables::{ReemissionRecord, RunRecord, RunStatus, TableInfo, WakeReason, keys},
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
    /// How long the replay took, ms.
    pub took_ms: u64,
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
        let now_ms = self.shared.now_ms();
        let entries = self.shared.store.snapshot().await?;
        let sim = SimBackend::new();
        let sandbox_store = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default())?;
        let mut before: Vec<RunRecord> = Vec::new();
        let mut batch = Batch::new();
        for (key, sealed) in entries {
            if TableInfo::of_key(&key).is_some_and(|t| t.prefix == keys::OPEN_RUNS.prefix())
                && let Some(run_id) = keys::run_of_key(&key)
            {
                match self.shared.load_run(run_id) {
                    Ok(run) => before.push(run),
                    Err(RuntimeError::UnknownRun { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            batch.put_sealed(key, sealed);
            if batch.len() >= COPY_BATCH {
                sandbox_store.commit(std::mem::take(&mut batch), Durability::Async).await?;
            }
        }
        // Each waiting run re-entered as a wait's end re-enters it.
        for run in &before {
            if waits(&run.status) {
                let resumed = RunRecord {
                    status: RunStatus::Running,
                    wake_reason: Some(WakeReason::Resumed),
                    ..run.clone()
                };
                batch.put(keys::run(&run.run_id), &resumed)?;
            }
        }
        sandbox_store.commit(batch, Durability::Sync).await?;

        let config = RuntimeConfig {
            stop_calls: true,
            // A recovery hook that fails once fails every time in a sandbox whose time does
            // not move: what the runtime would do after its attempts, at once.
            max_recover_attempts: 1,
            ..self.shared.config.clone()
        };
        let mut builder =
            Runtime::builder(sandbox_store).config(config).virtual_clock(VirtualClock::new(now_ms));
        builder.kinds = self.shared.kinds.clone();
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
        report.took_ms = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX);
        tracing::info!(
            replayed = report.replayed,
            differ = report.runs.len(),
            escalate = report.escalating(),
            took_ms = report.took_ms,
            "open runs replayed"
        );
        Ok(report)
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
    let mut out = RunReplay {
        run_id: run.run_id.clone(),
        kind: run.kind.clone(),
        escalates: false,
        findings: Vec::new(),
    };
    let mut after = sandbox.shared.load_run(&run.run_id)?.status;
    // A fiber re-entered at an event wait it had journaled waits again without a boundary
    // (the store still says running): what it waits for, and the chunks it re-emitted
    // differently, are in its cell.
    let mut unwritten = Vec::new();
    if let Some(live) = sandbox.shared.registry.get(&run.run_id) {
        if let Some(waiter) = live.cell.event_waiter.lock().as_ref() {
            after = RunStatus::WaitingEvent { name: waiter.0.clone() };
        }
        if let Some(buffer) = live.cell.stream.lock().as_ref() {
            unwritten.extend(buffer.reemissions.iter().cloned());
        }
    }
    match &after {
        RunStatus::Escalated { reason } => {
            out.escalates = true;
            out.findings.push(format!("would escalate: {reason}"));
        }
        RunStatus::Cancelled { reason } if reason.starts_with("replay stopped") => {
            out.findings.push(reason.clone());
        }
        RunStatus::Cancelled { reason } if !matches!(run.status, RunStatus::Cancelled { .. }) => {
            out.findings.push(format!("would end cancelled: {reason}"));
        }
        RunStatus::Failed { error } => out.findings.push(format!("would fail: {error}")),
        RunStatus::Completed { .. } if waits(&run.status) => {
            out.findings
                .push(format!("no longer waits on its {}: it would complete", wait_name(&run.status)));
        }
        status if waits(&run.status) && waits(status) && *status != run.status => {
            out.findings.push(format!(
                "no longer waits on its {}: it would wait on {}",
                wait_name(&run.status),
                wait_name(status)
            ));
        }
        RunStatus::Running | RunStatus::Accepted
            if !settled || sandbox.shared.registry.get(&run.run_id).is_some() =>
        {
            out.findings.push("did not reach a wait or an end within the replay's time".into());
        }
        _ => {}
    }
    let held: Vec<u64> = live
        .store
        .scan::<ReemissionRecord>(&keys::STREAM_REEMISSIONS.of_run(&run.run_id), None, usize::MAX)?
        .into_iter()
        .filter_map(|(_, r)| r.ok().map(|r| r.seq))
        .collect();
    let written = sandbox.shared.store.scan::<ReemissionRecord>(
        &keys::STREAM_REEMISSIONS.of_run(&run.run_id),
        None,
        usize::MAX,
    )?;
    let written: Vec<ReemissionRecord> = written.into_iter().map(|(_, r)| r).collect::<Result<_, _>>()?;
    for reemission in written.into_iter().chain(unwritten) {
        if !held.contains(&reemission.seq) {
            out.findings.push(format!(
                "chunk {} re-emitted differently (the durable chunk stands): {}",
                reemission.seq, reemission.emitted_json
            ));
        }
    }
    Ok(out)
}
