//! Durable runs for long-running agents: after the host dies, the same run continues from
//! its last safe boundary, without a second side effect.
//!
//! # Module map
//! - [`agent`]: the trait users implement.
//! - `run/`: `start` (durable accept, dedupe by key), `registry` (one live actor per run id),
//!   `actor` (one inbound event at a time).
//! - `fiber/`: `ctx` (what user code calls), `stash`, `recovery` (interrupted runs).
//! - `effect`: the idempotency ledger. `approval`: durable human pauses. `sleep`: durable
//!   sleeps. `event`: durable external events. `storage`: each run's key-value storage.
//! - `alarm/`: named durable alarms, the bounded scheduler window, delivery with retries.
//! - `eviction/`: hibernation, eviction, keep-alive guards.
//! - [`clock`]: the only source of time. `limits`: every default and maximum.
#![deny(missing_docs)]

pub mod agent;
mod alarm;
mod approval;
pub mod clock;
mod config;
mod effect;
mod error;
mod escalation;
mod event;
mod events;
mod eviction;
mod hooks;
mod json;
mod kernel;
pub mod limits;
mod metrics;
pub mod rng;
mod run;
mod runtime;
mod secret;
mod sleep;
mod stash;
mod storage;
mod typed;

pub use agent::Ctx;
pub use agent::{Agent, AlarmEvent, ExhaustedAction, Recovered, RecoveryReason};
pub use alarm::{AlarmAt, AlarmSpec};
pub use approval::{ApproveOutcome, PendingApproval};
pub use config::{DurabilityMode, RuntimeConfig, parse_bytes, parse_range};
pub use durafiber_store::tables::{Decision, RunOptions, RunRecord, RunStatus};
pub use error::{AgentError, LivenessViolation, RuntimeError};
pub use event::SendOutcome;
pub use events::Event;
pub use eviction::keep_alive::KeepAlive;
pub use json::{canonical as canonical_json, sha256_hex};
pub use kernel::shared::CrashHook;
pub use metrics::{HistogramSummary, MetricsSnapshot};
pub use run::start::StartOutcome;
pub use runtime::{ListFilter, RunInspection, RunPage, Runtime, RuntimeBuilder};
pub use secret::{Secret, Secrets};
pub use storage::{Storage, Transaction};
