//! How the writer gathers work: what it does next, the cadence of a task committing in a
//! loop, and one group — the merged batch of what arrived during the last barrier and who
//! waits for what.

use std::{
    sync::{
        atomic::Ordering::{Relaxed, SeqCst},
        mpsc,
    },
    time::{Duration, Instant},
};

use tokio::sync::{OwnedSemaphorePermit, oneshot};

use super::{Ack, Cmd, Durability, QUIET_AFTER, SPIN_FOR, Writer, WriterStats, health::Health};
use crate::{backend::Backend, batch::Batch, error::StoreError};

/// What the writer does next.
pub(super) enum Next {
    Command(Cmd),
    /// Async writes wait for their barrier.
    FlushDue,
    /// Nothing came for `QUIET_AFTER`, or nothing at all was due.
    Quiet,
    /// Every sender is gone.
    Closed,
}

/// Tells one task committing in a loop from anything else. Its commits come one to a group,
/// each right after the last was acknowledged, and begin with the same key (a run's stash).
/// For such a task the writer looks for the next commit for `SPIN_FOR` before it sleeps:
/// waking a sleeping thread costs about as much as the task takes between its commits. A
/// burst of alarm deliveries also commits one at a time, but each for another run; there
/// spinning would only take a core from the deliveries. The writer also checks it is not
/// crowded (`crowding::Crowding`) before it spins.
#[derive(Default)]
pub(super) struct Cadence {
    /// The first key of the last group, when it was one commit.
    pub(super) last_key: Vec<u8>,
    pub(super) last_lone: bool,
    pub(super) looping: bool,
}

impl Cadence {
    /// Takes in a gathered group and how long the writer waited for its first command.
    pub(super) fn observe(&mut self, group: &Group, waited: Duration) {
        let key = match (group.parts.as_slice(), group.merged.ops.first()) {
            ([_], Some(op)) => Some(op.key()),
            _ => None,
        };
        self.looping = waited < SPIN_FOR && self.last_lone && key == Some(self.last_key.as_slice());
        self.last_lone = key.is_some();
        if let Some(key) = key
            && key != self.last_key.as_slice()
        {
            self.last_key.clear();
            self.last_key.extend_from_slice(key);
        }
    }
}

/// Waits for the next command, for the async flush deadline, or for a quiet spell to end.
/// With neither due it still looks again after `QUIET_AFTER`: a lone commit written on its
/// own thread may have started a quiet spell the thread did not see. `spin`: look for the
/// next command for `SPIN_FOR` before sleeping (see `Cadence`).
pub(super) fn next_command(
    rx: &mpsc::Receiver<Cmd>,
    flush_due: Option<Instant>,
    quiet_due: Option<Instant>,
    spin: bool,
) -> Next {
    if spin && let Some(until) = Instant::now().checked_add(SPIN_FOR) {
        while Instant::now() < until {
            match rx.try_recv() {
                Ok(cmd) => return Next::Command(cmd),
                Err(mpsc::TryRecvError::Empty) => std::thread::yield_now(),
                Err(mpsc::TryRecvError::Disconnected) => return Next::Closed,
            }
        }
    }
    let until = flush_due.into_iter().chain(quiet_due).min().unwrap_or_else(|| Instant::now() + QUIET_AFTER);
    match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
        Ok(cmd) => Next::Command(cmd),
        Err(mpsc::RecvTimeoutError::Timeout) if flush_due.is_some_and(|due| Instant::now() >= due) => {
            Next::FlushDue
        }
        Err(mpsc::RecvTimeoutError::Timeout) => Next::Quiet,
        Err(mpsc::RecvTimeoutError::Disconnected) => Next::Closed,
    }
}

/// One write of a group: where its ops and absent keys sit in the merged batch, and who
/// waits for it.
pub(super) struct Part {
    pub(super) ops: std::ops::Range<usize>,
    pub(super) absent: std::ops::Range<usize>,
    pub(super) durability: Durability,
    pub(super) ack: Ack,
    /// Set when this write alone was refused (see `Group::apply_apart`).
    pub(super) refused: Option<StoreError>,
}

/// One gathered group: the merged writes and who waits for what.
#[derive(Default)]
pub(super) struct Group {
    pub(super) merged: Batch,
    pub(super) parts: Vec<Part>,
    pub(super) barrier_acks: Vec<Ack>,
    pub(super) snapshot_acks: Vec<oneshot::Sender<Result<crate::backend::Entries, StoreError>>>,
    pub(super) rooms: Vec<OwnedSemaphorePermit>,
}

impl Group {
    /// The writes sent ahead of the queue, then everything queued behind `first`: what
    /// arrived during the last barrier.
    pub(super) fn gather(first: Option<Cmd>, rx: &mpsc::Receiver<Cmd>, writer: &Writer) -> Group {
        let mut g = Group::default();
        for (batch, ack) in writer.take_ahead() {
            g.add(batch, Durability::Sync, ack, &writer.stats);
        }
        let mut next = first;
        let mut count = 0usize;
        while let Some(cmd) = next {
            count += 1;
            writer.queued.fetch_sub(1, SeqCst);
            match cmd {
                Cmd::Write { batch, durability, ack, room } => {
                    g.add(batch, durability, ack, &writer.stats);
                    g.rooms.push(room);
                }
                Cmd::Barrier { ack } => g.barrier_acks.push(ack),
                Cmd::Snapshot { ack } => g.snapshot_acks.push(ack),
                // A write sent ahead after this group took those before it: its wake-up is
                // read here, so the write comes too, or it would wait for the next command.
                Cmd::Wake => {
                    for (batch, ack) in writer.take_ahead() {
                        g.add(batch, Durability::Sync, ack, &writer.stats);
                    }
                }
            }
            next = if count < writer.config.group_batches_max { rx.try_recv().ok() } else { None };
        }
        g
    }

    /// Adds one write to the merged batch.
    pub(super) fn add(&mut self, batch: Batch, durability: Durability, ack: Ack, stats: &WriterStats) {
        stats.batches.fetch_add(1, Relaxed);
        let (ops, absent) = (self.merged.ops.len(), self.merged.absent.len());
        self.merged.extend(batch);
        self.parts.push(Part {
            ops: ops..self.merged.ops.len(),
            absent: absent..self.merged.absent.len(),
            durability,
            ack,
            refused: None,
        });
    }

    /// After the merged write was refused for one batch's sake (a key that exists, a shard
    /// not owned): applies each write on its own, so only the ones refused fail. Returns
    /// the first engine failure, which ends the group as a whole.
    pub(super) fn apply_apart(&mut self, backend: &dyn Backend, health: &Health) -> Result<(), StoreError> {
        for part in &mut self.parts {
            let alone = Batch {
                ops: self.merged.ops[part.ops.clone()].to_vec(),
                absent: self.merged.absent[part.absent.clone()].to_vec(),
            };
            match health.working(|| backend.apply(&alone)) {
                Ok(()) => {}
                Err(e) if e.is_batch_refusal() => part.refused = Some(e),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Answers every waiter with `e`.
    pub(super) fn fail_all(self, e: &StoreError) {
        for ack in self.parts.into_iter().map(|p| p.ack).chain(self.barrier_acks) {
            let _ = ack.send(Err(e.duplicate()));
        }
        for ack in self.snapshot_acks {
            let _ = ack.send(Err(e.duplicate()));
        }
    }

    /// Hands every snapshot waiter the whole keyspace as it stands after this group.
    pub(super) fn answer_snapshots(&mut self, backend: &dyn Backend) {
        if self.snapshot_acks.is_empty() {
            return;
        }
        let entries = backend.range(&[], &[0xff; 16], usize::MAX);
        for ack in self.snapshot_acks.drain(..) {
            let _ = ack.send(entries.as_ref().map(Clone::clone).map_err(StoreError::duplicate));
        }
    }
}
