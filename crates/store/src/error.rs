//! The store's one error type. Variants say what the caller can do next.

use std::path::PathBuf;

/// Everything that can go wrong below the runtime.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Another process (or another store in this one) owns the data directory.
    #[error("data directory {path} is in use by another process")]
    DirLocked {
        /// The directory that could not be locked.
        path: PathBuf,
    },
    /// A record failed its checksum or could not be decoded. Its run must be escalated.
    #[error("corrupt record {key} in table {table}: {reason}")]
    Corrupt {
        /// The logical table the record belongs to.
        table: &'static str,
        /// The record's key, printable.
        key: String,
        /// What exactly failed.
        reason: String,
    },
    /// A record was written by a format version this build does not know.
    #[error("record {key} in table {table} has unknown format version {version}")]
    UnknownVersion {
        /// The logical table the record belongs to.
        table: &'static str,
        /// The record's key, printable.
        key: String,
        /// The version found.
        version: u16,
    },
    /// A value could not be encoded (it is the caller's value, not the disk's).
    #[error("could not encode a record for table {table}: {reason}")]
    Encode {
        /// The logical table the record was meant for.
        table: &'static str,
        /// The encoder's message.
        reason: String,
    },
    /// The simulated backend has crashed; every operation fails until it is revived.
    #[error("the simulated store has crashed")]
    Crashed,
    /// The group-commit writer is gone (the store was closed).
    #[error("the store is closed")]
    Closed,
    /// The storage engine failed.
    #[error("storage engine: {0}")]
    Engine(String),
    /// The disk holding the store is nearly full: new work is refused until space returns.
    #[error("the disk holding {path} has {free_bytes} bytes free, under the reserve of {reserve_bytes}")]
    StorageFull {
        /// The data directory.
        path: PathBuf,
        /// Bytes free for unprivileged writers.
        free_bytes: u64,
        /// The reserve new work must leave.
        reserve_bytes: u64,
    },
    /// The store failed (a barrier hung, or the engine reported an i/o error) and takes no
    /// more writes; the process must be restarted to reopen it.
    #[error("the store failed and takes no more writes: {reason}")]
    Failed {
        /// What happened.
        reason: String,
    },
    /// The store holds less than it did at its last clean close: sled's log lost its tail.
    #[error("{path}: the store is not as its last clean close left it (commit {found_seq} of {expected_seq}); {} runs changed: run `durafiber store salvage`, or restore a backup", runs.len())]
    RolledBack {
        /// The data directory.
        path: PathBuf,
        /// The commit sequence number at the last clean close.
        expected_seq: u64,
        /// The one the store holds.
        found_seq: u64,
        /// The runs whose records changed.
        runs: Vec<String>,
    },
    /// The directory holds no durafiber store (an inspection never creates one).
    #[error("{path} is not a durafiber data directory")]
    NotAStore {
        /// The directory.
        path: PathBuf,
    },
    /// durafiber's own files are there but the engine's folder is gone: opening would
    /// silently start an empty store.
    #[error("{path} holds durafiber's files but no sled/ folder: refusing to open it as an empty store")]
    EngineMissing {
        /// The data directory.
        path: PathBuf,
    },
    /// The database (PostgreSQL) refused or did not answer a call. The call may be retried;
    /// the store carries on.
    #[error("database: {reason}")]
    Database {
        /// The server's code and message, or what went wrong on the way.
        reason: String,
    },
    /// A key the batch had to create ([`crate::Batch::insert`]) exists already: nothing of
    /// the batch was applied.
    #[error("record {key} exists already")]
    Exists {
        /// The key, printable.
        key: String,
    },
    /// The batch writes into a shard this node does not own (any more): nothing of it was
    /// applied. The shard's owner is the one to write it.
    #[error("shard {shard} is not owned by this node")]
    Fenced {
        /// The shard.
        shard: u32,
    },
    /// Another live process is node `node` of the database already: two processes under one
    /// node id would take each other's leases and address.
    #[error(
        "node id {node:?} is held by a live node at {addr}: give this one another --node-id, or stop that one"
    )]
    NodeIdTaken {
        /// The node id.
        node: String,
        /// Where the live node with that id serves HTTP.
        addr: String,
    },
    /// Another process holds the database's store: one process at a time may use it.
    #[error("the store in {url} is in use by another process")]
    DatabaseLocked {
        /// The database, without its password.
        url: String,
    },
    /// The disk failed.
    #[error("i/o on {path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
}

impl StoreError {
    /// A copy for every waiter of one failed write: i/o errors are not `Clone`, so their
    /// text is kept with their kind.
    pub fn duplicate(&self) -> StoreError {
        match self {
            StoreError::DirLocked { path } => StoreError::DirLocked { path: path.clone() },
            StoreError::Corrupt { table, key, reason } => {
                StoreError::Corrupt { table, key: key.clone(), reason: reason.clone() }
            }
            StoreError::UnknownVersion { table, key, version } => {
                StoreError::UnknownVersion { table, key: key.clone(), version: *version }
            }
            StoreError::Encode { table, reason } => StoreError::Encode { table, reason: reason.clone() },
            StoreError::Crashed => StoreError::Crashed,
            StoreError::Closed => StoreError::Closed,
            StoreError::Engine(text) => StoreError::Engine(text.clone()),
            StoreError::StorageFull { path, free_bytes, reserve_bytes } => StoreError::StorageFull {
                path: path.clone(),
                free_bytes: *free_bytes,
                reserve_bytes: *reserve_bytes,
            },
            StoreError::Failed { reason } => StoreError::Failed { reason: reason.clone() },
            StoreError::NotAStore { path } => StoreError::NotAStore { path: path.clone() },
            StoreError::RolledBack { path, expected_seq, found_seq, runs } => StoreError::RolledBack {
                path: path.clone(),
                expected_seq: *expected_seq,
                found_seq: *found_seq,
                runs: runs.clone(),
            },
            StoreError::EngineMissing { path } => StoreError::EngineMissing { path: path.clone() },
            StoreError::Exists { key } => StoreError::Exists { key: key.clone() },
            StoreError::Fenced { shard } => StoreError::Fenced { shard: *shard },
            StoreError::Database { reason } => StoreError::Database { reason: reason.clone() },
            StoreError::DatabaseLocked { url } => StoreError::DatabaseLocked { url: url.clone() },
            StoreError::NodeIdTaken { node, addr } => {
                StoreError::NodeIdTaken { node: node.clone(), addr: addr.clone() }
            }
            StoreError::Io { path, source } => StoreError::Io {
                path: path.clone(),
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
        }
    }

    /// Whether the failure belongs to one batch of a group (a key that exists, a shard not
    /// owned), so that the group's other batches are applied without it.
    pub fn is_batch_refusal(&self) -> bool {
        matches!(self, StoreError::Exists { .. } | StoreError::Fenced { .. })
    }

    /// Whether the engine itself failed: after this, sled's state in this process is not to
    /// be trusted, and the store stops taking writes.
    pub fn is_engine_failure(&self) -> bool {
        matches!(self, StoreError::Engine(_) | StoreError::Io { .. })
    }
}

impl From<sled::Error> for StoreError {
    fn from(e: sled::Error) -> Self {
        StoreError::Engine(e.to_string())
    }
}

/// A key in a readable form for errors: text stays text, NUL separators become `/`, other
/// bytes become `\xNN`.
pub fn printable(key: &[u8]) -> String {
    let mut s = String::new();
    for b in key {
        match b {
            0 => s.push('/'),
            0x20..=0x7e => s.push(*b as char),
            _ => s.push_str(&format!("\\x{b:02x}")),
        }
    }
    s
}
