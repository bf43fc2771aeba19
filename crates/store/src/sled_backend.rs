//! The embedded backend: one sled tree in one data directory, owned by one process.
//!
//! sled 0.34's `flush` ends in `sync_file_range`, which does not reach the disk's volatile
//! cache, and it writes large values to blob files without syncing them. The barrier here
//! therefore syncs new blob files and the blob directory, then flushes sled, then `fdatasync`s
//! the log file: only then is a boundary durable across a power loss.

use std::{
    collections::HashSet,
    fs::{File, OpenOptions},
    path::{Path, PathBuf},
};

use parking_lot::Mutex;

use crate::{Backend, Batch, StoreError, backend::Entries, batch::Op};

/// How long an opener waits for the lock a closing store still holds.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// Takes the directory's lock, waiting up to [`LOCK_WAIT`] for it. A store closed a moment
/// ago can still hold it: a child process forked by another thread at that moment shares
/// the lock file's descriptor until it execs, and the lock lasts as long as any copy.
fn lock_briefly(lock: &File, dir: &Path, lock_path: &Path) -> Result<(), StoreError> {
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

/// sled in a locked data directory.
pub struct SledBackend {
    db: sled::Db,
    dir: PathBuf,
    log_file: File,
    synced_blobs: Mutex<HashSet<std::ffi::OsString>>,
    // Held for the life of the backend: dropping the file releases the lock.
    _lock: File,
}

const LOCK_FILE: &str = "durafiber.lock";
/// Written once sled has created its files: from then on, a missing `sled/` is damage, not
/// a new store.
const MARKER_FILE: &str = "durafiber.store";
const SLED_DIR: &str = "sled";

/// Whether `dir` holds a durafiber store (made by this version or an older one).
pub fn is_store(dir: &Path) -> bool {
    dir.join(MARKER_FILE).exists() || dir.join(SLED_DIR).join("conf").exists()
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io { path: path.to_path_buf(), source }
}

/// Opens sled. We hold the directory's lock file, so no other store owns it; a refusal of
/// sled's own file lock can only come from the background threads of a store this process
/// just closed, which let go within milliseconds. Retry briefly before giving up.
fn open_sled(sled_dir: &Path) -> Result<sled::Db, StoreError> {
    // Everything explicit: no background flusher (our barrier decides when to sync), and a
    // mode that favours small writes.
    let config = sled::Config::new()
        .path(sled_dir)
        .flush_every_ms(None)
        .mode(sled::Mode::HighThroughput)
        .cache_capacity(1024 * 1024 * 1024);
    let mut last = None;
    for _ in 0..2_000 {
        match contained(sled_dir, || config.open())? {
            Ok(db) => return Ok(db),
            Err(sled::Error::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => last = Some(e),
            Err(e) => return Err(StoreError::Engine(format!("opening {}: {e}", sled_dir.display()))),
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    Err(StoreError::Io {
        path: sled_dir.to_path_buf(),
        source: last.unwrap_or_else(|| std::io::Error::other("sled lock")),
    })
}

/// Runs a sled call, turning a panic inside it (sled 0.34 panics on some damaged logs) into
/// an engine error naming the directory: sled's faults stay in the store layer.
fn contained<T>(dir: &Path, f: impl FnOnce() -> T) -> Result<T, StoreError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into());
        StoreError::Engine(format!("sled failed on {}: {what}", dir.display()))
    })
}

/// sled names a snapshot `snap.<lsn>` once it is complete, and `snap.<lsn>.generating`
/// while it writes it. Its reader does not skip the unfinished ones, so a process killed
/// while writing one would leave the store unopenable for good (spacejam/sled#1527): remove
/// them before sled looks.
fn remove_unfinished_snapshots(sled_dir: &Path) -> Result<(), StoreError> {
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
    std::fs::create_dir_all(&quarantine).map_err(io(&quarantine))?;
    for path in snapshots(sled_dir) {
        let Some(name) = path.file_name() else { continue };
        let target = quarantine.join(name);
        tracing::warn!(file = %path.display(), to = %target.display(), "quarantining a sled snapshot");
        std::fs::rename(&path, &target).map_err(io(&path))?;
    }
    sync_dir(&quarantine)?;
    sync_dir(sled_dir)
}

/// Makes a directory's entries (files created, renamed or removed in it) durable.
pub(crate) fn sync_dir(path: &Path) -> Result<(), StoreError> {
    File::open(path).and_then(|d| d.sync_all()).map_err(io(path))
}

/// durafiber's copy of sled's `conf` (segment size, compression, version: written once, at
/// creation), so a damaged `conf` can be put back.
const CONF_COPY: &str = "durafiber.sled-conf";

/// Saves sled's `conf` beside the store once it is known good.
fn save_conf(dir: &Path, sled_dir: &Path) -> Result<(), StoreError> {
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
fn open_with_repairs(dir: &Path, sled_dir: &Path) -> Result<sled::Db, StoreError> {
    let first = match open_sled(sled_dir) {
        Ok(db) => return Ok(db),
        Err(StoreError::Engine(e)) => e,
        Err(e) => return Err(e),
    };
    tracing::warn!(error = %first, "sled refused to open; repairing what durafiber can");
    if restore_conf(dir, sled_dir)? {
        match open_sled(sled_dir) {
            Ok(db) => return Ok(db),
            Err(StoreError::Engine(_)) => {}
            Err(e) => return Err(e),
        }
    }
    if has_snapshots(sled_dir) {
        // A damaged snapshot is fatal to sled even when its log is intact.
        quarantine_snapshots(dir, sled_dir)?;
        return open_sled(sled_dir);
    }
    Err(StoreError::Engine(first))
}

impl SledBackend {
    /// Opens the store in `dir`, which must already hold one: inspection and repair never
    /// create an empty store by mistake (a typo in `--data`).
    pub fn open_existing(dir: &Path) -> Result<Self, StoreError> {
        if !is_store(dir) {
            return Err(StoreError::NotAStore { path: dir.to_path_buf() });
        }
        Self::open(dir)
    }

    /// Opens (creating if needed) the store in `dir`. A second opener gets `DirLocked`.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        if !dir.exists() {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                sync_dir(parent)?;
            }
        }
        let lock_path = dir.join(LOCK_FILE);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io(&lock_path))?;
        lock_briefly(&lock, dir, &lock_path)?;
        let sled_dir = dir.join(SLED_DIR);
        let marker = dir.join(MARKER_FILE);
        if marker.exists() && !sled_dir.exists() {
            return Err(StoreError::EngineMissing { path: dir.to_path_buf() });
        }
        remove_unfinished_snapshots(&sled_dir)?;
        let db = open_with_repairs(dir, &sled_dir)?;
        save_conf(dir, &sled_dir)?;
        let log_path = sled_dir.join("db");
        let log_file = File::open(&log_path).map_err(io(&log_path))?;
        if !marker.exists() {
            // sled's new files and folder, then the marker, each durable with its parent.
            sync_dir(&sled_dir)?;
            File::create(&marker).and_then(|f| f.sync_all()).map_err(io(&marker))?;
            sync_dir(dir)?;
        }
        let backend = SledBackend {
            db,
            dir: dir.to_path_buf(),
            log_file,
            synced_blobs: Mutex::new(HashSet::new()),
            _lock: lock,
        };
        // Whatever an earlier process left unsynced is made durable before anyone reads it.
        backend.barrier()?;
        Ok(backend)
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn sync_new_blobs(&self) -> Result<(), StoreError> {
        let blob_dir = self.dir.join(SLED_DIR).join("blobs");
        let Ok(entries) = std::fs::read_dir(&blob_dir) else { return Ok(()) };
        let mut synced = self.synced_blobs.lock();
        let mut any = false;
        let mut present = HashSet::new();
        for entry in entries {
            let entry = entry.map_err(io(&blob_dir))?;
            let name = entry.file_name();
            if !synced.contains(&name) {
                let path = entry.path();
                match File::open(&path) {
                    Ok(f) => f.sync_data().map_err(io(&path))?,
                    // sled may collect a blob between listing and opening it.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(io(&path)(e)),
                }
                any = true;
            }
            present.insert(name);
        }
        if any {
            File::open(&blob_dir).and_then(|d| d.sync_all()).map_err(io(&blob_dir))?;
        }
        *synced = present;
        Ok(())
    }
}

impl Backend for SledBackend {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(contained(&self.dir, || self.db.get(key))??.map(|v| v.to_vec()))
    }

    fn range(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Entries, StoreError> {
        contained(&self.dir, || {
            let mut out = Vec::new();
            for item in self.db.range(start..end).take(limit) {
                let (k, v) = item?;
                out.push((k.to_vec(), v.to_vec()));
            }
            Ok(out)
        })?
    }

    fn apply(&self, batch: &Batch) -> Result<(), StoreError> {
        let mut b = sled::Batch::default();
        for op in &batch.ops {
            match op {
                Op::Put { key, value } => b.insert(key.as_slice(), value.as_slice()),
                Op::Delete { key } => b.remove(key.as_slice()),
            }
        }
        self.db.apply_batch(b)?;
        Ok(())
    }

    fn barrier(&self) -> Result<(), StoreError> {
        self.sync_new_blobs()?;
        self.db.flush()?;
        let log_path = self.dir.join(SLED_DIR).join("db");
        self.log_file.sync_data().map_err(io(&log_path))
    }

    fn disk_bytes(&self) -> u64 {
        self.db.size_on_disk().unwrap_or(0)
    }

    fn free_bytes(&self) -> Option<u64> {
        let stat = rustix::fs::statvfs(&self.dir).ok()?;
        Some(stat.f_bavail.saturating_mul(stat.f_frsize))
    }

    fn location(&self) -> PathBuf {
        self.dir.clone()
    }

    fn data_dir(&self) -> Option<PathBuf> {
        Some(self.dir.clone())
    }
}
