//! A run's family as the store links it (`children`, `parents`): the runs it started, the
//! run that started it, and the runs above it — whose pauses hold it and whose budgets count
//! its spending. A child is started under the key `<parent>:child:<name>`, so a run whose key
//! has no such mark has no parent and costs no read to know it.

use durafiber_store::{
    RunId,
    tables::{ChildRecord, ParentRecord, keys},
};

use crate::{
    error::RuntimeError,
    kernel::{
        cell::{Ancestor, RunCell},
        shared::Shared,
    },
};

/// What a child's idempotency key holds between its parent's run id and its name.
pub(crate) const CHILD_KEY_MARK: &str = ":child:";

/// How many runs above a run are looked at: a bound a chain of sub-agents does not reach.
const LINEAGE_MAX: usize = 64;

/// Whether a run started under idempotency key `key` may be a child.
pub(crate) fn may_have_parent(key: &str) -> bool {
    key.contains(CHILD_KEY_MARK)
}

/// The parent of `run_id`, if a run started it.
pub(crate) fn parent_of(shared: &Shared, run_id: &RunId) -> Result<Option<ParentRecord>, RuntimeError> {
    Ok(shared.store.get(&keys::parent_of(run_id))?)
}

/// The runs a child's end is sent to: the run that started it, then every fork that
/// inherited it.
pub(crate) fn parents_to_tell(shared: &Shared, run_id: &RunId) -> Result<Vec<RunId>, RuntimeError> {
    let mut out: Vec<RunId> = parent_of(shared, run_id)?.map(|p| p.parent_run_id).into_iter().collect();
    for (_, fork) in shared.store.scan(&keys::FORK_PARENTS.of_run(run_id), None, usize::MAX)? {
        out.push(fork?.parent_run_id);
    }
    Ok(out)
}

/// Every child of `run_id`, by name.
pub(crate) fn children_of(
    shared: &Shared,
    run_id: &RunId,
) -> Result<Vec<(String, ChildRecord)>, RuntimeError> {
    let mut out = Vec::new();
    for (key, child) in shared.store.scan(&keys::CHILDREN.of_run(run_id), None, usize::MAX)? {
        let name = keys::child_name(&key).unwrap_or_default();
        out.push((name, child?));
    }
    Ok(out)
}

/// The children `run_id` started itself, by name: its children but for those a fork
/// inherited from the run it came from, which stay that run's (theirs to cancel, to count
/// against a budget, to delete).
pub(crate) fn own_children_of(
    shared: &Shared,
    run_id: &RunId,
) -> Result<Vec<(String, ChildRecord)>, RuntimeError> {
    let mut out = children_of(shared, run_id)?;
    let mut own = Vec::with_capacity(out.len());
    for (name, child) in out.drain(..) {
        if parent_of(shared, &child.child_run_id)?.is_some_and(|p| p.parent_run_id.as_str() == run_id) {
            own.push((name, child));
        }
    }
    Ok(own)
}

/// The runs above `run_id` (started under `key`), nearest first, read through the parent
/// links.
pub(crate) fn ancestors(shared: &Shared, run_id: &RunId, key: &str) -> Result<Vec<Ancestor>, RuntimeError> {
    let mut out = Vec::new();
    let (mut run_id, mut key) = (run_id.clone(), key.to_string());
    while out.len() < LINEAGE_MAX && may_have_parent(&key) {
        let Some(parent) = parent_of(shared, &run_id)? else { break };
        let run = shared.load_run(&parent.parent_run_id)?;
        out.push(Ancestor { run_id: run.run_id.clone(), kind: run.kind.clone() });
        (run_id, key) = (run.run_id.clone(), run.key);
    }
    Ok(out)
}

/// The runs above a live run, read at the first need of its activation (they never change).
pub(crate) fn of_cell<'a>(shared: &Shared, cell: &'a RunCell) -> Result<&'a [Ancestor], RuntimeError> {
    if let Some(known) = cell.lineage.get() {
        return Ok(known);
    }
    let run = shared.load_run(&cell.run_id)?;
    let found = ancestors(shared, &cell.run_id, &run.key)?;
    Ok(cell.lineage.get_or_init(|| found.into_boxed_slice()))
}
