//! A clock set off on purpose: what a node whose machine keeps the wrong time does.

use std::time::Duration;

use durafiber_runtime::clock::{Clock, Sleep, SystemClock};

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
    fn now_ms(&self) -> u64 {
        let system = SystemClock.now_ms();
        if self.offset_ms >= 0 {
            system.saturating_add(self.offset_ms.unsigned_abs())
        } else {
            system.saturating_sub(self.offset_ms.unsigned_abs())
        }
    }

    fn sleep_until(&self, at_ms: u64) -> Sleep {
        let wait = Duration::from_millis(at_ms.saturating_sub(self.now_ms()));
        Box::pin(tokio::time::sleep(wait))
    }
}
