//! Which runs this runtime may run. Alone on its store it owns every run. On a store that
//! several nodes share, it owns the runs of the shards it holds a lease on (the store's
//! `Leases`), and only until its self-fence deadline: the last renewal's send time plus
//! most of the lease, past which the database may already have given the shards to another
//! node. `run/leases.rs` acquires, renews and hands shards over; this is the answer the
//! rest of the runtime asks before it runs or writes a run.

use durafiber_store::RunId;
use std::{
    collections::HashSet,
    time::{Duration, Instant},
};

use durafiber_store::lock::RwLock;
use durafiber_store::shard;

use crate::error::RuntimeError;

/// What this runtime owns.
pub(crate) struct Ownership {
    /// `None`: every shard (alone on the store).
    shards: RwLock<Option<HashSet<u32>>>,
    /// Past this instant no shard is owned, whatever `shards` says, until a renewal moves it.
    deadline: RwLock<Option<Instant>>,
    /// Told at every renewal, for whoever waits for the deadline to move.
    renewals: tokio::sync::Notify,
    /// Held by whatever changes the leases (a tick, a request's take-over, the release at
    /// shutdown), so that a tick under way when the node stops ends before the shards go
    /// back: after, it would take them again. `true` once the node has left.
    turn: tokio::sync::Mutex<bool>,
}

/// The right to change this node's leases, from [`Ownership::turn`].
pub(crate) type LeaseTurn<'a> = tokio::sync::MutexGuard<'a, bool>;

impl Ownership {
    /// Every run, for good: the store is this process's alone.
    pub fn everything() -> Self {
        Ownership {
            shards: RwLock::new(None),
            deadline: RwLock::new(None),
            renewals: Default::default(),
            turn: Default::default(),
        }
    }

    /// No run yet: a node on a shared store, before its first acquisition.
    pub fn nothing() -> Self {
        Ownership {
            shards: RwLock::new(Some(HashSet::new())),
            deadline: RwLock::new(Some(Instant::now())),
            renewals: Default::default(),
            turn: Default::default(),
        }
    }

    fn fenced_by_time(&self) -> bool {
        self.deadline.read().is_some_and(|d| Instant::now() >= d)
    }

    pub fn owns_shard(&self, s: u32) -> bool {
        match &*self.shards.read() {
            None => true,
            Some(set) => set.contains(&s) && !self.fenced_by_time(),
        }
    }

    /// Whether this runtime may run the run of id `run_id`, typed or as read from a key.
    pub fn owns(&self, run_id: impl AsRef<str>) -> bool {
        self.owns_shard(shard::of_run(run_id.as_ref()))
    }

    /// `Ok` when this runtime may run `run_id` now: asked before a side effect starts, so a
    /// node past its self-fence deadline starts none.
    pub fn check(&self, run_id: &RunId) -> Result<(), RuntimeError> {
        if self.owns(run_id) {
            Ok(())
        } else {
            Err(RuntimeError::NotOwner { run_id: run_id.into(), shard: shard::of_run(run_id) })
        }
    }

    /// What a scan of this node's runs is restricted to: `None` alone on the store (every
    /// run), else the shards owned now (none past the self-fence deadline).
    pub fn scan_filter(&self) -> Option<Vec<u32>> {
        self.shards.read().as_ref()?;
        Some(if self.fenced_by_time() { Vec::new() } else { self.shards() })
    }

    /// The shards owned now (empty when alone).
    pub fn shards(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.shards.read().iter().flatten().copied().collect();
        v.sort_unstable();
        v
    }

    pub fn gain(&self, shards: &[u32]) {
        if let Some(set) = &mut *self.shards.write() {
            set.extend(shards);
        }
    }

    pub fn lose(&self, shards: &[u32]) {
        if let Some(set) = &mut *self.shards.write() {
            for s in shards {
                set.remove(s);
            }
        }
    }

    /// A renewal sent at `sent` succeeded: the leases hold until `sent + ttl` at the
    /// earliest, by the database's clock; this node stops at `sent + ttl × 3/4`.
    pub fn renewed(&self, sent: Instant, ttl: Duration) {
        let deadline = sent.checked_add(ttl.mul_f64(0.75)).unwrap_or(sent);
        *self.deadline.write() = Some(deadline);
        self.renewals.notify_one();
    }

    /// The self-fence deadline (`None` alone on the store: there is none).
    pub fn deadline(&self) -> Option<Instant> {
        *self.deadline.read()
    }

    /// Returns at the next renewal, or at once if one came since the last call.
    pub async fn renewal(&self) {
        self.renewals.notified().await;
    }

    /// Whether the self-fence deadline has passed.
    pub fn expired(&self) -> bool {
        self.fenced_by_time()
    }

    /// Waits for the right to change the leases; `None` once the node has left.
    pub async fn turn(&self) -> Option<LeaseTurn<'_>> {
        let turn = self.turn.lock().await;
        (!*turn).then_some(turn)
    }

    /// The last turn: waits for any change under way (for at most `within`: one stuck on a
    /// database that does not answer is left behind), and no other comes after.
    pub async fn last_turn(&self, within: Duration) {
        if let Ok(mut turn) = tokio::time::timeout(within, self.turn.lock()).await {
            *turn = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alone_owns_everything_and_a_node_only_its_shards_until_its_deadline() {
        assert!(Ownership::everything().owns("run_a"));
        let o = Ownership::nothing();
        assert!(!o.owns("run_a"));
        o.gain(&[shard::of_run("run_a")]);
        assert!(!o.owns("run_a"), "no renewal yet: the deadline has passed");
        o.renewed(Instant::now(), Duration::from_secs(60));
        assert!(o.owns("run_a"));
        assert!(o.check(&RunId::from("run_a")).is_ok());
        o.renewed(
            Instant::now().checked_sub(Duration::from_secs(60)).expect("a minute since boot"),
            Duration::from_secs(10),
        );
        assert!(!o.owns("run_a"), "past the self-fence deadline");
        assert!(matches!(o.check(&RunId::from("run_a")), Err(RuntimeError::NotOwner { .. })));
    }
}
