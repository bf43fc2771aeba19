//! Durable output streams: what a fiber emits for a client (model tokens, progress lines),
//! kept so that a client reconnecting after an eviction or a crash reads it again from any
//! point, exactly once and in order.
//!
//! A chunk gets its sequence number when emitted and becomes durable with the run's next
//! boundary (a stash, an effect, a wait, the fiber's end), in the same batch. Each stash
//! stores the fiber's place in the stream beside it (its mark), so a fiber re-entered there
//! emits again from that place: chunks the stream already holds are matched, not repeated,
//! and the first new one continues the stream. `emit_sync` makes a chunk durable before it
//! returns, at the price of a commit per chunk. A durable chunk a reader has seen is never
//! taken back.
//!
//! A streaming effect's call (`Ctx::effect_stream`) shows its chunks to the run's readers on
//! this node as it sends them, before they are durable: [`StreamItem::Partial`]. They are
//! provisional. The call that commits writes its chunks to the stream with its receipt, and
//! a durable chunk replaces every partial one shown before it; a call that fails or is cut off
//! has its chunks taken back with a [`StreamItem::Reset`], so no reader is left holding half
//! an answer.

use durafiber_store::RunId;
use std::sync::Arc;

use durafiber_store::tables::{ReemissionRecord, StreamChunkRecord, StreamHead, keys};
use futures::Stream;
use serde::Serialize;

use tokio::sync::watch;

use crate::{
    error::{AgentError, RuntimeError},
    json,
    kernel::{
        live_stream::{Next, Shown},
        shared::{RawCtx, Shared},
        stream_buffer::StreamBuffer,
    },
    limits,
};

pub use durafiber_api::{PartialChunk, StreamChunk, StreamItem, StreamReset};

/// The stream as stored, for a fiber entering the run: its head, and its cursor at the mark
/// of the stash the fiber re-enters (0 for a fiber that starts from the top).
fn load(shared: &Shared, run_id: &RunId) -> Result<StreamBuffer, RuntimeError> {
    let key = keys::stream_head(run_id);
    let head = shared.store.get::<StreamHead>(&key)?.unwrap_or_default();
    let key = keys::stream_mark(run_id);
    let mark = shared.store.get::<u64>(&key)?.unwrap_or(0);
    Ok(StreamBuffer {
        head,
        pending: Vec::new(),
        cursor: mark.min(head.next_seq),
        mark,
        reemissions: Vec::new(),
    })
}

/// Emits `chunk` at the fiber's place in the run's stream; returns its sequence number.
///
/// A fiber re-entered at its last stash emits again what it emitted after that stash: where
/// the stream already holds a chunk at that place, the chunk is taken as that one (not
/// stored, not shown again). Past the stream's end the chunk is appended, durable with the
/// run's next boundary.
///
/// A re-emitted chunk that differs from the durable one — a deploy reworded it — is not the
/// run's error: what is durable stands, exactly once, and the difference is recorded (an
/// event, a counter, a `stream_reemissions` record with the next boundary). Under
/// `strict_streams` (what `AgentCheck` runs with, where code does not change between
/// attempts) it is [`AgentError::StreamDiverged`].
pub(crate) fn emit<T: Serialize + ?Sized>(raw: &RawCtx, chunk: &T) -> Result<u64, AgentError> {
    let text = json::canonical(chunk).map_err(|e| AgentError::Serialization(e.into()))?;
    emit_json(raw, raw.shared.obs.redact(text))
}

/// [`emit`] of a chunk already canonical JSON with secrets redacted.
pub(crate) fn emit_json(raw: &RawCtx, data_json: String) -> Result<u64, AgentError> {
    if !raw.in_fiber {
        return Err(AgentError::EmitFromHandler);
    }
    let shared = &raw.shared;
    let mut guard = raw.cell.output.stream.lock();
    let buffer = match guard.as_mut() {
        Some(buffer) => buffer,
        None => guard.insert(Box::new(load(shared, &raw.cell.run_id)?)),
    };
    let seq = buffer.cursor;
    if seq < buffer.head.next_seq {
        let key = keys::stream_chunk(&raw.cell.run_id, seq);
        let held = shared.store.get::<StreamChunkRecord>(&key)?;
        let same = held.as_ref().is_some_and(|held| held.data_json == data_json);
        if !same && (held.is_none() || shared.config.strict_streams) {
            return Err(AgentError::StreamDiverged { seq });
        }
        if !same {
            buffer.reemissions.push(reemission(shared, &raw.cell.run_id, seq, data_json));
        }
        buffer.cursor = seq.saturating_add(1);
        return Ok(seq);
    }
    let max = shared.config.stream_bytes_max;
    let bytes = buffer.head.bytes.saturating_add(data_json.len() as u64);
    if bytes > max {
        return Err(AgentError::StreamFull { bytes, max });
    }
    buffer.head = StreamHead { next_seq: seq.saturating_add(1), bytes };
    buffer.cursor = buffer.head.next_seq;
    buffer.pending.push((seq, StreamChunkRecord { data_json, emitted_at_ms: shared.now() }));
    Ok(seq)
}

/// A chunk re-emitted at `seq` unlike the durable one: traced, counted, logged in the run's
/// timeline, and its record for the next boundary.
fn reemission(shared: &Shared, run_id: &RunId, seq: u64, data_json: String) -> ReemissionRecord {
    tracing::info!(%run_id, seq, "output stream: chunk re-emitted differently; the durable chunk stands");
    crate::metrics::Metrics::bump(&shared.obs.metrics.stream_reemissions);
    shared.event(
        run_id,
        "stream_reemitted",
        format!("chunk {seq} re-emitted differently (after a deploy?); the durable chunk stands"),
    );
    let emitted_bytes = data_json.len() as u64;
    let mut emitted_json = data_json;
    if emitted_json.len() > ReemissionRecord::KEPT_BYTES {
        let mut cut = ReemissionRecord::KEPT_BYTES;
        while !emitted_json.is_char_boundary(cut) {
            cut -= 1;
        }
        emitted_json.truncate(cut);
    }
    ReemissionRecord { seq, emitted_json, emitted_bytes, at_ms: shared.now() }
}

/// `emit`, then a boundary that carries it: durable when this returns.
pub(crate) async fn emit_sync<T: Serialize + ?Sized>(raw: &RawCtx, chunk: &T) -> Result<u64, AgentError> {
    let seq = emit(raw, chunk)?;
    let batch = durafiber_store::Batch::new();
    raw.shared.commit_boundary(&raw.cell, batch, durafiber_store::Durability::Sync).await?;
    Ok(seq)
}

/// The sequence number the fiber's next chunk gets: after a re-entry, its place in the
/// stream at the stash it re-entered.
pub(crate) fn next_seq(raw: &RawCtx) -> Result<u64, AgentError> {
    let mut guard = raw.cell.output.stream.lock();
    if let Some(buffer) = guard.as_ref() {
        return Ok(buffer.cursor);
    }
    Ok(guard.insert(Box::new(load(&raw.shared, &raw.cell.run_id)?)).cursor)
}

/// Bytes the run's output stream has room for before `stream_bytes_max`.
pub(crate) fn room(raw: &RawCtx) -> Result<u64, AgentError> {
    let mut guard = raw.cell.output.stream.lock();
    let bytes = match guard.as_ref() {
        Some(buffer) => buffer.head.bytes,
        None => guard.insert(Box::new(load(&raw.shared, &raw.cell.run_id)?)).head.bytes,
    };
    Ok(raw.shared.config.stream_bytes_max.saturating_sub(bytes))
}

/// The mark a stash written now stores with it, when it changed (see [`StreamBuffer::new_mark`]).
pub(crate) fn new_mark(raw: &RawCtx) -> Option<u64> {
    raw.cell.output.stream.lock().as_deref().and_then(StreamBuffer::new_mark)
}

/// Up to `limit` durable chunks of `run_id` from `from_seq` on.
pub(crate) fn read(
    shared: &Shared,
    run_id: &RunId,
    from_seq: u64,
    limit: usize,
) -> Result<Vec<StreamChunk>, RuntimeError> {
    let after = from_seq.checked_sub(1).map(|seq| keys::stream_chunk(run_id, seq));
    let mut out = Vec::new();
    for (key, chunk) in shared.store.scan(&keys::STREAM.of_run(run_id), after.as_ref(), limit)? {
        let chunk = chunk?;
        let Some(seq) = keys::stream_seq(&key) else { continue };
        out.push(StreamChunk { seq, data_json: chunk.data_json, emitted_at_ms: chunk.emitted_at_ms });
    }
    Ok(out)
}

/// The run's durable chunks from `from_seq` on, then each new one as it becomes durable, and
/// between them the partial chunks of a streaming effect's call running on this node; the
/// stream ends after the last chunk of a run that has ended.
pub(crate) fn follow(
    shared: Arc<Shared>,
    run_id: RunId,
    from_seq: u64,
) -> impl Stream<Item = Result<StreamItem, RuntimeError>> + Send + 'static {
    let reader = Reader {
        chunks: shared.signals.stream_version.subscribe(),
        statuses: shared.signals.status_version.subscribe(),
        begun: shared.signals.live_version.subscribe(),
        shared,
        run_id,
        next: from_seq,
        ready: Default::default(),
        live: None,
        shown: Shown::default(),
        done: false,
    };
    futures::stream::unfold(reader, |mut r| async move {
        loop {
            if let Some(item) = r.ready.pop_front() {
                if let StreamItem::Chunk(chunk) = &item {
                    r.next = chunk.seq.saturating_add(1);
                    r.shown.durable_shown();
                }
                return Some((Ok(item), r));
            }
            if r.done {
                return None;
            }
            match r.fill().await {
                Err(e) => {
                    r.done = true;
                    return Some((Err(e), r));
                }
                Ok(Filled::Ended) => return None,
                Ok(Filled::Items) => continue,
                Ok(Filled::Nothing) => {}
            }
            if !r.changed().await {
                return None;
            }
        }
    })
}

/// A reader of a run's stream ([`follow`]): where it stands, what it has to show, and the
/// channels that say something new may be there.
struct Reader {
    shared: Arc<Shared>,
    run_id: RunId,
    next: u64,
    ready: std::collections::VecDeque<StreamItem>,
    chunks: watch::Receiver<u64>,
    statuses: watch::Receiver<u64>,
    begun: watch::Receiver<u64>,
    /// The running call's channel, once one was found.
    live: Option<watch::Receiver<u64>>,
    shown: Shown,
    done: bool,
}

/// What one look at the stream found.
enum Filled {
    /// Items to show.
    Items,
    /// Nothing, and the run has ended: the stream is over.
    Ended,
    /// Nothing yet.
    Nothing,
}

impl Reader {
    /// Reads what is there to show: durable chunks past the last shown, else the running
    /// call's partial chunks.
    async fn fill(&mut self) -> Result<Filled, RuntimeError> {
        // Marked seen before reading, so a chunk committed after the read wakes us.
        self.chunks.borrow_and_update();
        self.statuses.borrow_and_update();
        self.begun.borrow_and_update();
        if let Some(live) = self.live.as_mut() {
            live.borrow_and_update();
        }
        // A reader is shown only what is durable, but for partial chunks, which say so.
        self.shared.store.settle_reads().await?;
        // Read the status first: a run's last chunks are durable with its end, so once it
        // has ended, the read below sees all of them.
        let ended = self.shared.load_run(&self.run_id)?.status.is_terminal();
        let chunks = read(&self.shared, &self.run_id, self.next, limits::STREAM_READ_PAGE)?;
        if !chunks.is_empty() {
            self.ready.extend(chunks.into_iter().map(StreamItem::Chunk));
            return Ok(Filled::Items);
        }
        if ended {
            return Ok(Filled::Ended);
        }
        // Caught up with the durable chunks: what the running call has sent since.
        partial_items(&self.shared, &self.run_id, &mut self.shown, &mut self.live, &mut self.ready);
        Ok(if self.ready.is_empty() { Filled::Nothing } else { Filled::Items })
    }

    /// Waits until something may have changed; false when the runtime has gone.
    async fn changed(&mut self) -> bool {
        let live_changed = async {
            match self.live.as_mut() {
                Some(live) => live.changed().await.is_err(),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = self.chunks.changed() => return changed.is_ok(),
            changed = self.statuses.changed() => return changed.is_ok(),
            changed = self.begun.changed() => return changed.is_ok(),
            gone = live_changed => if gone { self.live = None },
            () = self.shared.foreign_writes_poll() => {}
        }
        true
    }
}

/// The partial chunks (and resets) the run's running streaming call has for a reader that has
/// shown `shown`; subscribes the reader to the call's changes.
fn partial_items(
    shared: &Shared,
    run_id: &RunId,
    shown: &mut Shown,
    live: &mut Option<watch::Receiver<u64>>,
    ready: &mut std::collections::VecDeque<StreamItem>,
) {
    let Some(run) = shared.registry.get(run_id) else { return };
    let slot = run.cell.output.live.lock();
    let Some(slot) = slot.as_ref() else { return };
    if live.is_none() {
        let mut receiver = slot.changed.subscribe();
        receiver.borrow_and_update();
        *live = Some(receiver);
    }
    for next in slot.effect.next_for(shown) {
        match next {
            Next::Reset { effect_id, reason } => {
                ready.push_back(StreamItem::Reset(StreamReset { effect_id, reason }));
            }
            Next::Partial { effect_id, call, index, chunks } => {
                ready.extend(chunks.into_iter().enumerate().map(|(i, data_json)| {
                    StreamItem::Partial(PartialChunk {
                        effect_id: effect_id.clone(),
                        call,
                        index: (index + i) as u64,
                        data_json,
                    })
                }));
            }
        }
    }
}
