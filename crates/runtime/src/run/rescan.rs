//! The scan that finds interrupted runs — at start-up, and on a shared store when a node
//! takes shards — and re-enters them in batches whose registrations share one write. What
//! each run needs is `recovery::plan`'s decision, made in `fiber::register`.

use durafiber_store::RunId;
use std::sync::Arc;
use std::time::Duration;

use durafiber_store::{
    Batch, Store,
    prefetch::Prefetched,
    tables::{RunStatus, keys},
};

use crate::{
    budget::Budgets,
    clock::Stopwatch,
    error::RuntimeError,
    kernel::cell::RunCell,
    kernel::inbox::{Activation, Registered},
    kernel::registry::LiveRun,
    kernel::shared::Shared,
    kernel::stash_record,
    limits,
    run::{actor, fiber},
};

/// Finds every interrupted run and re-activates it. Returns how many were found.
pub(crate) async fn scan_and_reactivate(shared: &Arc<Shared>) -> Result<usize, RuntimeError> {
    reactivate_interrupted(shared, &|run_id| shared.ownership.owns(run_id)).await
}

/// A run found in the open-run index, with its records as read in its page's walks
/// ([`Store::prefetch`]): a batch takes the run's record and stash from here, under the
/// run's locks, when nothing wrote them since, instead of looking each up in the store.
struct Found {
    run_id: RunId,
    run: Prefetched,
    stash: Prefetched,
    stash_version: Prefetched,
}

/// The page's runs with their records, each table read in one walk over the page's span of
/// at most twice as many records as the page has runs: past that, finished runs outnumber
/// the open ones, and the rest of the span is read a record at a time as before. A walk
/// that fails leaves its records to be read one at a time, where a damaged one is reported
/// against its run.
fn with_records(store: &Store, run_ids: Vec<RunId>) -> Vec<Found> {
    let limit = run_ids.len().saturating_mul(2).saturating_add(16);
    let walk = |key_of: &dyn Fn(&str) -> Vec<u8>| {
        let wanted: Vec<Vec<u8>> = run_ids.iter().map(|id| key_of(id)).collect();
        store.prefetch(&wanted, limit).unwrap_or_default().into_iter()
    };
    let (mut runs, mut stashes, mut versions) = (
        walk(&|id| keys::run(id).into_bytes()),
        walk(&|id| keys::stash(id).into_bytes()),
        walk(&|id| keys::stash_version(id).into_bytes()),
    );
    run_ids
        .into_iter()
        .map(|run_id| Found {
            run_id,
            run: runs.next().unwrap_or_default(),
            stash: stashes.next().unwrap_or_default(),
            stash_version: versions.next().unwrap_or_default(),
        })
        .collect()
}

/// The lanes' tasks, each answering how many runs it re-activated.
type Lanes = tokio::task::JoinSet<Result<usize, RuntimeError>>;

/// The recovery's lanes: each takes batches of found runs from its channel and re-activates
/// them one batch at a time; the join set answers how many each re-activated.
fn spawn_lanes(shared: &Arc<Shared>, lanes: usize) -> (Vec<tokio::sync::mpsc::Sender<Vec<Found>>>, Lanes) {
    let mut senders = Vec::with_capacity(lanes);
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..lanes {
        // One batch queued behind the one running: the scan stays a little ahead, and the
        // memory of a large recovery stays bounded.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<Found>>(1);
        let shared = shared.clone();
        let lane = async move {
            let mut found = 0;
            while let Some(batch) = rx.recv().await {
                found += reactivate_batch(&shared, batch).await?;
            }
            Ok::<usize, RuntimeError>(found)
        };
        // On a multi-threaded runtime each lane is driven by a thread of its own, which the
        // kernel shares the cores with, rather than queued among the runs it has recovered:
        // once those work, a worker's queue can hold thousands of them, and a lane that
        // waited its turn there at each step would fall behind the more it recovered. The
        // runs it spawns go to the runtime's workers as before.
        let handle = tokio::runtime::Handle::current();
        if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread {
            workers.spawn_blocking(move || handle.block_on(lane));
        } else {
            workers.spawn(lane);
        }
        senders.push(tx);
    }
    (senders, workers)
}

/// Re-activates the interrupted runs among those `keep` accepts: every one at start-up, the
/// runs of shards a node just acquired, or runs another node accepted into its shards and
/// has not seen live. The open-run index is read a page at a time; its runs are dealt into
/// lanes by lock stripe and each lane re-activates its runs in batches of
/// `RECOVERY_BATCH_MAX`, one batch at a time. Two lanes never share a stripe, so their
/// batches never wait for each other's locks and run side by side. Each page's records are
/// read in one walk per table before its runs are dealt.
pub(crate) async fn reactivate_interrupted(
    shared: &Arc<Shared>,
    keep: &(dyn Fn(&RunId) -> bool + Sync),
) -> Result<usize, RuntimeError> {
    let lanes = (limits::RECOVERY_ACTIVATIONS_MAX / limits::RECOVERY_BATCH_MAX).max(1);
    let (senders, mut workers) = spawn_lanes(shared, lanes);
    let mut dealt: Vec<Vec<Found>> = (0..lanes).map(|_| Vec::new()).collect();
    let mut after = None;
    let mut scanned = Ok(());
    'pages: loop {
        let (ids, next) = match shared.open_runs_page(after.as_ref()) {
            Ok(page) => page,
            Err(e) => {
                scanned = Err(e);
                break;
            }
        };
        let ids: Vec<RunId> = ids.into_iter().filter(|id| keep(id)).collect();
        for found in with_records(&shared.store, ids) {
            let lane = crate::kernel::cell::stripe(&found.run_id, limits::ACTIVATION_STRIPES) % lanes;
            dealt[lane].push(found);
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

/// What a batch of found runs comes to: the interrupted ones' registrations in one batch
/// (their cells built), the runs to re-enter alone, the paused runs whose pause was lifted.
struct Planned {
    interrupted: usize,
    writes: Batch,
    registered: Vec<(Arc<RunCell>, Box<Registered>)>,
    alone: Vec<RunId>,
    lifted: Vec<RunId>,
}

/// Plans each found run as one activation would (`fiber::register`), from its prefetched
/// records.
fn plan(shared: &Arc<Shared>, found: Vec<Found>, budgets: &Budgets) -> Planned {
    let mut interrupted = 0;
    let mut writes = Batch::new();
    let mut registered = Vec::with_capacity(found.len());
    let mut alone = Vec::new();
    let mut lifted = Vec::new();
    for Found { run_id, run, stash, stash_version } in found {
        let mut run = match shared.load_run_prefetched(&run_id, run) {
            Ok(run) => run,
            Err(e) => {
                tracing::error!(%run_id, error = %e, "run record unreadable; the run cannot continue");
                shared.event(&run_id, "corrupt", e.to_string());
                continue;
            }
        };
        match run.status {
            RunStatus::Accepted | RunStatus::Running => interrupted += 1,
            // Paused, but its pause was lifted by a resume the process died in: no run is
            // left behind.
            RunStatus::Paused { .. } if crate::pause::reason_of(shared, &run).is_none() => {
                interrupted += 1;
                lifted.push(run_id);
                continue;
            }
            _ => continue,
        }
        match fiber::register(shared, &mut run, budgets, &mut writes) {
            Ok((mode, hook)) => {
                run.updated_at_ms = shared.now();
                let stash = stash_record::read_prefetched(&shared.store, &run_id, stash, stash_version);
                // Only the record: the run stays in the open-run index it was found in. A
                // run whose cell cannot be built is left for the single activation to report.
                let key = keys::run(&run.run_id);
                match actor::new_cell(shared, &run, &stash) {
                    Ok(cell) if writes.put(key, &run).is_ok() => {
                        // Boxed now, as the fiber takes it: the batch's list stays small.
                        registered.push((cell, Box::new(Registered { run, mode, stash, hook })));
                    }
                    _ => alone.push(run_id),
                }
            }
            Err(Activation::Later(at_ms)) => shared.timers.wake_at(at_ms, &run_id),
            Err(Activation::Nothing) => {}
            Err(_) => alone.push(run_id),
        }
    }
    Planned { interrupted, writes, registered, alone, lifted }
}

/// Commits the batch's registrations ahead of the queue, then makes each run live and starts
/// its fiber; a failed commit has them woken again in a second.
async fn register(
    shared: &Arc<Shared>,
    writes: Batch,
    registered: Vec<(Arc<RunCell>, Box<Registered>)>,
    watch: &Stopwatch,
    since: Stopwatch,
) {
    // Ahead of the queue: the runs already recovered may be committing far more than
    // the store can take, and a registration behind their commits would wait longer
    // the more runs were recovered — a recovery that snowballs. At most one batch per
    // lane is ahead at once.
    match shared.store.commit_ahead(writes).await {
        Ok(()) => {
            shared.signals.status_changed();
            for (cell, registration) in registered {
                let live = LiveRun::new(cell.clone());
                actor::activated(shared, &registration.run, watch, Some(cell.fiber_keep_alive));
                fiber::start_registered(shared, &cell, registration, since);
                shared.registry.insert(live);
            }
        }
        Err(e) => {
            tracing::error!(error = %e, runs = registered.len(), "could not register the fibers; retrying in 1 s");
            let at_ms = shared.now().saturating_add(Duration::from_secs(1));
            for (cell, _) in registered {
                shared.timers.wake_at(at_ms, &cell.run_id);
            }
        }
    }
}

/// Re-activates the interrupted runs among `run_ids` together: one read of each record,
/// under the runs' transition and record locks, and every fiber's registration in one
/// boundary — the same writes, decisions and order as one activation each (`actor.rs`), at
/// the cost of one barrier for the batch. A run that needs more (an escalation, a pause
/// lifted by a resume the process died in) is re-entered alone after the batch. Each run of
/// the batch is made live as a cold start would: its cell, its fiber, then its place in the
/// registry. Returns how many runs were found interrupted.
async fn reactivate_batch(shared: &Arc<Shared>, found: Vec<Found>) -> Result<usize, RuntimeError> {
    if shared.life.passive {
        return Ok(0);
    }
    let Ok(_activating) = shared.life.activating() else { return Ok(0) };
    // Virtual time waits for the registration write.
    let _busy = shared.life.busy();
    let since = shared.life.opened;
    let watch = Stopwatch::start();
    let run_ids: Vec<&str> = found.iter().map(|f| f.run_id.as_str()).collect();
    let transitions = shared.registry.transitions(&run_ids).await;
    // A run already live was activated by an event meanwhile; its actor re-enters it.
    let found: Vec<Found> = found
        .into_iter()
        .filter(|f| shared.registry.get(&f.run_id).is_none() && shared.ownership.owns(&f.run_id))
        .collect();
    let run_ids: Vec<&str> = found.iter().map(|f| f.run_id.as_str()).collect();
    let Ok(locks) = shared.lock_runs(&run_ids).await else { return Ok(0) };
    // One read of the budget keys between the batch's least and greatest run spares the
    // runs without a budget a read each (a lane holds about an eighth of that range).
    let budgets = match (run_ids.iter().min(), run_ids.iter().max()) {
        (Some(first), Some(last)) => Budgets::between(shared, first, last, 4 * limits::RECOVERY_BATCH_MAX),
        _ => Budgets::Unknown,
    };
    let Planned { interrupted, writes, registered, alone, lifted } = plan(shared, found, &budgets);
    if !registered.is_empty() {
        register(shared, writes, registered, &watch, since).await;
    }
    drop(locks);
    drop(transitions);
    for run_id in alone {
        shared.reactivate_since(&run_id, since).await;
    }
    for run_id in lifted {
        crate::pause::reenter(shared, &run_id).await?;
    }
    Ok(interrupted)
}
