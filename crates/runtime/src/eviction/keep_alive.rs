//! Keep-alive guards (§7.4): reference counted, released once, released on drop.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use crate::shared::Shared;

/// Holds a run live while it exists. Releasing it twice is harmless; dropping it releases.
pub struct KeepAlive {
    shared: Arc<Shared>,
    run_id: String,
    released: AtomicBool,
}

impl KeepAlive {
    pub(crate) fn acquire(shared: Arc<Shared>, run_id: &str) -> Self {
        let held = shared.liveness.guard_acquired(run_id, shared.now_ms());
        KeepAlive { shared, run_id: run_id.to_string(), released: AtomicBool::new(!held) }
    }

    /// Lets go of the guard. Only the first call counts.
    pub fn release(&self) {
        if !self.released.swap(true, Ordering::SeqCst) {
            self.shared.liveness.guard_released(&self.run_id, self.shared.now_ms());
            self.shared.driver_wake.notify_one();
        }
    }

    /// The run it holds.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.release();
    }
}
