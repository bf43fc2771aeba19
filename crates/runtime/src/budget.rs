//! Budgets: what one run may spend — effects started, cost units charged, time since its
//! start, recoveries — before it stops at its next boundary with
//! `Escalated{reason: "budget: <which>"}`. No new effect starts once a limit is crossed.
//!
//! The limits are fixed at the run's start (`RunOptions::budget` over the runtime's); the
//! spending rides on the run's boundaries (`kernel/spend.rs`), so after a crash the count is
//! the one the surviving work paid.
//!
//! A parent's budget counts its children's effects and cost units (and theirs): each run
//! keeps its own spending, and a check adds up what the runs below have recorded. A child
//! is stopped by a limit of a run above it as by its own; runs going on side by side may
//! each start one effect past a shared limit before they see the other's spending.

use durafiber_store::{
    Batch, RunId,
    tables::{BudgetLimits, BudgetRecord, BudgetSpent, Key, RunRecord, keys},
};

use crate::{
    error::{AgentError, RuntimeError},
    kernel::{
        lineage,
        shared::{RawCtx, Shared},
        spend,
    },
    metrics::Metrics,
};

/// Adds a new run's budget record to its accepting batch, when it has limits.
pub(crate) fn stage_at_start(
    batch: &mut Batch,
    run_id: &RunId,
    limits: Option<BudgetLimits>,
) -> Result<(), RuntimeError> {
    if let Some(limits) = limits {
        let record = BudgetRecord { limits, spent: Default::default() };
        batch.put(keys::budget(run_id), &record)?;
    }
    Ok(())
}

/// A budget a run's spending counts against — its own, or that of a run above it — with
/// everything spent under it so far: by its run, durable and pending, and by the runs below.
struct Counted {
    payer: RunId,
    limits: BudgetLimits,
    spent: BudgetSpent,
}

/// What the runs below `run_id` (its children, theirs…) have spent, as their boundaries
/// recorded it.
fn spent_below(shared: &Shared, run_id: &RunId) -> Result<BudgetSpent, RuntimeError> {
    let mut total = BudgetSpent::default();
    let mut next = vec![run_id.clone()];
    let mut seen = std::collections::HashSet::new();
    while let Some(parent) = next.pop() {
        for (_, record) in lineage::own_children_of(shared, &parent)? {
            let id = record.child_run_id.clone();
            if !seen.insert(id.clone()) {
                continue;
            }
            if let Some(budget) = spend::stored(&shared.store, &id)? {
                total = total.plus(budget.spent);
            }
            next.push(id);
        }
    }
    Ok(total)
}

/// The budgets the fiber's run counts against, with what was spent under each; empty for a
/// run without limits under runs without limits, which after its first boundary costs no read.
fn current(raw: &RawCtx) -> Result<Vec<Counted>, AgentError> {
    if raw.cell.spending.without_budget.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(Vec::new());
    }
    let (shared, run_id) = (&raw.shared, &raw.cell.run_id);
    let with_limits = |r: &BudgetRecord| r.limits != BudgetLimits::default();
    let pending = *raw.cell.spending.spend.lock();
    let mut counted = Vec::new();
    if let Some(own) = spend::stored(&shared.store, run_id)?.filter(with_limits) {
        let spent = own.spent.plus(pending).plus(spent_below(shared, run_id)?);
        counted.push(Counted { payer: run_id.clone(), limits: own.limits, spent });
    }
    // A parent's budget counts its children's spending: this run's durable spending is
    // among what is below it, its pending spending not yet.
    for above in lineage::of_cell(shared, &raw.cell)? {
        if let Some(theirs) = spend::stored(&shared.store, &above.run_id)?.filter(with_limits) {
            let spent = theirs.spent.plus(spent_below(shared, &above.run_id)?).plus(pending);
            counted.push(Counted { payer: above.run_id.clone(), limits: theirs.limits, spent });
        }
    }
    if counted.is_empty() {
        // Limits never change after a run's start, those of the runs above neither.
        raw.cell.spending.without_budget.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    Ok(counted)
}

/// The limit `counted` has crossed, if any, named; `starting_effect` asks whether one more
/// effect would cross `effects_max`. The time and recovery limits are the run's own.
fn crossed(raw: &RawCtx, counted: &Counted, starting_effect: bool) -> Result<Option<String>, AgentError> {
    let (limits, spent) = (counted.limits, counted.spent);
    let own = counted.payer == raw.cell.run_id;
    let name = |which: &str| {
        if own { which.to_string() } else { format!("{which}, counted against run {}", counted.payer) }
    };
    let effects = spent.effects.saturating_add(u32::from(starting_effect));
    if limits.effects_max.is_some_and(|max| effects > max) {
        return Ok(Some(name("effects")));
    }
    if limits.cost_units_max.is_some_and(|max| spent.cost_units > max) {
        return Ok(Some(name("cost_units")));
    }
    if let Some(max_ms) = limits.wall_time_max_ms.filter(|_| own) {
        let created = raw.shared.load_run(&raw.cell.run_id)?.created_at_ms;
        if raw.shared.now().saturating_since(created).as_millis() > u128::from(max_ms) {
            return Ok(Some(name("wall_time")));
        }
    }
    Ok(None)
}

/// The first limit crossed among `counted`, if any.
fn first_crossed(
    raw: &RawCtx,
    counted: &[Counted],
    starting_effect: bool,
) -> Result<Option<String>, AgentError> {
    for c in counted {
        if let Some(which) = crossed(raw, c, starting_effect)? {
            return Ok(Some(which));
        }
    }
    Ok(None)
}

fn stop(raw: &RawCtx, which: &str) -> AgentError {
    Metrics::bump(&raw.shared.obs.metrics.budget_stops);
    raw.shared.event(&raw.cell.run_id, "budget_exceeded", which.to_string());
    AgentError::escalate(format!("budget: {which}"))
}

/// At a boundary: the run stops here if it, or a run above it, has crossed a limit.
pub(crate) fn check(raw: &RawCtx) -> Result<(), AgentError> {
    let counted = current(raw)?;
    match first_crossed(raw, &counted, false)? {
        Some(which) => Err(stop(raw, &which)),
        None => Ok(()),
    }
}

/// Before a new effect is prepared: refused (the run stops) if it would cross a limit of its
/// own or of a run above it, else counted with the prepare's boundary.
pub(crate) fn admit_effect(raw: &RawCtx) -> Result<(), AgentError> {
    let counted = current(raw)?;
    if counted.is_empty() {
        return Ok(());
    }
    if let Some(which) = first_crossed(raw, &counted, true)? {
        return Err(stop(raw, &which));
    }
    raw.cell.spending.spend.lock().effects += 1;
    Ok(())
}

/// Records `units` of cost spent on `what`, durable with the run's next boundary.
pub(crate) fn charge(raw: &RawCtx, units: u64, what: &str) {
    {
        let mut pending = raw.cell.spending.spend.lock();
        pending.cost_units = pending.cost_units.saturating_add(units);
    }
    Metrics::add(&raw.shared.obs.metrics.cost_units, units);
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

    fn may_have(&self, run_id: &RunId) -> bool {
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
