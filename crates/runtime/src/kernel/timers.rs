//! What is due later: the alarm window, the runs to re-activate at a time, the next
//! retention sweep, and the wake of the driver that serves them on the system clock.

use durafiber_api::Timestamp;
use durafiber_store::RunId;
use std::{
    collections::BTreeSet,
    sync::atomic::{AtomicU32, AtomicU64},
};

use durafiber_store::lock::Mutex;
use tokio::sync::Notify;

use crate::kernel::alarm_window::Scheduler;

pub(crate) struct Timers {
    pub scheduler: Scheduler,
    /// Runs to re-activate at a time (recovery backoff, re-activation after eviction).
    pub wakeups: Mutex<BTreeSet<(Timestamp, RunId)>>,
    /// Wakes the system-clock driver when a deadline moved earlier.
    pub driver_wake: Notify,
    /// When the next retention sweep is due, ms; `u64::MAX` while one runs, or for ever
    /// when nothing is to be deleted (`retention.rs`).
    pub retention_due_ms: AtomicU64,
    /// Consecutive failures of the runtime itself while delivering alarms (§8.4).
    pub alarm_runtime_failures: AtomicU32,
}

impl Timers {
    pub fn new(scheduler: Scheduler, retention_on: bool) -> Self {
        Timers {
            scheduler,
            wakeups: Mutex::new(BTreeSet::new()),
            driver_wake: Notify::new(),
            // The first sweep comes with the first tick.
            retention_due_ms: AtomicU64::new(if retention_on { 0 } else { u64::MAX }),
            alarm_runtime_failures: AtomicU32::new(0),
        }
    }

    /// Re-activates `run_id` at `at`.
    pub fn wake_at(&self, at: Timestamp, run_id: &RunId) {
        tracing::debug!(%run_id, at_ms = at.as_millis(), "wake scheduled");
        self.wakeups.lock().insert((at, run_id.clone()));
        self.driver_wake.notify_one();
    }
}
