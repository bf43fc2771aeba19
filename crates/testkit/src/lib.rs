//! The test kit: what every durafiber test and example leans on.
//!
//! - [`conformance`]: the store conformance suite; every backend runs it.
//! - [`upstream`]: a real HTTP server on 127.0.0.1 that deduplicates by `Idempotency-Key`
//!   as payment APIs do, so "side effects once" is counted upstream, not by our own flag.
//! - [`agents`]: small agents the tests, the drill and the benchmarks share.
//! - [`bulk`]: many pending alarms written straight into a store.

pub mod agents;
pub mod bulk;
pub mod conformance;
pub mod upstream;

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
