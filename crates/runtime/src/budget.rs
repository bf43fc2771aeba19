//! Budgets: what one run may spend — effects started, cost units charged, time since its
//! start, recoveries — before it stops at its next boundary with
//! `Escalated{reason: "budget: <which>"}`. No new effect starts once a limit is crossed.
//!
//! The limits are fixed at the run's start (`RunOptions::budget` over the runtime's); the
//! spending rides on the run's boundaries (`kernel/spend.rs`), so after a crash the count is
//! the one the surviving work paid.

use durafiber_store::{
    Batch,
    tables::{BudgetLimits, BudgetRecord, Key, RunRecord, keys},
};

use crate::{
    error::{AgentError, RuntimeError},
    kernel::{
        shared::{RawCtx, Shared},
        spend,
    },
    metrics::Metrics,
};

/// Adds a new run's budget record to its accepting batch, when it has limits.
pub(crate) fn stage_at_start(
    batch: &mut Batch,
    run_id: &str,
    limits: Option<BudgetLimits>,
) -> Result<(), RuntimeError> {
    if let Some(limits) = limits {
        let record = BudgetRecord { limits, spent: Default::default() };
        batch.put(keys::budget(run_id), &record)?;
    }
    Ok(())
}

/// A run's budget and its spending, durable and pending together; `None` for a run without
/// limits, which after its first boundary costs no read.
fn current(raw: &RawCtx) -> Result<Option<BudgetRecord>, AgentError> {
    if raw.cell.without_budget.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(None);
    }
    let stored = spend::stored(&raw.shared.store, &raw.cell.run_id)?;
    let limits = stored.map(|r| r.limits).filter(|l| *l != BudgetLimits::default());
    if limits.is_none() {
        raw.cell.without_budget.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    let Some(mut record) = stored.filter(|_| limits.is_some()) else { return Ok(None) };
    let pending = *raw.cell.spend.lock();
    record.spent.effects = record.spent.effects.saturating_add(pending.effects);
    record.spent.cost_units = record.spent.cost_units.saturating_add(pending.cost_units);
    Ok(Some(record))
}

/// The limit `record` has crossed, if any; `starting_effect` asks whether one more effect
/// would cross `effects_max`.
fn crossed(
    shared: &Shared,
    run_id: &str,
    record: &BudgetRecord,
    starting_effect: bool,
) -> Result<Option<&'static str>, AgentError> {
    let (limits, spent) = (record.limits, record.spent);
    let effects = spent.effects.saturating_add(u32::from(starting_effect));
    if limits.effects_max.is_some_and(|max| effects > max) {
        return Ok(Some("effects"));
    }
    if limits.cost_units_max.is_some_and(|max| spent.cost_units > max) {
        return Ok(Some("cost_units"));
    }
    if let Some(max_ms) = limits.wall_time_max_ms {
        let created = shared.load_run(run_id)?.created_at_ms;
        if shared.now_ms().saturating_sub(created) > max_ms {
            return Ok(Some("wall_time"));
        }
    }
    Ok(None)
}

fn stop(raw: &RawCtx, which: &str) -> AgentError {
    Metrics::bump(&raw.shared.metrics.budget_stops);
    raw.shared.event(&raw.cell.run_id, "budget_exceeded", which.to_string());
    AgentError::escalate(format!("budget: {which}"))
}

/// At a boundary: the run stops here if it has crossed a limit.
pub(crate) fn check(raw: &RawCtx) -> Result<(), AgentError> {
    let Some(record) = current(raw)? else { return Ok(()) };
    match crossed(&raw.shared, &raw.cell.run_id, &record, false)? {
        Some(which) => Err(stop(raw, which)),
        None => Ok(()),
    }
}

/// Before a new effect is prepared: refused (the run stops) if it would cross a limit, else
/// counted with the prepare's boundary.
pub(crate) fn admit_effect(raw: &RawCtx) -> Result<(), AgentError> {
    let Some(record) = current(raw)? else { return Ok(()) };
    if let Some(which) = crossed(&raw.shared, &raw.cell.run_id, &record, true)? {
        return Err(stop(raw, which));
    }
    raw.cell.spend.lock().effects += 1;
    Ok(())
}

/// Records `units` of cost spent on `what`, durable with the run's next boundary.
pub(crate) fn charge(raw: &RawCtx, units: u64, what: &str) {
    {
        let mut pending = raw.cell.spend.lock();
        pending.cost_units = pending.cost_units.saturating_add(units);
    }
    Metrics::add(&raw.shared.metrics.cost_units, units);
    raw.shared.event(&raw.cell.run_id, "charged", format!("{units} units: {what}"));
}

/// Which runs may have a budget record. A recovery batch reads the keys of its runs' range
/// at once: a run outside them has none, and its recovery reads nothing more.
pub(crate) enum Budgets {
    /// Not looked up: read each run's record.
    Unknown,
    /// Every budget record's key between the batch's first and last run.
    Among(std::collections::HashSet<Key<BudgetRecord>>),
}

impl Budgets {
    /// The budget records of the runs between `first` and `last` (inclusive), when there
    /// are at most `most` of them; `Unknown` when there are more, or the read failed.
    pub(crate) fn between(shared: &Shared, first: &str, last: &str, most: usize) -> Budgets {
        match shared.store.keys_from_to(&keys::budget(first), &keys::budget(last), most.saturating_add(1)) {
            Ok(found) if found.len() <= most => Budgets::Among(found.into_iter().collect()),
            _ => Budgets::Unknown,
        }
    }

    fn may_have(&self, run_id: &str) -> bool {
        match self {
            Budgets::Unknown => true,
            Budgets::Among(found) => found.contains(&keys::budget(run_id)),
        }
    }
}

/// Whether recovering `run` once more would pass its `recoveries_max`.
pub(crate) fn recoveries_crossed(
    shared: &Shared,
    run: &RunRecord,
    budgets: &Budgets,
) -> Result<bool, RuntimeError> {
    if !budgets.may_have(&run.run_id) {
        return Ok(false);
    }
    let Some(record) = spend::stored(&shared.store, &run.run_id)? else { return Ok(false) };
    // `attempt` counts fiber attempts: a recovery now would be the `attempt`-th.
    Ok(record.limits.recoveries_max.is_some_and(|max| run.attempt > max))
}
