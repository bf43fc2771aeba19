//! A live run's output stream between boundaries: chunks the fiber emitted that are not
//! durable yet. Every boundary of the run takes them into its batch (`Shared::commit_boundary`,
//! `Shared::update_run_from`), so a chunk becomes durable with the next boundary; a failed
//! commit forgets what this buffer knew, and the next emit reads the stream's head again.

use durafiber_store::{
    Batch, StoreError,
    tables::{self, StreamChunkRecord, StreamHead},
};

/// The stream as this activation knows it: the head counting the chunks not yet durable, and
/// those chunks in sequence order.
#[derive(Debug, Default)]
pub(crate) struct StreamBuffer {
    pub head: StreamHead,
    pub pending: Vec<(u64, StreamChunkRecord)>,
}

impl StreamBuffer {
    /// Adds the pending chunks and the new head to `batch`; true when there were any.
    pub fn stage_into(&mut self, run_id: &str, batch: &mut Batch) -> Result<bool, StoreError> {
        if self.pending.is_empty() {
            return Ok(false);
        }
        for (seq, chunk) in self.pending.drain(..) {
            batch.put(tables::STREAM, tables::stream_key(run_id, seq), &chunk)?;
        }
        batch.put(tables::STREAM_HEADS, tables::STREAM_HEADS.key(&[run_id.as_bytes()]), &self.head)?;
        Ok(true)
    }
}
