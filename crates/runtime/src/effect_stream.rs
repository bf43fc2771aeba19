//! Streaming effects (`Ctx::effect_stream`): an effect whose call sends chunks as they come —
//! a model's tokens — shown at once to the run's readers, and paid for once.
//!
//! The call is an effect like any other (§5): one idempotency key, minted once, a receipt
//! committed once. What it adds:
//! - each chunk the call sends through its [`StreamSink`] is shown to the run's readers as a
//!   partial chunk (`kernel/live_stream.rs`) at once, not durable;
//! - the call that succeeds has its chunks written to the run's output stream in the same
//!   batch as its receipt, and the receipt keeps them: the durable stream holds one complete
//!   copy of the answer that committed, and a re-entered fiber gets the receipt — its chunks
//!   matched against the stream, as `Ctx::emit` matches — without a call;
//! - a call that fails, times out or is cut off has its chunks taken back: readers see a
//!   reset, then the next call's chunks from its start.

use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
};

use serde::{Deserialize, Serialize};

use crate::{
    effect::EffectError,
    effect_ledger::ReceiptHooks,
    error::AgentError,
    json,
    kernel::{
        cell::RunCell,
        live_stream::{LiveEffect, LiveSlot},
        shared::{RawCtx, Shared},
    },
    stream,
};

/// Where a streaming effect's call sends its chunks (`Ctx::effect_stream`). Each chunk is
/// shown to the run's readers as it is sent; the chunks of the call that succeeds become the
/// run's durable output with the effect's receipt. Cheap to clone; a sink whose call is over
/// takes nothing more.
#[derive(Clone)]
pub struct StreamSink {
    call: Arc<SinkCall>,
}

struct SinkCall {
    shared: Arc<Shared>,
    cell: Arc<RunCell>,
    effect_id: String,
    call: u32,
    /// Bytes the run's output stream has room for.
    room: u64,
    used: AtomicU64,
}

impl StreamSink {
    /// Sends `chunk`: shown to the run's readers now, durable if this call succeeds. A chunk
    /// past the room left in the run's output stream (`stream_bytes_max`) is refused as a
    /// permanent error, as is one sent after the call ended.
    pub fn send<T: Serialize + ?Sized>(&self, chunk: &T) -> Result<(), EffectError> {
        let c = &self.call;
        let text = json::canonical(chunk).map_err(|e| EffectError::Permanent(e.into()))?;
        let text = c.shared.obs.redact(text);
        let used = c.used.fetch_add(text.len() as u64, Ordering::SeqCst).saturating_add(text.len() as u64);
        if used > c.room {
            return Err(EffectError::Permanent(format!(
                "the run's output stream is full: {used} bytes sent, room for {}",
                c.room
            )));
        }
        let mut slot = c.cell.output.live.lock();
        match slot.as_mut() {
            Some(slot) if slot.effect.is_call(&c.effect_id, c.call) && slot.effect.retracted.is_none() => {
                slot.effect.chunks.push(text);
                slot.touch();
                Ok(())
            }
            _ => Err(EffectError::Permanent(format!(
                "effect {}: call {} is over; its chunks are not taken",
                c.effect_id, c.call
            ))),
        }
    }

    /// This call's number within this entry of the effect, from 1.
    pub fn call(&self) -> u32 {
        self.call.call
    }
}

/// A streaming effect's receipt: the call's answer and the chunks it sent, and where in the
/// run's output stream they were written.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Streamed<R> {
    pub result: R,
    /// The chunks, as canonical JSON with secrets redacted.
    pub chunks: Vec<String>,
    /// The sequence number of the first of them in the run's output stream.
    pub first_seq: u64,
}

/// One streaming effect in one entry of the fiber: numbers its calls, opens and takes back
/// their slots, and writes or matches the chunks with the receipt.
pub(crate) struct StreamedEffect {
    shared: Arc<Shared>,
    cell: Arc<RunCell>,
    effect_id: String,
    room: u64,
    calls: AtomicU32,
    /// An earlier entry prepared the effect and did not commit it: its calls' chunks, which
    /// readers may hold, are void.
    prepared_before: AtomicBool,
}

impl StreamedEffect {
    pub fn new(raw: &RawCtx, effect_id: &str) -> Result<Arc<Self>, AgentError> {
        let room = stream::room(raw)?;
        Ok(Arc::new(StreamedEffect {
            shared: raw.shared.clone(),
            cell: raw.cell.clone(),
            effect_id: effect_id.to_string(),
            room,
            calls: AtomicU32::new(0),
            prepared_before: AtomicBool::new(false),
        }))
    }

    /// Opens the next call's slot, replacing the last one, and hands out its sink; the guard
    /// takes the call's chunks back unless the call succeeds.
    pub fn begin_call(self: &Arc<Self>) -> (StreamSink, CallGuard) {
        let call = self.calls.fetch_add(1, Ordering::SeqCst).saturating_add(1);
        let effect = LiveEffect {
            effect_id: self.effect_id.clone(),
            call,
            replaced: call > 1 || self.prepared_before.load(Ordering::SeqCst),
            chunks: Vec::new(),
            retracted: None,
        };
        *self.cell.output.live.lock() = Some(LiveSlot::new(effect));
        self.shared.signals.live_version.send_modify(|v| *v = v.wrapping_add(1));
        let sink = StreamSink {
            call: Arc::new(SinkCall {
                shared: self.shared.clone(),
                cell: self.cell.clone(),
                effect_id: self.effect_id.clone(),
                call,
                room: self.room,
                used: AtomicU64::new(0),
            }),
        };
        (sink, CallGuard { effect: self.clone(), call, done: false })
    }

    /// The chunks call `call` sent.
    fn chunks_of(&self, call: u32) -> Vec<String> {
        match self.cell.output.live.lock().as_ref() {
            Some(slot) if slot.effect.is_call(&self.effect_id, call) => slot.effect.chunks.clone(),
            _ => Vec::new(),
        }
    }

    /// Takes back what call `call` sent (or the last call, given `None`), for `reason`.
    pub fn retract(&self, call: Option<u32>, reason: &str) {
        let mut slot = self.cell.output.live.lock();
        let Some(slot) = slot.as_mut() else { return };
        let ours = slot.effect.effect_id == self.effect_id && call.is_none_or(|c| c == slot.effect.call);
        if ours && slot.effect.retracted.is_none() {
            slot.effect.chunks.clear();
            slot.effect.retracted = Some(reason.to_string());
            slot.touch();
            tracing::debug!(run_id = %self.cell.run_id, effect_id = self.effect_id, reason, "a streaming call's chunks were taken back");
        }
    }

    /// The effect committed (or was replayed): its chunks are durable, the slot goes.
    pub fn settled(&self) {
        let mut slot = self.cell.output.live.lock();
        if slot.as_ref().is_some_and(|s| s.effect.effect_id == self.effect_id) {
            *slot = None;
        }
    }

    /// The effect's end: committed, its slot goes and its answer is returned; not, what its
    /// last call sent is taken back.
    pub fn ended<R>(&self, performed: Result<Streamed<R>, AgentError>) -> Result<R, AgentError> {
        match performed {
            Ok(receipt) => {
                self.settled();
                Ok(receipt.result)
            }
            Err(e) => {
                self.retract(None, &format!("the effect did not commit: {e}"));
                Err(e)
            }
        }
    }
}

/// Takes a call's chunks back when the call fails or is dropped unfinished (a timeout, an
/// eviction).
pub(crate) struct CallGuard {
    effect: Arc<StreamedEffect>,
    call: u32,
    done: bool,
}

impl CallGuard {
    /// The call succeeded with `result`: its receipt, with the chunks it sent.
    pub fn succeeded<R>(mut self, result: R) -> Streamed<R> {
        self.done = true;
        Streamed { result, chunks: self.effect.chunks_of(self.call), first_seq: 0 }
    }

    /// The call failed with `error`.
    pub fn failed(mut self, error: &EffectError) {
        self.done = true;
        self.effect.retract(Some(self.call), &error.to_string());
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if !self.done {
            self.effect.retract(Some(self.call), "the call was cut off");
        }
    }
}

impl<R> ReceiptHooks<Streamed<R>> for StreamedEffect {
    fn entered(&self, prepared_before: bool) {
        self.prepared_before.store(prepared_before, Ordering::SeqCst);
    }

    fn before_commit(&self, raw: &RawCtx, receipt: &mut Streamed<R>) -> Result<(), AgentError> {
        receipt.first_seq = stream::next_seq(raw)?;
        for chunk in &receipt.chunks {
            stream::emit_json(raw, chunk.clone())?;
        }
        Ok(())
    }

    fn replayed(&self, raw: &RawCtx, receipt: &Streamed<R>) -> Result<(), AgentError> {
        // A fiber that stands where the chunks were written emits them again, matched with the
        // stream as `Ctx::emit` matches; one re-entered past them (its stash came after the
        // effect) does not.
        if stream::next_seq(raw)? <= receipt.first_seq {
            for chunk in &receipt.chunks {
                stream::emit_json(raw, chunk.clone())?;
            }
        }
        Ok(())
    }
}
