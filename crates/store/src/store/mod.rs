//! The typed front door of the store: opening it, and commits that go through the
//! group-commit writer. Its reads are in `reads.rs`.

mod reads;

pub use reads::Decoded;

use std::{
    path::Path,
    sync::{Arc, mpsc},
    time::Duration,
};

use tokio::sync::{Semaphore, TryAcquireError, oneshot};

use crate::{
    backend::Backend,
    barrier::{Cmd, Durability, Health, Writer, WriterConfig, WriterStats, spawn_writer},
    batch::Batch,
    error::StoreError,
    lock::{Mutex, RwLock},
    sled_backend::SledBackend,
};

/// Settings of a store.
#[derive(Debug, Clone, Copy)]
pub struct StoreConfig {
    /// An `Async` commit is durable within this window.
    pub flush_every: Duration,
    /// Most batches one barrier covers.
    pub group_batches_max: usize,
    /// Most writes queued for the writer at once: a writer past it waits for room, so a burst
    /// cannot grow the queue without bound while a barrier is slow.
    pub queued_writes_max: usize,
    /// Free bytes new work must leave on the data filesystem ([`Store::check_room`]); running
    /// boundaries keep committing down to a quarter of it, then wait for space.
    pub disk_reserve_bytes: u64,
    /// A barrier that has not returned after this long fails the store.
    pub barrier_timeout: Duration,
    /// Bytes of the sled store's write-ahead log ([`crate::wal`]): sled itself is synced
    /// each time this much has been logged.
    pub wal_bytes: u64,
    /// A quiet sled store moves its logged writes into sled at most this long after its last
    /// checkpoint, however few they are.
    pub checkpoint_after: Duration,
    /// Bytes of sled's page cache: memory spent to read stored runs quickly.
    pub cache_bytes: u64,
}

impl StoreConfig {
    /// How the sled backend opens with this configuration.
    fn sled(&self) -> crate::sled_backend::SledOptions {
        crate::sled_backend::SledOptions {
            wal_bytes: self.wal_bytes,
            cache_bytes: self.cache_bytes,
            checkpoint_after: self.checkpoint_after,
        }
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            flush_every: Duration::from_millis(5),
            group_batches_max: 4096,
            queued_writes_max: 16_384,
            disk_reserve_bytes: 64 * 1024 * 1024,
            barrier_timeout: Duration::from_secs(30),
            wal_bytes: crate::wal::DEFAULT_BYTES,
            checkpoint_after: crate::sled_backend::CHECKPOINT_AFTER_DEFAULT,
            cache_bytes: crate::sled_backend::CACHE_BYTES_DEFAULT,
        }
    }
}

/// The store's condition, for `/health` and operators.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StoreHealth {
    /// Why the store failed, if it did: it takes no more writes until the process restarts.
    pub failed: Option<String>,
    /// Writes wait for disk space (below the floor).
    pub parked: bool,
    /// Bytes free on the data filesystem, when there is one.
    pub free_bytes: Option<u64>,
    /// New work is refused (below the reserve).
    pub low_on_space: bool,
}

/// A store: a backend plus its one writer. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Arc<dyn Backend>,
    stats: Arc<WriterStats>,
    health: Arc<Health>,
    disk_reserve_bytes: u64,
    /// Whether a clean close may write the rollback witness: not for a store opened
    /// despite a rollback (that would bless the loss).
    witness_ok: std::sync::atomic::AtomicBool,
    /// Room in the writer's queue: one permit per queued write, given back once it is applied.
    room: Arc<Semaphore>,
    /// Senders share it: a send wakes the writer, and others need not wait for that.
    tx: RwLock<Option<mpsc::Sender<Cmd>>>,
    writer: Arc<Writer>,
    writer_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shut_down();
    }
}

impl Inner {
    /// After a clean close: what the store holds, for the next open to compare.
    fn write_witness(&self) {
        if !self.witness_ok.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        if let Some(dir) = self.backend.data_dir()
            && let Err(e) = crate::witness::write(&dir, self.backend.as_ref())
        {
            tracing::warn!(error = %e, "could not write the rollback witness");
        }
    }

    fn shut_down(&self) {
        // A parked writer stops waiting for space; dropping the sender ends the writer after
        // a last barrier.
        self.health.closing.store(true, std::sync::atomic::Ordering::Relaxed);
        drop(self.tx.write().take());
        if let Some(h) = self.writer_thread.lock().take() {
            // A failed store's writer may be stuck inside the engine for good: leave it.
            if self.health.failure().is_none() && h.join().is_ok() {
                self.write_witness();
            }
        }
    }
}

/// Whether `location` names a database (`postgres://…`) rather than a data directory.
pub fn is_database_url(location: &str) -> bool {
    location.starts_with("postgres://") || location.starts_with("postgresql://")
}

impl Store {
    /// Opens the sled store in `dir`, creating it if needed. A store that went back in time
    /// since its last clean close is refused with [`StoreError::RolledBack`].
    pub fn open_dir(dir: &Path, config: StoreConfig) -> Result<Store, StoreError> {
        Store::checked(
            dir,
            Store::with_backend(Arc::new(SledBackend::open_with(dir, &config.sled())?), config)?,
        )
    }

    /// Opens the sled store in `dir`, which must already hold one (inspection and repair).
    pub fn open_existing_dir(dir: &Path, config: StoreConfig) -> Result<Store, StoreError> {
        Store::checked(
            dir,
            Store::with_backend(Arc::new(SledBackend::open_existing_with(dir, &config.sled())?), config)?,
        )
    }

    /// Opens an existing store whatever happened to it, for repair: a rollback is returned
    /// beside the store instead of refusing it.
    pub fn open_for_repair(
        dir: &Path,
        config: StoreConfig,
    ) -> Result<(Store, Option<crate::witness::Rollback>), StoreError> {
        let backend = SledBackend::open_existing_with(dir, &config.sled())?;
        let store = Store::with_backend(Arc::new(backend), config)?;
        let rollback = store.rollback(dir)?;
        if rollback.is_some() {
            store.inner.witness_ok.store(false, std::sync::atomic::Ordering::Relaxed);
        }
        Ok((store, rollback))
    }

    fn checked(dir: &Path, store: Store) -> Result<Store, StoreError> {
        match store.rollback(dir)? {
            None => Ok(store),
            Some(rb) => {
                store.inner.witness_ok.store(false, std::sync::atomic::Ordering::Relaxed);
                store.close();
                Err(StoreError::RolledBack {
                    path: dir.to_path_buf(),
                    expected_seq: rb.expected_seq,
                    found_seq: rb.found_seq,
                    runs: rb.runs,
                })
            }
        }
    }

    /// Whether the store went back in time: lost past its write-ahead log, or behind the
    /// witness of its last clean close.
    fn rollback(&self, dir: &Path) -> Result<Option<crate::witness::Rollback>, StoreError> {
        match self.inner.backend.lost_on_open() {
            Some(lost) => Ok(Some(lost)),
            None => crate::witness::check(dir, self.inner.backend.as_ref()),
        }
    }

    /// Opens the store at `location`: a `postgres://` URL (a database, with the `postgres`
    /// feature) or a data directory for the embedded sled store.
    pub fn open_at(location: &str, config: StoreConfig) -> Result<Store, StoreError> {
        if is_database_url(location) {
            #[cfg(feature = "postgres")]
            return Store::open_postgres(location, config);
            #[cfg(not(feature = "postgres"))]
            return Err(StoreError::Database { reason: "this build has no PostgreSQL backend".into() });
        }
        Store::open_dir(Path::new(location), config)
    }

    /// Opens the store in the PostgreSQL database at `url`, creating its tables if needed.
    #[cfg(feature = "postgres")]
    pub fn open_postgres(url: &str, config: StoreConfig) -> Result<Store, StoreError> {
        let backend = crate::pg_backend::PgBackend::open_with_timeout(url, config.barrier_timeout)?;
        Store::with_backend(Arc::new(backend), config)
    }

    /// A store over any backend.
    pub fn with_backend(backend: Arc<dyn Backend>, config: StoreConfig) -> Result<Store, StoreError> {
        let writer_config = WriterConfig {
            group_batches_max: config.group_batches_max.max(1),
            disk_floor_bytes: config.disk_reserve_bytes / 4,
            barrier_timeout: config.barrier_timeout,
        };
        let stats = Arc::new(WriterStats::default());
        let health = Arc::new(Health::new(config.flush_every));
        let spawned = spawn_writer(backend.clone(), writer_config, stats.clone(), health.clone())?;
        Ok(Store {
            inner: Arc::new(Inner {
                backend,
                stats,
                health,
                disk_reserve_bytes: config.disk_reserve_bytes,
                witness_ok: std::sync::atomic::AtomicBool::new(true),
                room: Arc::new(Semaphore::new(config.queued_writes_max.max(1))),
                tx: RwLock::new(Some(spawned.tx)),
                writer: spawned.writer,
                writer_thread: Mutex::new(Some(spawned.thread)),
            }),
        })
    }

    /// Changes how long an `Async` write may stay uncovered by a barrier, from the next
    /// async group on.
    pub fn set_flush_every(&self, flush_every: Duration) {
        let us = u64::try_from(flush_every.as_micros()).unwrap_or(u64::MAX);
        self.inner.health.flush_every_us.store(us, std::sync::atomic::Ordering::Relaxed);
    }

    /// Batches applied and barriers run so far by this store's writer.
    pub fn writer_stats(&self) -> &WriterStats {
        &self.inner.stats
    }

    #[cfg(test)]
    pub(crate) fn writer(&self) -> &Writer {
        &self.inner.writer
    }

    /// The backend, for raw access in tests and inspection.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    fn send(&self, cmd: Cmd) -> Result<(), StoreError> {
        let tx = self.inner.tx.read();
        self.inner.writer.queue(tx.as_ref().ok_or(StoreError::Closed)?, cmd)
    }

    fn check_failed(&self) -> Result<(), StoreError> {
        match self.inner.health.failure() {
            Some(reason) => Err(StoreError::Failed { reason }),
            None => Ok(()),
        }
    }

    /// Waits for the writer's answer, or for the store to fail (the writer may never answer).
    async fn answer(&self, done: oneshot::Receiver<Result<(), StoreError>>) -> Result<(), StoreError> {
        let mut failed = self.inner.health.failed.subscribe();
        tokio::select! {
            answer = done => answer.map_err(|_| StoreError::Closed)?,
            _ = failed.wait_for(std::option::Option::is_some) => self.check_failed(),
        }
    }

    /// Commits `batch` atomically; returns once it is as durable as `durability` says.
    ///
    /// A `Sync` commit that finds the writer idle and nothing queued is written and synced
    /// on the caller's thread, blocking it for the disk's sync (a local store's only, only
    /// while its syncs are quick, and only on a multi-threaded runtime, whose other workers
    /// go on meanwhile): a task committing now and then is not woken twice for each commit.
    /// Anything else waits for the writer thread.
    pub async fn commit(&self, batch: Batch, durability: Durability) -> Result<(), StoreError> {
        self.check_failed()?;
        // A single-threaded runtime has no other thread to go on with while this one
        // waits for a disk: on a disk that stopped answering, it would stop as a whole.
        let other_workers = crate::lock::on_multi_threaded_runtime();
        let batch = match durability {
            Durability::Sync if other_workers => match self.inner.writer.write_inline(batch) {
                Ok(written) => return written,
                Err(batch) => batch,
            },
            _ => batch,
        };
        let room = self.inner.room.clone().acquire_owned().await.map_err(|_| StoreError::Closed)?;
        let (ack, done) = oneshot::channel();
        self.send(Cmd::Write { batch, durability, ack, room })?;
        self.answer(done).await
    }

    /// Commits `batch` durably (`Sync`) ahead of every write queued or waiting for room in
    /// the queue: the writer's next group takes it first. For the few writes that must not
    /// queue behind many others — a recovery's registrations, while the runs it has already
    /// recovered commit as fast as they can — and only for callers that bound how many they
    /// send at once, since nothing else bounds them.
    pub async fn commit_ahead(&self, batch: Batch) -> Result<(), StoreError> {
        self.check_failed()?;
        let (ack, done) = oneshot::channel();
        {
            let tx = self.inner.tx.read();
            self.inner.writer.send_ahead(tx.as_ref().ok_or(StoreError::Closed)?, batch, ack)?;
        }
        self.answer(done).await
    }

    /// Refuses new work while the data filesystem is below the reserve: what is running can
    /// still finish, down to the floor.
    pub fn check_room(&self) -> Result<(), StoreError> {
        self.check_failed()?;
        match self.inner.backend.free_bytes() {
            Some(free_bytes) if free_bytes < self.inner.disk_reserve_bytes => Err(StoreError::StorageFull {
                path: self.inner.backend.location(),
                free_bytes,
                reserve_bytes: self.inner.disk_reserve_bytes,
            }),
            _ => Ok(()),
        }
    }

    /// The store's condition.
    pub fn health(&self) -> StoreHealth {
        let free_bytes = self.inner.backend.free_bytes();
        StoreHealth {
            failed: self.inner.health.failure(),
            parked: self.inner.health.parked.load(std::sync::atomic::Ordering::Relaxed),
            free_bytes,
            low_on_space: free_bytes.is_some_and(|f| f < self.inner.disk_reserve_bytes),
        }
    }

    /// Changes to `Some(reason)` when the store fails, so a server can exit for its supervisor.
    pub fn failed_signal(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.inner.health.failed.subscribe()
    }

    /// `commit` for callers outside an async runtime. A lone `Sync` commit is written on
    /// the caller's thread, as in `commit`.
    pub fn commit_blocking(&self, batch: Batch, durability: Durability) -> Result<(), StoreError> {
        self.check_failed()?;
        let batch = match durability {
            Durability::Sync => match self.inner.writer.write_inline(batch) {
                Ok(written) => return written,
                Err(batch) => batch,
            },
            Durability::Async => batch,
        };
        let room = loop {
            match self.inner.room.clone().try_acquire_owned() {
                Ok(room) => break room,
                Err(TryAcquireError::Closed) => return Err(StoreError::Closed),
                // A full queue drains within one barrier; a blocking caller may wait.
                Err(TryAcquireError::NoPermits) => std::thread::sleep(Duration::from_millis(1)),
            }
        };
        let (ack, mut done) = oneshot::channel();
        self.send(Cmd::Write { batch, durability, ack, room })?;
        loop {
            match done.try_recv() {
                Ok(answer) => return answer,
                Err(oneshot::error::TryRecvError::Closed) => return Err(StoreError::Closed),
                Err(oneshot::error::TryRecvError::Empty) => {
                    self.check_failed()?;
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        }
    }

    /// Returns once everything committed so far is durable.
    pub async fn barrier(&self) -> Result<(), StoreError> {
        self.check_failed()?;
        let (ack, done) = oneshot::channel();
        self.send(Cmd::Barrier { ack })?;
        self.answer(done).await
    }

    /// Returns once everything applied so far is durable: what any read up to now may have
    /// seen. Free when nothing is in flight; otherwise waits for the barrier the writer runs
    /// anyway (at once for a sync group, within `flush_every` for async writes, before it
    /// parks on a full disk), so a read never costs a barrier of its own. Call it before
    /// acting on, or showing, what a read returned.
    pub async fn settle_reads(&self) -> Result<(), StoreError> {
        self.check_failed()?;
        let target = self.inner.health.applied.load(std::sync::atomic::Ordering::SeqCst);
        let mut durable = self.inner.health.durable.subscribe();
        if *durable.borrow() >= target {
            return Ok(());
        }
        let mut failed = self.inner.health.failed.subscribe();
        tokio::select! {
            _ = durable.wait_for(|groups| *groups >= target) => Ok(()),
            _ = failed.wait_for(std::option::Option::is_some) => self.check_failed(),
        }
    }

    /// Every entry as it stands between two group commits: a consistent copy, taken while
    /// the store keeps serving (writes wait for the copy, reads do not).
    pub async fn snapshot(&self) -> Result<crate::backend::Entries, StoreError> {
        self.check_failed()?;
        let (ack, done) = oneshot::channel();
        self.send(Cmd::Snapshot { ack })?;
        done.await.map_err(|_| StoreError::Closed)?
    }

    /// Whether the store holds no record at all.
    pub fn is_empty(&self) -> Result<bool, StoreError> {
        Ok(self.inner.backend.range(&[], &[0xff; 16], 1)?.is_empty())
    }

    /// Makes everything durable and stops the writer. Later commits fail with `Closed`.
    pub fn close(&self) {
        self.inner.shut_down();
    }
}
