//! The test kit: what every durafiber test and example leans on.
//!
//! - [`check`]: the crash and eviction checker, for any agent.
//! - [`conformance`]: the store conformance suite; every backend runs it.
//! - [`postgres`]: a private PostgreSQL server per test.
//! - [`upstream`], [`agents`], [`bulk`]: from `durafiber-demo` — the idempotent upstream,
//!   the agents the server hosts, bulk alarm data, the eviction and alarm simulations.

pub mod check;
pub mod conformance;
pub mod postgres;

pub use durafiber_demo::{agents, bulk, sim, upstream};

pub use durafiber_runtime::rng::SeededRng;

/// Installs a tracing subscriber once, filtered by `RUST_LOG` (warnings by default). It writes
/// through the test harness, so a passing test stays quiet and a failing one shows its log.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}
