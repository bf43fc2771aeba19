//! Group commit: one writer thread gathers the batches that arrive while a barrier is in
//! progress, applies them as one atomic write, covers them with one barrier, then
//! acknowledges each.
//!
//! Throughput therefore grows with the number of concurrent writers instead of being capped at
//! one `fsync` per boundary. A `Sync` batch is acknowledged only after the barrier that covers
//! it has returned; an `Async` batch right after it is applied, with a barrier due within
//! `flush_every`. Merging a group into one engine write keeps every batch atomic (the group
//! is all or nothing, which is stronger) and costs the engine one log entry instead of many.

use std::{
    sync::{Arc, mpsc},
    time::{Duration, Instant},
};

use tokio::sync::{OwnedSemaphorePermit, oneshot};

use crate::{Backend, Batch, StoreError};

/// How durable a batch must be before `commit` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Durability {
    /// Return after a barrier covered the batch: it survives a crash and a power loss.
    Sync,
    /// Return once the batch is applied; a barrier covers it within `flush_every`.
    Async,
}

pub(crate) type Ack = oneshot::Sender<Result<(), StoreError>>;

pub(crate) enum Cmd {
    /// `room` is the write's place in the bounded queue, given back once it is applied.
    Write {
        batch: Batch,
        durability: Durability,
        ack: Ack,
        room: OwnedSemaphorePermit,
    },
    Barrier {
        ack: Ack,
    },
}

/// Settings of the writer thread.
#[derive(Debug, Clone, Copy)]
pub struct WriterConfig {
    /// Upper bound on how long an `Async` batch stays uncovered.
    pub flush_every: Duration,
    /// Most batches gathered into one group.
    pub group_batches_max: usize,
}

/// What the writer has done, for tests and figures: group commit shows as fewer barriers
/// than batches.
#[derive(Debug, Default)]
pub struct WriterStats {
    /// Batches applied.
    pub batches: std::sync::atomic::AtomicU64,
    /// Barriers run.
    pub barriers: std::sync::atomic::AtomicU64,
}

/// Copies an error for every waiter of one failed write (io errors are not `Clone`).
fn for_each_waiter(e: &StoreError) -> StoreError {
    match e {
        StoreError::Crashed => StoreError::Crashed,
        StoreError::Closed => StoreError::Closed,
        other => StoreError::Engine(other.to_string()),
    }
}

pub(crate) fn spawn_writer(
    backend: Arc<dyn Backend>,
    config: WriterConfig,
    stats: Arc<WriterStats>,
) -> Result<(mpsc::Sender<Cmd>, std::thread::JoinHandle<()>), StoreError> {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::Builder::new()
        .name("durafiber-writer".into())
        .spawn(move || writer_loop(backend.as_ref(), &rx, config, &stats))
        .map_err(|source| StoreError::Io { path: "writer thread".into(), source })?;
    Ok((tx, handle))
}

/// Waits for the next command, or for the async flush deadline; `None` on shutdown.
fn next_command(rx: &mpsc::Receiver<Cmd>, flush_due: Option<Instant>) -> Option<Option<Cmd>> {
    match flush_due {
        None => rx.recv().ok().map(Some),
        Some(due) => match rx.recv_timeout(due.saturating_duration_since(Instant::now())) {
            Ok(cmd) => Some(Some(cmd)),
            Err(mpsc::RecvTimeoutError::Timeout) => Some(None),
            Err(mpsc::RecvTimeoutError::Disconnected) => None,
        },
    }
}

fn writer_loop(backend: &dyn Backend, rx: &mpsc::Receiver<Cmd>, config: WriterConfig, stats: &WriterStats) {
    use std::sync::atomic::Ordering::Relaxed;
    // Set while async writes are applied but not yet covered by a barrier.
    let mut flush_due: Option<Instant> = None;
    loop {
        let Some(first) = next_command(rx, flush_due) else {
            let _ = backend.barrier();
            return;
        };
        // Gather what is queued: everything that arrived during the last barrier.
        let mut merged = Batch::new();
        let mut sync_acks: Vec<Ack> = Vec::new();
        let mut async_acks: Vec<Ack> = Vec::new();
        let mut barrier_acks: Vec<Ack> = Vec::new();
        let mut rooms: Vec<OwnedSemaphorePermit> = Vec::new();
        let mut next = first;
        let mut group = 0usize;
        while let Some(cmd) = next {
            group += 1;
            match cmd {
                Cmd::Write { batch, durability, ack, room } => {
                    stats.batches.fetch_add(1, Relaxed);
                    merged.extend(batch);
                    rooms.push(room);
                    match durability {
                        Durability::Sync => sync_acks.push(ack),
                        Durability::Async => async_acks.push(ack),
                    }
                }
                Cmd::Barrier { ack } => barrier_acks.push(ack),
            }
            next = if group < config.group_batches_max { rx.try_recv().ok() } else { None };
        }
        let applied = if merged.is_empty() { Ok(()) } else { backend.apply(&merged) };
        // Applied (or refused): the queue has room again while the barrier runs.
        drop(rooms);
        if let Err(e) = applied {
            tracing::error!(error = %e, batches = sync_acks.len() + async_acks.len(), "write failed");
            for ack in sync_acks.drain(..).chain(async_acks.drain(..)) {
                let _ = ack.send(Err(for_each_waiter(&e)));
            }
        }
        if !async_acks.is_empty() {
            for ack in async_acks {
                let _ = ack.send(Ok(()));
            }
            flush_due.get_or_insert_with(|| Instant::now() + config.flush_every);
        }
        let flush_now = flush_due.is_some_and(|due| Instant::now() >= due);
        if sync_acks.is_empty() && barrier_acks.is_empty() && !flush_now {
            continue;
        }
        let result = backend.barrier();
        stats.barriers.fetch_add(1, Relaxed);
        if result.is_ok() {
            flush_due = None;
        } else if let Err(e) = &result {
            tracing::error!(error = %e, "durability barrier failed");
        }
        for ack in sync_acks.into_iter().chain(barrier_acks) {
            let _ = ack.send(result.as_ref().map(|_| ()).map_err(for_each_waiter));
        }
    }
}
