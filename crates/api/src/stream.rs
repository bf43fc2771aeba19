//! A run's output stream as a reader is shown it: durable chunks, a streaming effect's
//! partial chunks, and the resets that take those back.

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::time::Timestamp;

/// One durable chunk of a run's output stream.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamChunk {
    /// Its place in the stream: 0, 1, 2, … with no gap.
    pub seq: u64,
    /// The chunk, as canonical JSON.
    pub data_json: String,
    /// When the fiber emitted it, ms.
    pub emitted_at_ms: Timestamp,
}

impl StreamChunk {
    /// The chunk, typed.
    pub fn data<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(&self.data_json)
    }
}

/// What a reader of a run's output stream is shown, in order.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamItem {
    /// A durable chunk. It replaces every partial chunk shown before it: a streaming effect's
    /// call that committed has its chunks durable as the chunks that follow.
    Chunk(StreamChunk),
    /// A chunk a streaming effect's call sent, not durable yet: show it, and drop it at the
    /// next durable chunk or reset.
    Partial(PartialChunk),
    /// Drop the partial chunks shown of an effect: its call failed, was cut off, or another
    /// call of it began (after a crash, on the process that took the run over).
    Reset(StreamReset),
}

impl StreamItem {
    /// The durable chunk, if this is one.
    pub fn durable(self) -> Option<StreamChunk> {
        match self {
            StreamItem::Chunk(chunk) => Some(chunk),
            _ => None,
        }
    }
}

/// A chunk of a streaming effect's call, shown before it is durable.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartialChunk {
    /// The effect whose call sent it.
    pub effect_id: String,
    /// The call's number within this entry of the effect, from 1.
    pub call: u32,
    /// Its place among the call's chunks, from 0.
    pub index: u64,
    /// The chunk, as canonical JSON.
    pub data_json: String,
}

/// The partial chunks of an effect are taken back.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamReset {
    /// The effect whose partial chunks to drop.
    pub effect_id: String,
    /// Why: the call's error, or that another call began.
    pub reason: String,
}
