//! Durable runs for long-running agents: after the host dies, the same run continues from
//! its last safe boundary, without a second side effect.
//!
//! # Module map, top layer first (each imports only its own layer and those below)
//! - `runtime/`: the public [`Runtime`] (`handle`, `inspect`, `inbound`), [`testing`]
//!   (crash hooks and internal views as extension traits); `typed`: an agent's typed hooks
//!   behind the kernel's erased interface.
//! - `run/`: `start` (durable accept), `actor` (activation, the only code that spawns an
//!   actor — at a run's first inbound event — and the actor), `fiber` (decision,
//!   registration and end), `recovery` (the plan), `rescan` (interrupted runs re-entered in
//!   batches), `alarm_delivery`, `driver` (the loop that moves runs on time), `liveness` (the rule,
//!   checked).
//! - [`agent`]: the trait users implement and the [`Ctx`] its hooks are handed.
//! - features: `approval` (a pause bound to its payload's hash), `approval_pending` (those a
//!   reviewer's screen lists), `approval_quorum` (those more than one person decides),
//!   `approval_view` (how an agent would like a reviewer to see one); `event` (external
//!   events), `sleep` (durable sleeps); `effect` (a call and its policy), `effect_ledger` (its
//!   entry in the idempotency ledger), `effect_stream` (a streaming call's live chunks),
//!   `limit` (named limits' turns); `child` (sub-agents started and joined); `stash` (a stored
//!   stash read back, upgraded); `stream` (output streams); `budget` (what a run may spend);
//!   `pause` (the kill switch); `escalation`; `storage` (each run's key-value storage);
//!   `retention` (settled runs deleted); `alarm/` (set and cancel, cron); `eviction/`
//!   (hibernation, parking, eviction, keep-alive).
//! - `kernel/`: the runtime's services (observability, signals, lifecycle, lock stripes,
//!   controls, timers), the one boundary committer, run records written under their lock,
//!   the registry of live runs, the actors' inbox, run cells, the busy count, the activity
//!   tracker, the alarm window (its own module map).
//! - base: [`clock`] (the only source of time), [`limits`], `config`, `error`, `json`,
//!   `metrics`, [`rng`], `secret`, `events`, `hooks`, `boundary` (the typed boundary a crash
//!   hook stops at), `types` (the run id, options, states), [`trace`] (a run's trace: derived
//!   ids, spans sent over OTLP).
#![deny(missing_docs)]

pub mod agent;
mod alarm;
mod approval;
mod approval_pending;
mod approval_quorum;
mod approval_view;
mod boundary;
mod budget;
mod child;
pub mod clock;
mod config;
mod effect;
mod effect_ledger;
mod effect_stream;
mod error;
mod escalation;
mod event;
mod events;
mod eviction;
mod hooks;
mod json;
mod kernel;
mod limit;
pub mod limits;
mod metrics;
mod pause;
mod retention;
pub mod rng;
mod run;
mod runtime;
mod secret;
mod sleep;
mod stash;
mod storage;
mod stream;
pub mod trace;
mod typed;
mod types;

pub use agent::Ctx;
pub use agent::{Agent, AlarmEvent, ExhaustedAction, Recovered, RecoveryReason};
pub use alarm::{Alarm, AlarmAt, AlarmSpec, CronSchedule};
pub use approval::ApproveOutcome;
pub use approval_pending::PendingApproval;
pub use approval_quorum::{ApprovalRule, Decider, DeclineRule, Reviewers};
pub use approval_view::{ApprovalView, FieldValue, ViewField};

/// JSON Schemas of agents' inputs, for the server's OpenAPI document (feature `schemars`).
#[cfg(feature = "schemars")]
pub use schemars;

/// The JSON Schema of `T`, as [`Agent::input_schema`] returns it (feature `schemars`).
#[cfg(feature = "schemars")]
pub fn input_schema_of<T: schemars::JsonSchema>() -> serde_json::Value {
    schemars::schema_for!(T).to_value()
}
pub use boundary::{Boundary, UnknownBoundary};
pub use child::Child;
pub use config::{
    Budget, DurabilityMode, NamedLimit, Rate, Retention, RuntimeConfig, TraceExport, parse_bytes, parse_range,
};
pub use durafiber_api::Timestamp;
pub use durafiber_store::tables::{
    AlarmRecord, ApprovalRecord, ApprovalRuleRecord, BudgetLimits, BudgetRecord, BudgetSpent, CronRecord,
    DeadLetter, Decision, ForkRecord, LedgerEntry, PauseRecord, Receipt, RunRecord, RunStatus, StashRecord,
    VoteRecord,
};
pub use effect::{EffectError, EffectOptions};
pub use effect_stream::StreamSink;
pub use error::{AgentError, LivenessViolation, RuntimeError};
pub use event::SendOutcome;
pub use events::Event;
pub use eviction::keep_alive::KeepAlive;
pub use json::{HASH_V2_PREFIX, canonical as canonical_json, hash_matches, payload_hash, sha256_hex};
pub use kernel::limiters::LimitGauge;
pub use kernel::observe::CrashHook;
pub use metrics::{HistogramSummary, MetricsSnapshot, describe as describe_metrics};
pub use retention::{DELETE_BATCH_MAX, RunDeleted, SWEEP_EVERY, SWEEP_RUNS_MAX};
pub use run::fork::ForkOptions;
pub use run::start::{StartOutcome, StartRequest};
pub use runtime::{
    ChildShown, DeployProblem, Gauges, HistoryEntry, ListFilter, PausedNow, Quorum, ReplayReport,
    RunInspection, RunOwner, RunPage, RunReplay, Runtime, RuntimeBuilder, StoreGauges, testing,
};
pub use secret::{BadDestination, Destination, Secret, SecretRefusal, Secrets};
pub use storage::{Storage, Transaction};
pub use stream::{PartialChunk, StreamChunk, StreamItem, StreamReset};
pub use types::{RunId, RunOptions, RunState};
