//! A run's state without its details: what lists are filtered by, and what both the
//! stored status (`records`) and the shown one (`status`) name themselves and call terminal
//! by.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Serialize};

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

    /// Completed, failed, cancelled or escalated: nothing more happens on its own.
    pub fn is_terminal(self) -> bool {
        matches!(self, RunState::Completed | RunState::Failed | RunState::Cancelled | RunState::Escalated)
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

/// A name that is no run state's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown run state {0:?} (one of {names})", names = RunState::ALL.map(RunState::name).join(", "))]
pub struct UnknownState(pub String);

impl FromStr for RunState {
    type Err = UnknownState;

    /// Parses a state's name.
    fn from_str(s: &str) -> Result<Self, UnknownState> {
        RunState::ALL.into_iter().find(|state| state.name() == s).ok_or_else(|| UnknownState(s.to_string()))
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
    fn every_state_name_parses_back() {
        for state in RunState::ALL {
            assert_eq!(state.name().parse::<RunState>().expect("parses"), state);
        }
        assert!("eventually".parse::<RunState>().is_err());
        let bogus = "bogus".parse::<RunState>();
        assert!(matches!(bogus, Err(e) if e.to_string().contains("waiting_event")));
    }
}
