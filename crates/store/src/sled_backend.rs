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
                last = Some(e)
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
fn open_with_repairs(dir: &Path, sled_dir: &Path, cache_bytes: u64) -> Result<sled::Db, StoreError> {
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
        let sled_dir = dir.join(SLED_DIR);
        let marker = dir.join(MARKER_FILE);
        if marker.exists() && !sled_dir.exists() {
            return Err(StoreError::EngineMissing { path: dir.to_path_buf() });
        }
        remove_unfinished_snapshots(&sled_dir)?;
        // sled's open replays its own log on this thread; the write-ahead log is read and
        // decoded beside it, on the core that would otherwise wait.
        let (db, log) = std::thread::scope(|scope| {
            let reading = std::thread::Builder::new()
                .name("durafiber-wal-read".into())
                .spawn_scoped(scope, || Wal::read(dir))
                .map_err(|source| StoreError::Io { path: dir.join(wal::FILE), source });
            let db = open_with_repairs(dir, &sled_dir, options.cache_bytes);
            let log = match reading {
                Ok(reading) => reading.join().unwrap_or_else(|_| {
                    Err(StoreError::Engine("reading the write-ahead log panicked".into()))
                }),
                Err(e) => Err(e),
            };
            (db, log)
        });
        let (db, log) = (db?, log?);
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
                // Larger than a log half: it goes into sled at once, durably, with all
                // before it.
                self.overlay.write().apply(lsn, &batch.ops);
                logged.last_lsn = lsn;
                self.rotate(&mut logged)?;
                return self.checkpoints.wait_idle();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Op;

    fn put(batch: &mut Batch, i: u32) {
        batch.ops.push(Op::Put { key: format!("k{i:06}").into_bytes(), value: vec![(i % 251) as u8; 40] });
    }

    fn value(backend: &SledBackend, i: u32) -> Option<Vec<u8>> {
        backend.get(format!("k{i:06}").as_bytes()).expect("get")
    }

    /// Writes `from..to`, one batch each, each durable; nothing goes into sled by a close.
    fn write(backend: &SledBackend, from: u32, to: u32) {
        for i in from..to {
            let mut batch = Batch::new();
            put(&mut batch, i);
            backend.apply(&batch).expect("apply");
            backend.barrier().expect("barrier");
        }
    }

    #[test]
    fn records_sled_lacks_are_readable_at_once_and_reach_sled_behind_the_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        let wal_bytes = wal::MIN_BYTES;
        // Enough to fill both halves and come back to the first: its new records are not in
        // sled when the backend goes away without a checkpoint.
        let first = SledBackend::open_sized(dir.path(), wal_bytes).expect("open");
        write(&first, 0, 2_000);
        // The back half's checkpoint runs behind the writer: let it finish.
        first.checkpoints.wait_idle().expect("checkpoint");
        let held = first.engine.stored_lsn().expect("lsn");
        assert!(held > 1_000 && held < 2_000, "the back half is not in sled: {held}");
        assert_eq!(first.log.lock().wal.half(), 0);
        drop(first);

        // The reopened store re-applies them behind the open: readable now from memory...
        let second = SledBackend::open_sized(dir.path(), wal_bytes).expect("reopen");
        assert_eq!(second.log.lock().wal.half(), 1, "the half holding the records is kept");
        assert!((0..2_000).all(|i| value(&second, i).is_some_and(|v| v == vec![(i % 251) as u8; 40])));
        // ...and the log goes on in the other half, over records sled already has, until
        // it has moved halves twice more, which waits for that checkpoint.
        write(&second, 2_000, 4_000);
        assert!(second.engine.stored_lsn().expect("lsn") >= 2_000);
        drop(second);

        let third = SledBackend::open_sized(dir.path(), wal_bytes).expect("reopen");
        assert!((0..4_000).all(|i| value(&third, i).is_some()));
        third.checkpoint().expect("checkpoint");
        assert_eq!(third.engine.stored_lsn().expect("lsn"), 4_000);
    }

    #[test]
    fn a_marked_read_stays_current_only_until_its_key_is_written_even_through_checkpoints() {
        let dir = tempfile::tempdir().expect("tempdir");
        let backend = SledBackend::open_sized(dir.path(), wal::MIN_BYTES).expect("open");
        write(&backend, 0, 10);
        backend.checkpoint().expect("checkpoint");
        let key = |i: u32| format!("k{i:06}").into_bytes();
        let (entries, mark) = backend.range_marked(&key(0), &key(10), 100).expect("range").expect("a mark");
        assert_eq!(entries.len(), 10);
        assert!((0..12).all(|i| backend.unchanged_since(mark, &key(i))));

        // Rewriting one key, or creating one, spoils the mark for that key alone...
        write(&backend, 3, 4);
        write(&backend, 11, 12);
        assert!(!backend.unchanged_since(mark, &key(3)) && !backend.unchanged_since(mark, &key(11)));
        assert!(backend.unchanged_since(mark, &key(4)));
        // ...and once a checkpoint has taken those writes out of memory, for every key.
        backend.checkpoint().expect("checkpoint");
        assert!(!backend.unchanged_since(mark, &key(3)) && !backend.unchanged_since(mark, &key(4)));

        // A checkpoint of writes made before a mark leaves it good.
        write(&backend, 1_000, 1_200);
        let (_, mark) = backend.range_marked(&key(0), &key(10), 100).expect("range").expect("a mark");
        assert!(!backend.unchanged_since(mark, &key(1_100)), "held in memory until the checkpoint");
        backend.checkpoint().expect("checkpoint");
        assert!(backend.unchanged_since(mark, &key(5)) && backend.unchanged_since(mark, &key(1_100)));
    }

    #[test]
    fn a_quiet_writer_moves_its_log_into_sled_once_there_is_enough_of_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let backend = SledBackend::open_sized(dir.path(), wal::MIN_BYTES).expect("open");
        // A few records are not worth a checkpoint.
        write(&backend, 0, 3);
        backend.quiet().expect("quiet");
        backend.checkpoints.wait_idle().expect("idle");
        assert_eq!(backend.engine.stored_lsn().expect("lsn"), 0);
        // Past an eighth of the half (and short of filling it), they are.
        write(&backend, 3, 200);
        assert!(
            backend.log.lock().wal.filled_past(QUIET_CHECKPOINT_SHARE)
                && !backend.log.lock().wal.filled_past(1)
        );
        backend.quiet().expect("quiet");
        backend.checkpoints.wait_idle().expect("idle");
        assert_eq!(backend.engine.stored_lsn().expect("lsn"), 200);
        assert!((0..200).all(|i| value(&backend, i).is_some()));
        // Gone without a close: the next open finds everything, in sled already.
        drop(backend);
        let reopened = SledBackend::open_sized(dir.path(), wal::MIN_BYTES).expect("reopen");
        assert_eq!(reopened.engine.stored_lsn().expect("lsn"), 200);
        assert!((0..200).all(|i| value(&reopened, i).is_some_and(|v| v == vec![(i % 251) as u8; 40])));
    }

    #[test]
    fn a_quiet_store_checkpoints_a_few_records_once_they_are_old_enough() {
        let dir = tempfile::tempdir().expect("tempdir");
        let after = std::time::Duration::from_millis(300);
        let options =
            SledOptions { wal_bytes: wal::MIN_BYTES, checkpoint_after: after, ..SledOptions::default() };
        let backend = SledBackend::open_with(dir.path(), &options).expect("open");
        write(&backend, 0, 3);
        // Too few and too young: told to ask again within the interval.
        let again = backend.quiet().expect("quiet").expect("asked to be told again");
        assert!(again <= after, "{again:?}");
        backend.checkpoints.wait_idle().expect("idle");
        assert_eq!(backend.engine.stored_lsn().expect("lsn"), 0);
        // Old enough: into sled, however few.
        std::thread::sleep(again);
        assert_eq!(backend.quiet().expect("quiet"), None);
        backend.checkpoints.wait_idle().expect("idle");
        assert_eq!(backend.engine.stored_lsn().expect("lsn"), 3);
        // Nothing logged since: nothing to ask.
        assert_eq!(backend.quiet().expect("quiet"), None);
    }
}
