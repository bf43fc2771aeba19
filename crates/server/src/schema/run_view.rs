//! How the API shows a run: its record, state, stash, ledger, alarms, approvals and dead
//! letters, each with its JSON schema. The runtime builds this JSON from its records,
//! embedding each stored JSON text (`input_json`, `output_json`, `stash_json`, ...) as JSON
//! under the name without `_json`; these types only describe it.

use durafiber_runtime::RunId;
use durafiber_store::{
    access::AuditRecord,
    tables::{Decision, RunOptions, SystemAlarm, WakeReason},
};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

/// `GET /runs/{id}`: everything stored about a run, secrets redacted.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunView {
    /// The run record.
    pub run: RunShown,
    /// Its last stash.
    pub stash: Option<StashShown>,
    /// The agent's `STASH_VERSION` that wrote it; null before the first stash.
    pub stash_version: Option<u32>,
    /// Its effects.
    pub ledger: Vec<LedgerShown>,
    /// Its pending alarms.
    pub alarms: Vec<AlarmShown>,
    /// Its approvals, pending and decided.
    pub approvals: Vec<ApprovalShown>,
    /// Its abandoned alarms.
    pub dead_letters: Vec<DeadLetterShown>,
    /// Its budget and what it has spent; null for a run with no budget that charged nothing.
    pub budget: Option<durafiber_store::tables::BudgetRecord>,
    /// The audited requests about it.
    pub audit: Vec<AuditRecord>,
    /// Its trace's id (32 hex digits), derived from the run id: every process's spans of the
    /// run are in this trace.
    pub trace_id: String,
    /// Its trace in the trace UI, when the server's `traces.ui` is configured.
    pub trace_url: Option<String>,
    /// The named limit one of its effects waits its turn in, on the node that answered.
    pub waiting_on_limit: Option<String>,
    /// The run that started it as its child (`Ctx::start_child`), and its name there.
    pub parent: Option<durafiber_store::tables::ParentRecord>,
    /// The runs it started as its children: `name`, `run_id`, `kind`, `state`.
    pub children: Vec<serde_json::Value>,
    /// On a store several nodes share: the node that runs it now (null while its shard has
    /// no owner). Absent alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<Option<String>>,
}

/// A run record with its input (and output) as JSON.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunShown {
    /// The run's handle.
    pub run_id: RunId,
    /// The agent kind.
    pub kind: String,
    /// The idempotency key it was started with.
    pub key: String,
    /// Its input.
    pub input: Value,
    /// The input's hash.
    pub input_hash: String,
    /// Its state.
    pub status: durafiber_api::Status,
    /// When it was accepted, ms.
    pub created_at_ms: durafiber_api::Timestamp,
    /// When it last changed, ms.
    pub updated_at_ms: durafiber_api::Timestamp,
    /// Activations so far.
    pub attempt: u32,
    /// Recovery attempts so far.
    pub recover_attempts: u32,
    /// When the next recovery may start, ms.
    pub next_recover_at_ms: durafiber_api::Timestamp,
    /// Why the run is to be woken, if it is.
    pub wake_reason: Option<WakeReason>,
    /// Why cancellation was asked, if it was.
    pub cancel_reason: Option<String>,
    /// How it is kept.
    pub options: RunOptions,
}

/// The run's last stash.
#[derive(Debug, Serialize, ToSchema)]
pub struct StashShown {
    /// The run.
    pub run_id: RunId,
    /// The activation that wrote it.
    pub attempt: u32,
    /// The step named.
    pub step: String,
    /// Its place among the run's boundaries.
    pub seq: u64,
    /// The stash.
    pub stash: Value,
    /// When, ms.
    pub written_at_ms: durafiber_api::Timestamp,
}

/// One effect of the run.
#[derive(Debug, Serialize, ToSchema)]
pub struct LedgerShown {
    /// The run.
    pub run_id: RunId,
    /// The effect's id within the run.
    pub effect_id: String,
    /// Minted once, reused on every re-entry.
    pub idempotency_key: String,
    /// The arguments' hash.
    pub args_hash: String,
    /// When the key was minted, ms.
    pub prepared_at_ms: durafiber_api::Timestamp,
    /// The receipt, once committed.
    pub committed: Option<ReceiptShown>,
}

/// An effect's committed receipt.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReceiptShown {
    /// What the outside world answered, secrets redacted.
    pub receipt: Value,
    /// Its hash.
    pub receipt_hash: String,
    /// When it was committed, ms.
    pub committed_at_ms: durafiber_api::Timestamp,
}

/// A pending alarm, its payload as JSON.
#[derive(Debug, Serialize, ToSchema)]
pub struct AlarmShown {
    /// The run.
    pub run_id: RunId,
    /// The alarm.
    pub name: String,
    /// When it is due, ms.
    pub due_at_ms: durafiber_api::Timestamp,
    /// When it was set, ms.
    pub scheduled_at_ms: durafiber_api::Timestamp,
    /// Given to `on_alarm`.
    pub payload: Value,
    /// Its period, ms.
    pub every_ms: Option<u64>,
    /// Deliveries started for the current occurrence.
    pub attempts_started: u32,
    /// Which setting of the alarm this is.
    pub generation: u64,
    /// Set by the runtime itself (an escalation, a sleep's wake, an event wait's timeout).
    pub system: Option<SystemAlarm>,
    /// A cron alarm's schedule.
    pub cron: Option<durafiber_store::tables::CronRecord>,
    /// Failed occurrences of a periodic or cron alarm being retried, each as an alarm record.
    pub retrying: Vec<Value>,
}

/// An approval, its payload as JSON.
#[derive(Debug, Serialize, ToSchema)]
pub struct ApprovalShown {
    /// The run.
    pub run_id: RunId,
    /// The pause within the run.
    pub approval_id: String,
    /// Exactly what the run showed.
    pub payload: Value,
    /// The hash a decision must quote.
    pub payload_hash: String,
    /// When it was asked, ms.
    pub requested_at_ms: durafiber_api::Timestamp,
    /// When silence escalates it, ms.
    pub escalate_at_ms: durafiber_api::Timestamp,
    /// The decision, once made.
    pub decision: Option<Decision>,
    /// Nobody answered in time.
    pub escalated: bool,
    /// The token that decided, from the audit trail.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    /// Who must decide it, when it takes more than one person.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<durafiber_store::tables::ApprovalRuleRecord>,
    /// Each person's decision so far, when it takes more than one person.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub votes: Option<Vec<durafiber_store::tables::VoteRecord>>,
}

/// An abandoned alarm.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeadLetterShown {
    /// The alarm as it was.
    pub alarm: AlarmShown,
    /// Its last delivery's error.
    pub last_error: String,
    /// When it was abandoned, ms.
    pub dead_at_ms: durafiber_api::Timestamp,
}
