//! The typed front door of the store: reads that open envelopes, and commits that go through
//! the group-commit writer.

use std::{
    path::Path,
    sync::{Arc, Mutex, mpsc},
    time::Duration,
};

use serde::de::DeserializeOwned;
use tokio::sync::{Semaphore, TryAcquireError, oneshot};

use crate::{
    Backend, Batch, SledBackend, StoreError,
    backend::Entries,
    barrier::{Cmd, Durability, WriterConfig, WriterStats, spawn_writer},
    codec, envelope,
    tables::Table,
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
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            flush_every: Duration::from_millis(5),
            group_batches_max: 4096,
            queued_writes_max: 16_384,
        }
    }
}

/// A store: a backend plus its one writer. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Arc<dyn Backend>,
    stats: Arc<WriterStats>,
    /// Room in the writer's queue: one permit per queued write, given back once it is applied.
    room: Arc<Semaphore>,
    tx: Mutex<Option<mpsc::Sender<Cmd>>>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shut_down();
    }
}

impl Inner {
    fn shut_down(&self) {
        // Dropping the sender ends the writer after a last barrier.
        drop(self.tx.lock().unwrap_or_else(|p| p.into_inner()).take());
        if let Some(h) = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = h.join();
        }
    }
}

/// Keys with their decoded records; each record decodes (or fails) on its own.
pub type Decoded<T> = Vec<(Vec<u8>, Result<T, StoreError>)>;

/// The end of the key range that starts with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0xff; 9]
}

/// Opens and decodes one sealed value.
pub fn decode_sealed<T: DeserializeOwned>(table: Table, key: &[u8], sealed: &[u8]) -> Result<T, StoreError> {
    let body = envelope::open(table.name, key, sealed)?;
    codec::decode(body).map_err(|reason| StoreError::Corrupt {
        table: table.name,
        key: crate::tables::printable(key),
        reason,
    })
}

impl Store {
    /// Opens the sled store in `dir`.
    pub fn open_dir(dir: &Path, config: StoreConfig) -> Result<Store, StoreError> {
        Store::with_backend(Arc::new(SledBackend::open(dir)?), config)
    }

    /// A store over any backend.
    pub fn with_backend(backend: Arc<dyn Backend>, config: StoreConfig) -> Result<Store, StoreError> {
        let writer_config = WriterConfig {
            flush_every: config.flush_every,
            group_batches_max: config.group_batches_max.max(1),
        };
        let stats = Arc::new(WriterStats::default());
        let (tx, handle) = spawn_writer(backend.clone(), writer_config, stats.clone())?;
        Ok(Store {
            inner: Arc::new(Inner {
                backend,
                stats,
                room: Arc::new(Semaphore::new(config.queued_writes_max.max(1))),
                tx: Mutex::new(Some(tx)),
                writer: Mutex::new(Some(handle)),
            }),
        })
    }

    /// Batches applied and barriers run so far by this store's writer.
    pub fn writer_stats(&self) -> &WriterStats {
        &self.inner.stats
    }

    /// The backend, for raw access in tests and inspection.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    fn send(&self, cmd: Cmd) -> Result<(), StoreError> {
        let tx = self.inner.tx.lock().unwrap_or_else(|p| p.into_inner());
        tx.as_ref().ok_or(StoreError::Closed)?.send(cmd).map_err(|_| StoreError::Closed)
    }

    /// Commits `batch` atomically; returns once it is as durable as `durability` says.
    pub async fn commit(&self, batch: Batch, durability: Durability) -> Result<(), StoreError> {
        let room = self.inner.room.clone().acquire_owned().await.map_err(|_| StoreError::Closed)?;
        let (ack, done) = oneshot::channel();
        self.send(Cmd::Write { batch, durability, ack, room })?;
        done.await.map_err(|_| StoreError::Closed)?
    }

    /// `commit` for callers outside an async runtime.
    pub fn commit_blocking(&self, batch: Batch, durability: Durability) -> Result<(), StoreError> {
        let room = loop {
            match self.inner.room.clone().try_acquire_owned() {
                Ok(room) => break room,
                Err(TryAcquireError::Closed) => return Err(StoreError::Closed),
                // A full queue drains within one barrier; a blocking caller may wait.
                Err(TryAcquireError::NoPermits) => std::thread::sleep(Duration::from_millis(1)),
            }
        };
        let (ack, done) = oneshot::channel();
        self.send(Cmd::Write { batch, durability, ack, room })?;
        done.blocking_recv().map_err(|_| StoreError::Closed)?
    }

    /// Returns once everything committed so far is durable.
    pub async fn barrier(&self) -> Result<(), StoreError> {
        let (ack, done) = oneshot::channel();
        self.send(Cmd::Barrier { ack })?;
        done.await.map_err(|_| StoreError::Closed)?
    }

    /// Makes everything durable and stops the writer. Later commits fail with `Closed`.
    pub fn close(&self) {
        self.inner.shut_down();
    }

    /// The record under `key` of `table`.
    pub fn get<T: DeserializeOwned>(&self, table: Table, key: &[u8]) -> Result<Option<T>, StoreError> {
        match self.inner.backend.get(key)? {
            None => Ok(None),
            Some(sealed) => decode_sealed(table, key, &sealed).map(Some),
        }
    }

    /// Up to `limit` records of `table` whose key starts with `prefix` and sorts after
    /// `after`. A record that fails to decode comes back as its own error, so one corrupt
    /// record never hides the others.
    pub fn scan<T: DeserializeOwned>(
        &self,
        table: Table,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Decoded<T>, StoreError> {
        let start = match after {
            Some(a) if a >= prefix => {
                let mut s = a.to_vec();
                s.push(0);
                s
            }
            _ => prefix.to_vec(),
        };
        let rows = self.inner.backend.range(&start, &prefix_end(prefix), limit)?;
        Ok(rows
            .into_iter()
            .map(|(k, v)| {
                let decoded = decode_sealed(table, &k, &v);
                (k, decoded)
            })
            .collect())
    }

    /// Raw keys in `[start, end)`, for indexes whose keys carry all the information.
    pub fn keys_between(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Vec<u8>>, StoreError> {
        Ok(self.inner.backend.range(start, end, limit)?.into_iter().map(|(k, _)| k).collect())
    }

    /// Every raw entry of a table, for inspection and tests.
    pub fn raw_scan(&self, table: Table, limit: usize) -> Result<Entries, StoreError> {
        self.inner.backend.range(&[table.prefix], &prefix_end(&[table.prefix]), limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_the_next_prefix() {
        assert_eq!(prefix_end(b"ab"), b"ac".to_vec());
        assert_eq!(prefix_end(&[b'a', 0xff]), b"b".to_vec());
    }
}
