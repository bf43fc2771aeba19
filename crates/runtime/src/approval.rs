//! Human approvals (§6): a pause that lives in storage, bound to the run id and to the hash
//! of the payload the human saw. A decision is written once; it reaches a live fiber in place
//! or re-enters the run through `on_fiber_recovered`, with the same result either way.

use crate::kernel::commit::{self, After};
use durafiber_api::Timestamp;
use durafiber_store::RunId;
use durafiber_store::tables::RunRecord;
use std::sync::Arc;

use durafiber_store::{
    Batch, Durability,
    tables::{
        self, AlarmRecord, ApprovalRecord, ApprovalRuleRecord, Decision, Key, RunStatus, SystemAlarm,
        VoteRecord, WakeReason, keys,
    },
};
use tokio::sync::oneshot;

use crate::boundary::Boundary;
use crate::trace::{Ended, Parent};
use crate::{
    alarm,
    approval_quorum::{self as quorum, ApprovalRule, Decider},
    error::{AgentError, RuntimeError},
    escalation, json,
    kernel::cell::ApprovalOutcome,
    kernel::shared::{RawCtx, Shared},
    limits,
};

pub use durafiber_api::ApproveOutcome;

/// Whether a stored payload hash (of any version) is the hash of `payload_json`.
fn same_payload(stored: &str, payload_json: &str) -> Result<bool, AgentError> {
    let value: serde_json::Value =
        json::parse(payload_json).map_err(|e| AgentError::Serialization(e.into()))?;
    json::hash_matches(stored, &value).map_err(|e| AgentError::Serialization(e.into()))
}

/// The name of the alarm that escalates an approval nobody answered.
pub(crate) fn escalation_alarm_name(approval_id: &str) -> String {
    format!("escalate:{approval_id}")
}

/// The alarm that escalates pause `approval_id` of `run_id` at `due_at`.
fn escalation_alarm(run_id: &RunId, approval_id: &str, due_at: Timestamp) -> AlarmRecord {
    AlarmRecord {
        run_id: run_id.clone(),
        name: escalation_alarm_name(approval_id),
        due_at_ms: due_at,
        scheduled_at_ms: due_at,
        payload_json: "null".into(),
        every_ms: None,
        attempts_started: 0,
        generation: 1,
        system: Some(SystemAlarm::EscalateApproval { approval_id: approval_id.to_string() }),
    }
}

pub(crate) async fn request(
    raw: &mut RawCtx,
    approval_id: &str,
    payload_json: String,
    payload_hash: String,
    rule: Option<&ApprovalRule>,
) -> Result<Decision, AgentError> {
    tables::check_id("approval id", approval_id).map_err(AgentError::fail)?;
    let escalate_after = rule.and_then(|r| r.escalate_after).unwrap_or(raw.shared.config.escalate_after);
    let rule = rule.map(ApprovalRule::stored).transpose().map_err(AgentError::fail)?;
    if payload_json.len() > limits::PAYLOAD_BYTES_MAX {
        return Err(AgentError::fail(format!(
            "approval payload is over {} bytes",
            limits::PAYLOAD_BYTES_MAX
        )));
    }
    let shared = raw.shared.clone();
    let run_id = raw.cell.run_id.clone();
    let key = keys::approval(&run_id, approval_id);
    let existing: Option<ApprovalRecord> = shared.store.get(&key)?;
    if let Some(decision) = recorded_answer(&shared, existing.as_ref(), &payload_json)? {
        return Ok(decision);
    }
    let now = shared.now();
    let escalate_at_ms = now.saturating_add(escalate_after);
    let record = existing.unwrap_or(ApprovalRecord {
        run_id: run_id.clone(),
        approval_id: approval_id.to_string(),
        payload_json,
        payload_hash,
        requested_at_ms: now,
        escalate_at_ms,
        decision: None,
        escalated: false,
    });
    let escalation = escalation_alarm(&run_id, approval_id, record.escalate_at_ms);
    let pending_stash = raw.cell.pending_exit.lock().take().map(|stash| *stash);
    // One boundary: the pause and its rule, the waiting state, the escalation alarm, an
    // exit-mode stash.
    let after = After::at((Boundary::AfterApprovalRequest, approval_id))
        .progress()
        .alarm_set(escalation.due_at_ms, escalation.name.clone())
        .event("approval_requested", format!("{approval_id}: hash {}", record.payload_hash))
        .span(&shared, || {
            raw.span_since("approval.request", now)
                .attr("durafiber.approval.id", approval_id.to_string())
                .attr("durafiber.approval.payload_hash", record.payload_hash.clone())
                .attr(
                    "durafiber.approval.escalate_at_ms",
                    i64::try_from(record.escalate_at_ms.as_millis()).unwrap_or(i64::MAX),
                )
        });
    let change = |run: &mut RunRecord, batch: &mut Batch| {
        batch.put(key.clone(), &record)?;
        if let Some(rule) = &rule {
            batch.put(keys::approval_rule(&run_id, approval_id), rule)?;
        }
        alarm::stage(batch, &escalation)?;
        if let Some(stash) = &pending_stash {
            stash.stage(batch, shared.config.history_max)?;
        }
        run.status = RunStatus::WaitingApproval { approval_id: approval_id.to_string() };
        Ok(true)
    };
    commit::commit_run(raw, change, after).await.map_err(AgentError::from)?;
    wait_for_decision(raw, approval_id, &key).await
}

/// What a pause asked again already has: its decision (a re-entered fiber), or a refusal —
/// another payload under its id, or its escalation; `None` while it waits.
fn recorded_answer(
    shared: &Shared,
    existing: Option<&ApprovalRecord>,
    payload_json: &str,
) -> Result<Option<Decision>, AgentError> {
    match existing {
        Some(r) if !same_payload(&r.payload_hash, payload_json)? => {
            Err(AgentError::ApprovalConflict { approval_id: r.approval_id.clone() })
        }
        Some(r) if r.escalated => Err(AgentError::escalate("approval_timeout")),
        Some(ApprovalRecord { decision: Some(decision), run_id, approval_id, .. }) => {
            shared.event(run_id, "approval_replayed", format!("{approval_id}: recorded decision returned"));
            Ok(Some(decision.clone()))
        }
        _ => Ok(None),
    }
}

async fn wait_for_decision(
    raw: &RawCtx,
    approval_id: &str,
    key: &Key<ApprovalRecord>,
) -> Result<Decision, AgentError> {
    let shared = &raw.shared;
    let (tx, rx) = oneshot::channel();
    *raw.cell.waits.approval.lock() = Some(Box::new((approval_id.to_string(), tx)));
    // A decision may have landed between the pause's write and the waiter's registration.
    if let Some(ApprovalRecord { decision: Some(d), .. }) = shared.store.get(key)? {
        raw.cell.waits.approval.lock().take();
        return Ok(d);
    }
    shared.fiber_waiting(&raw.cell.run_id, true, shared.now());
    let outcome = shared.life.parked(raw.in_fiber, rx).await;
    shared.fiber_waiting(&raw.cell.run_id, false, shared.now());
    match outcome {
        // The wake token drops here, after the fiber counts itself busy again.
        Ok(ApprovalOutcome::Decided(d, _token)) => Ok(d),
        Ok(ApprovalOutcome::Escalated) => Err(AgentError::escalate("approval_timeout")),
        Err(_) => Err(AgentError::Runtime("the approval wait was dropped".into())),
    }
}

/// What a decision of a pause comes to before anything is written.
enum Ruling {
    /// The pause is decided by it (with the vote that met its rule, and the approvals so far).
    Decides(Decision, Option<(VoteRecord, u32)>),
    /// Nothing more to write: a retry answered alike, or a vote recorded short of the rule.
    Answered(ApproveOutcome),
}

pub(crate) async fn approve(
    shared: &Arc<Shared>,
    run_id: &RunId,
    approval_id: &str,
    payload_hash: &str,
    decision: Decision,
    by: Option<&Decider>,
) -> Result<ApproveOutcome, RuntimeError> {
    let _one_at_a_time = shared.stripes.inbound(run_id).await;
    let run = shared.load_run(run_id)?;
    let mut record = pending_record(shared, run_id, approval_id, payload_hash)?;
    let rule: Option<ApprovalRuleRecord> = shared.store.get(&keys::approval_rule(run_id, approval_id))?;
    let required = rule.as_ref().map_or(1, |r| r.required);
    let outcome = |recorded: bool, decided: bool, approvals: u32| ApproveOutcome {
        run_id: run_id.clone(),
        approval_id: approval_id.into(),
        recorded,
        decided,
        approvals,
        required,
    };
    let ruling = match &rule {
        None => match &record.decision {
            Some(d) if *d == decision => Ruling::Answered(outcome(false, true, u32::from(d.approved))),
            Some(_) => return Err(already_decided(run_id, approval_id)),
            None if run.status.is_terminal() => return Err(not_pending(run_id, approval_id)),
            None => Ruling::Decides(decision, None),
        },
        Some(rule) => {
            let decider = by.ok_or_else(|| RuntimeError::DeciderUnknown {
                run_id: run_id.clone(),
                approval_id: approval_id.into(),
            })?;
            vote(shared, &run, &record, rule, decider, decision, &outcome).await?
        }
    };
    let (decided, vote) = match ruling {
        Ruling::Answered(answer) => return Ok(answer),
        Ruling::Decides(decided, vote) => (decided, vote),
    };
    record.decision = Some(decided.clone());
    record_decision(shared, &run, &record, approval_id, vote.as_ref().map(|(v, _)| v)).await?;
    if let (Some((vote, approvals)), Some(rule)) = (&vote, &rule) {
        vote_span(shared, &run.kind, &record, vote, *approvals, rule.required);
    }
    // From the request to the decision: how long the run waited for a human.
    shared.obs.span(|| {
        Ended::new(run_id, &run.kind, "approval.decision", Parent::Root)
            .times(record.requested_at_ms, shared.now())
            .attr("durafiber.approval.id", approval_id.to_string())
            .attr("durafiber.approval.payload_hash", record.payload_hash.clone())
            .attr("durafiber.approval.approved", decided.approved)
            .attr("durafiber.approval.comment", decided.comment.clone())
            .attr("durafiber.approval.by", by.map(|d| d.name.clone()).unwrap_or_default())
    });
    let approvals = match &vote {
        Some((_, approvals)) => *approvals,
        None => u32::from(decided.approved),
    };
    deliver(shared, run_id, approval_id, decided).await;
    Ok(outcome(true, true, approvals))
}

/// The pause `approval_id` of `run_id`, still waiting, whose payload hashes to `payload_hash`.
fn pending_record(
    shared: &Shared,
    run_id: &RunId,
    approval_id: &str,
    payload_hash: &str,
) -> Result<ApprovalRecord, RuntimeError> {
    let record: ApprovalRecord = shared
        .store
        .get(&keys::approval(run_id, approval_id))?
        .ok_or_else(|| not_pending(run_id, approval_id))?;
    if record.escalated {
        return Err(not_pending(run_id, approval_id));
    }
    if record.payload_hash != payload_hash {
        return Err(RuntimeError::StaleApproval {
            run_id: run_id.clone(),
            approval_id: approval_id.to_string(),
        });
    }
    Ok(record)
}

/// One person's vote on a pause with a rule: a retry answered alike, a vote recorded short of
/// the rule, or the vote that decides it.
async fn vote(
    shared: &Shared,
    run: &RunRecord,
    record: &ApprovalRecord,
    rule: &ApprovalRuleRecord,
    decider: &Decider,
    decision: Decision,
    outcome: &impl Fn(bool, bool, u32) -> ApproveOutcome,
) -> Result<Ruling, RuntimeError> {
    let (run_id, approval_id) = (&run.run_id, record.approval_id.as_str());
    if let Some(reason) = quorum::refusal(rule, decider) {
        return Err(RuntimeError::NotAReviewer {
            run_id: run_id.clone(),
            approval_id: approval_id.into(),
            reason,
        });
    }
    let mut votes = votes_of(shared, run_id, approval_id)?;
    if let Some(prior) = votes.iter().find(|v| v.by == decider.name) {
        // One person counts once; the same decision again is a retry, answered alike.
        let approvals = quorum::tally(rule, &votes).approvals;
        return match prior.approved == decision.approved && prior.comment == decision.comment {
            true => Ok(Ruling::Answered(outcome(false, record.decision.is_some(), approvals))),
            false => Err(RuntimeError::AlreadyVoted {
                run_id: run_id.clone(),
                approval_id: approval_id.into(),
                by: decider.name.clone(),
            }),
        };
    }
    if record.decision.is_some() {
        return Err(already_decided(run_id, approval_id));
    }
    if run.status.is_terminal() {
        return Err(not_pending(run_id, approval_id));
    }
    let vote = VoteRecord {
        by: decider.name.clone(),
        approved: decision.approved,
        comment: decision.comment.clone(),
        payload_hash: record.payload_hash.clone(),
        at_ms: shared.now(),
    };
    votes.push(vote.clone());
    let tally = quorum::tally(rule, &votes);
    if let Some(decided) = tally.decision {
        return Ok(Ruling::Decides(decided, Some((vote, tally.approvals))));
    }
    // Not decided yet: the vote alone, durable before it is answered.
    let mut batch = Batch::new();
    batch.put(keys::approval_vote(run_id, approval_id, &vote.by), &vote)?;
    shared.store.commit(batch, Durability::Sync).await?;
    let detail = format!(
        "{approval_id}: {} {}, {} of {}",
        vote.by,
        verb(vote.approved),
        tally.approvals,
        rule.required
    );
    shared.event(run_id, "approval_vote", detail);
    vote_span(shared, &run.kind, record, &vote, tally.approvals, rule.required);
    Ok(Ruling::Answered(outcome(true, false, tally.approvals)))
}

/// The decision as one boundary of the run: the pause decided (with the vote that met its
/// rule), journaled at the run's boundary, its escalation alarm gone, the run running again.
async fn record_decision(
    shared: &Shared,
    run: &RunRecord,
    record: &ApprovalRecord,
    approval_id: &str,
    vote: Option<&VoteRecord>,
) -> Result<(), RuntimeError> {
    let run_id = &run.run_id;
    let escalation = escalation_alarm_name(approval_id);
    // The boundary the run stands at: a fork from a later one inherits the decision.
    let seq = shared.store.get(&keys::stash(run_id))?.map_or(0, |stash| stash.seq);
    shared
        .update_run(run_id, |run, batch| {
            batch.put(keys::approval(run_id, approval_id), record)?;
            batch.put(keys::journal_seq(run_id, keys::Journaled::Approval, approval_id), &seq)?;
            if let Some(vote) = vote {
                batch.put(keys::approval_vote(run_id, approval_id, &vote.by), vote)?;
            }
            alarm::unstage(batch, run_id, &escalation, record.escalate_at_ms);
            if run.status == (RunStatus::WaitingApproval { approval_id: approval_id.to_string() }) {
                run.status = RunStatus::Running;
                run.wake_reason = Some(WakeReason::Resumed);
            }
            // A decision is progress: the run's recovery count starts again (§3.6).
            run.recover_attempts = 0;
            run.next_recover_at_ms = Timestamp::ZERO;
            Ok(true)
        })
        .await?;
    shared.timers.scheduler.remove(record.escalate_at_ms, run_id, &escalation);
    shared.liveness.activity(run_id, shared.now());
    let approved = record.decision.as_ref().is_some_and(|d| d.approved);
    shared.event(run_id, "approval_decided", format!("{approval_id}: approved={approved}"));
    Ok(())
}

fn not_pending(run_id: &RunId, approval_id: &str) -> RuntimeError {
    RuntimeError::NotPending { run_id: run_id.clone(), approval_id: approval_id.to_string() }
}

fn already_decided(run_id: &RunId, approval_id: &str) -> RuntimeError {
    RuntimeError::AlreadyDecided { run_id: run_id.into(), approval_id: approval_id.into() }
}

fn verb(approved: bool) -> &'static str {
    if approved { "approved" } else { "declined" }
}

/// The decisions recorded on a pause with a rule, by decider.
pub(crate) fn votes_of(
    shared: &Shared,
    run_id: &RunId,
    approval_id: &str,
) -> Result<Vec<VoteRecord>, RuntimeError> {
    let mut votes = Vec::new();
    for (_, vote) in shared.store.scan(&keys::approval_votes(run_id, approval_id), None, usize::MAX)? {
        votes.push(vote?);
    }
    Ok(votes)
}

/// One person's decision on a pause with a rule, with where the rule stands after it.
fn vote_span(
    shared: &Shared,
    kind: &str,
    record: &ApprovalRecord,
    vote: &VoteRecord,
    approvals: u32,
    required: u32,
) {
    shared.obs.span(|| {
        Ended::new(&record.run_id, kind, "approval.vote", Parent::Root)
            .times(vote.at_ms, vote.at_ms)
            .attr("durafiber.approval.id", record.approval_id.clone())
            .attr("durafiber.approval.by", vote.by.clone())
            .attr("durafiber.approval.approved", vote.approved)
            .attr("durafiber.approval.payload_hash", vote.payload_hash.clone())
            .attr("durafiber.approval.approvals", i64::from(approvals))
            .attr("durafiber.approval.required", i64::from(required))
    });
}

/// Hands the decision to the waiting fiber, or re-enters the run when its fiber is gone.
async fn deliver(shared: &Arc<Shared>, run_id: &RunId, approval_id: &str, decision: Decision) {
    if let Some(live) = shared.registry.get(run_id) {
        let mut slot = live.cell.waits.approval.lock();
        if slot.as_ref().is_some_and(|waiter| waiter.0 == approval_id)
            && let Some(waiter) = slot.take().map(|waiter| waiter.1)
            && waiter.send(ApprovalOutcome::Decided(decision, shared.life.wake_token())).is_ok()
        {
            return;
        }
    }
    shared.reactivate(run_id).await;
}

/// The escalation alarm fired: if nobody decided, the run goes to `Escalated{approval_timeout}`.
pub(crate) async fn on_escalation_alarm(
    shared: &Arc<Shared>,
    run_id: &RunId,
    approval_id: &str,
) -> Result<(), RuntimeError> {
    let _one_at_a_time = shared.stripes.inbound(run_id).await;
    let key = keys::approval(run_id, approval_id);
    let Some(mut record) = shared.store.get::<ApprovalRecord>(&key)? else {
        return Ok(());
    };
    if record.decision.is_some() || record.escalated {
        return Ok(());
    }
    record.escalated = true;
    let mut extra = Batch::new();
    extra.put(key, &record)?;
    escalation::escalate(shared, run_id, "approval_timeout", extra).await
}
