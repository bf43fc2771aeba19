//! A node's shards on a store several nodes share (the store's `Leases`).
//!
//! At open the node says it is alive and acquires its fair share of the free shards, before
//! the recovery scan, which then recovers only the runs of the shards it holds. Every third
//! of `lease_ttl` it renews, acquires free or expired shards up to its fair share (a node
//! that died leaves its shards to expire), hands back what is over it (a node that joined
//! gets some), and re-activates runs other nodes accepted into its shards. A shard gained
//! has its interrupted runs recovered and its alarms read; a shard lost (renewal refused:
//! another node acquired it) has its runs dropped from memory without a write. A renewal
//! that cannot reach the database leaves the leases in doubt: at the self-fence deadline
//! (`Ownership`) the node drops every shard by itself, before the database can give them
//! to another node, even while its call to the database has not returned. When a lease of
//! another node expires before the next tick is due (that node stopped renewing), the tick
//! comes at the expiry instead, to take the shard at once. At shutdown the shards are
//! handed back, so others take over at once.

use durafiber_api::Timestamp;
use durafiber_store::RunId;
use std::{
    collections::HashSet,
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use durafiber_store::{Leases, shard};

use crate::{error::RuntimeError, eviction::idle, kernel::shared::Shared, run::rescan};

fn leases(shared: &Shared) -> Option<&dyn Leases> {
    shared.store.backend().leases()
}

/// Runs a call of the store's leases on a blocking thread: a database that does not answer
/// must not hold a worker of the runtime (the self-fence deadline holds meanwhile, by time).
async fn call<T: Send + 'static>(
    shared: &Shared,
    f: impl FnOnce(&dyn Leases) -> Result<T, durafiber_store::StoreError> + Send + 'static,
) -> Result<T, durafiber_store::StoreError> {
    let store = shared.store.clone();
    match tokio::task::spawn_blocking(move || store.backend().leases().map(f)).await {
        Ok(Some(result)) => result,
        Ok(None) => Err(durafiber_store::StoreError::Database { reason: "the store has no leases".into() }),
        Err(e) => Err(durafiber_store::StoreError::Database { reason: format!("lease call: {e}") }),
    }
}

/// This machine's own time (the agreed time's source).
fn local(shared: &Shared) -> Timestamp {
    shared.time.agreed.as_ref().map_or_else(|| shared.now(), |a| a.local())
}

/// Sets the time base the nodes share from a heartbeat sent at `sent` (this machine's
/// time) that read the database's clock as `database`. A reading is off by up to half its
/// round trip: one that took longer than `max_clock_skew`, or than a second, says too little
/// and is passed over.
fn agree(shared: &Shared, database: Timestamp, sent: Timestamp) {
    let Some(agreed) = &shared.time.agreed else { return };
    let answered = agreed.local();
    let bound = skew_bound_ms(shared);
    let round_trip_ms = u64::try_from(answered.saturating_since(sent).as_millis()).unwrap_or(u64::MAX);
    if round_trip_ms > bound.min(ROUND_TRIP_MAX_MS) {
        tracing::debug!(round_trip_ms, "heartbeat too slow to set the clock by");
        return;
    }
    let before = agreed.offset_ms();
    let offset = agreed.measured(database, sent, answered);
    let skewed = offset.unsigned_abs() > bound;
    if skewed && before.unsigned_abs() <= bound {
        tracing::warn!(
            offset_ms = offset,
            max_ms = bound,
            "this machine's clock is off the database's by more than max_clock_skew: taking no shard \
             until it is back within it (the runtime keeps its times on the database's clock)"
        );
    } else if !skewed && before.unsigned_abs() > bound {
        tracing::info!(offset_ms = offset, "this machine's clock is back within max_clock_skew");
    }
}

/// The slowest heartbeat the offset is measured from, ms: its reading is off by up to half.
const ROUND_TRIP_MAX_MS: u64 = 1_000;

/// `max_clock_skew`, ms.
fn skew_bound_ms(shared: &Shared) -> u64 {
    u64::try_from(shared.config.max_clock_skew.as_millis()).unwrap_or(u64::MAX)
}

/// Whether this machine's clock is further from the database's than `max_clock_skew`, or
/// not yet measured against it (the first heartbeats were too slow to tell): a node takes
/// no shard until it knows its times are the others'.
fn clock_skewed(shared: &Shared) -> bool {
    let bound = skew_bound_ms(shared);
    shared.time.agreed.as_ref().is_some_and(|a| !a.is_measured() || a.offset_ms().unsigned_abs() > bound)
}

/// How many shards this node should hold with `nodes` alive.
fn fair_share(nodes: usize) -> usize {
    (shard::SHARDS as usize).div_ceil(nodes.max(1))
}

/// The first heartbeat and acquisition, at open.
///
/// A node id whose last process was seen within the lease is refused, since that process
/// may be alive. Joining retries for a little over a lease: a process that died stops being
/// seen and its id is then free (a node restarted at once after a crash waits that long); a
/// live one keeps renewing, and the node refuses to start with [`StoreError::NodeIdTaken`].
///
/// [`StoreError::NodeIdTaken`]: durafiber_store::StoreError::NodeIdTaken
pub(crate) async fn join(shared: &Shared, advertise: &str) -> Result<(), RuntimeError> {
    let Some(leases) = leases(shared) else { return Ok(()) };
    let ttl = shared.config.lease_ttl;
    let give_up = Instant::now() + ttl + ttl / 2;
    loop {
        let sent = local(shared);
        match leases.heartbeat(advertise, ttl, !clock_skewed(shared)) {
            Ok(database_ms) => {
                agree(shared, Timestamp::from_millis(database_ms), sent);
                break;
            }
            Err(durafiber_store::StoreError::NodeIdTaken { node, addr }) if Instant::now() < give_up => {
                tracing::warn!(
                    node,
                    addr,
                    "node id last seen within the lease; waiting to see if it is alive"
                );
                tokio::time::sleep(ttl / 4).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    // A node whose clock is far off takes no shard, until a tick finds it back within
    // bounds, and says so at once, so that the others do not leave it a share.
    let want = if clock_skewed(shared) {
        leases.heartbeat(advertise, ttl, false)?;
        0
    } else {
        fair_share(leases.live_nodes(ttl)?)
    };
    let sent = Instant::now();
    let acquired = leases.acquire(want, ttl)?;
    shared.ownership.renewed(sent, ttl);
    let shards: Vec<u32> = acquired.iter().map(|l| l.shard).collect();
    shared.ownership.gain(&shards);
    tracing::info!(node = leases.node_id(), shards = shards.len(), "joined: shards acquired");
    Ok(())
}

/// Holds the node's leases until shutdown: renews them, and fences the node by itself at
/// its deadline while a renewal does not get through.
///
/// The fence runs as a task of its own: a tick can be held up for seconds in a call to a
/// database that does not answer (or that it waits for while the database restarts), and
/// the deadline must pass on time all the same.
pub(crate) async fn hold(shared: Arc<Shared>, advertise: String) {
    let fence = {
        let shared = shared.clone();
        AbortOnDrop(tokio::spawn(async move { fence_at_deadline(&shared).await }))
    };
    renew(&shared, &advertise).await;
    drop(fence);
}

/// Stops a task when its handle goes: the fence ends with the leases' holder.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn renew(shared: &Arc<Shared>, advertise: &str) {
    let period = shared.config.lease_ttl / 3;
    let Some(mut news) = leases(shared).map(Leases::news) else { return };
    let mut wait = period;
    loop {
        // A node that left or released shards says so: their runs need not wait a tick.
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            changed = news.changed() => if changed.is_err() { return },
        }
        let Some(_turn) = shared.ownership.turn().await else { return };
        if shared.life.shutting_down.load(Ordering::SeqCst) {
            return;
        }
        tick(shared, advertise).await;
        wait = next_tick(shared, period).await;
    }
}

/// How long until the next tick: a period, or less when a lease another node holds expires
/// sooner (its node stopped renewing: it died or lost the database), so its shards are
/// taken the moment the database lets them go rather than up to a period later.
async fn next_tick(shared: &Arc<Shared>, period: Duration) -> Duration {
    match call(shared, |l| l.next_expiry()).await {
        // A little after it, so the database's clock has surely passed it too.
        Ok(Some(expiry)) => period.min(expiry.saturating_add(EXPIRY_MARGIN)),
        Ok(None) => period,
        Err(e) => {
            tracing::debug!(error = %e, "could not read when the other nodes' leases expire");
            period
        }
    }
}

/// How long after a lease's expiry a node that wants its shard asks for it.
const EXPIRY_MARGIN: Duration = Duration::from_millis(20);

/// At the self-fence deadline, with no renewal since, the node drops every shard by
/// itself, whether or not the tick's call to the database has returned yet: the runs
/// stop here before the database can give their shards to another node.
async fn fence_at_deadline(shared: &Arc<Shared>) {
    loop {
        let Some(deadline) = shared.ownership.deadline() else { return };
        if Instant::now() < deadline {
            tokio::select! {
                () = tokio::time::sleep_until(deadline.into()) => {}
                () = shared.ownership.renewal() => {}
            }
            continue;
        }
        self_fence(shared).await;
        shared.ownership.renewal().await;
    }
}

/// Drops every shard held, writing nothing: their leases may have expired.
async fn self_fence(shared: &Arc<Shared>) {
    let all = shared.ownership.shards();
    if all.is_empty() {
        return;
    }
    tracing::error!(shards = all.len(), "self-fence: the leases may have expired; dropping every shard");
    if let Some(leases) = leases(shared) {
        leases.forget(&all);
    }
    drop_shards(shared, &all).await;
}

async fn tick(shared: &Arc<Shared>, advertise: &str) {
    let ttl = shared.config.lease_ttl;
    let addr = advertise.to_string();
    let sent = local(shared);
    let taking = !clock_skewed(shared);
    match call(shared, move |l| l.heartbeat(&addr, ttl, taking)).await {
        Ok(database_ms) => agree(shared, Timestamp::from_millis(database_ms), sent),
        // This process went unseen for a lease (stopped, or cut off) and another took its
        // node id: the shards are that one's to hold now, and this one holds none.
        Err(e @ durafiber_store::StoreError::NodeIdTaken { .. }) => {
            tracing::error!(error = %e, "another process took this node's id; holding no shard");
            self_fence(shared).await;
            return;
        }
        Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
    }
    let sent = Instant::now();
    match call(shared, move |l| l.renew(ttl)).await {
        Ok(lost) => {
            shared.ownership.renewed(sent, ttl);
            if !lost.is_empty() {
                tracing::warn!(shards = lost.len(), "shards lost to another node");
                drop_shards(shared, &lost).await;
            }
        }
        Err(e) => {
            tracing::error!(error = %e, "could not renew the shards' leases");
            // Shards gained since the fence (a request's take-over) go too.
            if shared.ownership.expired() {
                self_fence(shared).await;
            }
            return;
        }
    }
    let fair = match call(shared, move |l| l.live_nodes(ttl)).await {
        Ok(n) => fair_share(n),
        Err(e) => {
            tracing::warn!(error = %e, "could not count the live nodes");
            return;
        }
    };
    let held = shared.ownership.shards();
    if clock_skewed(shared) {
        adopt(shared).await;
        return;
    }
    // A little over its share is kept, so two nodes do not pass shards back and forth.
    let slack = (fair / 16).max(2);
    if held.len() > fair + slack {
        hand_back(shared, &held[fair..]).await;
    } else if held.len() < fair {
        let want = fair - held.len();
        match call(shared, move |l| l.acquire(want, ttl)).await {
            Ok(acquired) if !acquired.is_empty() => {
                let gained: Vec<u32> = acquired.iter().map(|l| l.shard).collect();
                tracing::info!(shards = gained.len(), "shards acquired");
                take_up(shared, &gained).await;
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "could not acquire shards"),
        }
    }
    adopt(shared).await;
}

/// Takes `shard` now if no node holds it (its node died and no tick took it yet): a request
/// for one of its runs is then served here instead of waiting. True when this node owns it.
pub(crate) async fn take_over(shared: &Arc<Shared>, shard: u32) -> bool {
    if shared.ownership.owns_shard(shard) {
        return true;
    }
    if clock_skewed(shared) {
        return false;
    }
    let ttl = shared.config.lease_ttl;
    let acquired = {
        let Some(_turn) = shared.ownership.turn().await else { return false };
        call(shared, move |l| l.acquire_shard(shard, ttl)).await
    };
    match acquired {
        Ok(Some(_)) => {
            tracing::info!(shard, "took over a shard no node held, for a request");
            take_up(shared, &[shard]).await;
            shared.ownership.owns_shard(shard)
        }
        Ok(None) => false,
        Err(e) => {
            tracing::warn!(shard, error = %e, "could not take over the shard");
            false
        }
    }
}

/// Starts running the shards gained: their alarms are read, their interrupted runs recovered.
async fn take_up(shared: &Arc<Shared>, gained: &[u32]) {
    shared.ownership.gain(gained);
    shared.timers.scheduler.rescan();
    shared.timers.driver_wake.notify_one();
    let gained: HashSet<u32> = gained.iter().copied().collect();
    let keep =
        |run_id: &RunId| gained.contains(&shard::of_run(run_id)) && shared.registry.get(run_id).is_none();
    match rescan::reactivate_interrupted(shared, &keep).await {
        Ok(n) => tracing::info!(runs = n, "runs of the shards gained re-activated"),
        Err(e) => tracing::error!(error = %e, "could not scan the shards gained; the next tick does"),
    }
}

/// Runs accepted by other nodes into this node's shards, or left without a fiber: activated
/// here. (A start on a node that does not own the run's shard writes the run and leaves it
/// to the owner.)
async fn adopt(shared: &Arc<Shared>) {
    let woken: HashSet<RunId> = shared.timers.wakeups.lock().iter().map(|(_, id)| id.clone()).collect();
    let keep = |run_id: &RunId| {
        shared.ownership.owns(run_id) && shared.registry.get(run_id).is_none() && !woken.contains(run_id)
    };
    if let Err(e) = rescan::reactivate_interrupted(shared, &keep).await {
        tracing::warn!(error = %e, "could not look for runs to adopt");
    }
}

/// Drops the runs of `shards` from memory, writing nothing: they are not this node's now.
async fn drop_shards(shared: &Arc<Shared>, shards: &[u32]) {
    shared.ownership.lose(shards);
    let lost: HashSet<u32> = shards.iter().copied().collect();
    shared.timers.scheduler.retain(|run_id| !lost.contains(&shard::of_run(run_id)));
    shared.timers.wakeups.lock().retain(|(_, run_id)| !lost.contains(&shard::of_run(run_id)));
    for run_id in shared.registry.run_ids() {
        if lost.contains(&shard::of_run(&run_id)) {
            idle::disown(shared, &run_id).await;
        }
    }
}

/// Hands `shards` to other nodes: their runs are evicted while this node still owns them
/// (so their recovery is not counted as a failure), then the leases are released.
async fn hand_back(shared: &Arc<Shared>, shards: &[u32]) {
    let going: HashSet<u32> = shards.iter().copied().collect();
    tracing::info!(shards = going.len(), "handing shards over to other nodes");
    // Not run here from now on; the leases still let the evictions write.
    shared.ownership.lose(shards);
    for run_id in shared.registry.run_ids() {
        if going.contains(&shard::of_run(&run_id)) {
            idle::evict(shared, &run_id, "its shard is handed to another node").await;
        }
    }
    drop_shards(shared, shards).await;
    let released = shards.to_vec();
    if let Err(e) = call(shared, move |l| l.release(&released)).await {
        tracing::warn!(error = %e, "could not release shards; they expire instead");
    }
}

/// At shutdown, after every run was stopped: the shards go back at once, and the node stops
/// counting as alive, so the others' fair share covers them right away. A tick under way
/// ends first (it could take the shards again), bounded by a lease: past it they expire.
pub(crate) async fn release_all(shared: &Shared) {
    let Some(leases) = leases(shared) else { return };
    shared.ownership.last_turn(shared.config.lease_ttl).await;
    shared.ownership.lose(&leases.held());
    if let Err(e) = leases.leave() {
        tracing::warn!(error = %e, "could not hand the shards back at shutdown; they expire instead");
    }
}
