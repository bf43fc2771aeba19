//! A bounded in-memory log of what the runtime did, for timelines, simulations and tests.
//! Every event is also traced with its run id.

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
    pub at_ms: u64,
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
    events: VecDeque<Event>,
    last_seq: u64,
}

impl EventLog {
    pub fn push(&self, at_ms: u64, run_id: &str, kind: &str, detail: String) {
        tracing::info!(run_id, event = kind, %detail, at_ms, "run event");
        let mut log = self.inner.lock();
        log.last_seq += 1;
        let seq = log.last_seq;
        // A full log reuses its oldest event's strings for the run id and the kind, and frees
        // the replaced detail outside the lock: a recovery logs events for every run, and
        // making and freeing their strings was most of what logging one cost.
        let replaced = if log.events.len() >= EVENT_LOG_MAX { log.events.pop_front() } else { None };
        let (event, replaced) = match replaced {
            Some(mut old) => {
                old.run_id.set(run_id);
                old.kind.clear();
                old.kind.push_str(kind);
                let old_detail = std::mem::replace(&mut old.detail, detail);
                (Event { seq, at_ms, ..old }, Some(old_detail))
            }
            None => (Event { seq, at_ms, run_id: RunId::from(run_id), kind: kind.to_string(), detail }, None),
        };
        log.events.push_back(event);
        drop(log);
        drop(replaced);
    }

    pub fn snapshot(&self) -> Vec<Event> {
        self.inner.lock().events.iter().cloned().collect()
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
            .filter(|e| run_id.is_none_or(|r| r == e.run_id))
            .take(limit)
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn following_the_log_sees_each_event_once_in_order() {
        let log = EventLog::default();
        log.push(1, "a", "accepted", String::new());
        log.push(2, "b", "accepted", String::new());
        log.push(3, "a", "activated", String::new());
        let all = log.since(0, None, 10);
        assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
        let of_a = log.since(1, Some("a"), 10);
        assert_eq!(of_a.iter().map(|e| e.kind.as_str()).collect::<Vec<_>>(), ["activated"]);
        assert!(log.since(3, None, 10).is_empty());
        assert_eq!(log.since(0, None, 2).len(), 2);
    }
}
