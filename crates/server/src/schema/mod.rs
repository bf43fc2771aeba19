//! The API's bodies that are not a runtime type: what clients send, what the server answers
//! beyond the runtime's own records, and the error shape. Each derives its JSON schema for
//! the OpenAPI document (`GET /openapi.json`), which a test checks against real answers.

use durafiber_runtime::RunId;
use durafiber_runtime::{RunStatus, SendOutcome};
use durafiber_store::access::AuditRecord;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::auth::Role;

mod run_view;

pub use run_view::*;

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

/// `POST /runs/{id}/fork`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkBody {
    /// The boundary to fork from: a `seq` of `GET /runs/{id}/history`.
    pub at: u64,
    /// The fork's input; the source's when absent. It must be the kind's input type.
    #[serde(default)]
    pub input: Option<Value>,
    /// How the fork is kept.
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
    /// Runs paused one by one: a page of them, in the order of their ids.
    pub runs: Vec<PausedEntry>,
    /// The last run of a full page: `after` for the next one.
    pub next: Option<String>,
}

/// One pause.
#[derive(Debug, Serialize, ToSchema)]
pub struct PausedEntry {
    /// The kind or the run id.
    pub target: String,
    /// Why.
    pub reason: String,
    /// Since when, ms.
    pub paused_at_ms: durafiber_api::Timestamp,
}

/// The answer to a cancel.
#[derive(Debug, Serialize, ToSchema)]
pub struct Cancelled {
    /// The run.
    pub run_id: RunId,
    /// Its state after the request.
    pub status: RunStatus,
}

/// The answer to a message.
#[derive(Debug, Serialize, ToSchema)]
pub struct Handled {
    /// The run.
    pub run_id: RunId,
    /// Always true: `on_message` returned.
    pub handled: bool,
}

/// The answer to a request.
#[derive(Debug, Serialize, ToSchema)]
pub struct Reply {
    /// The run.
    pub run_id: RunId,
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
    pub run_id: RunId,
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
    pub run_id: RunId,
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
    pub run_id: RunId,
    /// The alarm.
    pub name: String,
    /// Always true.
    pub set: bool,
}

/// The answer to cancelling an alarm.
#[derive(Debug, Serialize, ToSchema)]
pub struct AlarmCancelled {
    /// The run.
    pub run_id: RunId,
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
    pub created_at_ms: durafiber_api::Timestamp,
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
