//! The durable record store under durafiber.
//!
//! It knows records, batches and barriers; it knows nothing of actors, clocks or agents.
//! The runtime decides *when* a boundary is written, this crate decides *how*.
//!
//! # What survives
//! - **A process crash** (SIGKILL, panic, OOM): every batch whose `commit` was acknowledged in
//!   [`Durability::Sync`] mode, whole. A batch is applied atomically, so a crash never leaves
//!   half of one behind. In [`Durability::Async`] mode, the writes of the last `flush_every`
//!   window may be lost, and nothing older.
//! - **A power loss**: the same, because an acknowledged barrier has made the write-ahead
//!   log ([`wal`]) that holds the batch durable (a direct `O_DSYNC` write, or `fdatasync`),
//!   and sled receives batches only as whole checkpoints that are made durable (new blob
//!   files, the blob directory, sled's flush, then `fdatasync` of its log: sled 0.34's own
//!   flush stops at `sync_file_range`, which leaves the data in the disk's volatile cache)
//!   before the log lets go of them.
//! - **Bit rot or a bad write inside a record**: every record is sealed in a checksummed,
//!   versioned [`envelope`]; reading it back yields [`StoreError::Corrupt`] naming the key, and
//!   every other record stays readable.
//!
//! # Module map
//! - [`RunId`]: the id a run's records hold, as a type of its own (`durafiber-api`'s, as are the
//!   record types of [`tables`]).
//! - [`envelope`]: format version + checksum around every record.
//! - [`codec`]: the one bincode configuration.
//! - [`tables`]: key layout of the logical tables, and the record types stored in them.
//! - [`batch`]: one boundary = one atomic batch.
//! - [`backend`]: the small trait a storage engine implements; [`sled_backend`] and
//!   [`sim_backend`] (loses every write after the last barrier on `crash()`), and with the
//!   `postgres` feature `pg_backend` (a table in a PostgreSQL database).
//! - [`barrier`]: group commit: many batches, one barrier, then acknowledge.
//! - [`store`]: the typed front door the runtime uses.
//! - [`repair`]: verify, salvage, backup and restore, for operators.
//! - [`wal`]: the write-ahead log in front of sled: one durable write per barrier.
//! - [`prefetch`]: records of one table read in one walk, for single reads later.
//! - [`witness`]: catches a log that went back in time (sled drops a damaged tail silently).
//! - [`lock`]: the locks durafiber's threads share: waiters sleep, never yield the CPU.
//! - [`access`]: API token records (hashes only) and the append-only audit trail.
//! - [`shard`]: which of the shards a run and its records belong to.
//! - `checkpoint`: how logged batches reach sled; `memtable`: what was logged since, in front
//!   of sled for reads; `direct`: the log's appends past the page cache.
//! - `crowding`: whether the writer thread waits for a core; `fsync`: file system calls'
//!   errors with their path, and durable directory entries; `error`: the one [`StoreError`].
#![deny(missing_docs)]

pub mod access;
pub mod backend;
pub mod barrier;
pub mod batch;
mod checkpoint;
pub mod codec;
mod crowding;
mod direct;
pub mod envelope;
mod error;
mod fsync;
pub mod lock;
mod memtable;
#[cfg(feature = "postgres")]
pub mod pg_backend;
pub mod prefetch;
pub mod repair;
pub mod shard;
pub mod sim_backend;
pub mod sled_backend;
pub mod store;
pub mod tables;
pub mod wal;
pub mod witness;

pub use backend::{Backend, Lease, Leases, ShardOwner, SharedLimits};
pub use barrier::{Durability, WriterStats};
pub use batch::Batch;
pub use durafiber_api::{RunId, Timestamp};
pub use error::StoreError;
#[cfg(feature = "postgres")]
pub use pg_backend::PgBackend;
pub use sim_backend::{SimBackend, SimCrash};
pub use sled_backend::SledBackend;
pub use store::{Store, StoreConfig, StoreHealth};
