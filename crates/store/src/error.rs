//! The store's one error type. Variants say what the caller can do next.

use std::path::PathBuf;

/// Everything that can go wrong below the runtime.
#[derive(Debug, thiserror::Error)]
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
    /// The disk failed.
    #[error("i/o on {path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
}

impl From<sled::Error> for StoreError {
    fn from(e: sled::Error) -> Self {
        StoreError::Engine(e.to_string())
    }
}
