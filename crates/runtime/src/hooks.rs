//! The plain data the runtime hands an agent's hooks: why a run is re-entered, the alarm
//! being delivered, what an abandoned alarm does to the run. Below the kernel, so that the
//! kernel's interface to agent code can name them.

use serde::de::DeserializeOwned;

use crate::{error::AgentError, json};

/// Why a run is re-entered through `on_fiber_recovered`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecoveryReason {
    /// The process died while the fiber ran.
    Crash,
    /// The runtime evicted the run mid-fiber.
    Evicted,
    /// A decision or alarm arrived after the fiber was gone.
    Resumed,
}

/// An alarm being delivered (§8.3).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AlarmEvent {
    /// The alarm's name.
    pub name: String,
    /// The payload it was set with, as JSON.
    pub payload_json: String,
    /// When it was scheduled for, before any retry.
    pub scheduled_time_ms: u64,
    /// Failed deliveries before this one.
    pub retry_count: u32,
    /// `retry_count > 0`.
    pub is_retry: bool,
}

impl AlarmEvent {
    /// The payload, typed.
    pub fn payload<T: DeserializeOwned>(&self) -> Result<T, AgentError> {
        json::parse(&self.payload_json).map_err(AgentError::Serialization)
    }
}

/// What to do when an alarm is abandoned after its last retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExhaustedAction {
    /// The run goes to `Escalated{alarm_exhausted}`: a human must look.
    Escalate,
    /// The dead letter is enough; the run carries on.
    Ignore,
}
