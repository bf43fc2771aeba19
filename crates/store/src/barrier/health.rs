//! The writer's health: failed for good, closing, parked below the free-space floor, and how
//! far groups have been applied and made durable; the watchdog that fails the store when an
//! engine call does not return; the wait for space below the floor.

use std::{
    sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
    time::{Duration, Instant},
};

use tokio::sync::watch;

use super::WriterConfig;
use crate::backend::Backend;

/// The writer's condition, shared with the store's front door and the watchdog.
pub(crate) struct Health {
    /// `Some(reason)` once the store failed; it never recovers in-process.
    pub failed: watch::Sender<Option<String>>,
    /// Set when the store closes: a parked writer gives up waiting for space.
    pub closing: AtomicBool,
    /// Parked below the free-space floor.
    pub parked: AtomicBool,
    /// Groups applied (or being applied) so far: what a read may have seen.
    pub applied: AtomicU64,
    /// Groups covered by a completed barrier.
    pub durable: watch::Sender<u64>,
    /// Upper bound on how long an `Async` batch stays uncovered, µs: set at open and
    /// changeable later (`Store::set_flush_every`), so the runtime's setting applies to a
    /// store its user opened.
    pub flush_every_us: AtomicU64,
    /// When the engine call in progress started, ms since `epoch`; 0 when idle.
    pub(super) working_since_ms: AtomicU64,
    pub(super) epoch: Instant,
}

impl Health {
    pub(crate) fn new(flush_every: Duration) -> Self {
        Health {
            flush_every_us: AtomicU64::new(u64::try_from(flush_every.as_micros()).unwrap_or(u64::MAX)),
            failed: watch::Sender::new(None),
            closing: AtomicBool::new(false),
            parked: AtomicBool::new(false),
            applied: AtomicU64::new(0),
            durable: watch::Sender::new(0),
            working_since_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    pub(crate) fn failure(&self) -> Option<String> {
        self.failed.borrow().clone()
    }

    pub(crate) fn fail(&self, reason: String) {
        self.failed.send_if_modified(|f| {
            if f.is_some() {
                return false;
            }
            tracing::error!(reason, "the store failed; it takes no more writes until the process restarts");
            *f = Some(reason);
            true
        });
    }

    pub(super) fn since_epoch_ms(&self) -> u64 {
        (self.epoch.elapsed().as_millis() as u64).max(1)
    }

    /// Runs an engine call under the watchdog's eye.
    pub(super) fn working<T>(&self, f: impl FnOnce() -> T) -> T {
        self.working_since_ms.store(self.since_epoch_ms(), Relaxed);
        let out = f();
        self.working_since_ms.store(0, Relaxed);
        out
    }
}

/// Fails the store when an engine call has run longer than `timeout`. Ends with the store.
pub(super) fn watchdog(health: &Health, timeout: Duration) {
    let tick = (timeout / 8).clamp(Duration::from_millis(10), Duration::from_millis(500));
    while !health.closing.load(Relaxed) && health.failure().is_none() {
        std::thread::sleep(tick);
        let since = health.working_since_ms.load(Relaxed);
        if since != 0 && health.since_epoch_ms().saturating_sub(since) > timeout.as_millis() as u64 {
            health.fail(format!(
                "a durability barrier has not returned after {} ms (is the disk full or gone?)",
                timeout.as_millis()
            ));
        }
    }
}

/// Whether a write's caller has just seen the disk above the free-space floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Space {
    Checked,
    Unchecked,
}

pub(super) fn below_floor(backend: &dyn Backend, config: &WriterConfig) -> bool {
    backend.free_bytes().is_some_and(|free| free < config.disk_floor_bytes)
}

/// Parks while the disk is below the floor. False when the store closed meanwhile.
pub(super) fn wait_for_space(backend: &dyn Backend, config: &WriterConfig, health: &Health) -> bool {
    let below = || below_floor(backend, config);
    if !below() {
        return true;
    }
    tracing::warn!(
        floor_bytes = config.disk_floor_bytes,
        "the disk is below the store's floor: writes wait until space returns"
    );
    health.parked.store(true, Relaxed);
    while below() {
        if health.closing.load(Relaxed) {
            health.parked.store(false, Relaxed);
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    health.parked.store(false, Relaxed);
    tracing::info!("space is back: writes resume");
    true
}
