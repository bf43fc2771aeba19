//! Keep-alive guards (§7.4): reference counted, released once, released on drop.

use durafiber_store::RunId;
use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use crate::kernel::shared::Shared;

/// Holds a run live while it exists. Releasing it twice is harmless; dropping it releases.
pub struct KeepAlive {
    shared: Arc<Shared>,
    run_id: RunId,
    /// The activation it holds; `None` when the run was not live (it holds nothing).
    epoch: Option<u64>,
    released: AtomicBool,
}

impl KeepAlive {
    pub(crate) fn acquire(shared: Arc<Shared>, run_id: &RunId) -> Self {
        let epoch = shared.liveness.guard_acquired(run_id, shared.now());
        KeepAlive { shared, run_id: run_id.clone(), epoch, released: AtomicBool::new(epoch.is_none()) }
    }

    /// Lets go of the guard. Only the first call counts.
    pub fn release(&self) {
        if !self.released.swap(true, Ordering::SeqCst)
            && let Some(epoch) = self.epoch
        {
            self.shared.liveness.guard_released(&self.run_id, epoch, self.shared.now());
            self.shared.timers.driver_wake.notify_one();
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
