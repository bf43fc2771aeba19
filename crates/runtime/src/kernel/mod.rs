//! The kernel: what every feature works through and nothing above it defines. It imports
//! only the base modules (limits, clock, config, error, json, metrics, rng, secret, events,
//! hooks, boundary, trace); features and runs import it.
//!
//! - `shared`: a runtime's services, each owning its state, the untyped context agent code
//!   reaches the runtime through, and the erased agent interface; the services are
//!   `observe` (metrics, events, spans, secrets, the crash hook), `signals` (the versions
//!   waiters sleep on), `lifecycle` (shutdown, activations, work in progress), `stripes` (the
//!   start, run and inbound locks), `controls` (named limits, pauses, the hook gate, jitter
//!   and chaos) and `timers` (the alarm window, wakeups, retention's next sweep).
//! - `commit`: the one boundary committer — a boundary staged by a feature, committed in
//!   one place, and the actions after it run in one place.
//! - `run_writes`: a run's record read and written under its stripe lock.
//! - `registry`, `by_run_id`, `mailbox`, `inbox`, `cell`: the live runs, the table that finds
//!   each by its id, a run's lazily spawned actor, what it is sent, its in-memory cell.
//! - `hook_gate`, `busy`, `activity`: which recovery hooks run at once, the work in progress
//!   virtual time waits for, who is idle since when.
//! - `alarm_window`, `ownership`: the bounded window of due alarms; which runs this node may
//!   run.
//! - `stash_record`, `stream_buffer`, `live_stream`, `spend`: a stash with its version, output
//!   chunks not yet durable, a streaming effect's partial chunks, spending not yet durable.
//! - `limiters`, `pauses`, `lineage`: the named limits' slots, what operators paused, a run's
//!   family as the store links it.

pub(crate) mod activity;
pub(crate) mod alarm_window;
pub(crate) mod busy;
pub(crate) mod by_run_id;
pub(crate) mod cell;
pub(crate) mod commit;
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
