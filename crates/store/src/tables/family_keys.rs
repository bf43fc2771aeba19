//! The keys of a run's history and family: the ring of its recent boundaries, the journal
//! of the boundary each step settled at, where a fork came from, and the links between a run,
//! its children and the forks that inherited them. Re-exported by [`super::keys`], the one
//! place keys are built.

use durafiber_api::family_records::*;

use super::{
    list::{CHILDREN, FORK_PARENTS, FORKS, HISTORY, JOURNAL_SEQS, PARENTS},
    table::Key,
};

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
