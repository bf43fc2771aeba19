//! What tests, benchmarks and drills reach for and an agent never needs: a hook at every
//! crash point, and views of the runtime's insides. Kept out of the everyday API as
//! extension traits; `use durafiber_runtime::testing::*` brings them in.

use super::{builder::RuntimeBuilder, handle::Runtime};
use crate::kernel::shared::CrashHook;

/// Test-only settings of a [`RuntimeBuilder`].
pub trait BuilderTestExt: Sized {
    /// Called at every named crash point; see [`CrashHook`]. Returning `true` evicts the
    /// run right there: tests evict or crash at an exact boundary, the drill's server stops
    /// at one to be killed.
    fn crash_hook(self, hook: CrashHook) -> Self;
}

impl BuilderTestExt for RuntimeBuilder {
    fn crash_hook(mut self, hook: CrashHook) -> Self {
        self.crash_hook = Some(hook);
        self
    }
}

/// Views of a running [`Runtime`]'s insides, for tests and benchmarks.
pub trait RuntimeTestExt {
    /// Alarms the scheduler holds in memory (bounded whatever the number pending).
    fn alarm_window_len(&self) -> usize;

    /// The time since the runtime opened, µs: what recovery benchmarks measure from.
    fn since_open_us(&self) -> u64;
}

impl RuntimeTestExt for Runtime {
    fn alarm_window_len(&self) -> usize {
        self.shared.timers.scheduler.window_len()
    }

    fn since_open_us(&self) -> u64 {
        self.shared.life.opened.elapsed_us()
    }
}
