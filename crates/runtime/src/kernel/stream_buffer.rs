//! A live run's output stream between boundaries: chunks the fiber emitted that are not
//! durable yet, and where this activation of the fiber stands in the stream. Every boundary
//! of the run takes the chunks into its batch (`Shared::commit_boundary`,
//! `Shared::update_run_from`), so a chunk becomes durable with the next boundary; a failed
//! commit forgets what this buffer knew, and the next emit reads the stream again.

use durafiber_store::RunId;
use durafiber_store::{
    Batch, StoreError,
    tables::{ReemissionRecord, StreamChunkRecord, StreamHead, keys},
};

/// The stream as this activation knows it.
#[derive(Debug, Default)]
pub(crate) struct StreamBuffer {
    /// The head, counting the chunks not yet durable.
    pub head: StreamHead,
    /// Chunks not yet durable, in sequence order.
    pub pending: Vec<(u64, StreamChunkRecord)>,
    /// The sequence number the fiber's next chunk has: below `head` after a re-entry, while
    /// the fiber emits again what the stream already holds.
    pub cursor: u64,
    /// The stream mark stored with the run's last stash (`tables::STREAM_MARKS`).
    pub mark: u64,
    /// Chunks this activation emitted differently from the durable ones at their places,
    /// recorded with the next boundary.
    pub reemissions: Vec<ReemissionRecord>,
}

impl StreamBuffer {
    /// Adds the pending chunks and the new head to `batch`; true when there were any.
    pub fn stage_into(&mut self, run_id: &RunId, batch: &mut Batch) -> Result<bool, StoreError> {
        for reemission in self.reemissions.drain(..) {
            batch.put(keys::stream_reemission(run_id, reemission.seq), &reemission)?;
        }
        if self.pending.is_empty() {
            return Ok(false);
        }
        for (seq, chunk) in self.pending.drain(..) {
            batch.put(keys::stream_chunk(run_id, seq), &chunk)?;
        }
        batch.put(keys::stream_head(run_id), &self.head)?;
        Ok(true)
    }

    /// The mark a stash written now stores, when it differs from the stored one: the
    /// fiber's place in the stream, which is where a fiber re-entered at that stash stands.
    pub fn new_mark(&self) -> Option<u64> {
        (self.cursor != self.mark).then_some(self.cursor)
    }
}
