//! Group commit: one writer thread applies the batches that arrive while a barrier is in
//! progress, then covers them all with one barrier, then acknowledges each.
//!
//! Throughput therefore grows with the number of concurrent writers instead of being capped at
//! one `fsync` per boundary. A `Sync` batch is acknowledged only after the barrier that covers
//! it has returned; an `Async` batch right after it is applied, with a barrier due within
//! `flush_every`.

use std::{
    sync::{Arc, mpsc},
    time::{Duration, Instant},
};

use tokio::sync::oneshot;

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
    Write { batch: Batch, durability: Durability, ack: Ack },
    Barrier { ack: Ack },
}

/// Settings of the writer thread.
#[derive(Debug, Clone, Copy)]
pub struct WriterConfig {
    /// Upper bound on how long an `Async` batch stays uncovered.
    pub flush_every: Duration,
    /// Most batches gathered into one group.
    pub group_batches_max: usize,
}

/// Copies an error for every waiter of one failed barrier (io errors are not `Clone`).
fn for_each_waiter(e: &StoreError) -> StoreError {
    match e {
        StoreError::Crashed => StoreError::Crashed,
        StoreError::Closed => StoreError::Closed,
        other => StoreError::Engine(format!("barrier failed: {other}")),
    }
}

pub(crate) fn spawn_writer(
    backend: Arc<dyn Backend>,
    config: WriterConfig,
) -> Result<(mpsc::Sender<Cmd>, std::thread::JoinHandle<()>), StoreError> {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::Builder::new()
        .name("durafiber-writer".into())
        .spawn(move || writer_loop(backend.as_ref(), &rx, config))
        .map_err(|source| StoreError::Io { path: "writer thread".into(), source })?;
    Ok((tx, handle))
}

fn writer_loop(backend: &dyn Backend, rx: &mpsc::Receiver<Cmd>, config: WriterConfig) {
    // Set while async writes are applied but not yet covered by a barrier.
    let mut flush_due: Option<Instant> = None;
    let mut waiting: Vec<Ack> = Vec::new();
    loop {
        let first = match flush_due {
            None => match rx.recv() {
                Ok(cmd) => Some(cmd),
                Err(_) => return,
            },
            Some(due) => match rx.recv_timeout(due.saturating_duration_since(Instant::now())) {
                Ok(cmd) => Some(cmd),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let _ = backend.barrier();
                    return;
                }
            },
        };
        let mut group = 0usize;
        let mut next = first;
        while let Some(cmd) = next {
            group += 1;
            match cmd {
                Cmd::Write { batch, durability, ack } => match (backend.apply(&batch), durability) {
                    (Err(e), _) => {
                        let _ = ack.send(Err(e));
                    }
                    (Ok(()), Durability::Sync) => waiting.push(ack),
                    (Ok(()), Durability::Async) => {
                        let _ = ack.send(Ok(()));
                        flush_due.get_or_insert_with(|| Instant::now() + config.flush_every);
                    }
                },
                Cmd::Barrier { ack } => waiting.push(ack),
            }
            next = if group < config.group_batches_max { rx.try_recv().ok() } else { None };
        }
        let flush_now = flush_due.is_some_and(|due| Instant::now() >= due);
        if waiting.is_empty() && !flush_now {
            continue;
        }
        let result = backend.barrier();
        if result.is_ok() {
            flush_due = None;
        }
        for ack in waiting.drain(..) {
            let _ = ack.send(match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(for_each_waiter(e)),
            });
        }
        if let Err(e) = result {
            tracing::error!(error = %e, "durability barrier failed");
        }
    }
}
