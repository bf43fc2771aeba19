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

/// Files of a store are its owner's only: run inputs, the audit trail and token hashes are
/// in them. Every file the store writes is created with this mode.
pub(crate) const PRIVATE_FILE: u32 = 0o600;
/// The data directory's mode, and its folders'.
pub(crate) const PRIVATE_DIR: u32 = 0o700;

/// A new file opened for writing, readable and writable by its owner only.
pub(crate) fn create_private(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(PRIVATE_FILE).open(path)
}

/// `dir` (created if missing) and the folders leading to it that this call creates, with
/// mode 0700.
pub(crate) fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new().recursive(true).mode(PRIVATE_DIR).create(dir)
}

/// Makes `dir` and every folder under it 0700, and every file under it 0600: what the
/// engine created with the process's umask becomes its owner's only.
pub(crate) fn make_private(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let mut folders = vec![dir.to_path_buf()];
    while let Some(folder) = folders.pop() {
        std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(PRIVATE_DIR))?;
        for entry in std::fs::read_dir(&folder)?.flatten() {
            match entry.file_type() {
                Ok(kind) if kind.is_dir() => folders.push(entry.path()),
                Ok(kind) if kind.is_file() => {
                    std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(PRIVATE_FILE))?;
                }
                _ => {}
            }
        }
    }
    Ok(())
}
