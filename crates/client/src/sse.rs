//! Following a run's output stream over server-sent events, reopened with `Last-Event-ID`
//! when the connection drops, so that every durable chunk arrives once and in order. Partial
//! chunks shown before a drop are taken back with a reset: the server that answers the
//! reopened stream may be another process, whose call starts over.

use std::time::{Duration, Instant};

use durafiber_api::{PartialChunk, StreamChunk, StreamItem, StreamReset};
use futures::{SinkExt as _, Stream, StreamExt as _, channel::mpsc};
use reqwest::Method;

use crate::{Client, error::ClientError};

/// How long to wait before reopening a dropped stream.
const REOPEN_PAUSE: Duration = Duration::from_millis(200);

/// One event of the stream as the server frames it.
#[derive(Debug, Default)]
struct Frame {
    event: String,
    id: Option<String>,
    data: String,
}

/// Splits server-sent events out of the bytes received so far; what is left is an
/// incomplete event.
fn frames(buffer: &mut String) -> Vec<Frame> {
    let mut out = Vec::new();
    while let Some(end) = buffer.find("\n\n") {
        let block: String = buffer.drain(..end + 2).collect();
        let mut frame = Frame::default();
        for line in block.lines() {
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => frame.event = value.to_string(),
                "id" => frame.id = Some(value.to_string()),
                "data" => {
                    if !frame.data.is_empty() {
                        frame.data.push('\n');
                    }
                    frame.data.push_str(value);
                }
                _ => {}
            }
        }
        if !frame.event.is_empty() || !frame.data.is_empty() {
            out.push(frame);
        }
    }
    out
}

/// Why one connection of the stream ended.
enum Ended {
    /// The server said the run ended: the stream is complete.
    Complete,
    /// The connection dropped: reopen after the last chunk.
    Dropped,
    /// The consumer went away.
    Abandoned,
}

/// What the stream has shown since its last durable chunk.
#[derive(Default)]
struct Shown {
    /// The effect whose partial chunks were shown and not yet replaced or taken back.
    partial_of: Option<String>,
}

/// Reads one connection, sending each item on; `next` is the first chunk not yet sent.
async fn one_connection(
    client: &Client,
    path: &str,
    next: &mut u64,
    shown: &mut Shown,
    tx: &mut mpsc::Sender<Result<StreamItem, ClientError>>,
) -> Result<Ended, ClientError> {
    let from = *next;
    let response = client
        .send(Method::GET, path, |r| {
            let r = r.header(reqwest::header::ACCEPT, "text/event-stream");
            match from.checked_sub(1) {
                Some(last) => r.header("Last-Event-ID", last.to_string()),
                None => r,
            }
        })
        .await?;
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    while let Some(bytes) = body.next().await {
        let Ok(bytes) = bytes else { return Ok(Ended::Dropped) };
        buffer.push_str(&String::from_utf8_lossy(&bytes));
        for frame in frames(&mut buffer) {
            match frame.event.as_str() {
                "chunk" => {
                    let Some(seq) = frame.id.as_deref().and_then(|id| id.parse::<u64>().ok()) else {
                        return Err(ClientError::Decode(format!(
                            "a chunk without a sequence number: {frame:?}"
                        )));
                    };
                    if seq < *next {
                        continue;
                    }
                    *next = seq.saturating_add(1);
                    shown.partial_of = None;
                    let chunk = StreamChunk {
                        seq,
                        data_json: frame.data,
                        emitted_at_ms: durafiber_api::Timestamp::ZERO,
                    };
                    if tx.send(Ok(StreamItem::Chunk(chunk))).await.is_err() {
                        return Ok(Ended::Abandoned);
                    }
                }
                "partial" => {
                    let partial = parse_partial(&frame.data)?;
                    shown.partial_of = Some(partial.effect_id.clone());
                    if tx.send(Ok(StreamItem::Partial(partial))).await.is_err() {
                        return Ok(Ended::Abandoned);
                    }
                }
                "reset" => {
                    let reset: StreamReset = serde_json::from_str(&frame.data)
                        .map_err(|e| ClientError::Decode(format!("a reset event: {e}: {}", frame.data)))?;
                    shown.partial_of = None;
                    if tx.send(Ok(StreamItem::Reset(reset))).await.is_err() {
                        return Ok(Ended::Abandoned);
                    }
                }
                "end" => return Ok(Ended::Complete),
                "error" => return Err(ClientError::Decode(frame.data)),
                _ => {}
            }
        }
    }
    Ok(Ended::Dropped)
}

/// A `partial` event's data: `{"effect_id", "call", "index", "data"}`.
fn parse_partial(data: &str) -> Result<PartialChunk, ClientError> {
    #[derive(serde::Deserialize)]
    struct Wire {
        effect_id: String,
        call: u32,
        index: u64,
        data: Box<serde_json::value::RawValue>,
    }
    let wire: Wire = serde_json::from_str(data)
        .map_err(|e| ClientError::Decode(format!("a partial event: {e}: {data}")))?;
    Ok(PartialChunk {
        effect_id: wire.effect_id,
        call: wire.call,
        index: wire.index,
        data_json: wire.data.get().to_string(),
    })
}

/// The items of `path` from `from` on; see [`Client::stream`].
pub(crate) fn follow(
    client: Client,
    path: String,
    from: u64,
) -> impl Stream<Item = Result<StreamItem, ClientError>> + Send + 'static {
    let (mut tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let mut next = from;
        let mut shown = Shown::default();
        let mut failing_since: Option<Instant> = None;
        loop {
            // Partial chunks shown on a dropped connection are void: the call that sent them
            // may never commit, and the next connection shows the call now running from its
            // start.
            if let Some(effect_id) = shown.partial_of.take() {
                let reset = StreamReset { effect_id, reason: "the stream's connection dropped".into() };
                if tx.send(Ok(StreamItem::Reset(reset))).await.is_err() {
                    return;
                }
            }
            match one_connection(&client, &path, &mut next, &mut shown, &mut tx).await {
                Ok(Ended::Complete | Ended::Abandoned) => return,
                Ok(Ended::Dropped) => failing_since = None,
                Err(e @ ClientError::Unreachable { .. }) => {
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= client.retry_budget {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            }
            tracing::debug!(path, next, "the stream's connection dropped; reopening");
            tokio::time::sleep(REOPEN_PAUSE).await;
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_on_blank_lines_and_keep_the_rest() {
        let mut buffer = "event: chunk\nid: 3\ndata: \"a\"\n\nevent: end\ndata: compl".to_string();
        let got = frames(&mut buffer);
        assert_eq!(got.len(), 1);
        assert_eq!(
            (got[0].event.as_str(), got[0].id.as_deref(), got[0].data.as_str()),
            ("chunk", Some("3"), "\"a\"")
        );
        assert_eq!(buffer, "event: end\ndata: compl");
        buffer.push_str("eted\n\n");
        let got = frames(&mut buffer);
        assert_eq!((got[0].event.as_str(), got[0].data.as_str()), ("end", "completed"));
        assert!(buffer.is_empty());
    }

    #[test]
    fn keep_alive_comments_are_no_frames() {
        let mut buffer = ":\n\n".to_string();
        assert!(frames(&mut buffer).is_empty());
    }
}
