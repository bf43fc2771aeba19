//! A clock set off on purpose: what a node whose machine keeps the wrong time does.

use std::time::Duration;

use durafiber_runtime::{
    Timestamp,
    clock::{Clock, Sleep, SystemClock},
};

/// The system clock moved by a fixed offset, ahead (positive) or behind (negative), as a
/// machine's clock is when its time service is broken.
#[derive(Debug, Clone, Copy)]
pub struct SkewedClock {
    offset_ms: i64,
}

impl SkewedClock {
    /// The system clock `offset_ms` ahead (behind when negative).
    pub fn new(offset_ms: i64) -> Self {
        SkewedClock { offset_ms }
    }
}

impl Clock for SkewedClock {
    fn now(&self) -> Timestamp {
        let system = SystemClock.now();
        let by = Duration::from_millis(self.offset_ms.unsigned_abs());
        if self.offset_ms >= 0 { system.saturating_add(by) } else { system.saturating_sub(by) }
    }

    fn sleep_until(&self, at: Timestamp) -> Sleep {
        Box::pin(tokio::time::sleep(at.saturating_since(self.now())))
    }
}
