//! File system calls' errors with the path they concern, and durable directory entries: a
//! file created, renamed or removed is only there after a crash once its directory is
//! synced too.

use std::{fs::File, path::Path};

use crate::error::StoreError;

/// Turns an i/o error into the store's error naming `path`.
pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io { path: path.to_path_buf(), source }
}

/// Makes a directory's entries (files created, renamed or removed in it) durable.
pub(crate) fn sync_dir(path: &Path) -> Result<(), StoreError> {
    File::open(path).and_then(|d| d.sync_all()).map_err(io(path))
}
