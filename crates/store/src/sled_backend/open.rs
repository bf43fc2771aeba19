//! Opening sled in a data directory: the directory's lock, and the repairs durafiber makes
//! when sled refuses (an unfinished snapshot removed, a damaged `conf` put back, damaged
//! snapshots set aside).

use std::{
    fs::File,
    path::{Path, PathBuf},
};

use crate::{
    checkpoint::contained,
    error::StoreError,
    fsync::{io, sync_dir},
};

/// How long an opener waits for the lock a closing store still holds.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// Takes the directory's lock, waiting up to [`LOCK_WAIT`] for it. A store closed a moment
/// ago can still hold it: a child process forked by another thread at that moment shares
/// the lock file's descriptor until it execs, and the lock lasts as long as any copy.
pub(super) fn lock_briefly(lock: &File, dir: &Path, lock_path: &Path) -> Result<(), StoreError> {
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        match lock.try_lock() {
            Ok(()) => return Ok(()),
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(StoreError::DirLocked { path: dir.to_path_buf() });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(lock_path)(e)),
        }
    }
}

/// Opens sled. We hold the directory's lock file, so no other store owns it; a refusal of
/// sled's own file lock can only come from the background threads of a store this process
/// just closed, which let go within milliseconds. Retry briefly before giving up.
fn open_sled(sled_dir: &Path, cache_bytes: u64) -> Result<sled::Db, StoreError> {
    // Everything explicit: no background flusher (checkpoints decide when to sync), a mode
    // that favours small writes, and the cache of `SledOptions::cache_bytes` (by default one
    // that keeps a million pending alarms' bulk load under 1 GiB of memory while their
    // deliveries stay on time, `bench alarms --pending`).
    let config = sled::Config::new()
        .path(sled_dir)
        .flush_every_ms(None)
        .mode(sled::Mode::HighThroughput)
        .cache_capacity(cache_bytes);
    let mut last = None;
    for _ in 0..2_000 {
        match contained(sled_dir, || config.open())? {
            Ok(db) => return Ok(db),
            // sled reports its lock taken as `Other`, naming the lock in its message.
            Err(sled::Error::Io(e))
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.to_string().contains("could not acquire lock") =>
            {
                last = Some(e);
            }
            Err(e) => return Err(StoreError::Engine(format!("opening {}: {e}", sled_dir.display()))),
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    Err(StoreError::Io {
        path: sled_dir.to_path_buf(),
        source: last.unwrap_or_else(|| std::io::Error::other("sled lock")),
    })
}

/// sled names a snapshot `snap.<lsn>` once it is complete, and `snap.<lsn>.generating`
/// while it writes it. Its reader does not skip the unfinished ones, so a process killed
/// while writing one would leave the store unopenable for good (spacejam/sled#1527): remove
/// them before sled looks.
pub(super) fn remove_unfinished_snapshots(sled_dir: &Path) -> Result<(), StoreError> {
    let Ok(entries) = std::fs::read_dir(sled_dir) else { return Ok(()) };
    let mut removed = false;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if name.starts_with("snap.") && name.ends_with(".generating") {
            let path = entry.path();
            tracing::warn!(file = %path.display(), "removing an unfinished sled snapshot left by a crash");
            std::fs::remove_file(&path).map_err(io(&path))?;
            removed = true;
        }
    }
    if removed {
        sync_dir(sled_dir)?;
    }
    Ok(())
}

fn snapshots(sled_dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(sled_dir) else { return Vec::new() };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("snap."))
        .map(|e| e.path())
        .collect()
}

fn has_snapshots(sled_dir: &Path) -> bool {
    !snapshots(sled_dir).is_empty()
}

/// Moves every snapshot into `quarantine/` beside the store, where an operator can look.
fn quarantine_snapshots(dir: &Path, sled_dir: &Path) -> Result<(), StoreError> {
    let quarantine = dir.join("quarantine");
    crate::fsync::create_private_dir(&quarantine).map_err(io(&quarantine))?;
    for path in snapshots(sled_dir) {
        let Some(name) = path.file_name() else { continue };
        let target = quarantine.join(name);
        tracing::warn!(file = %path.display(), to = %target.display(), "quarantining a sled snapshot");
        std::fs::rename(&path, &target).map_err(io(&path))?;
    }
    sync_dir(&quarantine)?;
    sync_dir(sled_dir)
}

/// durafiber's copy of sled's `conf` (segment size, compression, version: written once, at
/// creation), so a damaged `conf` can be put back.
const CONF_COPY: &str = "durafiber.sled-conf";

/// Saves sled's `conf` beside the store once it is known good.
pub(super) fn save_conf(dir: &Path, sled_dir: &Path) -> Result<(), StoreError> {
    let copy = dir.join(CONF_COPY);
    if copy.exists() {
        return Ok(());
    }
    let conf = sled_dir.join("conf");
    let bytes = std::fs::read(&conf).map_err(io(&conf))?;
    let tmp = dir.join(format!("{CONF_COPY}.partial"));
    std::fs::write(&tmp, &bytes).and_then(|()| File::open(&tmp)?.sync_all()).map_err(io(&tmp))?;
    std::fs::rename(&tmp, &copy).map_err(io(&copy))?;
    sync_dir(dir)
}

/// Puts back sled's `conf` from durafiber's copy when they differ; true when it did.
fn restore_conf(dir: &Path, sled_dir: &Path) -> Result<bool, StoreError> {
    let (copy, conf) = (dir.join(CONF_COPY), sled_dir.join("conf"));
    let Ok(good) = std::fs::read(&copy) else { return Ok(false) };
    if std::fs::read(&conf).is_ok_and(|now| now == good) {
        return Ok(false);
    }
    tracing::warn!(file = %conf.display(), "sled's conf is damaged; putting back durafiber's copy");
    std::fs::write(&conf, &good).and_then(|()| File::open(&conf)?.sync_all()).map_err(io(&conf))?;
    sync_dir(sled_dir)?;
    Ok(true)
}

/// Opens sled, repairing what durafiber can when it refuses: a damaged `conf` is put back
/// from durafiber's copy, then damaged snapshots are set aside so sled rebuilds from its
/// log. Each step is logged with the file it concerns.
pub(super) fn open_with_repairs(
    dir: &Path,
    sled_dir: &Path,
    cache_bytes: u64,
) -> Result<sled::Db, StoreError> {
    let first = match open_sled(sled_dir, cache_bytes) {
        Ok(db) => return Ok(db),
        Err(StoreError::Engine(e)) => e,
        Err(e) => return Err(e),
    };
    tracing::warn!(error = %first, "sled refused to open; repairing what durafiber can");
    if restore_conf(dir, sled_dir)? {
        match open_sled(sled_dir, cache_bytes) {
            Ok(db) => return Ok(db),
            Err(StoreError::Engine(_)) => {}
            Err(e) => return Err(e),
        }
    }
    if has_snapshots(sled_dir) {
        // A damaged snapshot is fatal to sled even when its log is intact.
        quarantine_snapshots(dir, sled_dir)?;
        return open_sled(sled_dir, cache_bytes);
    }
    Err(StoreError::Engine(first))
}
