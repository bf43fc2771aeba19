//! The small trait a storage engine implements. The sled backend keeps data on disk; the
//! simulated backend keeps it in memory and loses what no barrier covered when it "crashes".
//! A shared networked backend would implement the same four calls.

use crate::{batch::Batch, error::StoreError};

/// Raw entries, `(key, sealed value)`, in key order.
pub type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// When a marked read ([`Backend::range_marked`]) was made, in the backend's own terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadMark(pub u64);

/// What a rollback took: how far the store got, how far it had been (at its last clean close,
/// or in its write-ahead log), and the runs it changed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Rollback {
    /// The commit sequence number at the last clean close.
    pub expected_seq: u64,
    /// The one the store holds now.
    pub found_seq: u64,
    /// Runs whose records differ from the witness (changed, lost, or older).
    pub runs: Vec<String>,
    /// Writes the write-ahead log still holds past the gap that lost the others, in log
    /// order: `salvage` applies them, so what reads is kept (the runs they touch are among
    /// `runs`, and arrive escalated for a human).
    #[serde(skip)]
    pub stranded: Vec<crate::batch::Op>,
}

/// A node's lease on one shard: the epoch its writes into the shard are fenced by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The shard ([`crate::shard`]).
    pub shard: u32,
    /// Raised by every acquisition: a write at an older epoch is refused.
    pub epoch: i64,
}

/// Who owns a shard now, for routing requests to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardOwner {
    /// The shard.
    pub shard: u32,
    /// The owning node.
    pub node_id: String,
    /// Where that node serves HTTP, when it told.
    pub http_addr: Option<String>,
}

/// Shard ownership among nodes that share one store (the PostgreSQL backend's
/// `open_node`). Only the owner of a run's shard writes the run: every write is fenced by
/// the epochs of the leases the backend holds, so a node that lost a shard (its lease
/// expired and another node acquired it) has each later write refused with
/// [`StoreError::Fenced`], whatever it believes.
pub trait Leases: Send + Sync {
    /// This node's id.
    fn node_id(&self) -> &str;
    /// Says the node is alive and where it serves HTTP. Refused with
    /// [`StoreError::NodeIdTaken`] while another process under the same node id has said so
    /// within `ttl`: one live process per node id. A node that is not `taking` shards (its
    /// clock is off) is not counted among the nodes that share them. Returns the database's
    /// clock when it took the heartbeat, ms since the Unix epoch: the time base the nodes
    /// share.
    fn heartbeat(&self, http_addr: &str, ttl: std::time::Duration, taking: bool) -> Result<u64, StoreError>;
    /// Nodes seen within `ttl` that take shards, this one included.
    fn live_nodes(&self, ttl: std::time::Duration) -> Result<usize, StoreError>;
    /// Acquires up to `want` shards that no one holds or whose lease expired, for `ttl`.
    fn acquire(&self, want: usize, ttl: std::time::Duration) -> Result<Vec<Lease>, StoreError>;
    /// Acquires `shard` alone, if no one holds it or its lease expired (a request for a run
    /// whose node died, arriving before any node's tick took the shard).
    fn acquire_shard(&self, shard: u32, ttl: std::time::Duration) -> Result<Option<Lease>, StoreError>;
    /// Renews every lease held for `ttl`; returns the shards lost (taken meanwhile), which
    /// are fenced from now on.
    fn renew(&self, ttl: std::time::Duration) -> Result<Vec<u32>, StoreError>;
    /// Stops writing into `shards` at once, here, without asking the database (a lease that
    /// could have expired: the self-fence).
    fn forget(&self, shards: &[u32]);
    /// Hands `shards` back, for another node to acquire without waiting for expiry.
    fn release(&self, shards: &[u32]) -> Result<(), StoreError>;
    /// Leaves the cluster at a clean stop: every shard handed back and the node no longer
    /// counted alive, so the others take its share at once.
    fn leave(&self) -> Result<(), StoreError>;
    /// Changes when another node says shards changed hands (it left, or released some) or
    /// that it accepted a run into a shard it does not own: a hint to look now rather than
    /// at the next renewal.
    fn news(&self) -> tokio::sync::watch::Receiver<u64>;
    /// Tells the other nodes that a run of `shard` was accepted here, for its owner to pick
    /// up now (a hint: the owner's next tick finds it anyway).
    fn announce(&self, shard: u32) -> Result<(), StoreError>;
    /// The shards held now.
    fn held(&self) -> Vec<u32>;
    /// Every shard's live owner.
    fn owners(&self) -> Result<Vec<ShardOwner>, StoreError>;
    /// How long until the first lease another node holds expires, by the database's clock
    /// (`None`: no other node holds a lease that has not expired).
    fn next_expiry(&self) -> Result<Option<std::time::Duration>, StoreError>;
}

/// Named limits that several nodes share (`limits` in the runtime config): concurrency slots
/// leased for a time, and a token bucket per limit, both on the database's clock. A node that
/// dies holds its slots until their leases expire: the nodes then make fewer calls at once
/// for a while, never more.
pub trait SharedLimits: Send + Sync {
    /// Takes a free slot of the `slots` of `name` for `holder`, until `ttl` from now; `None`
    /// when every slot is held.
    fn take_slot(
        &self,
        name: &str,
        slots: u32,
        holder: &str,
        ttl: std::time::Duration,
    ) -> Result<Option<u32>, StoreError>;
    /// Extends `holder`'s lease on the slot; false when it was lost (it expired, and may
    /// have been taken).
    fn renew_slot(
        &self,
        name: &str,
        slot: u32,
        holder: &str,
        ttl: std::time::Duration,
    ) -> Result<bool, StoreError>;
    /// Gives `holder`'s slot back.
    fn release_slot(&self, name: &str, slot: u32, holder: &str) -> Result<(), StoreError>;
    /// Takes a token from the bucket of `name`, which fills at `per_sec` up to `burst` and
    /// starts empty; `None` when one was taken, else how long until one is due.
    fn take_token(
        &self,
        name: &str,
        per_sec: f64,
        burst: f64,
    ) -> Result<Option<std::time::Duration>, StoreError>;
}

/// A key-value engine with atomic batches and an explicit durability barrier.
///
/// Contract for implementors, checked by the conformance suite in `durafiber-testkit`:
/// - `apply` makes a batch visible to reads atomically; it need not be durable yet;
/// - `barrier` returns only when every batch applied before it will survive a crash or a
///   power loss;
/// - a crash loses nothing a completed barrier covered, and never half a batch;
/// - a batch with a key of `absent` that exists is refused whole with `StoreError::Exists`.
pub trait Backend: Send + Sync + 'static {
    /// The raw (sealed) value under `key`.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// Up to `limit` entries with `start <= key < end`, in key order.
    fn range(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Entries, StoreError>;
    /// Up to `limit` entries with `start <= key < end` that belong to runs of `shards`
    /// ([`crate::shard`]), in key order: what a node that owns those shards scans. The
    /// default filters `range` page by page; a shared backend filters where the data is.
    fn range_in_shards(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        shards: &[u32],
    ) -> Result<Entries, StoreError> {
        let wanted: std::collections::HashSet<u32> = shards.iter().copied().collect();
        let page = limit.clamp(256, 4096);
        let mut out = Vec::new();
        let mut from = start.to_vec();
        loop {
            let rows = self.range(&from, end, page)?;
            let last = if rows.len() >= page { rows.last().map(|(k, _)| k.clone()) } else { None };
            out.extend(
                rows.into_iter()
                    .filter(|(k, _)| crate::shard::of_key(k).is_some_and(|s| wanted.contains(&s))),
            );
            if out.len() >= limit {
                out.truncate(limit);
                return Ok(out);
            }
            match last {
                Some(mut k) => {
                    k.push(0);
                    from = k;
                }
                None => return Ok(out),
            }
        }
    }
    /// [`Backend::range`], with a mark by which [`Backend::unchanged_since`] later tells
    /// whether a key read then still holds what was read. `None`, without reading, when the
    /// backend cannot tell (the default): reading each key later is then as good.
    fn range_marked(
        &self,
        _start: &[u8],
        _end: &[u8],
        _limit: usize,
    ) -> Result<Option<(Entries, ReadMark)>, StoreError> {
        Ok(None)
    }
    /// Whether nothing can have written `key` since the read that gave `mark`: `false`
    /// whenever the backend cannot be sure.
    fn unchanged_since(&self, _mark: ReadMark, _key: &[u8]) -> bool {
        false
    }
    /// Applies every op of `batch`, atomically.
    fn apply(&self, batch: &Batch) -> Result<(), StoreError>;
    /// Makes everything applied so far durable.
    fn barrier(&self) -> Result<(), StoreError>;
    /// Whether a lone `Sync` commit may be applied and synced on its committer's thread
    /// instead of the writer thread's (`barrier::Writer::write_inline`): for a backend
    /// whose writes are local file i/o, quick and bounded. One that waits on a network
    /// keeps every write on the writer thread.
    fn writes_inline(&self) -> bool {
        false
    }
    /// The writer has had nothing to do for a while: a moment to move logged writes into
    /// the engine in the background, so that the next burst of writes and the next open
    /// find less to do. Returns without waiting for that work; `Some(after)` asks to be told
    /// again after that long if the writer is still quiet then.
    fn quiet(&self) -> Result<Option<std::time::Duration>, StoreError> {
        Ok(None)
    }
    /// A barrier that also leaves nothing to re-apply at the next open: run at a clean close.
    fn checkpoint(&self) -> Result<(), StoreError> {
        self.barrier()
    }
    /// What the backend found lost when it opened (its engine went back past what its own
    /// log still held), for the store to refuse or report.
    fn lost_on_open(&self) -> Option<Rollback> {
        None
    }
    /// Bytes of the files behind the store, for inspection (0 when there are none).
    fn disk_bytes(&self) -> u64 {
        0
    }
    /// For a backend that logs writes ahead of its engine: how long the writes that live
    /// only in its log have waited for their checkpoint at most (zero when none wait).
    /// `None` for a backend without such a log.
    fn checkpoint_lag(&self) -> Option<std::time::Duration> {
        None
    }
    /// Bytes free on the filesystem behind the store, when there is one. Cheap: it is asked
    /// before every group commit.
    fn free_bytes(&self) -> Option<u64> {
        None
    }
    /// The data directory, for a backend that keeps files (the rollback witness lives there).
    fn data_dir(&self) -> Option<std::path::PathBuf> {
        None
    }
    /// Shard leases, for a backend that several nodes share; `None`: this process owns
    /// every shard.
    fn leases(&self) -> Option<&dyn Leases> {
        None
    }
    /// Limits several nodes share, for a backend that several nodes share; `None`: this
    /// process alone calls out, and keeps its limits in memory.
    fn shared_limits(&self) -> Option<&dyn SharedLimits> {
        None
    }
    /// Where the store lives, for error messages.
    fn location(&self) -> std::path::PathBuf {
        std::path::PathBuf::from("(in memory)")
    }
}
