//! The API's bodies that are not a runtime type: what clients send, what the server answers
//! beyond the runtime's own records, and the error shape. Each derives its JSON schema for
//! the OpenAPI document (`GET /openapi.json`), which a test checks against real answers.

use durafiber_runtime::{RunStatus, SendOutcome};
use durafiber_store::{
    access::AuditRecord,
    tables::{Decision, RunOptions, SystemAlarm, WakeReason},
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::auth::Role;

/// Every refusal and failure: a 4xx for the request, a 5xx for the server's own failure.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// What went wrong, for a person.
    pub error: String,
    /// What went wrong, for a program: `UnknownRun`, `StaleApproval`, `Forbidden`, ...
    pub kind: String,
}

/// `GET /health`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// True while the store takes writes.
    pub ok: bool,
    /// Why the store failed, once it has.
    pub failed: Option<String>,
    /// Writes wait for disk space.
    pub parked: bool,
    /// Free space is below the reserve.
    pub low_on_space: bool,
    /// Free bytes on the store's filesystem, when known.
    pub free_bytes: Option<u64>,
    /// This node's id, on a store several nodes share.
    pub node_id: Option<String>,
    /// How many shards this node owns, on a store several nodes share.
    pub shards: Option<usize>,
}

/// `POST /runs`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartBody {
    /// The agent kind.
    pub kind: String,
    /// The agent's input.
    pub input: Value,
    /// How the run is kept.
    #[serde(default)]
    pub options: Option<StartOptions>,
}

/// Options of a new run.
#[derive(Debug, Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartOptions {
    /// `sync`, `async` or `exit`; the server's default when absent.
    pub durability: Option<String>,
    /// Keep the fiber alive while it waits (no hibernation).
    pub fiber_keep_alive: Option<bool>,
    /// What the run may spend: `effects_max`, `cost_units_max`, `wall_time_max` (`"2h"`),
    /// `recoveries_max`; the server's `budget` fills what is absent.
    #[serde(default)]
    pub budget: Option<BudgetBody>,
}

/// A run's budget, as `POST /runs` takes it.
#[derive(Debug, Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetBody {
    /// Effects the run may start.
    pub effects_max: Option<u32>,
    /// Cost units it may charge.
    pub cost_units_max: Option<u64>,
    /// How long after its start it may go on starting work (`"90m"`, `"2h"`).
    pub wall_time_max: Option<String>,
    /// Recoveries it may have.
    pub recoveries_max: Option<u32>,
}

/// `POST /runs/{id}/cancel`.
#[derive(Debug, Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelBody {
    /// Why; kept as the run's cancel reason.
    #[serde(default)]
    pub reason: Option<String>,
}

/// `POST /kinds/{kind}/pause`, `POST /runs/{id}/pause`.
#[derive(Debug, Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PauseBody {
    /// Why: shown as the runs' `Paused{reason}`.
    #[schema(min_length = 1)]
    pub reason: String,
}

/// The answer to a pause or a resume.
#[derive(Debug, Serialize, ToSchema)]
pub struct PauseOutcome {
    /// The kind or the run.
    pub target: String,
    /// Whether it is paused now.
    pub paused: bool,
    /// For a resume: whether it was paused before.
    pub changed: bool,
}

/// `GET /paused`: what operators hold now.
#[derive(Debug, Serialize, ToSchema)]
pub struct Paused {
    /// Paused kinds, by name.
    pub kinds: Vec<PausedEntry>,
    /// Runs paused one by one.
    pub runs: Vec<PausedEntry>,
}

/// One pause.
#[derive(Debug, Serialize, ToSchema)]
pub struct PausedEntry {
    /// The kind or the run id.
    pub target: String,
    /// Why.
    pub reason: String,
    /// Since when, ms.
    pub paused_at_ms: u64,
}

/// The answer to a cancel.
#[derive(Debug, Serialize, ToSchema)]
pub struct Cancelled {
    /// The run.
    pub run_id: String,
    /// Its state after the request.
    pub status: RunStatus,
}

/// The answer to a message.
#[derive(Debug, Serialize, ToSchema)]
pub struct Handled {
    /// The run.
    pub run_id: String,
    /// Always true: `on_message` returned.
    pub handled: bool,
}

/// The answer to a request.
#[derive(Debug, Serialize, ToSchema)]
pub struct Reply {
    /// The run.
    pub run_id: String,
    /// What `on_request` answered, secrets redacted.
    pub reply: Value,
}

/// One key of a run's storage.
#[derive(Debug, Serialize, ToSchema)]
pub struct StorageEntry {
    /// The key.
    pub key: String,
    /// Its value, secrets redacted.
    pub value: Value,
}

/// A page of a run's storage.
#[derive(Debug, Serialize, ToSchema)]
pub struct StoragePage {
    /// The run.
    pub run_id: String,
    /// The entries, in key order.
    pub entries: Vec<StorageEntry>,
    /// `start_after` for the next page; null on the last one.
    pub next: Option<String>,
}

/// `POST /runs/{id}/events/{name}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EventBody {
    /// The event's payload.
    #[serde(default)]
    pub payload: Value,
    /// A repeat with the same key is a duplicate, not a second event.
    pub idempotency_key: Option<String>,
}

/// The answer to an event.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventSent {
    /// The run.
    pub run_id: String,
    /// The event's name.
    pub name: String,
    /// Delivered to a waiting fiber, buffered, or a duplicate.
    pub outcome: SendOutcome,
}

/// `POST /runs/{id}/approvals/{approval_id}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApproveBody {
    /// The hash of the payload the human saw: a different payload refuses the decision.
    pub payload_hash: String,
    /// Approve or decline.
    pub approved: bool,
    /// Kept with the decision.
    #[serde(default)]
    pub comment: String,
}

/// `PUT /runs/{id}/alarms/{name}`: exactly one of `delay_ms`, `at_ms` and `cron`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AlarmBody {
    /// Due this long from now, ms.
    pub delay_ms: Option<u64>,
    /// Due at this clock time, ms since the Unix epoch.
    pub at_ms: Option<u64>,
    /// Given to `on_alarm`.
    #[serde(default)]
    pub payload: Value,
    /// Repeats this often, ms.
    pub every_ms: Option<u64>,
    /// Fires on this cron schedule (`0 9 * * MON-FRI`), first at its next time.
    pub cron: Option<String>,
    /// The IANA time zone `cron` is read in (`Europe/Berlin`); UTC when absent.
    pub time_zone: Option<String>,
}

/// The answer to setting an alarm.
#[derive(Debug, Serialize, ToSchema)]
pub struct AlarmSet {
    /// The run.
    pub run_id: String,
    /// The alarm.
    pub name: String,
    /// Always true.
    pub set: bool,
}

/// The answer to cancelling an alarm.
#[derive(Debug, Serialize, ToSchema)]
pub struct AlarmCancelled {
    /// The run.
    pub run_id: String,
    /// The alarm.
    pub name: String,
    /// False when there was no such alarm.
    pub cancelled: bool,
}

/// `POST /tokens`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenBody {
    /// 1–64 letters, digits, `-`, `_` or `.`; shown in the audit trail.
    #[schema(pattern = "^[A-Za-z0-9._-]{1,64}$")]
    pub name: String,
    /// `reader`, `reviewer`, `operator` or `admin`.
    #[schema(value_type = Role)]
    pub role: String,
}

/// A new token: the only time it is shown.
#[derive(Debug, Serialize, ToSchema)]
pub struct TokenCreated {
    /// Its name.
    pub name: String,
    /// Its role.
    pub role: Role,
    /// The token itself.
    pub token: String,
}

/// A token as an admin sees it: never the token or its hash.
#[derive(Debug, Serialize, ToSchema)]
pub struct TokenShown {
    /// Its name.
    pub name: String,
    /// Its role.
    pub role: String,
    /// When it was created, ms since the Unix epoch.
    pub created_at_ms: u64,
}

/// The answer to revoking a token.
#[derive(Debug, Serialize, ToSchema)]
pub struct TokenRevoked {
    /// Its name.
    pub name: String,
    /// False when there was no such token.
    pub revoked: bool,
}

/// A page of the audit trail.
#[derive(Debug, Serialize, ToSchema)]
pub struct AuditPage {
    /// The entries, oldest first.
    pub entries: Vec<AuditRecord>,
    /// `after` for the next page; null on the last one.
    pub next: Option<u64>,
}

// The run view's shapes. The runtime builds this JSON from its records, embedding each
// stored JSON text (`input_json`, `output_json`, `stash_json`, ...) as JSON under the name
// without `_json`; these types only describe it.

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
    /// On a store several nodes share: the node that runs it now (null while its shard has
    /// no owner). Absent alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<Option<String>>,
}

/// A run record with its input (and output) as JSON.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunShown {
    /// The run's handle.
    pub run_id: String,
    /// The agent kind.
    pub kind: String,
    /// The idempotency key it was started with.
    pub key: String,
    /// Its input.
    pub input: Value,
    /// The input's hash.
    pub input_hash: String,
    /// Its state.
    pub status: StatusShown,
    /// When it was accepted, ms.
    pub created_at_ms: u64,
    /// When it last changed, ms.
    pub updated_at_ms: u64,
    /// Activations so far.
    pub attempt: u32,
    /// Recovery attempts so far.
    pub recover_attempts: u32,
    /// When the next recovery may start, ms.
    pub next_recover_at_ms: u64,
    /// Why the run is to be woken, if it is.
    pub wake_reason: Option<WakeReason>,
    /// Why cancellation was asked, if it was.
    pub cancel_reason: Option<String>,
    /// How it is kept.
    pub options: RunOptions,
}

/// A run's state, a completed run's output as JSON.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StatusShown {
    /// Durably recorded; no fiber has started yet.
    Accepted,
    /// A fiber is registered.
    Running,
    /// Waits for a human.
    WaitingApproval {
        /// The approval.
        approval_id: String,
    },
    /// Waits for an alarm.
    WaitingAlarm {
        /// The alarm.
        name: String,
    },
    /// Waits for an external event.
    WaitingEvent {
        /// The event.
        name: String,
    },
    /// Finished with an output.
    Completed {
        /// The output.
        output: Value,
    },
    /// Finished with an error.
    Failed {
        /// What went wrong.
        error: String,
    },
    /// Stopped on request.
    Cancelled {
        /// Why.
        reason: String,
    },
    /// A human must look.
    Escalated {
        /// Why.
        reason: String,
    },
    /// Held by an operator; a resume lets it continue where it stopped.
    Paused {
        /// Why.
        reason: String,
    },
}

/// The run's last stash.
#[derive(Debug, Serialize, ToSchema)]
pub struct StashShown {
    /// The run.
    pub run_id: String,
    /// The activation that wrote it.
    pub attempt: u32,
    /// The step named.
    pub step: String,
    /// Its place among the run's boundaries.
    pub seq: u64,
    /// The stash.
    pub stash: Value,
    /// When, ms.
    pub written_at_ms: u64,
}

/// One effect of the run.
#[derive(Debug, Serialize, ToSchema)]
pub struct LedgerShown {
    /// The run.
    pub run_id: String,
    /// The effect's id within the run.
    pub effect_id: String,
    /// Minted once, reused on every re-entry.
    pub idempotency_key: String,
    /// The arguments' hash.
    pub args_hash: String,
    /// When the key was minted, ms.
    pub prepared_at_ms: u64,
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
    pub committed_at_ms: u64,
}

/// A pending alarm, its payload as JSON.
#[derive(Debug, Serialize, ToSchema)]
pub struct AlarmShown {
    /// The run.
    pub run_id: String,
    /// The alarm.
    pub name: String,
    /// When it is due, ms.
    pub due_at_ms: u64,
    /// When it was set, ms.
    pub scheduled_at_ms: u64,
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
    pub run_id: String,
    /// The pause within the run.
    pub approval_id: String,
    /// Exactly what the run showed.
    pub payload: Value,
    /// The hash a decision must quote.
    pub payload_hash: String,
    /// When it was asked, ms.
    pub requested_at_ms: u64,
    /// When silence escalates it, ms.
    pub escalate_at_ms: u64,
    /// The decision, once made.
    pub decision: Option<Decision>,
    /// Nobody answered in time.
    pub escalated: bool,
    /// The token that decided, from the audit trail.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
}

/// An abandoned alarm.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeadLetterShown {
    /// The alarm as it was.
    pub alarm: AlarmShown,
    /// Its last delivery's error.
    pub last_error: String,
    /// When it was abandoned, ms.
    pub dead_at_ms: u64,
}
