//! Checkpoints: how logged batches reach sled. A full log half's table goes into sled, then
//! the LSN of its last record, and sled is then made durable; the
//! checkpoint thread does this while the writer goes on in the other half. Opening a store
//! re-applies the records sled lacks in the same way: on that thread, as its first table,
//! when they all lie in the log's newer half (`sled_backend.rs`), else before the open
//! returns.
//!
//! sled 0.34's own flush ends in `sync_file_range`, which does not reach the disk's volatile
//! cache, and it writes large values to blob files without syncing them. Making sled durable
//! therefore syncs new blob files and the blob directory, then flushes sled, then
//! `fdatasync`s its log file.

use std::{
    collections::HashSet,
    fs::File,
    path::{Path, PathBuf},
    sync::{Arc, mpsc},
};

use crate::{
    backend::Rollback,
    batch::Op,
    codec, envelope,
    error::StoreError,
    fsync::io,
    lock::{Condvar, Mutex, RwLock},
    memtable::{Overlay, Table, apply_to},
    tables,
    wal::Record,
};

/// sled and the files behind it, shared by the backend and its checkpoint thread.
pub(crate) struct Engine {
    pub db: sled::Db,
    pub dir: PathBuf,
    /// sled's log file, for `fdatasync` (and the data filesystem's free space).
    pub log_file: File,
    pub log_path: PathBuf,
    pub blob_dir: PathBuf,
    synced_blobs: Mutex<HashSet<std::ffi::OsString>>,
}

/// The key under which sled keeps the LSN of the last record it holds.
fn lsn_key() -> Vec<u8> {
    tables::keys::meta::<u64>("wal_lsn").into_bytes()
}

/// Runs a sled call, turning a panic inside it (sled 0.34 panics on some damaged logs) into
/// an engine error naming the directory: sled's faults stay in the store layer.
pub(crate) fn contained<T>(dir: &Path, f: impl FnOnce() -> T) -> Result<T, StoreError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(std::string::ToString::to_string)
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into());
        StoreError::Engine(format!("sled failed on {}: {what}", dir.display()))
    })
}

impl Engine {
    pub fn new(db: sled::Db, dir: &Path, sled_dir: &Path) -> Result<Engine, StoreError> {
        let log_path = sled_dir.join("db");
        let log_file = File::open(&log_path).map_err(io(&log_path))?;
        Ok(Engine {
            db,
            dir: dir.to_path_buf(),
            log_file,
            log_path,
            blob_dir: sled_dir.join("blobs"),
            synced_blobs: Mutex::new(HashSet::new()),
        })
    }

    /// The LSN of the last record sled holds (0 for a store that never had one).
    pub fn stored_lsn(&self) -> Result<u64, StoreError> {
        let key = lsn_key();
        let Some(sealed) = contained(&self.dir, || self.db.get(&key))?? else { return Ok(0) };
        let body = envelope::open(tables::keys::META.name, &key, &sealed)?;
        codec::decode(body).map_err(|reason| StoreError::Corrupt {
            table: tables::keys::META.name,
            key: tables::printable(&key),
            reason: reason.to_string(),
        })
    }

    /// Writes `table` into sled, then `lsn`, then makes sled durable.
    ///
    /// Key by key, not as one sled batch: sled's atomic batch takes a lock every other
    /// writer and reader of sled waits for, and writes its buffer out twice. A checkpoint cut
    /// short by a crash is still safe: sled recovers a prefix of its writes, so the LSN,
    /// written last, is there only with every key before it; without it, the next open
    /// re-applies every record after the older LSN, which rewrites each key this checkpoint
    /// touched.
    pub fn persist(&self, table: &Table, lsn: u64) -> Result<(), StoreError> {
        let body = codec::encode(&lsn).map_err(|reason| StoreError::Encode {
            table: tables::keys::META.name,
            reason: reason.to_string(),
        })?;
        let sealed_lsn = envelope::seal(&lsn_key(), &body);
        contained(&self.dir, || {
            for (key, value) in table {
                match value {
                    Some(value) => self.db.insert(key.as_slice(), value.as_slice()).map(drop)?,
                    None => self.db.remove(key.as_slice()).map(drop)?,
                }
            }
            self.db.insert(lsn_key(), sealed_lsn).map(drop)
        })??;
        self.make_durable()
    }

    /// Writes one batch straight into sled, with `lsn`, as one sled batch, then makes sled
    /// durable: for a batch larger than a log half, which no log record holds, so the next
    /// open could not re-apply what a crash cut short. sled applies its own batch whole or
    /// not at all, across a crash too, where `persist` writes key by key.
    pub fn persist_whole(&self, ops: &[Op], lsn: u64) -> Result<(), StoreError> {
        let body = codec::encode(&lsn).map_err(|reason| StoreError::Encode {
            table: tables::keys::META.name,
            reason: reason.to_string(),
        })?;
        let mut whole = sled::Batch::default();
        for op in ops {
            match op {
                Op::Put { key, value } => whole.insert(key.as_slice(), value.as_slice()),
                Op::Delete { key } => whole.remove(key.as_slice()),
            }
        }
        whole.insert(lsn_key(), envelope::seal(&lsn_key(), &body));
        contained(&self.dir, || self.db.apply_batch(whole))??;
        self.make_durable()
    }

    /// Makes everything sled holds durable across a power loss.
    pub fn make_durable(&self) -> Result<(), StoreError> {
        self.sync_new_blobs()?;
        contained(&self.dir, || self.db.flush())??;
        self.log_file.sync_data().map_err(io(&self.log_path))
    }

    fn sync_new_blobs(&self) -> Result<(), StoreError> {
        let Ok(entries) = std::fs::read_dir(&self.blob_dir) else { return Ok(()) };
        let mut synced = self.synced_blobs.lock();
        let mut any = false;
        let mut present = HashSet::new();
        for entry in entries {
            let entry = entry.map_err(io(&self.blob_dir))?;
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
            File::open(&self.blob_dir).and_then(|d| d.sync_all()).map_err(io(&self.blob_dir))?;
        }
        *synced = present;
        Ok(())
    }

    /// What sled lacks of `records`: those after its LSN, in order, as one table, with
    /// the highest LSN the log holds (new records number on from it), and what was lost
    /// when the records after sled's LSN do not follow on from it — sled went back past a
    /// checkpoint, or the log was damaged: then only the records that do follow on are
    /// taken, since the rest would land on an older state than theirs.
    pub fn replay(&self, records: &[Record]) -> Result<Replay, StoreError> {
        let held = self.stored_lsn()?;
        let highest = records.iter().map(|r| r.lsn).max().unwrap_or(0).max(held);
        let mut table = Table::new();
        let mut last = held;
        let mut lost = Vec::new();
        for record in records.iter().filter(|r| r.lsn > held) {
            if lost.is_empty() && record.lsn == last + 1 {
                apply_to(&mut table, &record.ops);
                last = record.lsn;
            } else {
                lost.push(record);
            }
        }
        if last > held {
            tracing::info!(records = last - held, "the write-ahead log holds records sled lacks");
        }
        if lost.is_empty() {
            return Ok(Replay { table, from: held + 1, last, highest, lost: None });
        }
        let mut runs: Vec<String> = lost
            .iter()
            .flat_map(|r| r.ops.iter())
            .filter_map(|op| match op {
                Op::Put { key, .. } | Op::Delete { key } => tables::keys::run_of_key(key).map(str::to_string),
            })
            .collect();
        runs.sort();
        runs.dedup();
        tracing::error!(
            held = last,
            highest,
            "the write-ahead log's records after sled's last one do not follow on"
        );
        let stranded = lost.iter().flat_map(|r| r.ops.iter().cloned()).collect();
        let lost = Rollback { expected_seq: highest, found_seq: last, runs, stranded };
        Ok(Replay { table, from: held + 1, last, highest, lost: Some(lost) })
    }
}

/// The records sled lacks, as one checkpoint's table ([`Engine::replay`]).
pub(crate) struct Replay {
    /// Their writes, newest value per key.
    pub table: Table,
    /// The LSN of the first of them.
    pub from: u64,
    /// The LSN of the last of them; sled's own LSN when there are none.
    pub last: u64,
    /// The highest LSN the log holds.
    pub highest: u64,
    /// The records that could not be taken, when some do not follow on.
    pub lost: Option<Rollback>,
}

impl Replay {
    /// Whether any record is to be re-applied.
    pub fn is_empty(&self) -> bool {
        self.last < self.from
    }
}

/// A frozen table and the LSN of its last record: one checkpoint's work.
type Frozen = (Arc<Table>, u64);

/// What the checkpoint thread is doing.
#[derive(Default)]
struct State {
    busy: bool,
    failed: Option<String>,
}

/// The checkpoint thread, and how the writer waits for it.
pub(crate) struct Checkpointer {
    state: Arc<(Mutex<State>, Condvar)>,
    tx: Mutex<Option<mpsc::Sender<Frozen>>>,
    handle: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Checkpointer {
    /// Starts the thread. It writes each frozen table it is handed into sled, then drops it
    /// from the overlay.
    pub fn start(engine: Arc<Engine>, overlay: Arc<RwLock<Overlay>>) -> Result<Checkpointer, StoreError> {
        let state = Arc::new((Mutex::new(State::default()), Condvar::new()));
        let (tx, rx) = mpsc::channel::<Frozen>();
        let thread_state = state.clone();
        let handle = std::thread::Builder::new()
            .name("durafiber-checkpoint".into())
            .spawn(move || {
                while let Ok((table, lsn)) = rx.recv() {
                    let result = engine.persist(&table, lsn);
                    if result.is_ok() {
                        let mut overlay = overlay.write();
                        overlay.frozen = None;
                        overlay.checkpoints += 1;
                        overlay.dropped_through = overlay.dropped_through.max(lsn);
                    }
                    let (lock, done) = &*thread_state;
                    let mut state = lock.lock();
                    if let Err(e) = result {
                        tracing::error!(error = %e, "a checkpoint into sled failed");
                        state.failed = Some(e.to_string());
                    }
                    state.busy = false;
                    done.notify_all();
                }
            })
            .map_err(|source| StoreError::Io { path: "checkpoint thread".into(), source })?;
        Ok(Checkpointer { state, tx: Mutex::new(Some(tx)), handle: Mutex::new(Some(handle)) })
    }

    /// Waits until no checkpoint is running; an error if one failed.
    pub fn wait_idle(&self) -> Result<(), StoreError> {
        let (lock, done) = &*self.state;
        let mut state = lock.lock();
        while state.busy {
            state = done.wait(state);
        }
        self.failure(&state)
    }

    /// Whether a checkpoint is running now.
    pub fn is_busy(&self) -> bool {
        self.state.0.lock().busy
    }

    /// An error if a checkpoint failed: sled's state in this process is not to be trusted.
    pub fn check(&self) -> Result<(), StoreError> {
        self.failure(&self.state.0.lock())
    }

    fn failure(&self, state: &State) -> Result<(), StoreError> {
        match &state.failed {
            Some(reason) => Err(StoreError::Engine(format!("a checkpoint into sled failed: {reason}"))),
            None => Ok(()),
        }
    }

    /// Hands a frozen table to the thread. The caller waited for it to be idle.
    pub fn hand_over(&self, table: Arc<Table>, lsn: u64) -> Result<(), StoreError> {
        self.state.0.lock().busy = true;
        let sent = self.tx.lock().as_ref().is_some_and(|tx| tx.send((table, lsn)).is_ok());
        if !sent {
            self.state.0.lock().busy = false;
            return Err(StoreError::Closed);
        }
        Ok(())
    }

    /// Lets the thread finish what it was handed, and waits for it.
    pub fn stop(&self) {
        drop(self.tx.lock().take());
        if let Some(handle) = self.handle.lock().take() {
            let _ = handle.join();
        }
    }
}
