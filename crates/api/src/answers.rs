//! What the API answers to a start, an event, a decision and a listing: each outcome as the
//! runtime returns it and the server writes it.

use std::{ops::Deref, time::Duration};

use serde::{Deserialize, Serialize};

use crate::{
    ids::RunId,
    records::{AlarmRecord, CronRecord, RunRecord, RunStatus, VoteRecord},
    time::Timestamp,
};

/// What `start` returns: the run's handle and whether this call created it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StartOutcome {
    /// The run's id: the handle to keep.
    pub run_id: RunId,
    /// True when this call accepted the run; false when the key was already known.
    pub accepted: bool,
    /// The run's current state.
    pub status: RunStatus,
}

/// What `send_event` did with an event.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SendOutcome {
    /// A wait for it was pending: the run has it now (or will as soon as it is re-entered).
    Delivered,
    /// Nobody waits for it yet: kept, in order, until a wait of that name takes it.
    Buffered,
    /// Its idempotency key was seen before: nothing new was delivered.
    Duplicate,
}

/// What `approve` did.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApproveOutcome {
    /// The run.
    pub run_id: RunId,
    /// The approval.
    pub approval_id: String,
    /// False when the same decision had already been recorded (a no-op).
    pub recorded: bool,
    /// Whether the pause is decided now: with a rule, only once enough people decided.
    pub decided: bool,
    /// Approvals recorded so far (1 for a pause without a rule, once approved).
    pub approvals: u32,
    /// Approvals that decide it: its rule's, or 1.
    pub required: u32,
}

/// A pause waiting for a reviewer, as a reviewer's screen loads it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PendingApproval {
    /// The run's handle.
    pub run_id: RunId,
    /// The pause within the run.
    pub approval_id: String,
    /// Exactly what the run showed.
    pub payload: serde_json::Value,
    /// The hash an approval must quote.
    pub payload_hash: String,
    /// When it was requested.
    pub requested_at_ms: Timestamp,
    /// How long it has waited, ms.
    #[serde(with = "crate::time::millis_duration")]
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub age_ms: Duration,
    /// When silence escalates it.
    pub escalate_at_ms: Timestamp,
    /// Approvals by different people that decide it (1 without a rule).
    #[serde(default = "one")]
    pub required: u32,
    /// Who decided so far, under a rule: "1 of 2 — approved by alice".
    #[serde(default)]
    pub votes: Vec<VoteRecord>,
}

fn one() -> u32 {
    1
}

impl PendingApproval {
    /// Where a page that ends with this approval is continued from: `<run_id>/<approval_id>`,
    /// as `GET /approvals?after=` and the console's inbox take it.
    pub fn cursor(&self) -> String {
        format!("{}/{}", self.run_id, self.approval_id)
    }

    /// A [`PendingApproval::cursor`] split into its run and its approval; `None` when either
    /// half is missing.
    pub fn split_cursor(cursor: &str) -> Option<(RunId, &str)> {
        let (run_id, approval_id) = cursor.split_once('/')?;
        (!run_id.is_empty() && !approval_id.is_empty()).then(|| (RunId::from(run_id), approval_id))
    }
}

/// One page of runs.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunPage {
    /// The runs.
    pub runs: Vec<RunRecord>,
    /// Pass as `after` for the next page; `None` on the last one.
    pub next: Option<RunId>,
}

/// A pending alarm as listed: its record (the next due time, attempts), its cron schedule if
/// it has one, and the failed occurrences of a periodic or cron alarm still being retried.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Alarm {
    /// The alarm's record; its fields read through (`alarm.due_at_ms`).
    #[serde(flatten)]
    pub record: AlarmRecord,
    /// The cron schedule of a cron alarm.
    pub cron: Option<CronRecord>,
    /// Failed occurrences being retried, each with its own next attempt time.
    pub retrying: Vec<AlarmRecord>,
}

impl Deref for Alarm {
    type Target = AlarmRecord;

    fn deref(&self) -> &AlarmRecord {
        &self.record
    }
}
