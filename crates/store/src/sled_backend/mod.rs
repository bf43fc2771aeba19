//! The embedded backend: one sled tree in one data directory, owned by one process.
//!
//! A batch is logged in the write-ahead log ([`crate::wal`]) and kept in memory
//! (`memtable.rs`), where reads find it; a barrier is one durable write of that log. sled
//! receives the logged batches a log half at a time (`checkpoint.rs`). This module
//! opens sled and repairs what durafiber can when sled refuses to open.

use std::{
    fs::{File, OpenOptions},
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
    sync::Arc,
};

mod open;

use open::{lock_briefly, open_with_repairs, remove_unfinished_snapshots, save_conf};

use crate::{
    backend::Backend,
    backend::Entries,
    backend::ReadMark,
    backend::Rollback,
    batch::Batch,
    checkpoint::{Checkpointer, Engine, contained},
    error::StoreError,
    fsync::{io, sync_dir},
    lock::{Mutex, RwLock},
    memtable::{Overlay, merge},
    wal::{self, Appended, Wal},
};

/// sled in a locked data directory, behind a write-ahead log ([`crate::wal`]) and the
/// tables of what it logged (`memtable.rs`).
pub struct SledBackend {
    engine: Arc<Engine>,
    overlay: Arc<RwLock<Overlay>>,
    log: Mutex<Logged>,
    checkpoints: Checkpointer,
    /// Records the write-ahead log held that could not be re-applied, found at open.
    lost_tail: Option<Rollback>,
    /// A quiet store's logged writes reach sled at most this long after its last checkpoint.
    checkpoint_after: std::time::Duration,
    // Held for the life of the backend: dropping the file releases the lock.
    _lock: File,
}

/// The write-ahead log and the LSN of the last batch applied.
struct Logged {
    wal: Wal,
    last_lsn: u64,
    /// When the last checkpoint was handed over (or the store opened).
    checkpointed_at: std::time::Instant,
}

/// How many times a range read starts again when a checkpoint changed sled under it.
const RANGE_RETRIES: usize = 8;

/// A quiet writer starts a checkpoint once the half being written is an eighth full: below
/// that, the next open re-applies little, and a trickle of writes with pauses between them
/// does not checkpoint at every pause.
const QUIET_CHECKPOINT_SHARE: u64 = 8;

/// How long, by default, logged writes of a quiet store wait for their checkpoint at most
/// ([`SledOptions::checkpoint_after`]), however little the log holds: like PostgreSQL's
/// `checkpoint_timeout`, it bounds how long acknowledged writes live only in the log.
pub const CHECKPOINT_AFTER_DEFAULT: std::time::Duration = std::time::Duration::from_secs(30);

/// sled's cache by default: it keeps a million pending alarms' bulk load under 1 GiB.
pub const CACHE_BYTES_DEFAULT: u64 = 192 * 1024 * 1024;

/// How a sled store is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SledOptions {
    /// Bytes of the write-ahead log (two halves; at least [`wal::MIN_BYTES`]).
    pub wal_bytes: u64,
    /// Bytes of sled's page cache: memory spent for reads of stored runs.
    pub cache_bytes: u64,
    /// A quiet store's logged writes reach sled at most this long after its last checkpoint.
    pub checkpoint_after: std::time::Duration,
}

impl Default for SledOptions {
    fn default() -> Self {
        SledOptions {
            wal_bytes: wal::DEFAULT_BYTES,
            cache_bytes: CACHE_BYTES_DEFAULT,
            checkpoint_after: CHECKPOINT_AFTER_DEFAULT,
        }
    }
}

/// How soon a quiet writer is told again when a checkpoint is still running.
const CHECKPOINT_BUSY_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

const LOCK_FILE: &str = "durafiber.lock";
/// Written once sled has created its files: from then on, a missing `sled/` is damage, not
/// a new store.
const MARKER_FILE: &str = "durafiber.store";
const SLED_DIR: &str = "sled";

/// Whether `dir` holds a durafiber store (made by this version or an older one).
pub fn is_store(dir: &Path) -> bool {
    dir.join(MARKER_FILE).exists() || dir.join(SLED_DIR).join("conf").exists()
}

impl SledBackend {
    /// Opens the store in `dir`, which must already hold one: inspection and repair never
    /// create an empty store by mistake (a typo in `--data`).
    pub fn open_existing(dir: &Path) -> Result<Self, StoreError> {
        Self::open_existing_sized(dir, wal::DEFAULT_BYTES)
    }

    /// [`SledBackend::open_existing`] with a write-ahead log of `wal_bytes`.
    pub fn open_existing_sized(dir: &Path, wal_bytes: u64) -> Result<Self, StoreError> {
        Self::open_existing_with(dir, &SledOptions { wal_bytes, ..SledOptions::default() })
    }

    /// [`SledBackend::open_existing`] with `options`.
    pub fn open_existing_with(dir: &Path, options: &SledOptions) -> Result<Self, StoreError> {
        if !is_store(dir) {
            return Err(StoreError::NotAStore { path: dir.to_path_buf() });
        }
        Self::open_with(dir, options)
    }

    /// Opens (creating if needed) the store in `dir`, with a write-ahead log of the default
    /// size. A second opener gets `DirLocked`.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        Self::open_sized(dir, wal::DEFAULT_BYTES)
    }

    /// [`SledBackend::open`] with a write-ahead log of `wal_bytes` (at least 64 KiB): a
    /// smaller log checkpoints sled more often.
    pub fn open_sized(dir: &Path, wal_bytes: u64) -> Result<Self, StoreError> {
        Self::open_with(dir, &SledOptions { wal_bytes, ..SledOptions::default() })
    }

    /// Opens (creating if needed) the store in `dir` with `options`.
    pub fn open_with(dir: &Path, options: &SledOptions) -> Result<Self, StoreError> {
        let wal_bytes = options.wal_bytes;
        let lock = locked_dir(dir)?;
        let sled_dir = dir.join(SLED_DIR);
        let marker = dir.join(MARKER_FILE);
        if marker.exists() && !sled_dir.exists() {
            return Err(StoreError::EngineMissing { path: dir.to_path_buf() });
        }
        remove_unfinished_snapshots(&sled_dir)?;
        let (db, log) = sled_beside_log(dir, &sled_dir, options.cache_bytes)?;
        save_conf(dir, &sled_dir)?;
        // sled creates its files with the process's umask: its owner's only, as ours are.
        crate::fsync::make_private(dir).map_err(io(dir))?;
        if !marker.exists() {
            // sled's new files and folder, then the marker, each durable with its parent.
            sync_dir(&sled_dir)?;
            crate::fsync::create_private(&marker).and_then(|f| f.sync_all()).map_err(io(&marker))?;
            sync_dir(dir)?;
        }
        let engine = Arc::new(Engine::new(db, dir, &sled_dir)?);
        let replay = engine.replay(&log.records)?;
        // The records sled lacks are re-applied by the checkpoint thread, after the open,
        // when they all lie in the log's newer half: the log is written in the other half
        // meanwhile, and comes back to this one only once that checkpoint is complete.
        // Otherwise, and whenever a record was lost, here and now.
        let behind_open = match log.newer_half {
            Some(half) if replay.lost.is_none() && log.size == Some(Wal::file_size(wal_bytes)) => {
                (!replay.is_empty() && replay.from >= log.newer_from).then_some(half)
            }
            _ => None,
        };
        if behind_open.is_none() && !replay.is_empty() {
            engine.persist(&replay.table, replay.last)?;
        }
        // Whatever an earlier process left unsynced is made durable before the log is
        // written over and before anyone reads it.
        engine.make_durable()?;
        // A log whose records could not all be re-applied keeps its size, so it is not
        // written anew and the loss is found again at the next open.
        let wal_bytes = if replay.lost.is_some() { log.size.unwrap_or(wal_bytes) } else { wal_bytes };
        let wal = Wal::open(dir, wal_bytes, behind_open.map_or(0, |half| 1 - half))?;
        let overlay = Arc::new(RwLock::new(Overlay { applied_lsn: replay.highest, ..Overlay::default() }));
        let checkpoints = Checkpointer::start(engine.clone(), overlay.clone())?;
        if behind_open.is_some() {
            let table = Arc::new(replay.table);
            overlay.write().frozen = Some(table.clone());
            checkpoints.hand_over(table, replay.last)?;
        }
        Ok(SledBackend {
            engine,
            overlay,
            log: Mutex::new(Logged {
                wal,
                last_lsn: replay.highest,
                checkpointed_at: std::time::Instant::now(),
            }),
            checkpoint_after: options.checkpoint_after,
            checkpoints,
            lost_tail: replay.lost,
            _lock: lock,
        })
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.engine.dir
    }

    /// Entries with `start <= key < end` as one moment's state: the overlay merged over
    /// sled, read again if a checkpoint landed in between. With the LSN of the newest batch
    /// the overlay had applied (`Overlay::unchanged_since`), unless checkpoints kept
    /// landing and the last attempt is returned as it is.
    fn range_read(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
    ) -> Result<(Entries, Option<ReadMark>), StoreError> {
        let mut attempt = 0;
        loop {
            let (overlay, seen, applied) = {
                let o = self.overlay.read();
                (o.range(start, end, limit), o.checkpoints, o.applied_lsn)
            };
            let entries = contained(&self.engine.dir, || {
                let sled = self
                    .engine
                    .db
                    .range(start..end)
                    .map(|item| item.map(|(k, v)| (k.to_vec(), v.to_vec())).map_err(StoreError::from));
                merge(overlay, sled, limit)
            })??;
            // sled changes only at a checkpoint: with none since the overlay was read, the
            // two together are one moment's state.
            attempt += 1;
            if self.overlay.read().checkpoints == seen {
                return Ok((entries, Some(ReadMark(applied))));
            }
            if attempt > RANGE_RETRIES {
                return Ok((entries, None));
            }
        }
    }

    /// Syncs this half, then hands its table to the checkpoint thread once it has finished
    /// the other half's, and moves the log to the other half.
    fn rotate(&self, logged: &mut Logged) -> Result<(), StoreError> {
        logged.wal.sync()?;
        self.checkpoints.wait_idle()?;
        let table = self.overlay.write().freeze();
        self.checkpoints.hand_over(table, logged.last_lsn)?;
        logged.wal.switch();
        logged.checkpointed_at = std::time::Instant::now();
        Ok(())
    }
}

impl Drop for SledBackend {
    fn drop(&mut self) {
        // The checkpoint thread writes sled: it ends before the directory's lock is let go.
        self.checkpoints.stop();
    }
}

impl Backend for SledBackend {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        if let Some(value) = self.overlay.read().get(key) {
            return Ok(value);
        }
        // Not logged since the last checkpoint: sled has the newest value.
        Ok(contained(&self.engine.dir, || self.engine.db.get(key))??.map(|v| v.to_vec()))
    }

    fn range(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Entries, StoreError> {
        self.range_read(start, end, limit).map(|(entries, _)| entries)
    }

    /// The mark is the LSN of the newest batch the overlay had applied when it was read
    /// (`Overlay::unchanged_since`).
    fn range_marked(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
    ) -> Result<Option<(Entries, ReadMark)>, StoreError> {
        Ok(match self.range_read(start, end, limit)? {
            (entries, Some(mark)) => Some((entries, mark)),
            (_, None) => None,
        })
    }

    fn unchanged_since(&self, mark: ReadMark, key: &[u8]) -> bool {
        self.overlay.read().unchanged_since(mark.0, key)
    }

    fn apply(&self, batch: &Batch) -> Result<(), StoreError> {
        // Under the log's lock, so the log and the tables see batches in the same order,
        // and no other batch can create a key between the check and the write.
        let mut logged = self.log.lock();
        if let Some(key) = batch.first_present(|k| Ok(self.get(k)?.is_some()))? {
            return Err(StoreError::Exists { key: crate::tables::printable(key) });
        }
        let lsn = logged.last_lsn + 1;
        if logged.wal.append(lsn, &batch.ops) == Appended::Full {
            self.rotate(&mut logged)?;
            if logged.wal.append(lsn, &batch.ops) == Appended::Full {
                // Larger than a log half, so in no log record: everything before it goes
                // into sled (the rotate above handed it over), then the batch itself, whole,
                // in one sled batch with its LSN. Written key by key like a checkpoint, a
                // crash could leave part of it, and nothing would re-apply the rest.
                self.checkpoints.wait_idle()?;
                self.engine.persist_whole(&batch.ops, lsn)?;
                let mut overlay = self.overlay.write();
                overlay.applied_lsn = overlay.applied_lsn.max(lsn);
                // A prefetched read from before it is no longer current (`unchanged_since`).
                overlay.checkpoints += 1;
                overlay.dropped_through = overlay.dropped_through.max(lsn);
                logged.last_lsn = lsn;
                return Ok(());
            }
        }
        self.overlay.write().apply(lsn, &batch.ops);
        logged.last_lsn = lsn;
        Ok(())
    }

    /// One durable write of the write-ahead log (`Wal::sync`).
    fn barrier(&self) -> Result<(), StoreError> {
        self.log.lock().wal.sync()?;
        self.checkpoints.check()
    }

    /// A file on a local disk: a sync takes a fraction of a millisecond.
    fn writes_inline(&self) -> bool {
        true
    }

    /// Starts a checkpoint of the half being written when it holds enough to be worth one
    /// and no checkpoint is running: the writer never waits here. A burst of writes after
    /// a quiet spell then starts on an empty half, with no checkpoint beside it taking CPU
    /// and disk from its barriers, and a process killed after a quiet spell leaves its
    /// next open nothing to re-apply.
    ///
    /// However little the half holds, its writes go to sled once they are `checkpoint_after`
    /// old: a quiet store's acknowledged writes do not live only in the log for long.
    fn quiet(&self) -> Result<Option<std::time::Duration>, StoreError> {
        let mut logged = self.log.lock();
        if self.overlay.read().active.is_empty() {
            return Ok(None);
        }
        if self.checkpoints.is_busy() {
            return Ok(Some(CHECKPOINT_BUSY_RETRY));
        }
        let age = logged.checkpointed_at.elapsed();
        if logged.wal.filled_past(QUIET_CHECKPOINT_SHARE) || age >= self.checkpoint_after {
            self.rotate(&mut logged)?;
            return Ok(None);
        }
        Ok(Some(self.checkpoint_after.saturating_sub(age)))
    }

    /// Everything logged goes into sled, durably: the next open has nothing to re-apply.
    fn checkpoint(&self) -> Result<(), StoreError> {
        let mut logged = self.log.lock();
        logged.wal.sync()?;
        self.checkpoints.wait_idle()?;
        if !self.overlay.read().active.is_empty() {
            self.rotate(&mut logged)?;
            self.checkpoints.wait_idle()?;
        }
        self.engine.make_durable()
    }

    fn lost_on_open(&self) -> Option<Rollback> {
        self.lost_tail.clone()
    }

    fn disk_bytes(&self) -> u64 {
        self.engine.db.size_on_disk().unwrap_or(0) + self.log.lock().wal.file_bytes()
    }

    /// Writes since the last checkpoint was handed over are the ones that may live only in
    /// the log: none, or as old as that hand-over at most.
    fn checkpoint_lag(&self) -> Option<std::time::Duration> {
        let logged = self.log.lock();
        match self.overlay.read().active.is_empty() {
            true => Some(std::time::Duration::ZERO),
            false => Some(logged.checkpointed_at.elapsed()),
        }
    }

    /// Asked of sled's open log file, in the data directory: `fstatvfs` skips the path
    /// lookup `statvfs` makes, which was most of its cost on every lone commit.
    fn free_bytes(&self) -> Option<u64> {
        let stat = rustix::fs::fstatvfs(&self.engine.log_file).ok()?;
        Some(stat.f_bavail.saturating_mul(stat.f_frsize))
    }

    fn location(&self) -> PathBuf {
        self.engine.dir.clone()
    }

    fn data_dir(&self) -> Option<PathBuf> {
        Some(self.engine.dir.clone())
    }
}

/// The data directory, made (durably) when missing, and its lock taken.
fn locked_dir(dir: &Path) -> Result<std::fs::File, StoreError> {
    if !dir.exists() {
        crate::fsync::create_private_dir(dir).map_err(io(dir))?;
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
    }
    let lock_path = dir.join(LOCK_FILE);
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(crate::fsync::PRIVATE_FILE)
        .open(&lock_path)
        .map_err(io(&lock_path))?;
    lock_briefly(&lock, dir, &lock_path)?;
    Ok(lock)
}

/// sled opened, and the write-ahead log read. sled's open replays its own log on this
/// thread; the write-ahead log is read and decoded beside it, on the core that would
/// otherwise wait.
fn sled_beside_log(
    dir: &Path,
    sled_dir: &Path,
    cache_bytes: u64,
) -> Result<(sled::Db, wal::Contents), StoreError> {
    let (db, log) = std::thread::scope(|scope| {
        let reading = std::thread::Builder::new()
            .name("durafiber-wal-read".into())
            .spawn_scoped(scope, || Wal::read(dir))
            .map_err(|source| StoreError::Io { path: dir.join(wal::FILE), source });
        let db = open_with_repairs(dir, sled_dir, cache_bytes);
        let log = match reading {
            Ok(reading) => reading
                .join()
                .unwrap_or_else(|_| Err(StoreError::Engine("reading the write-ahead log panicked".into()))),
            Err(e) => Err(e),
        };
        (db, log)
    });
    Ok((db?, log?))
}

#[cfg(test)]
mod tests;
