//! What a live run has spent since its last boundary: effects admitted and cost units
//! charged. Every boundary of the run adds it to the run's budget record in its own batch
//! (`Shared::commit_boundary`, `Shared::update_run_from`), so spending is as durable as the
//! work it paid for; a crash loses at most what the lost work spent.

use durafiber_store::RunId;
use durafiber_store::{
    Batch, Store, StoreError,
    tables::{BudgetRecord, BudgetSpent, keys},
};

/// What a live run spent since its last boundary, held in its cell.
#[derive(Default)]
pub(crate) struct CellSpending {
    /// Effects admitted and cost units charged since the last boundary.
    pub spend: durafiber_store::lock::Mutex<BudgetSpent>,
    /// Set once the run's budget was read and it has no limits (they never change after its
    /// start), so its boundaries read nothing more.
    pub without_budget: std::sync::atomic::AtomicBool,
}

/// A run's budget record as stored; `None` for a run with no budget that charged nothing.
pub(crate) fn stored(store: &Store, run_id: &RunId) -> Result<Option<BudgetRecord>, StoreError> {
    store.get(&keys::budget(run_id))
}

/// Adds `pending` to the run's stored spending in `batch`; true when there was any.
pub(crate) fn stage(
    store: &Store,
    run_id: &RunId,
    pending: &mut BudgetSpent,
    batch: &mut Batch,
) -> Result<bool, StoreError> {
    if *pending == BudgetSpent::default() {
        return Ok(false);
    }
    let mut record = stored(store, run_id)?.unwrap_or_default();
    record.spent = record.spent.plus(*pending);
    *pending = BudgetSpent::default();
    batch.put(keys::budget(run_id), &record)?;
    Ok(true)
}
