//! The record types the tables hold: what a run, its stash, its effects, approvals, alarms,
//! stream, events, budget and pauses look like on disk, and the access records behind tokens
//! and the audit trail. A run's history and family are in `family_records.rs`.

use serde::{Deserialize, Serialize};

use crate::{ids::RunId, state::RunState, time::Timestamp};

/// The durable record of a run: its handle, its input and where it stands.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// Never changes.
    pub run_id: RunId,
    /// The agent kind that executes the run.
    pub kind: String,
    /// The idempotency key `start` was called with.
    pub key: String,
    /// The input, as canonical JSON.
    pub input_json: String,
    /// SHA-256 of `input_json`, hex.
    pub input_hash: String,
    /// Lifecycle position.
    pub status: RunStatus,
    /// When `start` accepted it.
    pub created_at_ms: Timestamp,
    /// Last status change.
    pub updated_at_ms: Timestamp,
    /// Fiber attempts started, counting from 1 once the first fiber is registered.
    pub attempt: u32,
    /// Recovery attempts since the last progress (a stash); escalates at the maximum.
    pub recover_attempts: u32,
    /// Earliest time the next recovery may start (backoff).
    pub next_recover_at_ms: Timestamp,
    /// Why the run will be re-entered, when the runtime knows (evicted, resumed).
    pub wake_reason: Option<WakeReason>,
    /// A cancellation requested from outside, seen by the fiber.
    pub cancel_reason: Option<String>,
    /// Per-run options chosen at start.
    pub options: RunOptions,
}

/// Per-run overrides of the runtime's defaults.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunOptions {
    /// Durability mode of stashes: `sync`, `async` or `exit`; `None` is the runtime's default.
    pub durability: Option<String>,
    /// Whether a running fiber holds a keep-alive; `None` is the runtime's default.
    pub fiber_keep_alive: Option<bool>,
}

/// Why an interrupted run is re-entered, when it is not a plain crash.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WakeReason {
    /// The runtime evicted the run mid-fiber.
    Evicted,
    /// A decision or alarm arrived for a run whose fiber was gone.
    Resumed,
}

/// A run's position in its lifecycle. Every change is a boundary.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Durably recorded; no fiber has started yet.
    Accepted,
    /// A fiber is registered.
    Running,
    /// The fiber waits for a human.
    WaitingApproval {
        /// The approval it waits for.
        approval_id: String,
    },
    /// The fiber waits for an alarm.
    WaitingAlarm {
        /// The alarm it waits for.
        name: String,
    },
    /// Finished with an output (canonical JSON).
    Completed {
        /// The output, as JSON.
        output_json: String,
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
        /// Why (`approval_timeout`, `corrupt`, `max_recover_attempts`, `max_age`, ...).
        reason: String,
    },
    /// The fiber waits for an external event (`ctx.wait_for_event`).
    WaitingEvent {
        /// The event it waits for.
        name: String,
    },
    /// Held by an operator (`pause_kind`, `pause_run`) at its start or before an effect; a
    /// resume lets it continue where it stopped.
    Paused {
        /// Why, as the operator said.
        reason: String,
    },
}

impl RunStatus {
    /// Its state without the details.
    pub fn state(&self) -> RunState {
        match self {
            RunStatus::Accepted => RunState::Accepted,
            RunStatus::Running => RunState::Running,
            RunStatus::WaitingApproval { .. } => RunState::WaitingApproval,
            RunStatus::WaitingAlarm { .. } => RunState::WaitingAlarm,
            RunStatus::WaitingEvent { .. } => RunState::WaitingEvent,
            RunStatus::Completed { .. } => RunState::Completed,
            RunStatus::Failed { .. } => RunState::Failed,
            RunStatus::Cancelled { .. } => RunState::Cancelled,
            RunStatus::Escalated { .. } => RunState::Escalated,
            RunStatus::Paused { .. } => RunState::Paused,
        }
    }

    /// Completed, failed, cancelled or escalated: nothing more happens on its own.
    pub fn is_terminal(&self) -> bool {
        self.state().is_terminal()
    }

    /// The state's name, as the contract spells it.
    pub fn name(&self) -> &'static str {
        self.state().name()
    }
}

/// The last stash of a run. Each stash replaces the previous one whole.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StashRecord {
    /// The run it belongs to.
    pub run_id: RunId,
    /// The fiber attempt that wrote it.
    pub attempt: u32,
    /// The named step the fiber had reached.
    pub step: String,
    /// Stash sequence number within the run, from 1, never reused.
    pub seq: u64,
    /// The snapshot, as canonical JSON.
    pub stash_json: String,
    /// When it was written.
    pub written_at_ms: Timestamp,
}

/// One effect in the ledger. Lifecycle: absent → `Prepared` → `Committed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LedgerEntry {
    /// The run that owns the effect.
    pub run_id: RunId,
    /// The logical effect within the run.
    pub effect_id: String,
    /// Minted once, before the first call; reused on every re-entry.
    pub idempotency_key: String,
    /// SHA-256 of the arguments' canonical JSON.
    pub args_hash: String,
    /// When the key was minted.
    pub prepared_at_ms: Timestamp,
    /// Filled in when the effect's receipt is committed.
    pub committed: Option<Receipt>,
}

/// What the outside world answered to an effect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    /// The receipt, as canonical JSON.
    pub receipt_json: String,
    /// SHA-256 of `receipt_json`, hex.
    pub receipt_hash: String,
    /// When it was committed.
    pub committed_at_ms: Timestamp,
}

/// A durable human pause, bound to the run and to the hash of the payload the human sees.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRecord {
    /// The paused run.
    pub run_id: RunId,
    /// The pause within the run.
    pub approval_id: String,
    /// What the reviewer is shown, as canonical JSON.
    pub payload_json: String,
    /// SHA-256 of `payload_json`, hex; an approval must quote it.
    pub payload_hash: String,
    /// When the pause was written.
    pub requested_at_ms: Timestamp,
    /// When silence escalates.
    pub escalate_at_ms: Timestamp,
    /// The decision, written once.
    pub decision: Option<Decision>,
    /// Silence escalated the pause; it can no longer be decided.
    pub escalated: bool,
}

/// Who must decide an approval that takes more than one person (`approval_rules`),
/// written with the pause. A pause without one is decided by its first decision.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalRuleRecord {
    /// Approvals by different people that decide it.
    pub required: u32,
    /// The only people who may decide it, by name; empty: anyone the next field allows.
    pub reviewers: Vec<String>,
    /// The role a decider must hold, if any (as the server names roles).
    pub role: Option<String>,
    /// Whether one decline declines it (`false`), or only as many declines as leave the
    /// approvals unable to reach `required` (`true`).
    pub decline_by_majority: bool,
}

/// One person's decision on an approval with a rule (`approval_votes`).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VoteRecord {
    /// Who decided (the name the server knows them by).
    pub by: String,
    /// Approved or declined.
    pub approved: bool,
    /// Free text from them.
    pub comment: String,
    /// The payload hash they quoted: the one they saw.
    pub payload_hash: String,
    /// When, ms.
    pub at_ms: Timestamp,
}

/// A reviewer's answer.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// Approved or rejected.
    pub approved: bool,
    /// Free text from the reviewer.
    #[serde(default)]
    pub comment: String,
}

/// A named, durable wake-up of a run.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlarmRecord {
    /// The run to wake.
    pub run_id: RunId,
    /// Unique within the run; `default` is the Durable Object single alarm.
    pub name: String,
    /// When it is due next (a retry moves it).
    pub due_at_ms: Timestamp,
    /// When it was scheduled for, before any retry.
    pub scheduled_at_ms: Timestamp,
    /// Handed to `on_alarm`, as JSON.
    pub payload_json: String,
    /// Period of a periodic alarm.
    pub every_ms: Option<u64>,
    /// Deliveries started, persisted before each handler runs.
    pub attempts_started: u32,
    /// Changes on every set, so a delivery can tell that its handler re-set the alarm.
    pub generation: u64,
    /// Alarms the runtime sets for itself (approval escalation) are not the agent's.
    pub system: Option<SystemAlarm>,
}

/// Alarms the runtime owns.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SystemAlarm {
    /// Escalate the approval if it is still pending.
    EscalateApproval {
        /// The approval to escalate.
        approval_id: String,
    },
    /// Wake a run whose fiber sleeps durably under this name.
    WakeSleep {
        /// The sleep's name.
        name: String,
    },
    /// End a run's wait for an event that did not come in time.
    EventTimeout {
        /// The event's name.
        name: String,
    },
}

/// An operator's pause of a kind or a run.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PauseRecord {
    /// Why, as the operator said.
    pub reason: String,
    /// When, ms.
    pub paused_at_ms: Timestamp,
}

/// A cron alarm's schedule.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CronRecord {
    /// The cron expression, as given (five fields, or six with seconds first).
    pub expr: String,
    /// The IANA time zone it is read in; `None` is UTC.
    pub time_zone: Option<String>,
}

/// What one run may spend, fixed at its start; `None` is no limit.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetLimits {
    /// Effects started (prepared), at most.
    pub effects_max: Option<u32>,
    /// Cost units charged (`ctx.charge`), at most.
    pub cost_units_max: Option<u64>,
    /// Time from the run's start, ms, at most.
    pub wall_time_max_ms: Option<u64>,
    /// Recoveries (fiber attempts after the first), at most.
    pub recoveries_max: Option<u32>,
}

/// What a run has spent against its budget, written with its boundaries.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetSpent {
    /// Effects started.
    pub effects: u32,
    /// Cost units charged.
    pub cost_units: u64,
}

impl BudgetSpent {
    /// Both spendings together (saturating).
    pub fn plus(self, other: BudgetSpent) -> BudgetSpent {
        BudgetSpent {
            effects: self.effects.saturating_add(other.effects),
            cost_units: self.cost_units.saturating_add(other.cost_units),
        }
    }
}

/// A run's budget and its spending.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetRecord {
    /// The limits.
    pub limits: BudgetLimits,
    /// The spending.
    pub spent: BudgetSpent,
}

/// One chunk of a run's output stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamChunkRecord {
    /// The chunk, as canonical JSON.
    pub data_json: String,
    /// When the fiber emitted it, ms.
    pub emitted_at_ms: Timestamp,
}

/// A chunk a re-entered fiber emitted at a place of its stream that held another one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReemissionRecord {
    /// The chunk's place in the stream.
    pub seq: u64,
    /// What the fiber emitted, as canonical JSON, cut to its first
    /// [`ReemissionRecord::KEPT_BYTES`] bytes.
    pub emitted_json: String,
    /// The whole emitted chunk's length, bytes.
    pub emitted_bytes: u64,
    /// When, ms.
    pub at_ms: Timestamp,
}

impl ReemissionRecord {
    /// Bytes of the emitted chunk a record keeps.
    pub const KEPT_BYTES: usize = 1024;
}

/// How far a run's output stream has come.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamHead {
    /// The sequence number the next chunk gets.
    pub next_seq: u64,
    /// Bytes of chunk data written so far.
    pub bytes: u64,
}

/// An external event waiting for its run's fiber.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    /// The event's payload, as canonical JSON.
    pub payload_json: String,
    /// The sender's idempotency key, if it gave one.
    pub idempotency_key: Option<String>,
    /// When it was sent.
    pub sent_at_ms: Timestamp,
}

/// One wait of a fiber for an event: when it gives up, and what it got.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventWaitRecord {
    /// When the wait times out, if it does.
    pub timeout_at_ms: Option<Timestamp>,
    /// `None` while waiting; `Some(None)` when it timed out; `Some(Some(payload))` when an
    /// event arrived.
    pub result: Option<Option<String>>,
}

/// A durable sleep (`ctx.sleep_for`): its wake time is fixed when first asked for, so a
/// re-entered fiber keeps the original time, and `done` makes it return at once afterwards.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SleepRecord {
    /// The run.
    pub run_id: RunId,
    /// The sleep's name within the run.
    pub name: String,
    /// When it ends, ms.
    pub wake_at_ms: Timestamp,
    /// Whether the fiber has woken from it.
    pub done: bool,
}

/// An alarm abandoned after its last retry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The alarm as it was at its last attempt.
    pub alarm: AlarmRecord,
    /// The last failure.
    pub last_error: String,
    /// When it was abandoned.
    pub dead_at_ms: Timestamp,
}

/// An API token as stored: its SHA-256, never the token itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// Unique; shown in the audit trail beside everything the token did.
    pub name: String,
    /// `reader`, `reviewer`, `operator` or `admin`.
    pub role: String,
    /// Lower-case hex SHA-256 of the token.
    pub hash: String,
    /// When it was created.
    pub created_at_ms: Timestamp,
}

/// One entry of the append-only audit trail.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// Its place in the trail: strictly increasing.
    pub seq: u64,
    /// When it was recorded.
    pub at_ms: Timestamp,
    /// The name of the token that asked.
    pub actor: String,
    /// What was asked: `approve`, `cancel`, `set_alarm`, `token_create`, ...
    pub action: String,
    /// The run it concerns, if any.
    pub run_id: Option<RunId>,
    /// The request's particulars (an approval id and decision, an alarm name, ...).
    pub detail: String,
}
