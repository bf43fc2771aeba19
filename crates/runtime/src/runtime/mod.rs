//! The runtime: the public face of everything in this crate.
//!
//! `Runtime::builder(store)` registers agent kinds and opens the runtime; opening scans for
//! interrupted runs and re-activates them without waiting for a request. On the system clock
//! a driver task (`run/driver.rs`) wakes at the next deadline (hibernation, eviction,
//! heartbeat, recovery backoff, alarm); on a virtual clock, `advance` walks the same
//! deadlines in order. The handle's methods are split by what they do: `handle` (open, start,
//! time, shutdown), `inspect` (reading runs), `inbound` (what reaches a run from outside),
//! `deploy_check` (would new code carry the open runs: their inputs and stashes decoded),
//! `deploy_replay` (what new code does with each open run, re-entered in a sandbox), `testing` (crash hooks and internal
//! views, as extension traits).

mod builder;
mod deploy_check;
mod deploy_replay;
mod gauges;
mod handle;
mod inbound;
mod inspect;
pub mod testing;

pub use builder::RuntimeBuilder;
pub use deploy_check::DeployProblem;
pub use deploy_replay::{ReplayReport, RunReplay};
pub use gauges::{Gauges, StoreGauges};
pub use handle::{RunOwner, Runtime};
pub use inbound::PausedNow;
pub use inspect::{ChildShown, HistoryEntry, ListFilter, Quorum, RunInspection, RunPage};
