//! The one list of tables: each table's name, prefix and value type, declared once, and what
//! follows from the list — every table (`ALL`), the decoder that checks a stored record as
//! its table's type, and the run a stored key belongs to. Re-exported by [`super::keys`].

use durafiber_api::{family_records::*, records::*};

use super::table::{Table, TableInfo, decode_sealed, printable};
use durafiber_api::RunId;

use crate::error::StoreError;

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
    /// `name NUL scheduled_at_ms` ([`super::keys::retry_due_name`]).
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
    /// settled_at_ms run_id ([`super::keys::settled`]).
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
