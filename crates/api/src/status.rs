//! A run's state as the API shows it: the one status the server writes and every client
//! reads, a completed run's output as JSON rather than as the text it is stored as.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{records::RunStatus, state::RunState};

/// A run's state as the API shows it: a completed run's output as JSON.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Durably recorded; no fiber has started yet.
    Accepted,
    /// A fiber is registered.
    Running,
    /// Waits for a human.
    WaitingApproval {
        /// The approval.
        approval_id: String,
    },
    /// Waits for an alarm.
    WaitingAlarm {
        /// The alarm.
        name: String,
    },
    /// Waits for an external event.
    WaitingEvent {
        /// The event.
        name: String,
    },
    /// Finished with an output.
    Completed {
        /// The output.
        output: Value,
    },
    /// Finished with an error.
    Failed {
        /// What went wrong.
        error: String,
    },
    /// Stopped on request.
    Cancelled {
        /// Why.
        reason: String,
    },
    /// A human must look.
    Escalated {
        /// Why.
        reason: String,
    },
    /// Held by an operator; a resume lets it continue where it stopped.
    Paused {
        /// Why.
        reason: String,
    },
}

impl Status {
    /// Its state without the details.
    pub fn state(&self) -> RunState {
        match self {
            Status::Accepted => RunState::Accepted,
            Status::Running => RunState::Running,
            Status::WaitingApproval { .. } => RunState::WaitingApproval,
            Status::WaitingAlarm { .. } => RunState::WaitingAlarm,
            Status::WaitingEvent { .. } => RunState::WaitingEvent,
            Status::Completed { .. } => RunState::Completed,
            Status::Failed { .. } => RunState::Failed,
            Status::Cancelled { .. } => RunState::Cancelled,
            Status::Escalated { .. } => RunState::Escalated,
            Status::Paused { .. } => RunState::Paused,
        }
    }

    /// Whether the run has finished for good.
    pub fn is_terminal(&self) -> bool {
        self.state().is_terminal()
    }

    /// The state's name, as `GET /runs?state=` takes it.
    pub fn name(&self) -> &'static str {
        self.state().name()
    }

    /// What it waits for, or why it ended; empty for the rest.
    pub fn detail(&self) -> &str {
        match self {
            Status::WaitingApproval { approval_id: s }
            | Status::WaitingAlarm { name: s }
            | Status::WaitingEvent { name: s }
            | Status::Failed { error: s }
            | Status::Cancelled { reason: s }
            | Status::Escalated { reason: s }
            | Status::Paused { reason: s } => s,
            _ => "",
        }
    }
}

impl From<&RunStatus> for Status {
    /// The stored state as shown: an output that is not JSON (never written so) shows as text.
    fn from(status: &RunStatus) -> Self {
        match status {
            RunStatus::Accepted => Status::Accepted,
            RunStatus::Running => Status::Running,
            RunStatus::WaitingApproval { approval_id } => {
                Status::WaitingApproval { approval_id: approval_id.clone() }
            }
            RunStatus::WaitingAlarm { name } => Status::WaitingAlarm { name: name.clone() },
            RunStatus::WaitingEvent { name } => Status::WaitingEvent { name: name.clone() },
            RunStatus::Completed { output_json } => Status::Completed {
                output: serde_json::from_str(output_json)
                    .unwrap_or_else(|_| Value::String(output_json.clone())),
            },
            RunStatus::Failed { error } => Status::Failed { error: error.clone() },
            RunStatus::Cancelled { reason } => Status::Cancelled { reason: reason.clone() },
            RunStatus::Escalated { reason } => Status::Escalated { reason: reason.clone() },
            RunStatus::Paused { reason } => Status::Paused { reason: reason.clone() },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_statuses_name_their_state_alike() {
        assert_eq!(RunStatus::Accepted.state().name(), "accepted");
        let paused = RunStatus::Paused { reason: "x".into() };
        assert_eq!((Status::from(&paused).name(), paused.name()), ("paused", "paused"));
        assert!(Status::from(&RunStatus::Failed { error: "e".into() }).is_terminal());
    }
}
