//! The test kit: what every durafiber test and example leans on.
//!
//! - [`check`]: the crash and eviction checker, for any agent.
//! - [`clock`]: a clock set off on purpose, as a node whose machine keeps the wrong time.
//! - [`conformance`]: the store conformance suite; every backend runs it.
//! - [`openai`]: a fake OpenAI-compatible chat-completions server (streaming, tool calls,
//!   usage, scripted `429`s and cut streams), so model-calling agents are tested offline.
//! - [`otlp`]: an OpenTelemetry collector in the test's process, to find a run's spans.
//! - [`postgres`]: a private PostgreSQL server per test.
//! - [`process`]: child processes with a deadline, so a hung child fails its test.
//! - [`upstream`]: a real HTTP server on 127.0.0.1 that deduplicates by `Idempotency-Key`
//!   as payment APIs do, so "side effects once" is counted upstream, not by our own flag.

pub mod check;
pub mod clock;
pub mod conformance;
pub mod openai;
pub mod otlp;
pub mod postgres;
pub mod process;
pub mod upstream;

pub use durafiber_runtime::rng::SeededRng;

/// Where every simulation's virtual clock starts (2026-01-01T00:00:00Z).
pub const SIM_EPOCH_MS: u64 = 1_767_225_600_000;

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
