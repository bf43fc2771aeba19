//! The kernel: what every feature works through and nothing above it defines — the shared
//! runtime state, run cells, the registry of live runs, the actors' inbox, the alarm window,
//! the activity tracker, what this node owns, a run's family as the store links it, a run's stored stash, its output stream and spending between boundaries, the named limits' slots, and the interface through which agent code is called. It imports
//! only the base modules (limits, clock, config, error, json, metrics, rng, secret, events,
//! hooks); features and runs import it.

pub(crate) mod activity;
pub(crate) mod agents;
pub(crate) mod alarm_window;
pub(crate) mod busy;
pub(crate) mod by_run_id;
pub(crate) mod cell;
pub(crate) mod controls;
pub(crate) mod hook_gate;
pub(crate) mod inbox;
pub(crate) mod lifecycle;
pub(crate) mod limiters;
pub(crate) mod lineage;
pub(crate) mod live_stream;
pub(crate) mod mailbox;
pub(crate) mod observe;
pub(crate) mod ownership;
pub(crate) mod pauses;
pub(crate) mod registry;
pub(crate) mod run_writes;
pub(crate) mod shared;
pub(crate) mod signals;
pub(crate) mod spend;
pub(crate) mod stash_record;
pub(crate) mod stream_buffer;
pub(crate) mod stripes;
pub(crate) mod timers;
