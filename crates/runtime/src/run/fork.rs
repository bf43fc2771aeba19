//! Forking a run from a boundary of its history: a new run of the same kind that starts from
//! the stash written at that boundary, without paying again for what came before it.
//!
//! What the source had settled before the boundary — effects committed, approvals decided,
//! sleeps woken, event waits ended (`journal_seqs` says at which boundary each settled) — is
//! copied into the fork as settled: a committed effect keeps its idempotency key and receipt,
//! so re-entered it returns the receipt and calls nothing, and the fork's record lists it as
//! inherited. What settled at or after the boundary is not copied: the fork mints new keys for
//! those effects, and asks again for those approvals. Its output stream is copied up to the
//! boundary's mark, its storage as it was at the boundary (`storage::as_at`: today's, with
//! the writes after the boundary undone). Children started before the boundary are the
//! fork's children too — the same runs, joined or not, never started again; those started
//! at or after it are started anew by the fork. The source is only read.
//!
//! Refused (`ForkRefused`), rather than guessed: a boundary the history no longer keeps, a
//! step settled before boundaries were journaled, a stream mark or storage the history
//! cannot tell (storage written before the run kept a storage history). Alarms and pending waits of the source
//! are not carried: the fork's code sets and asks them again as it goes on.

use durafiber_api::Timestamp;
use std::sync::Arc;

use durafiber_store::{
    Batch, Durability, StoreError,
    tables::{
        ApprovalRecord, ChildRecord, EventWaitRecord, ForkRecord, HistoryRecord, LedgerEntry, ParentRecord,
        RunRecord, RunStatus, SleepRecord, StashRecord, StreamChunkRecord, StreamHead, WakeReason, keys,
        keys::Journaled,
    },
};

use crate::{
    error::RuntimeError,
    json,
    kernel::shared::Shared,
    run::start::{self, StartOutcome},
    storage::AsAtError,
    types::{RunId, RunOptions},
};

/// How a fork starts: its input (the source's when `None`; it must be the kind's input type)
/// and its options.
#[derive(Debug, Clone, Default)]
pub struct ForkOptions {
    /// The fork's input as JSON; `None` keeps the source's.
    pub input_json: Option<String>,
    /// Its durability, keep-alive and budget.
    pub run: RunOptions,
}

/// Most records a fork copies in its one write.
const FORK_RECORDS_MAX: usize = 10_000;

fn refused(run_id: &RunId, reason: impl Into<String>) -> RuntimeError {
    RuntimeError::ForkRefused { run_id: run_id.into(), reason: reason.into() }
}

pub(crate) async fn fork(
    shared: &Arc<Shared>,
    source_id: &RunId,
    at: u64,
    key: &str,
    options: ForkOptions,
) -> Result<StartOutcome, RuntimeError> {
    let source = shared.load_run(source_id)?;
    durafiber_store::tables::check_id("idempotency key", key)
        .map_err(|e| RuntimeError::InvalidInput(e.into()))?;
    let input_json = fork_input(shared, &source, options.input_json.as_deref())?;
    let input: serde_json::Value =
        json::parse(&input_json).map_err(|e| RuntimeError::InvalidInput(e.into()))?;
    let key_record = keys::run_by_key(&source.kind, key);
    let _guard = shared.stripes.start(key).await;
    if let Some(existing) = start::existing(shared, &key_record, key, &input)? {
        return Ok(existing);
    }
    shared.store.check_room()?;
    let store = &shared.store;
    let (history, point) = point_at(shared, source_id, at)?;
    let now = shared.now();
    let run_id = start::mint_run_id(now)?;
    let new = &run_id;
    let mut batch = Batch::new();
    let mut settled = Settled { store, source_id, at, new: &run_id, batch: &mut batch };
    let inherited_effects = settled.effects()?;
    let inherited_approvals = settled.approvals()?;
    settled.waits()?;
    settled.children()?;
    copy_stream(shared, source_id, new, at, &history, &mut batch)?;
    copy_storage(store, source_id, new, at, &mut batch)?;
    if batch.len() > FORK_RECORDS_MAX {
        return Err(refused(
            source_id,
            format!("it would copy {} records, more than {FORK_RECORDS_MAX}", batch.len()),
        ));
    }

    let fork = ForkRecord {
        source_run_id: source.run_id.clone(),
        at_seq: at,
        inherited_effects,
        inherited_approvals,
        forked_at_ms: now,
    };
    let input_hash = json::canonical_with_hash(&input).map_err(|e| RuntimeError::InvalidInput(e.into()))?.1;
    let run = fork_record_of(&source, &run_id, key, input_json, input_hash, &options, now);
    batch.put(key_record.clone(), &run.run_id)?;
    crate::budget::stage_at_start(&mut batch, new, options.run.budget.or(shared.config.budget).limits())?;
    stage_first_stash(&mut batch, &run_id, point, now, shared.config.history_max)?;
    batch.put(keys::fork(new), &fork)?;
    batch.put(keys::run(new), &run)?;
    batch.put(keys::open_run(new), &())?;
    batch.all_new();
    match store.commit(batch, Durability::Sync).await {
        Ok(()) => shared.signals.status_changed(),
        Err(StoreError::Exists { .. }) => {
            return start::existing(shared, &key_record, key, &input)?
                .ok_or_else(|| RuntimeError::Store(StoreError::Exists { key: key.to_string() }));
        }
        Err(e) => return Err(e.into()),
    }
    drop(_guard);
    shared.event(new, "forked", format!("from {source_id} at boundary {at}"));
    tracing::info!(run_id = %new, source = %source_id, at, "run forked");
    shared.reactivate(new).await;
    Ok(StartOutcome { run_id: RunId::new(run.run_id), accepted: true, status: RunStatus::Running })
}

/// The source's history and its entry at boundary `at`, which the history must still keep.
fn point_at(
    shared: &Shared,
    source_id: &RunId,
    at: u64,
) -> Result<(Vec<HistoryRecord>, HistoryRecord), RuntimeError> {
    let history = crate::kernel::stash_record::history(&shared.store, source_id, shared.config.history_max)?;
    let Some(point) = history.iter().find(|entry| entry.stash.seq == at).cloned() else {
        return Err(refused(
            source_id,
            format!("boundary {at} is not in its history (it keeps the last history_max boundaries)"),
        ));
    };
    Ok((history, point))
}

/// The fork's input as canonical JSON: the source's, or `given`, which must be the kind's —
/// what the run was is fixed, so a mismatch is a conflict with it, not a malformed request.
fn fork_input(shared: &Shared, source: &RunRecord, given: Option<&str>) -> Result<String, RuntimeError> {
    let Some(text) = given else { return Ok(source.input_json.clone()) };
    let not_its_input = |e: &dyn std::fmt::Display| {
        refused(&source.run_id, format!("the input is not {}'s: {e}", source.kind))
    };
    let value: serde_json::Value = json::parse(text).map_err(|e| not_its_input(&e))?;
    shared.agents.agent(&source.kind)?.check_input(&value).map_err(|e| not_its_input(&e))?;
    json::canonical(&value).map_err(|e| not_its_input(&e))
}

/// The fork's run record: interrupted at its boundary, as a run found after a crash, so its
/// first activation recovers it from the stash.
fn fork_record_of(
    source: &RunRecord,
    run_id: &RunId,
    key: &str,
    input_json: String,
    input_hash: String,
    options: &ForkOptions,
    now: Timestamp,
) -> RunRecord {
    RunRecord {
        run_id: run_id.clone(),
        kind: source.kind.clone(),
        key: key.to_string(),
        input_hash,
        input_json,
        status: RunStatus::Running,
        created_at_ms: now,
        updated_at_ms: now,
        attempt: 0,
        recover_attempts: 0,
        next_recover_at_ms: Timestamp::ZERO,
        wake_reason: Some(WakeReason::Resumed),
        cancel_reason: None,
        options: options.run.stored(),
    }
}

/// The fork's first stash, the one written at the boundary it came from, with its version
/// and its place in the fork's history.
fn stage_first_stash(
    batch: &mut Batch,
    run_id: &RunId,
    point: HistoryRecord,
    now: Timestamp,
    history_max: u32,
) -> Result<(), RuntimeError> {
    let stash = StashRecord { run_id: run_id.clone(), attempt: 0, written_at_ms: now, ..point.stash.clone() };
    batch.put(keys::stash(run_id), &stash)?;
    if point.version != 1 {
        batch.put(keys::stash_version(run_id), &point.version)?;
    }
    batch.put(keys::history(run_id, stash.seq, history_max), &HistoryRecord { stash, ..point })?;
    Ok(())
}

/// The source's storage as it was at the boundary, copied to the fork, whose own storage
/// history is whole from there.
fn copy_storage(
    store: &durafiber_store::Store,
    source_id: &RunId,
    new: &RunId,
    at: u64,
    batch: &mut Batch,
) -> Result<(), RuntimeError> {
    let storage = match crate::storage::as_at(store, source_id, at) {
        Ok(storage) => storage,
        Err(AsAtError::Unknown(reason)) => return Err(refused(source_id, reason)),
        Err(AsAtError::Store(e)) => return Err(e.into()),
    };
    for (key, value) in &storage {
        batch.put(keys::storage(new, key), value)?;
    }
    batch.put(keys::storage_log(new), &at)?;
    Ok(())
}

/// What the source had settled before the fork's boundary `at`, copied into the fork's
/// batch as settled, each with the fork's own journal entry (so a fork of the fork inherits
/// it too).
struct Settled<'a> {
    store: &'a durafiber_store::Store,
    source_id: &'a RunId,
    at: u64,
    new: &'a RunId,
    batch: &'a mut Batch,
}

impl Settled<'_> {
    /// Whether step `id` settled before `at`; if so, the fork's journal says at which boundary.
    fn inherit(&mut self, what: Journaled, id: &str) -> Result<bool, RuntimeError> {
        match self.store.get::<u64>(&keys::journal_seq(self.source_id, what, id))? {
            Some(seq) if seq < self.at => {
                self.batch.put(keys::journal_seq(self.new, what, id), &seq)?;
                Ok(true)
            }
            Some(_) => Ok(false),
            None => Err(refused(self.source_id, format!("{id} settled before its boundary was journaled"))),
        }
    }

    /// Effects committed before the point, with their keys and receipts; their ids.
    fn effects(&mut self) -> Result<Vec<String>, RuntimeError> {
        let mut inherited = Vec::new();
        for (_, entry) in self.store.scan(&keys::LEDGER.of_run(self.source_id), None, usize::MAX)? {
            let mut entry: LedgerEntry = entry?;
            if entry.committed.is_none() || !self.inherit(Journaled::Effect, &entry.effect_id)? {
                continue;
            }
            inherited.push(entry.effect_id.clone());
            entry.run_id = self.new.clone();
            self.batch.put(keys::ledger(self.new, &entry.effect_id), &entry)?;
        }
        Ok(inherited)
    }

    /// Approvals decided before the point, with their rules and votes; their ids.
    fn approvals(&mut self) -> Result<Vec<String>, RuntimeError> {
        let (store, source_id, new) = (self.store, self.source_id, self.new);
        let mut inherited = Vec::new();
        for (_, approval) in store.scan(&keys::APPROVALS.of_run(source_id), None, usize::MAX)? {
            let mut approval: ApprovalRecord = approval?;
            let id = approval.approval_id.clone();
            if approval.decision.is_none() || !self.inherit(Journaled::Approval, &id)? {
                continue;
            }
            if let Some(rule) = store.get(&keys::approval_rule(source_id, &id))? {
                self.batch.put(keys::approval_rule(new, &id), &rule)?;
            }
            for (_, vote) in store.scan(&keys::approval_votes(source_id, &id), None, usize::MAX)? {
                let vote = vote?;
                self.batch.put(keys::approval_vote(new, &id, &vote.by), &vote)?;
            }
            approval.run_id = new.clone();
            self.batch.put(keys::approval(new, &id), &approval)?;
            inherited.push(id);
        }
        Ok(inherited)
    }

    /// Durable sleeps woken and event waits ended before the point, with what they returned.
    fn waits(&mut self) -> Result<(), RuntimeError> {
        let (store, source_id, new) = (self.store, self.source_id, self.new);
        for (_, sleep) in store.scan(&keys::SLEEPS.of_run(source_id), None, usize::MAX)? {
            let mut sleep: SleepRecord = sleep?;
            if sleep.done && self.inherit(Journaled::Sleep, &sleep.name)? {
                sleep.run_id = new.clone();
                self.batch.put(keys::sleep(new, &sleep.name), &sleep)?;
            }
        }
        for (wait_key, wait) in store.scan(&keys::EVENT_WAITS.of_run(source_id), None, usize::MAX)? {
            let wait: EventWaitRecord = wait?;
            let name = wait_key.last_part().unwrap_or_default().to_string();
            if wait.result.is_some() && self.inherit(Journaled::EventWait, &name)? {
                self.batch.put(keys::event_wait(new, &name), &wait)?;
            }
        }
        Ok(())
    }

    /// Children started before the point are the fork's too, the same runs: a joined one
    /// answers its join from its end, one still going is joined, neither starts again. They
    /// stay their starter's children (its to cancel, to count against its budget, to
    /// delete); `fork_parents` sends their end to the fork too.
    fn children(&mut self) -> Result<(), RuntimeError> {
        let (store, source_id, new) = (self.store, self.source_id, self.new);
        for (link_key, link) in store.scan(&keys::CHILDREN.of_run(source_id), None, usize::MAX)? {
            let link: ChildRecord = link?;
            let name = keys::child_name(&link_key).unwrap_or_default();
            if self.inherit(Journaled::Child, &name)? {
                let adopted = ParentRecord { parent_run_id: new.clone(), name: name.clone() };
                self.batch.put(keys::fork_parent(&link.child_run_id, new), &adopted)?;
                self.batch.put(keys::child(new, &name), &link)?;
            }
        }
        Ok(())
    }
}

/// The source's output stream up to its mark at boundary `at`, copied to the fork.
fn copy_stream(
    shared: &Shared,
    source_id: &RunId,
    new: &RunId,
    at: u64,
    history: &[HistoryRecord],
    batch: &mut Batch,
) -> Result<(), RuntimeError> {
    let store = &shared.store;
    let Some(head) = store.get::<StreamHead>(&keys::stream_head(source_id))? else {
        return Ok(());
    };
    if head.next_seq == 0 {
        return Ok(());
    }
    // The mark is recorded with a stash when it moved: the latest one at or before `at`,
    // looked for boundary by boundary back from `at`. A boundary missing on the way (a ring
    // that grew overwrote it) leaves the mark unknown; back at boundary 1 without one,
    // nothing had been emitted before the first boundary moved it.
    let by_seq: std::collections::HashMap<u64, &HistoryRecord> =
        history.iter().map(|entry| (entry.stash.seq, entry)).collect();
    let mut seq = at;
    let mark = loop {
        match by_seq.get(&seq).map(|entry| entry.stream_mark) {
            Some(Some(mark)) => break mark,
            Some(None) if seq <= 1 => break 0,
            Some(None) => seq -= 1,
            None => {
                return Err(refused(source_id, "its stream mark at that boundary is older than its history"));
            }
        }
    };
    let mut bytes = 0u64;
    for (key, chunk) in store.scan(&keys::STREAM.of_run(source_id), None, usize::MAX)? {
        let seq = keys::stream_seq(&key).unwrap_or(u64::MAX);
        if seq >= mark {
            break;
        }
        let chunk: StreamChunkRecord = chunk?;
        bytes = bytes.saturating_add(chunk.data_json.len() as u64);
        batch.put(keys::stream_chunk(new, seq), &chunk)?;
    }
    if mark > 0 {
        batch.put(keys::stream_head(new), &StreamHead { next_seq: mark, bytes })?;
        batch.put(keys::stream_mark(new), &mark)?;
    }
    Ok(())
}
