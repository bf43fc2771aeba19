//! The small public types a caller holds: a run's handle ([`RunId`]), the options it is
//! started with ([`RunOptions`]) and the states it can be listed by ([`RunState`]).

use std::{fmt, str::FromStr};

pub use durafiber_store::RunId;
use durafiber_store::tables::{self, RunStatus};
use serde::{Deserialize, Serialize};

use crate::{
    config::{Budget, DurabilityMode},
    error::RuntimeError,
};

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

/// A run's state without its details, to filter lists by (§2.4).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Accepted; no fiber has run yet.
    Accepted,
    /// A fiber runs (or the run is interrupted and will be recovered).
    Running,
    /// Paused on a human's decision (the contract's `Waiting{approval}`).
    WaitingApproval,
    /// Paused on the clock: a durable sleep (the contract's `Waiting{alarm}`).
    WaitingAlarm,
    /// Paused on a named external event.
    WaitingEvent,
    /// Finished with an output.
    Completed,
    /// Finished with an error.
    Failed,
    /// Cancelled on request.
    Cancelled,
    /// A human must look.
    Escalated,
    /// Held by an operator.
    Paused,
}

impl RunState {
    /// Every state, in the order a run can reach them.
    pub const ALL: [RunState; 10] = [
        RunState::Accepted,
        RunState::Running,
        RunState::WaitingApproval,
        RunState::WaitingAlarm,
        RunState::WaitingEvent,
        RunState::Completed,
        RunState::Failed,
        RunState::Cancelled,
        RunState::Escalated,
        RunState::Paused,
    ];

    /// The state of `status`.
    pub fn of(status: &RunStatus) -> RunState {
        match status {
            RunStatus::Accepted => RunState::Accepted,
            RunStatus::Running => RunState::Running,
            RunStatus::WaitingApproval { .. } => RunState::WaitingApproval,
            RunStatus::WaitingAlarm { .. } => RunState::WaitingAlarm,
            RunStatus::WaitingEvent { .. } => RunState::WaitingEvent,
            RunStatus::Completed { .. } => RunState::Completed,
            RunStatus::Failed { .. } => RunState::Failed,
            RunStatus::Cancelled { .. } => RunState::Cancelled,
            RunStatus::Escalated { .. } => RunState::Escalated,
            RunStatus::Paused { .. } => RunState::Paused,
        }
    }

    /// The state's name, as the API spells it (`waiting_approval`, ...).
    pub fn name(self) -> &'static str {
        match self {
            RunState::Accepted => "accepted",
            RunState::Running => "running",
            RunState::WaitingApproval => "waiting_approval",
            RunState::WaitingAlarm => "waiting_alarm",
            RunState::WaitingEvent => "waiting_event",
            RunState::Completed => "completed",
            RunState::Failed => "failed",
            RunState::Cancelled => "cancelled",
            RunState::Escalated => "escalated",
            RunState::Paused => "paused",
        }
    }
}

impl FromStr for RunState {
    type Err = RuntimeError;

    /// Parses a state's name; anything else is `InvalidInput` naming the states there are.
    fn from_str(s: &str) -> Result<Self, RuntimeError> {
        RunState::ALL.into_iter().find(|state| state.name() == s).ok_or_else(|| {
            let names: Vec<_> = RunState::ALL.iter().map(|s| s.name()).collect();
            RuntimeError::InvalidInput(format!("unknown run state {s:?} (one of {})", names.join(", ")))
        })
    }
}

impl fmt::Display for RunState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_name_parses_back_and_agrees_with_the_stored_status() {
        for state in RunState::ALL {
            assert_eq!(state.name().parse::<RunState>().expect("parses"), state);
        }
        assert_eq!(RunState::of(&RunStatus::Accepted).name(), RunStatus::Accepted.name());
        let bogus = "bogus".parse::<RunState>();
        assert!(matches!(bogus, Err(RuntimeError::InvalidInput(m)) if m.contains("waiting_event")));
    }
}
