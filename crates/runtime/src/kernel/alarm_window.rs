//! The scheduler's bounded window over the store's due-time index (§8.6).
//!
//! Memory holds at most [`ALARM_WINDOW_MAX`] entries: the earliest ones. When the window is
//! not `complete`, alarms due after its `horizon` live only in the store and are read back
//! when the window drains. One timer (the driver's) serves them all.

use std::collections::{BTreeSet, HashSet};

use durafiber_store::{Store, StoreError, tables};
use parking_lot::Mutex;

use crate::limits::ALARM_WINDOW_MAX;

type Entry = (u64, String, String);

pub(crate) struct Scheduler {
    inner: Mutex<Window>,
}

struct Window {
    due: BTreeSet<Entry>,
    /// True when every pending alarm is in `due`.
    complete: bool,
    /// When not complete: alarms due after this are only in the store.
    horizon: u64,
    in_flight: HashSet<(String, String)>,
    capacity: usize,
}

impl Default for Scheduler {
    fn default() -> Self {
        Scheduler::with_capacity(ALARM_WINDOW_MAX)
    }
}

impl Scheduler {
    pub fn with_capacity(capacity: usize) -> Self {
        Scheduler {
            inner: Mutex::new(Window {
                due: BTreeSet::new(),
                complete: false,
                horizon: 0,
                in_flight: HashSet::new(),
                capacity: capacity.max(1),
            }),
        }
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Window> {
        self.inner.lock()
    }

    /// Reads the earliest alarms from the store's index into the window.
    pub fn refill(&self, store: &Store) -> Result<(), StoreError> {
        let mut w = self.lock();
        let keys =
            store.keys_between(&[tables::ALARM_DUE.prefix], &[tables::ALARM_DUE.prefix + 1], w.capacity)?;
        w.complete = keys.len() < w.capacity;
        w.due = keys.iter().filter_map(|k| tables::parse_alarm_due_key(k)).collect();
        w.horizon = w.due.last().map(|e| e.0).unwrap_or(0);
        Ok(())
    }

    pub fn insert(&self, due_at_ms: u64, run_id: &str, name: &str) {
        let mut w = self.lock();
        if !w.complete && due_at_ms > w.horizon {
            return; // read back from the store when the window reaches it
        }
        w.due.insert((due_at_ms, run_id.to_string(), name.to_string()));
        if w.due.len() > w.capacity {
            w.due.pop_last();
            w.complete = false;
            w.horizon = w.due.last().map(|e| e.0).unwrap_or(0);
        }
    }

    pub fn remove(&self, due_at_ms: u64, run_id: &str, name: &str) {
        self.lock().due.remove(&(due_at_ms, run_id.to_string(), name.to_string()));
    }

    /// The earliest due time the window knows.
    pub fn next_due_ms(&self) -> Option<u64> {
        self.lock().due.first().map(|e| e.0)
    }

    /// True when the window is empty but the store may hold more.
    pub fn needs_refill(&self) -> bool {
        let w = self.lock();
        w.due.is_empty() && !w.complete
    }

    /// Takes up to `max` alarms due by `now_ms` that are not being delivered already.
    pub fn take_due(&self, now_ms: u64, max: usize) -> Vec<Entry> {
        let mut w = self.lock();
        let mut out = Vec::new();
        while out.len() < max {
            let Some(first) = w.due.first().cloned() else { break };
            if first.0 > now_ms {
                break;
            }
            w.due.pop_first();
            let id = (first.1.clone(), first.2.clone());
            if w.in_flight.insert(id) {
                out.push(first);
            }
        }
        out
    }

    pub fn delivered(&self, run_id: &str, name: &str) {
        self.lock().in_flight.remove(&(run_id.to_string(), name.to_string()));
    }

    pub fn in_flight(&self) -> usize {
        self.lock().in_flight.len()
    }

    /// Alarms held in memory.
    pub fn window_len(&self) -> usize {
        self.lock().due.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_keeps_the_earliest_and_drops_the_rest_to_the_store() {
        let s = Scheduler::with_capacity(2);
        s.lock().complete = true;
        s.insert(30, "r", "c");
        s.insert(10, "r", "a");
        s.insert(20, "r", "b");
        assert_eq!(s.window_len(), 2);
        s.insert(25, "r", "d"); // beyond the horizon now: left in the store
        assert_eq!(s.take_due(100, 10).iter().map(|e| e.0).collect::<Vec<_>>(), vec![10, 20]);
        assert!(s.needs_refill());
    }
}
