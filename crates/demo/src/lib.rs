//! What `durafiber serve` hosts and what its drill, torture and benchmarks call — real code,
//! kept in one place so that the tests, the drill and the examples run the same thing:
//!
//! - [`agents`]: the refund, steps and order agents.
//! - [`upstream`]: a real HTTP server on 127.0.0.1 that deduplicates by `Idempotency-Key`
//!   as payment APIs do, so "side effects once" is counted upstream, not by our own flag.
//! - [`bulk`]: many pending alarms written straight into a store, for benchmarks.
//! - [`sim`]: the eviction and alarm-retry simulations on a virtual clock (`durafiber sim`).
//!
//! The test kit re-exports them; the command line depends on this crate, not on the
//! test kit.

pub mod agents;
pub mod bulk;
pub mod sim;
pub mod upstream;
