//! Every table, the type of its values and the layout of its keys: the one place a key is
//! built. Parts of a key are joined with a NUL byte, which ids may not contain
//! ([`super::check_id`]); numbers in keys are big-endian, so a range scan is in their order.

use super::{
    family_records::*,
    records::*,
    table::{Key, Prefix, Table, TableInfo, decode_sealed, printable},
};
use crate::{RunId, error::StoreError};

/// Declares each table once: its name, prefix and value type; [`ALL`] and the decoder that
/// checks any stored record as its table's type follow from the same list.
macro_rules! tables {
    ($($(#[$doc:meta])* $table:ident: $value:ty = ($name:literal, $prefix:literal);)*) => {
        $($(#[$doc])* pub const $table: Table<$value> = Table::new($name, $prefix);)*

        /// Every table, for inspection, repair and tests.
        pub const ALL: &[TableInfo] = &[$($table.info(),)* META];

        /// Opens and decodes one stored record as the type its table holds.
        pub fn check_record(table: TableInfo, key: &[u8], sealed: &[u8]) -> Result<(), StoreError> {
            $(if table.prefix == $prefix {
                return decode_sealed::<$value>(table, key, sealed).map(drop);
            })*
            if table.prefix == META.prefix {
                return decode_sealed::<u64>(table, key, sealed).map(drop);
            }
            Err(StoreError::Corrupt { table: table.name, key: printable(key), reason: "no such table".into() })
        }
    };
}

tables! {
    /// Runs by id: `r` run_id.
    RUNS: RunRecord = ("runs", b'r');
    /// The run id `start` minted for an idempotency key, per agent kind: `k` kind NUL key.
    RUN_KEYS: RunId = ("run_keys", b'k');
    /// Runs that are not terminal, so the recovery scan reads only these: `o` run_id.
    OPEN_RUNS: () = ("open_runs", b'o');
    /// The last stash of each run: `s` run_id.
    STASHES: StashRecord = ("stashes", b's');
    /// The agent's stash version of each run's last stash: `n` run_id, present only when it is
    /// not 1, so the stores of agents that never bump it hold nothing more.
    STASH_VERSIONS: u32 = ("stash_versions", b'n');
    /// The effect ledger: `l` run_id NUL effect_id.
    LEDGER: LedgerEntry = ("ledger", b'l');
    /// Human approvals, pending and decided: `p` run_id NUL approval_id.
    APPROVALS: ApprovalRecord = ("approvals", b'p');
    /// The rule of each approval more than one person decides: `R` run_id NUL approval_id.
    APPROVAL_RULES: ApprovalRuleRecord = ("approval_rules", b'R');
    /// Each person's decision on such an approval: `V` run_id NUL approval_id NUL by.
    APPROVAL_VOTES: VoteRecord = ("approval_votes", b'V');
    /// Each run's recent boundaries, their stashes as written, in a ring of `history_max`
    /// slots: `H` run_id NUL slot, the slot being the boundary's `seq` modulo `history_max`.
    HISTORY: HistoryRecord = ("history", b'H');
    /// The boundary (the last stash's `seq`) at which each journaled step of a run settled — an
    /// effect committed, an approval decided, a sleep woken, an event wait ended — so a fork
    /// knows which came before its point: `J` run_id NUL what NUL id.
    JOURNAL_SEQS: u64 = ("journal_seqs", b'J');
    /// Where each forked run came from: `K` run_id.
    FORKS: ForkRecord = ("forks", b'K');
    /// The runs each run started as its children, by name: `C` parent_run_id NUL name.
    CHILDREN: ChildRecord = ("children", b'C');
    /// The parent of each child run: `A` run_id.
    PARENTS: ParentRecord = ("parents", b'A');
    /// The forks that inherited a child run from the run that started it, so the child's end
    /// reaches their joins too: `F` child_run_id NUL fork_run_id.
    FORK_PARENTS: ParentRecord = ("fork_parents", b'F');
    /// Alarms by run and name: `a` run_id NUL name.
    ALARMS: AlarmRecord = ("alarms", b'a');
    /// Alarms by due time, the scheduler's index: `d` due_at_ms run_id NUL due name.
    ALARM_DUE: () = ("alarm_due", b'd');
    /// The cron expression of each cron alarm (its record in `alarms` holds the next due time):
    /// `c` run_id NUL name.
    ALARM_CRONS: CronRecord = ("alarm_crons", b'c');
    /// Failed occurrences of periodic and cron alarms, retried beside the schedule, which goes
    /// on: `q` run_id NUL name NUL scheduled_at_ms. Their `alarm_due` entries name them
    /// `name NUL scheduled_at_ms` ([`retry_due_name`]).
    ALARM_RETRIES: AlarmRecord = ("alarm_retries", b'q');
    /// Each run's durable output stream, one chunk per key, in order: `b` run_id NUL seq.
    STREAM: StreamChunkRecord = ("stream", b'b');
    /// Chunks a re-entered fiber emitted differently from the durable one at their place
    /// (its code changed in a deploy): the durable chunk stood, and this says what the new
    /// code emitted. Written with the run's next boundary: `D` run_id NUL seq.
    STREAM_REEMISSIONS: ReemissionRecord = ("stream_reemissions", b'D');
    /// Each run's stream length and size, written with its chunks: `h` run_id.
    STREAM_HEADS: StreamHead = ("stream_heads", b'h');
    /// Each run's stream length at its last stash: where a fiber re-entered there stands in its
    /// stream. Written with a stash when the run's stream is not empty; none reads as 0.
    /// `B` run_id.
    STREAM_MARKS: u64 = ("stream_marks", b'B');
    /// Runs whose recovery hook is running alone (a suspect's probe): how many such recoveries
    /// in a row the process did not survive. Written before the hook runs, removed when it
    /// settles. `P` run_id.
    HOOK_PROBES: u32 = ("hook_probes", b'P');
    /// Each run's budget and what it has spent, for runs that have one: `f` run_id.
    BUDGETS: BudgetRecord = ("budgets", b'f');
    /// Agent kinds an operator paused: `z` kind.
    PAUSED_KINDS: PauseRecord = ("paused_kinds", b'z');
    /// Runs an operator paused one by one: `j` run_id.
    PAUSED_RUNS: PauseRecord = ("paused_runs", b'j');
    /// Abandoned alarms: `x` run_id NUL name NUL dead_at_ms.
    DEAD_LETTERS: DeadLetter = ("dead_letters", b'x');
    /// Durable sleeps, the journal that makes a sleep wake once, at its time: `w` run_id NUL name.
    SLEEPS: SleepRecord = ("sleeps", b'w');
    /// External events sent to a run and not consumed yet, FIFO per name:
    /// `e` run_id NUL name NUL seq.
    EVENTS: EventRecord = ("events", b'e');
    /// Idempotency keys of sent events, so a repeat is a `Duplicate`, delivered once:
    /// `i` run_id NUL key.
    EVENT_KEYS: () = ("event_keys", b'i');
    /// The journal of event waits, what each wait returned, so a re-entry returns it again:
    /// `v` run_id NUL name.
    EVENT_WAITS: EventWaitRecord = ("event_waits", b'v');
    /// Each run's own key-value storage (`ctx.storage()`), canonical JSON under the user's key:
    /// `g` run_id NUL key.
    STORAGE: String = ("storage", b'g');
    /// Each run's storage history, so a fork can have its storage as it was at a boundary:
    /// what a key held before the run's first write to it after boundary `seq`:
    /// `U` run_id NUL seq NUL key.
    STORAGE_UNDO: StorageUndo = ("storage_undo", b'U');
    /// The boundary from which a run's storage history is whole (its storage was empty then,
    /// or the history began there): `L` run_id.
    STORAGE_LOGS: u64 = ("storage_logs", b'L');
    /// API tokens by name (the token's hash, never the token): `t` name.
    TOKENS: TokenRecord = ("tokens", b't');
    /// The audit trail, append-only: `u` seq.
    AUDIT: AuditRecord = ("audit", b'u');
    /// The audit entries of one run: `y` run_id NUL seq.
    AUDIT_BY_RUN: () = ("audit_by_run", b'y');
    /// Settled runs by how and when they settled, what retention walks: `S` how (one byte)
    /// settled_at_ms run_id ([`settled`]).
    SETTLED: () = ("settled", b'S');
}

/// The store's own bookkeeping (the rollback witness's commit sequence number, the log's
/// checkpoint): `m` name, each entry its own value type (a `u64` so far).
pub const META: TableInfo = TableInfo { name: "meta", prefix: b'm' };

impl TableInfo {
    /// The table a stored key belongs to, if any.
    pub fn of_key(key: &[u8]) -> Option<TableInfo> {
        ALL.iter().copied().find(|t| key.first() == Some(&t.prefix))
    }
}

/// The run a record belongs to, read from its key: the first key part for every table but
/// `run_keys`, `meta`, `tokens`, `audit` and `paused_kinds` (which belong to no run),
/// `alarm_due` (after its due time) and `settled` (after how and when).
pub fn run_of_key(key: &[u8]) -> Option<&str> {
    let table = TableInfo::of_key(key)?;
    let no_run = [RUN_KEYS.prefix(), META.prefix, TOKENS.prefix(), AUDIT.prefix(), PAUSED_KINDS.prefix()];
    if no_run.contains(&table.prefix) {
        return None;
    }
    let rest = key.get(1..)?;
    let rest = match table.prefix {
        p if p == ALARM_DUE.prefix() => rest.get(8..)?,
        p if p == SETTLED.prefix() => rest.get(9..)?,
        _ => rest,
    };
    let id = rest.split(|b| *b == 0).next()?;
    std::str::from_utf8(id).ok().filter(|s| !s.is_empty())
}

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

/// The slot of a run's history that boundary `seq` is written to when the history keeps
/// `history_max` boundaries: a ring, so a new boundary overwrites the one `history_max`
/// back instead of adding a key and deleting another. With `history_max` 0 (no history is
/// kept, but a fork still records its point) the slot is `seq` itself.
pub fn history(run_id: &str, seq: u64, history_max: u32) -> Key<HistoryRecord> {
    let slot = seq.checked_rem(u64::from(history_max)).unwrap_or(seq);
    HISTORY.key(&[run_id.as_bytes(), &slot.to_be_bytes()])
}

/// What a run's journal records the boundary of: which kind of step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Journaled {
    /// An effect committed.
    Effect,
    /// An approval decided.
    Approval,
    /// A durable sleep woken.
    Sleep,
    /// An event wait ended.
    EventWait,
    /// A child run started (`Ctx::start_child`).
    Child,
}

impl Journaled {
    fn code(self) -> &'static [u8] {
        match self {
            Journaled::Effect => b"effect",
            Journaled::Approval => b"approval",
            Journaled::Sleep => b"sleep",
            Journaled::EventWait => b"event",
            Journaled::Child => b"child",
        }
    }
}

/// The boundary at which step `id` of kind `what` of a run settled.
pub fn journal_seq(run_id: &str, what: Journaled, id: &str) -> Key<u64> {
    JOURNAL_SEQS.key(&[run_id.as_bytes(), what.code(), id.as_bytes()])
}

/// Where run `run_id` was forked from, if it was.
pub fn fork(run_id: &str) -> Key<ForkRecord> {
    FORKS.key(&[run_id.as_bytes()])
}

/// Child `name` of run `parent`.
pub fn child(parent: &str, name: &str) -> Key<ChildRecord> {
    CHILDREN.key(&[parent.as_bytes(), name.as_bytes()])
}

/// The parent of run `run_id`, if a run started it.
pub fn parent_of(run_id: &str) -> Key<ParentRecord> {
    PARENTS.key(&[run_id.as_bytes()])
}

/// Fork `fork`'s link to child `child`, which it inherited.
pub fn fork_parent(child: &str, fork: &str) -> Key<ParentRecord> {
    FORK_PARENTS.key(&[child.as_bytes(), fork.as_bytes()])
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

/// The retried occurrence of alarm `name` scheduled for `scheduled_at_ms`.
pub fn alarm_retry(run_id: &str, name: &str, scheduled_at_ms: u64) -> Key<AlarmRecord> {
    ALARM_RETRIES.key(&[run_id.as_bytes(), name.as_bytes(), &scheduled_at_ms.to_be_bytes()])
}

/// Every retried occurrence of a run's alarms, or of its alarm `name` only.
pub fn alarm_retries_of(run_id: &str, name: Option<&str>) -> Prefix<AlarmRecord> {
    match name {
        Some(name) => ALARM_RETRIES.prefix_of(&[run_id.as_bytes(), name.as_bytes()]),
        None => ALARM_RETRIES.of_run(run_id),
    }
}

/// An entry of the due index: time first, so a range scan is in due order.
pub fn alarm_due(due_at_ms: u64, run_id: &str, due_name: &str) -> Key<()> {
    ALARM_DUE.key(&[&[due_at_ms.to_be_bytes().as_slice(), run_id.as_bytes()].concat(), due_name.as_bytes()])
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
pub fn settled(how: Settled, settled_at_ms: u64, run_id: &str) -> Key<()> {
    SETTLED.key(&[&[&[how.code()], settled_at_ms.to_be_bytes().as_slice(), run_id.as_bytes()].concat()])
}

/// The entries of the runs that settled `how`, oldest first.
pub fn settled_of(how: Settled) -> Prefix<()> {
    SETTLED.all().narrowed(&[how.code()])
}

/// Present once every run settled before the settled index existed has its entry there.
pub fn settled_index_complete() -> Key<u64> {
    meta("settled_index")
}

pub(crate) fn parse_alarm_due_bytes(key: &[u8]) -> Option<(u64, String, String)> {
    let rest = key.strip_prefix(&[ALARM_DUE.prefix()])?;
    let due = u64::from_be_bytes(rest.get(..8)?.try_into().ok()?);
    let rest = rest.get(8..)?;
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

/// Alarm `name` of a run, abandoned at `dead_at_ms`.
pub fn dead_letter(run_id: &str, name: &str, dead_at_ms: u64) -> Key<DeadLetter> {
    DEAD_LETTERS.key(&[run_id.as_bytes(), name.as_bytes(), &dead_at_ms.to_be_bytes()])
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

/// Splits a settled-index key back into `(settled_at_ms, run_id)`.
pub fn parse_settled(key: &Key<()>) -> Option<(u64, &str)> {
    let rest = key.as_bytes().strip_prefix(&[SETTLED.prefix()])?.get(1..)?;
    let at = u64::from_be_bytes(rest.get(..8)?.try_into().ok()?);
    let run_id = std::str::from_utf8(rest.get(8..)?).ok().filter(|id| !id.is_empty())?;
    Some((at, run_id))
}

/// Splits a due-index key back into `(due_at_ms, run_id, due name)`.
pub fn parse_alarm_due(key: &Key<()>) -> Option<(u64, String, String)> {
    parse_alarm_due_bytes(key.as_bytes())
}

pub use super::key_parts::*;

#[cfg(test)]
#[path = "keys_tests.rs"]
mod tests;
