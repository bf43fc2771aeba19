//! What an operator or the configuration holds runs to: the named limits, the pauses, which
//! recovery hooks may run at once, and the seeded draws of jitter and chaos.

use std::sync::Arc;

use durafiber_store::lock::Mutex;

use crate::{
    kernel::{hook_gate::HookGate, limiters::Limiters, pauses::Pauses},
    rng::SeededRng,
};

pub(crate) struct Controls {
    /// The named limits effects' calls wait their turn in.
    pub limiters: Limiters,
    /// Kinds and runs operators paused, and the alarms held for them.
    pub pauses: Mutex<Pauses>,
    /// Which recovery hooks may run at once (`kernel/hook_gate.rs`).
    pub hook_gate: Arc<HookGate>,
    /// Jitter of retries and backoffs.
    pub rng_jitter: Mutex<SeededRng>,
    /// Chaos eviction draws, apart from jitter so that each sequence repeats on its own.
    pub rng_chaos: Mutex<SeededRng>,
}

impl Controls {
    pub fn new(limiters: Limiters, pauses: Pauses, seed: u64) -> Self {
        Controls {
            limiters,
            pauses: Mutex::new(pauses),
            hook_gate: Arc::default(),
            rng_jitter: Mutex::new(SeededRng::new(seed ^ 0x6a69_7474_6572)),
            rng_chaos: Mutex::new(SeededRng::new(seed ^ 0x0063_6861_6f73)),
        }
    }

    pub fn jitter_between(&self, lo: u64, hi: u64) -> u64 {
        self.rng_jitter.lock().between(lo, hi)
    }

    /// Whether a chaos eviction strikes now, at `rate`.
    pub fn chaos_strikes(&self, rate: f64) -> bool {
        rate > 0.0 && self.rng_chaos.lock().chance(rate)
    }
}
