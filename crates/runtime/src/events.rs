//! A bounded in-memory log of what the runtime did, for timelines, simulations and tests.
//! Every event is also traced with its run id.

use std::collections::VecDeque;

use parking_lot::Mutex;

use serde::Serialize;

use crate::limits::EVENT_LOG_MAX;

/// One thing that happened to a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Event {
    /// Clock time, ms.
    pub at_ms: u64,
    /// The run.
    pub run_id: String,
    /// What happened: `accepted`, `activated`, `hibernated`, `evicted`, `recovered`, ...
    pub kind: String,
    /// Details, free text.
    pub detail: String,
}

/// The last [`EVENT_LOG_MAX`] events.
#[derive(Default)]
pub(crate) struct EventLog {
    events: Mutex<VecDeque<Event>>,
}

impl EventLog {
    pub fn push(&self, at_ms: u64, run_id: &str, kind: &str, detail: String) {
        tracing::info!(run_id, event = kind, %detail, at_ms, "run event");
        let mut events = self.events.lock();
        if events.len() == EVENT_LOG_MAX {
            events.pop_front();
        }
        events.push_back(Event { at_ms, run_id: run_id.to_string(), kind: kind.to_string(), detail });
    }

    pub fn snapshot(&self) -> Vec<Event> {
        self.events.lock().iter().cloned().collect()
    }
}
