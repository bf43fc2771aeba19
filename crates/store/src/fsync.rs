//! Making directory entries durable: a file created, renamed or removed is only there
//! after a crash once its directory is synced too.

use std::{fs::File, path::Path};

use crate::StoreError;

/// Makes a directory's entries (files created, renamed or removed in it) durable.
pub(crate) fn sync_dir(path: &Path) -> Result<(), StoreError> {
    File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(|source| StoreError::Io { path: path.to_path_buf(), source })
}
