//! Durable output streams: what a fiber emits for a client (model tokens, progress lines),
//! kept so that a client reconnecting after an eviction or a crash reads it again from any
//! point, exactly once and in order.
//!
//! A chunk gets its sequence number when emitted and becomes durable with the run's next
//! boundary (a stash, an effect, a wait, the fiber's end), in the same batch. Each stash
//! stores the fiber's place in the stream beside it (its mark), so a fiber re-entered there
//! emits again from that place: chunks the stream already holds are matched, not repeated,
//! and the first new one continues the stream. `emit_sync` makes a chunk durable before it
//! returns, at the price of a commit per chunk. Readers only ever see durable chunks: a chunk
//! a reader has seen is never taken back.

use std::sync::Arc;

use durafiber_store::tables::{StreamChunkRecord, StreamHead, keys};
use futures::Stream;
use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::{
    error::{AgentError, RuntimeError},
    json,
    kernel::{
        shared::{RawCtx, Shared},
        stream_buffer::StreamBuffer,
    },
    limits,
};

/// One durable chunk of a run's output stream.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamChunk {
    /// Its place in the stream: 0, 1, 2, … with no gap.
    pub seq: u64,
    /// The chunk, as canonical JSON.
    pub data_json: String,
    /// When the fiber emitted it, ms.
    pub emitted_at_ms: u64,
}

impl StreamChunk {
    /// The chunk, typed.
    pub fn data<T: DeserializeOwned>(&self) -> Result<T, AgentError> {
        json::parse(&self.data_json).map_err(AgentError::Serialization)
    }
}

/// The stream as stored, for a fiber entering the run: its head, and its cursor at the mark
/// of the stash the fiber re-enters (0 for a fiber that starts from the top).
fn load(shared: &Shared, run_id: &str) -> Result<StreamBuffer, RuntimeError> {
    let key = keys::stream_head(run_id);
    let head = shared.store.get::<StreamHead>(&key)?.unwrap_or_default();
    let key = keys::stream_mark(run_id);
    let mark = shared.store.get::<u64>(&key)?.unwrap_or(0);
    Ok(StreamBuffer { head, pending: Vec::new(), cursor: mark.min(head.next_seq), mark })
}

/// Emits `chunk` at the fiber's place in the run's stream; returns its sequence number.
///
/// A fiber re-entered at its last stash emits again what it emitted after that stash: where
/// the stream already holds a chunk at that place, the same chunk is taken as that one (not
/// stored, not shown again) and a different one is [`AgentError::StreamDiverged`]. Past the
/// stream's end the chunk is appended, durable with the run's next boundary.
pub(crate) fn emit<T: Serialize + ?Sized>(raw: &RawCtx, chunk: &T) -> Result<u64, AgentError> {
    if !raw.in_fiber {
        return Err(AgentError::EmitFromHandler);
    }
    let shared = &raw.shared;
    let text = json::canonical(chunk).map_err(AgentError::Serialization)?;
    let data_json = shared.redact(text);
    let mut guard = raw.cell.stream.lock();
    let buffer = match guard.as_mut() {
        Some(buffer) => buffer,
        None => guard.insert(load(shared, &raw.cell.run_id)?),
    };
    let seq = buffer.cursor;
    if seq < buffer.head.next_seq {
        let key = keys::stream_chunk(&raw.cell.run_id, seq);
        let held = shared.store.get::<StreamChunkRecord>(&key)?;
        if held.is_some_and(|held| held.data_json == data_json) {
            buffer.cursor = seq.saturating_add(1);
            return Ok(seq);
        }
        return Err(AgentError::StreamDiverged { seq });
    }
    let max = shared.config.stream_bytes_max;
    let bytes = buffer.head.bytes.saturating_add(data_json.len() as u64);
    if bytes > max {
        return Err(AgentError::StreamFull { bytes, max });
    }
    buffer.head = StreamHead { next_seq: seq.saturating_add(1), bytes };
    buffer.cursor = buffer.head.next_seq;
    buffer.pending.push((seq, StreamChunkRecord { data_json, emitted_at_ms: shared.now_ms() }));
    Ok(seq)
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
    let mut guard = raw.cell.stream.lock();
    if let Some(buffer) = guard.as_ref() {
        return Ok(buffer.cursor);
    }
    Ok(guard.insert(load(&raw.shared, &raw.cell.run_id)?).cursor)
}

/// The mark a stash written now stores with it, when it changed (see [`StreamBuffer::new_mark`]).
pub(crate) fn new_mark(raw: &RawCtx) -> Option<u64> {
    raw.cell.stream.lock().as_ref().and_then(StreamBuffer::new_mark)
}

/// After a stash with mark `mark` committed: the buffer knows it is stored.
pub(crate) fn marked(raw: &RawCtx, mark: u64) {
    if let Some(buffer) = raw.cell.stream.lock().as_mut() {
        buffer.mark = mark;
    }
}

/// Up to `limit` durable chunks of `run_id` from `from_seq` on.
pub(crate) fn read(
    shared: &Shared,
    run_id: &str,
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

/// The run's durable chunks from `from_seq` on, then each new one as it becomes durable; the
/// stream ends after the last chunk of a run that has ended.
pub(crate) fn follow(
    shared: Arc<Shared>,
    run_id: String,
    from_seq: u64,
) -> impl Stream<Item = Result<StreamChunk, RuntimeError>> + Send + 'static {
    struct Reader {
        shared: Arc<Shared>,
        run_id: String,
        next: u64,
        ready: std::collections::VecDeque<StreamChunk>,
        chunks: tokio::sync::watch::Receiver<u64>,
        statuses: tokio::sync::watch::Receiver<u64>,
        done: bool,
    }
    let reader = Reader {
        chunks: shared.stream_version.subscribe(),
        statuses: shared.status_version.subscribe(),
        shared,
        run_id,
        next: from_seq,
        ready: Default::default(),
        done: false,
    };
    futures::stream::unfold(reader, |mut r| async move {
        loop {
            if let Some(chunk) = r.ready.pop_front() {
                r.next = chunk.seq.saturating_add(1);
                return Some((Ok(chunk), r));
            }
            if r.done {
                return None;
            }
            // Marked seen before reading, so a chunk committed after the read wakes us.
            r.chunks.borrow_and_update();
            r.statuses.borrow_and_update();
            // A reader is shown only what is durable.
            if let Err(e) = r.shared.store.settle_reads().await {
                r.done = true;
                return Some((Err(e.into()), r));
            }
            // Read the status first: a run's last chunks are durable with its end, so once it
            // has ended, the read below sees all of them.
            let ended = match r.shared.load_run(&r.run_id) {
                Ok(run) => run.status.is_terminal(),
                Err(e) => {
                    r.done = true;
                    return Some((Err(e), r));
                }
            };
            match read(&r.shared, &r.run_id, r.next, limits::STREAM_READ_PAGE) {
                Ok(chunks) if !chunks.is_empty() => r.ready.extend(chunks),
                Ok(_) if ended => return None,
                Ok(_) => {
                    tokio::select! {
                        changed = r.chunks.changed() => if changed.is_err() { return None },
                        changed = r.statuses.changed() => if changed.is_err() { return None },
                        () = r.shared.foreign_writes_poll() => {}
                    }
                }
                Err(e) => {
                    r.done = true;
                    return Some((Err(e), r));
                }
            }
        }
    })
}
