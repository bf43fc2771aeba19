//! The plain data the runtime hands an agent's hooks: why a run is re-entered, the alarm
//! being delivered, what an abandoned alarm does to the run. Below the kernel, so that the
//! kernel's interface to agent code can name them.

use durafiber_api::Timestamp;
use durafiber_store::RunId;
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
    pub scheduled_time_ms: Timestamp,
    /// Failed deliveries before this one.
    pub retry_count: u32,
    /// `retry_count > 0`.
    pub is_retry: bool,
    /// A periodic or cron alarm: its schedule goes on whatever this occurrence does.
    pub recurring: bool,
    /// The same for every delivery of this occurrence — its retries, and a re-delivery after
    /// a crash — and different for the next one (a periodic alarm's next period, the alarm
    /// set again): an idempotency key for what the handler does outside.
    pub delivery_id: String,
}

impl AlarmEvent {
    /// The delivery id of the occurrence of alarm `name` of `run_id` scheduled for
    /// `scheduled` by set number `generation`.
    pub(crate) fn delivery_id(run_id: &RunId, name: &str, scheduled: Timestamp, generation: u64) -> String {
        let occurrence = format!("{run_id}\0{name}\0{scheduled}\0{generation}");
        format!("dlv_{}", &json::sha256_hex(occurrence.as_bytes())[..32])
    }

    /// The payload, typed.
    pub fn payload<T: DeserializeOwned>(&self) -> Result<T, AgentError> {
        json::parse(&self.payload_json).map_err(|e| AgentError::Serialization(e.into()))
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
