//! Every table and the layout of its keys: the one place a key is built (the table list is
//! `list.rs`, a run's history and family keys `family_keys.rs`; both are re-exported here).
//! Parts of a key are joined with a NUL byte, which ids may not contain
//! ([`super::check_id`]); numbers in keys are big-endian, so a range scan is in their order.

use durafiber_api::{family_records::*, records::*};

use super::table::{Key, Prefix};
use durafiber_api::{RunId, Timestamp};

pub use super::{family_keys::*, list::*};

/// A run's record.
pub fn run(run_id: &str) -> Key<RunRecord> {
    RUNS.key(&[run_id.as_bytes()])
}

/// The run `start` minted for idempotency key `key` of agent kind `kind`.
pub fn run_by_key(kind: &str, key: &str) -> Key<RunId> {
    RUN_KEYS.key(&[kind.as_bytes(), key.as_bytes()])
}

/// The mark that a run is not terminal.
pub fn open_run(run_id: &str) -> Key<()> {
    OPEN_RUNS.key(&[run_id.as_bytes()])
}

/// A run's last stash.
pub fn stash(run_id: &str) -> Key<StashRecord> {
    STASHES.key(&[run_id.as_bytes()])
}

/// The agent's version of a run's last stash.
pub fn stash_version(run_id: &str) -> Key<u32> {
    STASH_VERSIONS.key(&[run_id.as_bytes()])
}

/// Effect `effect_id` of a run.
pub fn ledger(run_id: &str, effect_id: &str) -> Key<LedgerEntry> {
    LEDGER.key(&[run_id.as_bytes(), effect_id.as_bytes()])
}

/// Approval `approval_id` of a run.
pub fn approval(run_id: &str, approval_id: &str) -> Key<ApprovalRecord> {
    APPROVALS.key(&[run_id.as_bytes(), approval_id.as_bytes()])
}

/// The rule of approval `approval_id` of a run, if it has one.
pub fn approval_rule(run_id: &str, approval_id: &str) -> Key<ApprovalRuleRecord> {
    APPROVAL_RULES.key(&[run_id.as_bytes(), approval_id.as_bytes()])
}

/// The decision `by` made on approval `approval_id` of a run.
pub fn approval_vote(run_id: &str, approval_id: &str, by: &str) -> Key<VoteRecord> {
    APPROVAL_VOTES.key(&[run_id.as_bytes(), approval_id.as_bytes(), by.as_bytes()])
}

/// The decisions made on approval `approval_id` of a run, in the order of their deciders.
pub fn approval_votes(run_id: &str, approval_id: &str) -> Prefix<VoteRecord> {
    APPROVAL_VOTES.prefix_of(&[run_id.as_bytes(), approval_id.as_bytes()])
}

/// Alarm `name` of a run.
pub fn alarm(run_id: &str, name: &str) -> Key<AlarmRecord> {
    ALARMS.key(&[run_id.as_bytes(), name.as_bytes()])
}

/// The schedule of cron alarm `name` of a run.
pub fn alarm_cron(run_id: &str, name: &str) -> Key<CronRecord> {
    ALARM_CRONS.key(&[run_id.as_bytes(), name.as_bytes()])
}

/// The retried occurrence of alarm `name` scheduled for `scheduled_at`.
pub fn alarm_retry(run_id: &str, name: &str, scheduled_at: Timestamp) -> Key<AlarmRecord> {
    ALARM_RETRIES.key(&[run_id.as_bytes(), name.as_bytes(), &scheduled_at.as_millis().to_be_bytes()])
}

/// Every retried occurrence of a run's alarms, or of its alarm `name` only.
pub fn alarm_retries_of(run_id: &str, name: Option<&str>) -> Prefix<AlarmRecord> {
    match name {
        Some(name) => ALARM_RETRIES.prefix_of(&[run_id.as_bytes(), name.as_bytes()]),
        None => ALARM_RETRIES.of_run(run_id),
    }
}

/// An entry of the due index: time first, so a range scan is in due order.
pub fn alarm_due(due_at: Timestamp, run_id: &str, due_name: &str) -> Key<()> {
    ALARM_DUE.key(&[
        &[due_at.as_millis().to_be_bytes().as_slice(), run_id.as_bytes()].concat(),
        due_name.as_bytes(),
    ])
}

/// How a settled run ended, the first part of its key in the settled index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// `RunStatus::Completed`.
    Completed,
    /// `RunStatus::Failed`.
    Failed,
    /// `RunStatus::Cancelled`.
    Cancelled,
    /// `RunStatus::Escalated`.
    Escalated,
}

impl Settled {
    /// Every way of settling.
    pub const ALL: [Settled; 4] =
        [Settled::Completed, Settled::Failed, Settled::Cancelled, Settled::Escalated];

    /// How a run with `status` settled; `None` while it is open.
    pub fn of(status: &RunStatus) -> Option<Settled> {
        match status {
            RunStatus::Completed { .. } => Some(Settled::Completed),
            RunStatus::Failed { .. } => Some(Settled::Failed),
            RunStatus::Cancelled { .. } => Some(Settled::Cancelled),
            RunStatus::Escalated { .. } => Some(Settled::Escalated),
            _ => None,
        }
    }

    fn code(self) -> u8 {
        match self {
            Settled::Completed => b'c',
            Settled::Failed => b'f',
            Settled::Cancelled => b'x',
            Settled::Escalated => b'e',
        }
    }
}

/// A run's entry in the settled index: how, then when, so that one range scan finds the
/// runs that settled one way before a time, oldest first.
pub fn settled(how: Settled, settled_at: Timestamp, run_id: &str) -> Key<()> {
    SETTLED
        .key(&[&[&[how.code()], settled_at.as_millis().to_be_bytes().as_slice(), run_id.as_bytes()].concat()])
}

/// The entries of the runs that settled `how`, oldest first.
pub fn settled_of(how: Settled) -> Prefix<()> {
    SETTLED.all().narrowed(&[how.code()])
}

/// Present once every run settled before the settled index existed has its entry there.
pub fn settled_index_complete() -> Key<u64> {
    meta("settled_index")
}

pub(crate) fn parse_alarm_due_bytes(key: &[u8]) -> Option<(Timestamp, String, String)> {
    let rest = key.strip_prefix(&[ALARM_DUE.prefix()])?;
    let due = u64::from_be_bytes(rest.get(..8)?.try_into().ok()?);
    let rest = rest.get(8..)?;
    let sep = rest.iter().position(|b| *b == 0)?;
    let run = String::from_utf8(rest[..sep].to_vec()).ok()?;
    let name = String::from_utf8(rest[sep + 1..].to_vec()).ok()?;
    Some((Timestamp::from_millis(due), run, name))
}

/// The name under which a retried occurrence of alarm `name` sits in the due index: a NUL
/// cannot occur in a name, so it cannot collide with an alarm's own entry.
pub fn retry_due_name(name: &str, scheduled_at: Timestamp) -> String {
    format!("{name}\0{scheduled_at}")
}

/// Chunk `seq` of a run's output stream.
pub fn stream_chunk(run_id: &str, seq: u64) -> Key<StreamChunkRecord> {
    STREAM.key(&[run_id.as_bytes(), &seq.to_be_bytes()])
}

/// What a re-entered fiber emitted at place `seq` of a run's stream, where it differed.
pub fn stream_reemission(run_id: &str, seq: u64) -> Key<ReemissionRecord> {
    STREAM_REEMISSIONS.key(&[run_id.as_bytes(), &seq.to_be_bytes()])
}

/// How far a run's stream has come.
pub fn stream_head(run_id: &str) -> Key<StreamHead> {
    STREAM_HEADS.key(&[run_id.as_bytes()])
}

/// A run's place in its stream at its last stash.
pub fn stream_mark(run_id: &str) -> Key<u64> {
    STREAM_MARKS.key(&[run_id.as_bytes()])
}

/// The lone recoveries of a run the process died in.
pub fn hook_probe(run_id: &str) -> Key<u32> {
    HOOK_PROBES.key(&[run_id.as_bytes()])
}

/// A run's budget and spending.
pub fn budget(run_id: &str) -> Key<BudgetRecord> {
    BUDGETS.key(&[run_id.as_bytes()])
}

/// An operator's pause of agent kind `kind`.
pub fn paused_kind(kind: &str) -> Key<PauseRecord> {
    PAUSED_KINDS.key(&[kind.as_bytes()])
}

/// An operator's pause of one run.
pub fn paused_run(run_id: &str) -> Key<PauseRecord> {
    PAUSED_RUNS.key(&[run_id.as_bytes()])
}

/// Alarm `name` of a run, abandoned at `dead_at`.
pub fn dead_letter(run_id: &str, name: &str, dead_at: Timestamp) -> Key<DeadLetter> {
    DEAD_LETTERS.key(&[run_id.as_bytes(), name.as_bytes(), &dead_at.as_millis().to_be_bytes()])
}

/// A run's durable sleep `name`.
pub fn sleep(run_id: &str, name: &str) -> Key<SleepRecord> {
    SLEEPS.key(&[run_id.as_bytes(), name.as_bytes()])
}

/// Event number `seq` of name `name` buffered for a run.
pub fn event(run_id: &str, name: &str, seq: u64) -> Key<EventRecord> {
    EVENTS.key(&[run_id.as_bytes(), name.as_bytes(), &seq.to_be_bytes()])
}

/// The events of name `name` buffered for a run, oldest first.
pub fn events_named(run_id: &str, name: &str) -> Prefix<EventRecord> {
    EVENTS.prefix_of(&[run_id.as_bytes(), name.as_bytes()])
}

/// The mark that an event with idempotency key `key` was sent to a run.
pub fn event_key(run_id: &str, key: &str) -> Key<()> {
    EVENT_KEYS.key(&[run_id.as_bytes(), key.as_bytes()])
}

/// A run's wait for event `name`.
pub fn event_wait(run_id: &str, name: &str) -> Key<EventWaitRecord> {
    EVENT_WAITS.key(&[run_id.as_bytes(), name.as_bytes()])
}

/// Key `key` of a run's own storage.
pub fn storage(run_id: &str, key: &str) -> Key<String> {
    STORAGE.key(&[run_id.as_bytes(), key.as_bytes()])
}

/// What storage key `key` of a run held before its first write after boundary `seq`.
pub fn storage_undo(run_id: &str, seq: u64, key: &str) -> Key<StorageUndo> {
    STORAGE_UNDO.key(&[run_id.as_bytes(), &seq.to_be_bytes(), key.as_bytes()])
}

/// The boundary from which a run's storage history is whole.
pub fn storage_log(run_id: &str) -> Key<u64> {
    STORAGE_LOGS.key(&[run_id.as_bytes()])
}

/// The keys of a run's own storage that start with `prefix`.
pub fn storage_from(run_id: &str, prefix: &str) -> Prefix<String> {
    STORAGE.of_run(run_id).narrowed(prefix.as_bytes())
}

/// The token named `name`.
pub fn token(name: &str) -> Key<TokenRecord> {
    TOKENS.key(&[name.as_bytes()])
}

/// Entry `seq` of the audit trail.
pub fn audit(seq: u64) -> Key<AuditRecord> {
    AUDIT.key(&[&seq.to_be_bytes()])
}

/// The mark that audit entry `seq` concerns a run.
pub fn audit_by_run(run_id: &str, seq: u64) -> Key<()> {
    AUDIT_BY_RUN.key(&[run_id.as_bytes(), &seq.to_be_bytes()])
}

/// Entry `name` of the store's own bookkeeping.
pub(crate) fn meta<V>(name: &str) -> Key<V> {
    let mut bytes = vec![META.prefix];
    bytes.extend_from_slice(name.as_bytes());
    Key::new(META, bytes)
}

/// Splits a settled-index key back into `(settled_at, run_id)`.
pub fn parse_settled(key: &Key<()>) -> Option<(Timestamp, &str)> {
    let rest = key.as_bytes().strip_prefix(&[SETTLED.prefix()])?.get(1..)?;
    let at = u64::from_be_bytes(rest.get(..8)?.try_into().ok()?);
    let run_id = std::str::from_utf8(rest.get(8..)?).ok().filter(|id| !id.is_empty())?;
    Some((Timestamp::from_millis(at), run_id))
}

/// Splits a due-index key back into `(due_at, run_id, due name)`.
pub fn parse_alarm_due(key: &Key<()>) -> Option<(Timestamp, String, String)> {
    parse_alarm_due_bytes(key.as_bytes())
}

pub use super::key_parts::*;

#[cfg(test)]
#[path = "keys_tests.rs"]
mod tests;
