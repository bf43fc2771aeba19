//! The scheduler's bounded window over the store's due-time index (§8.6).
//!
//! Memory holds at most `RuntimeConfig::alarm_window` entries: the earliest ones. Alarms
//! after the window's horizon live only in the store. When the window runs down to half,
//! the next entries after the horizon are read in, outside the window's lock, so
//! deliveries never wait for the store's index and the next due time is always known. One
//! timer (the driver's) serves them all.

use durafiber_api::Timestamp;
use durafiber_store::RunId;
use std::collections::{BTreeSet, HashSet};

use durafiber_store::lock::{Mutex, MutexGuard};
use durafiber_store::{Store, StoreError, tables::keys};

use crate::limits::ALARM_REFILL_MAX;

type Entry = (Timestamp, String, String);

pub(crate) struct Scheduler {
    inner: Mutex<Window>,
}

/// What the window holds of the store's index.
#[derive(Debug, Clone, PartialEq)]
enum Horizon {
    /// Nothing read yet: every alarm is only in the store.
    Unread,
    /// Every alarm up to and including this entry is in the window; later ones only in the
    /// store.
    After(Entry),
    /// Every pending alarm is in the window.
    Complete,
}

impl Horizon {
    /// Whether `e` lies beyond the window, where only the store has it.
    fn beyond(&self, e: &Entry) -> bool {
        match self {
            Horizon::Unread => true,
            Horizon::After(h) => e > h,
            Horizon::Complete => false,
        }
    }
}

struct Window {
    due: BTreeSet<Entry>,
    horizon: Horizon,
    /// While a refill reads the store: the entries set beyond the horizon meanwhile, which
    /// the read may have missed.
    refilling: Option<Vec<Entry>>,
    in_flight: HashSet<(String, String)>,
    capacity: usize,
}

impl Window {
    /// Drops the latest entries past capacity back to the store.
    fn trim(&mut self) {
        while self.due.len() > self.capacity {
            self.due.pop_last();
            if let Some(last) = self.due.last() {
                self.horizon = Horizon::After(last.clone());
            }
        }
    }
}

impl Scheduler {
    pub fn with_capacity(capacity: usize) -> Self {
        Scheduler {
            inner: Mutex::new(Window {
                due: BTreeSet::new(),
                horizon: Horizon::Unread,
                refilling: None,
                in_flight: HashSet::new(),
                capacity: capacity.max(2),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Window> {
        self.inner.lock()
    }

    /// Whether the window has run low while the store holds more.
    pub fn wants_refill(&self) -> bool {
        let w = self.lock();
        w.horizon != Horizon::Complete && w.refilling.is_none() && w.due.len() <= w.capacity / 2
    }

    /// Reads the entries after the horizon from the store's index, up to capacity. The
    /// store is read without the window's lock: alarms set meanwhile beyond the horizon are
    /// noted and merged, so none is missed.
    /// Reads the whole index again at the next refill: shards were gained, whose alarms
    /// the window never read.
    pub fn rescan(&self) {
        let mut w = self.lock();
        w.horizon = Horizon::Unread;
        w.refilling = None;
    }

    /// Keeps only the alarms of runs `keep` accepts: shards were lost.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.lock().due.retain(|(_, run_id, _)| keep(run_id));
    }

    pub fn refill(
        &self,
        store: &Store,
        shards: Option<&[u32]>,
        keep: impl Fn(&str) -> bool,
    ) -> Result<(), StoreError> {
        let (after, horizon, want) = {
            let mut w = self.lock();
            if w.horizon == Horizon::Complete || w.refilling.is_some() {
                return Ok(());
            }
            let after = match &w.horizon {
                Horizon::After((due, run, name)) => Some(keys::alarm_due(*due, run, name)),
                _ => None,
            };
            w.refilling = Some(Vec::new());
            let room = w.capacity.saturating_sub(w.due.len());
            (after, w.horizon.clone(), room.clamp(1, ALARM_REFILL_MAX))
        };
        let read = store.keys_in(&keys::ALARM_DUE.all(), after.as_ref(), want, shards);
        let entries: Vec<Entry> = match &read {
            Ok(read) => read.iter().filter_map(keys::parse_alarm_due).collect(),
            Err(_) => Vec::new(),
        };
        let mut w = self.lock();
        let noted = w.refilling.take().unwrap_or_default();
        let keys = read?;
        if w.horizon == horizon {
            w.horizon = match entries.last() {
                Some(last) if keys.len() >= want => Horizon::After(last.clone()),
                _ => Horizon::Complete,
            };
            // The horizon is the last entry read, so the next refill goes on after it; a read
            // restricted to this node's shards returns only entries it keeps.
            w.due.extend(entries.into_iter().filter(|(_, run_id, _)| keep(run_id)));
        }
        // (Had the horizon moved down meanwhile, the entries read are beyond it: the next
        // refill reads them again.)
        for e in noted {
            if !w.horizon.beyond(&e) {
                w.due.insert(e);
            }
        }
        w.trim();
        Ok(())
    }

    pub fn insert(&self, due_at: Timestamp, run_id: &RunId, name: &str) {
        let mut w = self.lock();
        let e = (due_at, run_id.to_string(), name.to_string());
        if w.horizon.beyond(&e) {
            // Read back from the store when the window reaches it.
            if let Some(noted) = &mut w.refilling {
                noted.push(e);
            }
            return;
        }
        w.due.insert(e);
        w.trim();
    }

    pub fn remove(&self, due_at: Timestamp, run_id: &RunId, name: &str) {
        self.lock().due.remove(&(due_at, run_id.to_string(), name.to_string()));
    }

    /// The earliest due time the window knows.
    pub fn next_due(&self) -> Option<Timestamp> {
        self.lock().due.first().map(|e| e.0)
    }

    /// Takes up to `max` alarms due by `now` that are not being delivered already.
    pub fn take_due(&self, now: Timestamp, max: usize) -> Vec<Entry> {
        let mut w = self.lock();
        let mut out = Vec::new();
        while out.len() < max {
            let Some(first) = w.due.first().cloned() else { break };
            if first.0 > now {
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

    pub fn delivered(&self, run_id: &RunId, name: &str) {
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
        s.lock().horizon = Horizon::Complete;
        s.insert(Timestamp::from_millis(30), &RunId::from("r"), "c");
        s.insert(Timestamp::from_millis(10), &RunId::from("r"), "a");
        s.insert(Timestamp::from_millis(20), &RunId::from("r"), "b");
        assert_eq!(s.window_len(), 2);
        s.insert(Timestamp::from_millis(25), &RunId::from("r"), "d"); // beyond the horizon now: left in the store
        assert_eq!(
            s.take_due(Timestamp::from_millis(100), 10).iter().map(|e| e.0.as_millis()).collect::<Vec<_>>(),
            vec![10, 20]
        );
        assert!(s.wants_refill());
    }

    #[test]
    fn an_equal_due_time_past_the_horizon_is_left_to_the_store() {
        let s = Scheduler::with_capacity(2);
        s.lock().horizon = Horizon::Complete;
        s.insert(Timestamp::from_millis(10), &RunId::from("a"), "x");
        s.insert(Timestamp::from_millis(10), &RunId::from("b"), "x");
        s.insert(Timestamp::from_millis(10), &RunId::from("c"), "x");
        assert_eq!(s.lock().horizon, Horizon::After((Timestamp::from_millis(10), "b".into(), "x".into())));
        s.insert(Timestamp::from_millis(10), &RunId::from("d"), "x");
        assert_eq!(s.window_len(), 2);
    }
}
