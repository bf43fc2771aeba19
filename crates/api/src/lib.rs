//! durafiber's wire: what its HTTP API carries, as types the server writes and every client
//! reads. It depends on nothing but serde, so a client of the API never builds the runtime.
//!
//! - [`ids`]: a run's id, [`RunId`], the handle every call names a run by.
//! - [`records`] and [`family_records`]: the records the store keeps and the API shows as
//!   they are (a run, its stash, effects, approvals, alarms, stream, budget, history, family).
//! - [`state`]: a run's state without its details, [`RunState`]: what lists are filtered by,
//!   and what both statuses name themselves and call terminal by.
//! - [`status`]: a run's state as the API shows it, [`Status`].
//! - [`answers`]: what a start, an event, a decision and a listing answer.
//! - [`stream`]: what a reader of a run's output stream is shown.
//! - [`options`]: a run's durability mode and budget.
//! - [`time`]: a moment on the runtime's clock, [`Timestamp`], the type of every due time
//!   and every time a record is stamped with.
//! - [`error_kind`]: the `kind` of an API error, [`ApiErrorKind`].

pub mod answers;
pub mod error_kind;
pub mod family_records;
pub mod ids;
pub mod options;
pub mod records;
pub mod state;
pub mod status;
pub mod stream;
pub mod time;

pub use answers::{Alarm, ApproveOutcome, PendingApproval, RunPage, SendOutcome, StartOutcome};
pub use error_kind::ApiErrorKind;
pub use ids::RunId;
pub use options::{Budget, DurabilityMode, UnknownDurability};
pub use state::{RunState, UnknownState};
pub use status::Status;
pub use stream::{PartialChunk, StreamChunk, StreamItem, StreamReset};
pub use time::Timestamp;

/// The most items one page of a list holds (`limit`).
pub const LIST_PAGE_MAX: usize = 1000;
