//! The scan that finds interrupted runs — at start-up, and on a shared store when a node
//! takes shards — and re-enters them in batches whose registrations share one write. What
//! each run needs is `recovery::plan`'s decision, made in `fiber::register`.

use std::sync::Arc;

use durafiber_store::{
    Batch, Durability,
    tables::{self, RunStatus},
};

use crate::{
    budget::Budgets,
    clock::Stopwatch,
    error::RuntimeError,
    kernel::inbox::{Activation, Registered},
    kernel::registry::LiveRun,
    kernel::shared::Shared,
    limits,
    run::{actor, fiber},
};

/// Finds every interrupted run and re-activates it. Returns how many were found.
pub(crate) async fn scan_and_reactivate(shared: &Arc<Shared>) -> Result<usize, RuntimeError> {
    reactivate_interrupted(shared, &|run_id| shared.ownership.owns(run_id)).await
}

/// Re-activates the interrupted runs among those `keep` accepts: every one at start-up, the
/// runs of shards a node just acquired, or runs another node accepted into its shards and
/// has not seen live. The open-run index is read a page at a time; its runs are dealt into
/// lanes by lock stripe and each lane re-activates its runs in batches of
/// `RECOVERY_BATCH_MAX`, one batch at a time. Two lanes never share a stripe, so their
/// batches never wait for each other's locks and run side by side.
pub(crate) async fn reactivate_interrupted(
    shared: &Arc<Shared>,
    keep: &(dyn Fn(&str) -> bool + Sync),
) -> Result<usize, RuntimeError> {
    let lanes = (limits::RECOVERY_ACTIVATIONS_MAX / limits::RECOVERY_BATCH_MAX).max(1);
    let mut senders = Vec::with_capacity(lanes);
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..lanes {
        // One batch queued behind the one running: the scan stays a little ahead, and the
        // memory of a large recovery stays bounded.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<String>>(1);
        let shared = shared.clone();
        workers.spawn(async move {
            let mut found = 0;
            while let Some(batch) = rx.recv().await {
                found += reactivate_batch(&shared, batch).await?;
            }
            Ok::<usize, RuntimeError>(found)
        });
        senders.push(tx);
    }
    let mut dealt: Vec<Vec<String>> = vec![Vec::new(); lanes];
    let mut after: Option<Vec<u8>> = None;
    let mut scanned = Ok(());
    'pages: loop {
        let (ids, next) = match shared.open_runs_page(after.as_deref()) {
            Ok(page) => page,
            Err(e) => {
                scanned = Err(e);
                break;
            }
        };
        for id in ids.into_iter().filter(|id| keep(id)) {
            let lane = crate::kernel::cell::stripe(&id, limits::ACTIVATION_STRIPES) % lanes;
            dealt[lane].push(id);
            if dealt[lane].len() >= limits::RECOVERY_BATCH_MAX
                && senders[lane].send(std::mem::take(&mut dealt[lane])).await.is_err()
            {
                // The lane's task ended early: its error is reported below.
                break 'pages;
            }
        }
        match next {
            Some(last) => after = Some(last),
            None => break,
        }
    }
    for (lane, tx) in senders.into_iter().enumerate() {
        let rest = std::mem::take(&mut dealt[lane]);
        if scanned.is_ok() && !rest.is_empty() {
            let _ = tx.send(rest).await;
        }
    }
    let mut found = 0;
    while let Some(done) = workers.join_next().await {
        found += done.map_err(|e| {
            RuntimeError::Agent(crate::error::AgentError::Runtime(format!("recovery task: {e}")))
        })??;
    }
    scanned.map(|()| found)
}

/// Re-activates the interrupted runs among `run_ids` together: one read of each record,
/// under the runs' transition and record locks, and every fiber's registration in one
/// boundary — the same writes, decisions and order as one activation each (`actor.rs`), at
/// the cost of one barrier for the batch. A run that needs more (an escalation, a pause
/// lifted by a resume the process died in) is re-entered alone after the batch. Each run of
/// the batch is made live as a cold start would: its cell, its fiber, then its place in the
/// registry. Returns how many runs were found interrupted.
async fn reactivate_batch(shared: &Arc<Shared>, run_ids: Vec<String>) -> Result<usize, RuntimeError> {
    if shared.passive {
        return Ok(0);
    }
    let Ok(_activating) = shared.activating() else { return Ok(0) };
    // Virtual time waits for the registration write.
    let _busy = shared.busy();
    let since = shared.opened;
    let watch = Stopwatch::start();
    let transitions = shared.registry.transitions(&run_ids).await;
    // A run already live was activated by an event meanwhile; its actor re-enters it.
    let run_ids: Vec<String> = run_ids
        .into_iter()
        .filter(|id| shared.registry.get(id).is_none() && shared.ownership.owns(id))
        .collect();
    let Ok(locks) = shared.lock_runs(&run_ids).await else { return Ok(0) };
    // One read of the budget keys between the batch's least and greatest run spares the
    // runs without a budget a read each (a lane holds about an eighth of that range).
    let budgets = match (run_ids.iter().min(), run_ids.iter().max()) {
        (Some(first), Some(last)) => Budgets::between(shared, first, last, 4 * limits::RECOVERY_BATCH_MAX),
        _ => Budgets::Unknown,
    };
    let mut found = 0;
    let mut writes = Batch::new();
    let mut registered = Vec::with_capacity(run_ids.len());
    let mut alone = Vec::new();
    let mut lifted = Vec::new();
    for run_id in run_ids {
        let mut run = match shared.load_run(&run_id) {
            Ok(run) => run,
            Err(e) => {
                tracing::error!(run_id, error = %e, "run record unreadable; the run cannot continue");
                shared.event(&run_id, "corrupt", e.to_string());
                continue;
            }
        };
        match run.status {
            RunStatus::Accepted | RunStatus::Running => found += 1,
            // Paused, but its pause was lifted by a resume the process died in: no run is
            // left behind.
            RunStatus::Paused { .. } if shared.pause_reason(&run.kind, &run.run_id).is_none() => {
                found += 1;
                lifted.push(run_id);
                continue;
            }
            _ => continue,
        }
        match fiber::register(shared, &mut run, &budgets) {
            Ok(mode) => {
                run.updated_at_ms = shared.now_ms();
                let stash = fiber::read_stash(shared, &run_id);
                // Only the record: the run stays in the open-run index it was found in. A
                // run whose cell cannot be built is left for the single activation to report.
                let key = tables::RUNS.key(&[run.run_id.as_bytes()]);
                match actor::new_cell(shared, &run, &stash) {
                    Ok(cell) if writes.put(tables::RUNS, key, &run).is_ok() => {
                        // Boxed now, as the fiber takes it: the batch's list stays small.
                        registered.push((cell, Box::new(Registered { run, mode, stash })))
                    }
                    _ => alone.push(run_id),
                }
            }
            Err(Activation::Later(at_ms)) => shared.wake_at(at_ms, &run_id),
            Err(Activation::Nothing) => {}
            Err(_) => alone.push(run_id),
        }
    }
    if !registered.is_empty() {
        match shared.store.commit(writes, Durability::Sync).await {
            Ok(()) => {
                shared.status_changed();
                for (cell, registration) in registered {
                    let live = LiveRun::new(cell.clone());
                    actor::activated(shared, &registration.run, &watch);
                    let decided = fiber::registered(&cell, registration);
                    actor::begin(shared, &live, since, decided).await;
                    shared.registry.insert(&cell.run_id, live);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, runs = registered.len(), "could not register the fibers; retrying in 1 s");
                let at_ms = shared.now_ms().saturating_add(1_000);
                for (cell, _) in registered {
                    shared.wake_at(at_ms, &cell.run_id);
                }
            }
        }
    }
    drop(locks);
    drop(transitions);
    for run_id in alone {
        shared.reactivate_since(&run_id, since).await;
    }
    for run_id in lifted {
        crate::pause::reenter(shared, &run_id).await?;
    }
    Ok(found)
}
