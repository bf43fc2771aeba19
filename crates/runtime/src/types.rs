//! The small public types a caller holds: a run's handle ([`RunId`]), the options it is
//! started with ([`RunOptions`]) and the states it can be listed by ([`RunState`]).

pub use durafiber_store::RunId;
use durafiber_store::tables;
use serde::{Deserialize, Serialize};

use crate::config::{Budget, DurabilityMode};

/// Options of one run, given to a start ([`crate::StartRequest::with_options`]). `None` is the runtime's
/// default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunOptions {
    /// How durable the run's stashes are when `stash` returns.
    pub durability: Option<DurabilityMode>,
    /// Whether a running fiber holds a keep-alive (no idle eviction while it runs).
    pub fiber_keep_alive: Option<bool>,
    /// What the run may spend, over the runtime's `budget`.
    #[serde(default)]
    pub budget: Budget,
}

impl RunOptions {
    /// As stored in the run record.
    pub(crate) fn stored(self) -> tables::RunOptions {
        tables::RunOptions {
            durability: self.durability.map(|m| m.name().to_string()),
            fiber_keep_alive: self.fiber_keep_alive,
        }
    }
}

pub use durafiber_api::RunState;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::RuntimeError;

    #[test]
    fn an_unknown_state_is_invalid_input_naming_the_states() {
        let bogus = "bogus".parse::<RunState>().map_err(RuntimeError::from);
        assert!(matches!(bogus, Err(RuntimeError::InvalidInput(m)) if m.contains("waiting_event")));
    }
}
