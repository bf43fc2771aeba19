//! What the project's `durafiber` binary hosts and what its drill, torture and benchmarks
//! call — real code, kept in one place so that the tests, the drill and the examples run
//! the same thing. It is not part of the product: no product crate depends on it.
//!
//! - [`agents`]: the refund, steps and writer agents, and the order agent re-exported (the
//!   refund and order agents call the test kit's idempotent upstream).
//! - [`order`]: the torture's order agent, in two stash versions.
//! - [`poison`]: the torture's agent whose recovery hook aborts the process.
//! - [`bulk`]: many pending alarms written straight into a store, for benchmarks.
//! - [`sim`]: the eviction and alarm-retry simulations on a virtual clock (`durafiber sim`).

pub mod agents;
pub mod bulk;
pub mod order;
pub mod poison;
pub mod sim;
