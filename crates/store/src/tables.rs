//! The logical tables, their key layout, and the record types stored in them.
//!
//! All tables live in one sled tree under one-byte prefixes, so a boundary that touches several
//! tables (stash + run status + ledger entry) is one atomic batch. Parts of a key are joined
//! with a NUL byte, which ids may not contain ([`check_id`]).
//!
//! | table     | key                                   | value            |
//! |-----------|---------------------------------------|------------------|
//! | runs      | `r` run_id                            | [`RunRecord`]    |
//! | run_keys  | `k` kind NUL idempotency_key          | run id           |
//! | open_runs | `o` run_id                            | `()` (not terminal) |
//! | stashes   | `s` run_id                            | [`StashRecord`]  |
//! | ledger    | `l` run_id NUL effect_id              | [`LedgerEntry`]  |
//! | approvals | `p` run_id NUL approval_id            | [`ApprovalRecord`] |
//! | alarms    | `a` run_id NUL name                   | [`AlarmRecord`]  |
//! | alarm_due | `d` due_at_ms (u64 BE) run_id NUL name | `()`            |
//! | alarm_crons | `c` run_id NUL name                 | [`CronRecord`]   |
//! | alarm_retries | `q` run_id NUL name NUL scheduled_at_ms (u64 BE) | [`AlarmRecord`] |
//! | stream    | `b` run_id NUL seq (u64 BE)           | [`StreamChunkRecord`] |
//! | stream_heads | `h` run_id                         | [`StreamHead`]   |
//! | stream_marks | `B` run_id                         | u64 (stream length at the last stash) |
//! | hook_probes | `P` run_id                          | u32 (lone recoveries the process died in) |
//! | budgets   | `f` run_id                            | [`BudgetRecord`] |
//! | paused_kinds | `z` kind                           | [`PauseRecord`]  |
//! | paused_runs | `j` run_id                          | [`PauseRecord`]  |
//! | dead      | `x` run_id NUL name NUL dead_at_ms     | [`DeadLetter`]   |
//! | storage   | `g` run_id NUL key                    | JSON text        |

use serde::{Deserialize, Serialize};

/// A logical table: a name for errors and a one-byte key prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Table {
    /// Printable name, used in errors and inspection.
    pub name: &'static str,
    /// The key prefix that separates this table from the others.
    pub prefix: u8,
}

/// Runs by id.
pub const RUNS: Table = Table { name: "runs", prefix: b'r' };
/// Idempotency keys of `start`, per agent kind.
pub const RUN_KEYS: Table = Table { name: "run_keys", prefix: b'k' };
/// Runs that are not terminal: the recovery scan reads only these.
pub const OPEN_RUNS: Table = Table { name: "open_runs", prefix: b'o' };
/// The last stash of each run.
pub const STASHES: Table = Table { name: "stashes", prefix: b's' };
/// The agent's stash version of each run's last stash: `n` run_id → `u32`, present only when
/// it is not 1, so the stores of agents that never bump it hold nothing more.
pub const STASH_VERSIONS: Table = Table { name: "stash_versions", prefix: b'n' };
/// The effect ledger.
pub const LEDGER: Table = Table { name: "ledger", prefix: b'l' };
/// Human approvals, pending and decided.
pub const APPROVALS: Table = Table { name: "approvals", prefix: b'p' };
/// Alarms by run and name.
pub const ALARMS: Table = Table { name: "alarms", prefix: b'a' };
/// Alarms by due time: the scheduler's index.
pub const ALARM_DUE: Table = Table { name: "alarm_due", prefix: b'd' };
/// The cron expression of each cron alarm (its record in `alarms` holds the next due time).
pub const ALARM_CRONS: Table = Table { name: "alarm_crons", prefix: b'c' };
/// Failed occurrences of periodic and cron alarms, retried beside the schedule, which goes on:
/// `q` run_id NUL name NUL scheduled_at_ms (u64 BE) → [`AlarmRecord`] of that occurrence. Their
/// `alarm_due` entries name them `name NUL scheduled_at_ms` ([`retry_due_name`]).
pub const ALARM_RETRIES: Table = Table { name: "alarm_retries", prefix: b'q' };
/// Each run's durable output stream, one chunk per key, in sequence order.
pub const STREAM: Table = Table { name: "stream", prefix: b'b' };
/// Each run's stream length and size, written with its chunks.
pub const STREAM_HEADS: Table = Table { name: "stream_heads", prefix: b'h' };
/// Each run's stream length at its last stash (u64): where a fiber re-entered there stands in
/// its stream. Written with a stash when the run's stream is not empty; none reads as 0.
pub const STREAM_MARKS: Table = Table { name: "stream_marks", prefix: b'B' };
/// Runs whose recovery hook is running alone (a suspect's probe, `runtime/kernel/hook_gate.rs`):
/// how many such recoveries in a row the process did not survive (u32). Written before the
/// hook runs, removed when it settles.
pub const HOOK_PROBES: Table = Table { name: "hook_probes", prefix: b'P' };
/// Each run's budget and what it has spent, for runs that have one.
pub const BUDGETS: Table = Table { name: "budgets", prefix: b'f' };
/// Agent kinds an operator paused.
pub const PAUSED_KINDS: Table = Table { name: "paused_kinds", prefix: b'z' };
/// Runs an operator paused one by one.
pub const PAUSED_RUNS: Table = Table { name: "paused_runs", prefix: b'j' };
/// Abandoned alarms.
pub const DEAD_LETTERS: Table = Table { name: "dead_letters", prefix: b'x' };
/// External events sent to a run and not consumed yet, FIFO per name.
pub const EVENTS: Table = Table { name: "events", prefix: b'e' };
/// Idempotency keys of sent events, so a repeat is a `Duplicate`, delivered once.
pub const EVENT_KEYS: Table = Table { name: "event_keys", prefix: b'i' };
/// The journal of event waits: what each wait returned, so a re-entry returns it again.
pub const EVENT_WAITS: Table = Table { name: "event_waits", prefix: b'v' };
/// The store's own bookkeeping (the commit sequence number of the rollback witness).
pub const META: Table = Table { name: "meta", prefix: b'm' };
/// Durable sleeps by run and name: the journal that makes a sleep wake once, at its time.
pub const SLEEPS: Table = Table { name: "sleeps", prefix: b'w' };
/// Each run's own key-value storage (`ctx.storage()`): canonical JSON under the user's key.
pub const STORAGE: Table = Table { name: "storage", prefix: b'g' };
/// API tokens by name: `t` name → `access::TokenRecord` (the token's hash, never the token).
pub const TOKENS: Table = Table { name: "tokens", prefix: b't' };
/// The audit trail, append-only: `u` seq (u64 big-endian) → `access::AuditRecord`.
pub const AUDIT: Table = Table { name: "audit", prefix: b'u' };
/// The audit entries of one run: `y` run_id NUL seq → `()`.
pub const AUDIT_BY_RUN: Table = Table { name: "audit_by_run", prefix: b'y' };

/// The run a record belongs to, read from its key: the first key part for every table but
/// `run_keys`, `meta`, `tokens`, `audit` and `paused_kinds` (which belong to no run) and `alarm_due` (after
/// its due time).
pub fn run_of_key(key: &[u8]) -> Option<&str> {
    let table = Table::of_key(key)?;
    if [RUN_KEYS.prefix, META.prefix, TOKENS.prefix, AUDIT.prefix, PAUSED_KINDS.prefix]
        .contains(&table.prefix)
    {
        return None;
    }
    let rest = key.get(1..)?;
    let rest = if table.prefix == ALARM_DUE.prefix { rest.get(8..)? } else { rest };
    let id = rest.split(|b| *b == 0).next()?;
    std::str::from_utf8(id).ok().filter(|s| !s.is_empty())
}

/// Every table, for inspection and tests.
pub const ALL: [Table; 28] = [
    RUNS,
    RUN_KEYS,
    OPEN_RUNS,
    STASHES,
    STASH_VERSIONS,
    LEDGER,
    APPROVALS,
    ALARMS,
    ALARM_DUE,
    ALARM_CRONS,
    ALARM_RETRIES,
    STREAM,
    STREAM_HEADS,
    STREAM_MARKS,
    HOOK_PROBES,
    BUDGETS,
    PAUSED_KINDS,
    PAUSED_RUNS,
    DEAD_LETTERS,
    SLEEPS,
    META,
    EVENTS,
    EVENT_KEYS,
    EVENT_WAITS,
    STORAGE,
    TOKENS,
    AUDIT,
    AUDIT_BY_RUN,
];

impl Table {
    /// The full key of a record whose key parts are `parts`.
    pub fn key(&self, parts: &[&[u8]]) -> Vec<u8> {
        let mut k = Vec::with_capacity(1 + parts.iter().map(|p| p.len() + 1).sum::<usize>());
        k.push(self.prefix);
        for (i, p) in parts.iter().enumerate() {
            if i > 0 {
                k.push(0);
            }
            k.extend_from_slice(p);
        }
        k
    }

    /// The prefix shared by all keys that start with `parts` (a trailing separator included).
    pub fn prefix_of(&self, parts: &[&[u8]]) -> Vec<u8> {
        let mut k = self.key(parts);
        if !parts.is_empty() {
            k.push(0);
        }
        k
    }

    /// The table a stored key belongs to, if any.
    pub fn of_key(key: &[u8]) -> Option<Table> {
        ALL.iter().copied().find(|t| key.first() == Some(&t.prefix))
    }
}

/// The key of an `alarm_due` entry. Big-endian time first, so a range scan is in due order.
pub fn alarm_due_key(due_at_ms: u64, run_id: &str, name: &str) -> Vec<u8> {
    let mut k = vec![ALARM_DUE.prefix];
    k.extend_from_slice(&due_at_ms.to_be_bytes());
    k.extend_from_slice(run_id.as_bytes());
    k.push(0);
    k.extend_from_slice(name.as_bytes());
    k
}

/// Splits an `alarm_due` key back into `(due_at_ms, run_id, name)`.
pub fn parse_alarm_due_key(key: &[u8]) -> Option<(u64, String, String)> {
    let rest = key.strip_prefix(&[ALARM_DUE.prefix])?;
    let due = u64::from_be_bytes(rest.get(..8)?.try_into().ok()?);
    let rest = &rest[8..];
    let sep = rest.iter().position(|b| *b == 0)?;
    let run = String::from_utf8(rest[..sep].to_vec()).ok()?;
    let name = String::from_utf8(rest[sep + 1..].to_vec()).ok()?;
    Some((due, run, name))
}

/// The name under which a retried occurrence of alarm `name` sits in the due index: a NUL
/// cannot occur in a name, so it cannot collide with an alarm's own entry.
pub fn retry_due_name(name: &str, scheduled_at_ms: u64) -> String {
    format!("{name}\0{scheduled_at_ms}")
}

/// Splits a due-index name back into the alarm's name and, for a retried occurrence, the time
/// it was scheduled for.
pub fn parse_due_name(due_name: &str) -> (&str, Option<u64>) {
    match due_name.split_once('\0') {
        Some((name, at)) => match at.parse() {
            Ok(at) => (name, Some(at)),
            Err(_) => (due_name, None),
        },
        None => (due_name, None),
    }
}

/// The key of a retried occurrence in [`ALARM_RETRIES`].
pub fn alarm_retry_key(run_id: &str, name: &str, scheduled_at_ms: u64) -> Vec<u8> {
    ALARM_RETRIES.key(&[run_id.as_bytes(), name.as_bytes(), &scheduled_at_ms.to_be_bytes()])
}

/// The key of chunk `seq` of a run's output stream.
pub fn stream_key(run_id: &str, seq: u64) -> Vec<u8> {
    STREAM.key(&[run_id.as_bytes(), &seq.to_be_bytes()])
}

/// Why an id cannot be used as part of a key.
pub fn check_id(what: &str, id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err(format!("{what} is empty"));
    }
    let chars = id.chars().count();
    if chars > ID_CHARS_MAX {
        return Err(format!("{what} is {chars} characters, more than {ID_CHARS_MAX}"));
    }
    if id.contains('\0') {
        return Err(format!("{what} contains a NUL byte"));
    }
    Ok(())
}

/// Ids (run ids, keys, effect ids, alarm names) are bounded so keys stay small: at most this
/// many characters (2 KiB of UTF-8), as the API's document declares them.
pub const ID_CHARS_MAX: usize = 512;

/// A key in a readable form for errors: text stays text, other bytes become `\xNN`.
pub fn printable(key: &[u8]) -> String {
    let mut s = String::new();
    for b in key {
        match b {
            0 => s.push('/'),
            0x20..=0x7e => s.push(*b as char),
            _ => s.push_str(&format!("\\x{b:02x}")),
        }
    }
    s
}

/// The durable record of a run: its handle, its input and where it stands.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// Never changes.
    pub run_id: String,
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
    pub created_at_ms: u64,
    /// Last status change.
    pub updated_at_ms: u64,
    /// Fiber attempts started, counting from 1 once the first fiber is registered.
    pub attempt: u32,
    /// Recovery attempts since the last progress (a stash); escalates at the maximum.
    pub recover_attempts: u32,
    /// Earliest time the next recovery may start (backoff).
    pub next_recover_at_ms: u64,
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
    /// Completed, failed, cancelled or escalated: nothing more happens on its own.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            RunStatus::Completed { .. }
                | RunStatus::Failed { .. }
                | RunStatus::Cancelled { .. }
                | RunStatus::Escalated { .. }
        )
    }

    /// The state's name, as the contract spells it.
    pub fn name(&self) -> &'static str {
        match self {
            RunStatus::Accepted => "accepted",
            RunStatus::Running => "running",
            RunStatus::WaitingApproval { .. } => "waiting_approval",
            RunStatus::WaitingAlarm { .. } => "waiting_alarm",
            RunStatus::WaitingEvent { .. } => "waiting_event",
            RunStatus::Completed { .. } => "completed",
            RunStatus::Failed { .. } => "failed",
            RunStatus::Cancelled { .. } => "cancelled",
            RunStatus::Escalated { .. } => "escalated",
            RunStatus::Paused { .. } => "paused",
        }
    }
}

/// The last stash of a run. Each stash replaces the previous one whole.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StashRecord {
    /// The run it belongs to.
    pub run_id: String,
    /// The fiber attempt that wrote it.
    pub attempt: u32,
    /// The named step the fiber had reached.
    pub step: String,
    /// Stash sequence number within the run, from 1, never reused.
    pub seq: u64,
    /// The snapshot, as canonical JSON.
    pub stash_json: String,
    /// When it was written.
    pub written_at_ms: u64,
}

/// One effect in the ledger. Lifecycle: absent → `Prepared` → `Committed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LedgerEntry {
    /// The run that owns the effect.
    pub run_id: String,
    /// The logical effect within the run.
    pub effect_id: String,
    /// Minted once, before the first call; reused on every re-entry.
    pub idempotency_key: String,
    /// SHA-256 of the arguments' canonical JSON.
    pub args_hash: String,
    /// When the key was minted.
    pub prepared_at_ms: u64,
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
    pub committed_at_ms: u64,
}

/// A durable human pause, bound to the run and to the hash of the payload the human sees.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRecord {
    /// The paused run.
    pub run_id: String,
    /// The pause within the run.
    pub approval_id: String,
    /// What the reviewer is shown, as canonical JSON.
    pub payload_json: String,
    /// SHA-256 of `payload_json`, hex; an approval must quote it.
    pub payload_hash: String,
    /// When the pause was written.
    pub requested_at_ms: u64,
    /// When silence escalates.
    pub escalate_at_ms: u64,
    /// The decision, written once.
    pub decision: Option<Decision>,
    /// Silence escalated the pause; it can no longer be decided.
    pub escalated: bool,
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
    pub run_id: String,
    /// Unique within the run; `default` is the Durable Object single alarm.
    pub name: String,
    /// When it is due next (a retry moves it).
    pub due_at_ms: u64,
    /// When it was scheduled for, before any retry.
    pub scheduled_at_ms: u64,
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
    pub paused_at_ms: u64,
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
    pub emitted_at_ms: u64,
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
    pub sent_at_ms: u64,
}

/// One wait of a fiber for an event: when it gives up, and what it got.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventWaitRecord {
    /// When the wait times out, if it does.
    pub timeout_at_ms: Option<u64>,
    /// `None` while waiting; `Some(None)` when it timed out; `Some(Some(payload))` when an
    /// event arrived.
    pub result: Option<Option<String>>,
}

/// A durable sleep (`ctx.sleep_for`): its wake time is fixed when first asked for, so a
/// re-entered fiber keeps the original time, and `done` makes it return at once afterwards.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SleepRecord {
    /// The run.
    pub run_id: String,
    /// The sleep's name within the run.
    pub name: String,
    /// When it ends, ms.
    pub wake_at_ms: u64,
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
    pub dead_at_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alarm_due_keys_sort_by_time_and_parse_back() {
        let a = alarm_due_key(5, "run", "x");
        let b = alarm_due_key(300, "run", "a");
        assert!(a < b);
        assert_eq!(parse_alarm_due_key(&b), Some((300, "run".into(), "a".into())));
    }

    #[test]
    fn a_retried_occurrence_has_its_own_due_name() {
        let due = retry_due_name("tick", 42);
        assert_eq!(parse_due_name(&due), ("tick", Some(42)));
        assert_eq!(parse_due_name("tick"), ("tick", None));
        let key = alarm_due_key(5, "run", &due);
        assert_eq!(parse_alarm_due_key(&key), Some((5, "run".into(), due)));
        assert_eq!(run_of_key(&key), Some("run"));
        assert_eq!(run_of_key(&alarm_retry_key("run", "tick", 42)), Some("run"));
        assert_eq!(run_of_key(&stream_key("run", 7)), Some("run"));
    }

    #[test]
    fn ids_with_nul_are_refused() {
        assert!(check_id("effect id", "a\0b").is_err());
        assert!(check_id("effect id", "").is_err());
        assert!(check_id("effect id", "refund").is_ok());
    }
}
