//! A bounded in-memory log of what the runtime did, for timelines, simulations and tests.
//! Every event is also traced with its run id.

use durafiber_api::Timestamp;
use std::collections::VecDeque;

use durafiber_store::{RunId, lock::Mutex};

use serde::Serialize;

use crate::limits::EVENT_LOG_MAX;

/// One thing that happened to a run.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Event {
    /// Its place in the log: strictly increasing from 1, never reused while the process
    /// lives (follow the log with `events_since`).
    pub seq: u64,
    /// Clock time, ms.
    pub at_ms: Timestamp,
    /// The run.
    pub run_id: RunId,
    /// What happened: `accepted`, `activated`, `hibernated`, `evicted`, `recovered`, ...
    pub kind: String,
    /// Details, free text.
    pub detail: String,
}

/// The last [`EVENT_LOG_MAX`] events.
#[derive(Default)]
pub(crate) struct EventLog {
    inner: Mutex<Log>,
}

#[derive(Default)]
struct Log {
    events: VecDeque<Logged>,
    last_seq: u64,
}

/// An event as the log holds it: its run id and a short detail inside the entry itself, so
/// that logging one writes the next entry of the ring and nothing else. A recovery logs two
/// events a run; entries that pointed at strings of their own made each event replace
/// strings allocated 65,536 events before, a cache miss each, and free them.
struct Logged {
    seq: u64,
    at: Timestamp,
    run_id: Text,
    kind: &'static str,
    detail: Text,
}

/// Bytes of text an entry holds in place: with its length and the variant's tag, a `Text`
/// is 64 bytes. A minted run id is 48; most details are a word or a number or two.
const INLINE: usize = 62;

/// Text of up to [`INLINE`] bytes held in place, longer text on the heap.
enum Text {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<str>),
}

impl Text {
    fn new(text: &str) -> Self {
        match u8::try_from(text.len()) {
            Ok(len) if text.len() <= INLINE => {
                let mut bytes = [0; INLINE];
                bytes[..text.len()].copy_from_slice(text.as_bytes());
                Text::Inline { len, bytes }
            }
            _ => Text::Heap(text.into()),
        }
    }

    /// [`Text::new`] of a `String` the caller gives up: longer text keeps its heap buffer
    /// rather than being copied into a new one.
    fn owned(text: String) -> Self {
        if text.len() <= INLINE { Text::new(&text) } else { Text::Heap(text.into_boxed_str()) }
    }

    fn as_str(&self) -> &str {
        match self {
            // Only whole `&str`s are copied in, so the bytes are UTF-8 up to `len`.
            Text::Inline { len, bytes } => {
                std::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or_default()
            }
            Text::Heap(text) => text,
        }
    }
}

impl Logged {
    fn event(&self) -> Event {
        Event {
            seq: self.seq,
            at_ms: self.at,
            run_id: RunId::from(self.run_id.as_str()),
            kind: self.kind.to_string(),
            detail: self.detail.as_str().to_string(),
        }
    }
}

impl EventLog {
    pub fn push(&self, at: Timestamp, run_id: &RunId, kind: &'static str, detail: String) {
        tracing::info!(%run_id, event = kind, %detail, at_ms = at.as_millis(), "run event");
        let (run_id, detail) = (Text::new(run_id), Text::owned(detail));
        let mut log = self.inner.lock();
        log.last_seq += 1;
        let seq = log.last_seq;
        let replaced = if log.events.len() >= EVENT_LOG_MAX { log.events.pop_front() } else { None };
        log.events.push_back(Logged { seq, at, run_id, kind, detail });
        drop(log);
        // An event whose text was too long for its entry is freed outside the lock.
        drop(replaced);
    }

    pub fn snapshot(&self) -> Vec<Event> {
        self.inner.lock().events.iter().map(Logged::event).collect()
    }

    /// The events after `after_seq`, of one run or all, at most `limit`, oldest first.
    pub fn since(&self, after_seq: u64, run_id: Option<&str>, limit: usize) -> Vec<Event> {
        let log = self.inner.lock();
        // Sequence numbers are consecutive within the log: skip straight to the first one.
        let first = log.events.front().map_or(0, |e| e.seq);
        let skip = usize::try_from(after_seq.saturating_add(1).saturating_sub(first)).unwrap_or(usize::MAX);
        log.events
            .iter()
            .skip(skip)
            .filter(|e| run_id.is_none_or(|r| r == e.run_id.as_str()))
            .take(limit)
            .map(Logged::event)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn following_the_log_sees_each_event_once_in_order() {
        let log = EventLog::default();
        log.push(Timestamp::from_millis(1), &RunId::from("a"), "accepted", String::new());
        log.push(Timestamp::from_millis(2), &RunId::from("b"), "accepted", String::new());
        log.push(Timestamp::from_millis(3), &RunId::from("a"), "activated", String::new());
        let all = log.since(0, None, 10);
        assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
        let of_a = log.since(1, Some("a"), 10);
        assert_eq!(of_a.iter().map(|e| e.kind.as_str()).collect::<Vec<_>>(), ["activated"]);
        assert!(log.since(3, None, 10).is_empty());
        assert_eq!(log.since(0, None, 2).len(), 2);
    }

    #[test]
    fn short_and_long_texts_come_back_as_they_went_in() {
        let log = EventLog::default();
        let long_id = format!("run_{}", "9".repeat(200));
        let long_detail = "é".repeat(100);
        log.push(Timestamp::from_millis(1), &RunId::from("run_01a2"), "activated", "cold start 12 µs".into());
        log.push(Timestamp::from_millis(2), &RunId::from(long_id.as_str()), "escalated", long_detail.clone());
        log.push(Timestamp::from_millis(3), &RunId::from(""), "woke", String::new());
        let all = log.snapshot();
        assert_eq!(all[0].run_id.as_str(), "run_01a2");
        assert_eq!(all[0].detail, "cold start 12 µs");
        assert_eq!(
            (all[1].run_id.as_str(), all[1].detail.as_str()),
            (long_id.as_str(), long_detail.as_str())
        );
        assert_eq!((all[2].run_id.as_str(), all[2].kind.as_str(), all[2].detail.as_str()), ("", "woke", ""));
        assert_eq!(log.since(0, Some(&long_id), 10).len(), 1);
    }

    #[test]
    fn held_text_is_64_bytes_and_longer_text_goes_to_the_heap() {
        assert_eq!(std::mem::size_of::<Text>(), 64);
        assert_eq!(Text::new(&"x".repeat(INLINE)).as_str().len(), INLINE);
        assert!(matches!(Text::new(&"x".repeat(INLINE + 1)), Text::Heap(_)));
    }

    #[test]
    fn a_full_log_keeps_the_newest_events() {
        let log = EventLog::default();
        for i in 0..EVENT_LOG_MAX + 5 {
            log.push(
                Timestamp::from_millis(i as u64),
                &RunId::from(format!("run_{i}")),
                "accepted",
                format!("{i}"),
            );
        }
        let all = log.snapshot();
        assert_eq!(all.len(), EVENT_LOG_MAX);
        assert_eq!(all[0].seq, 6);
        assert_eq!(all[0].run_id.as_str(), "run_5");
        assert_eq!(all.last().map(|e| e.detail.clone()), Some(format!("{}", EVENT_LOG_MAX + 4)));
    }
}
