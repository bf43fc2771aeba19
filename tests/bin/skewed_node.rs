//! Child process of `clock_skew`: `serve` (and every other command of a user's binary) for
//! the `nap` agent, a durable sleep, on the system clock set off by `CLOCK_OFFSET_MS`
//! milliseconds: a node whose machine keeps the wrong time.

use std::time::Duration;

use durafiber_runtime::{Agent, AgentError, Ctx, Recovered};
use durafiber_testkit::clock::SkewedClock;
use serde::{Deserialize, Serialize};

/// Sleeps durably for `ms`, then ends with the time it woke (the runtime's clock).
#[derive(Default, Clone)]
struct Nap;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct NapInput {
    ms: u64,
}

impl Nap {
    async fn nap(ctx: &mut Ctx<Self>, input: &NapInput) -> Result<u64, AgentError> {
        ctx.sleep_for("nap", Duration::from_millis(input.ms)).await?;
        Ok(ctx.now().as_millis())
    }
}

impl Agent for Nap {
    const KIND: &'static str = "nap";
    type Input = NapInput;
    type Stash = ();
    type Output = u64;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, input: NapInput) -> Result<u64, AgentError> {
        Nap::nap(ctx, &input).await
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, r: Recovered<Self>) -> Result<u64, AgentError> {
        Nap::nap(ctx, &r.input).await
    }
}

fn main() {
    let offset_ms: i64 = std::env::var("CLOCK_OFFSET_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    durafiber_cli::main(move |builder| builder.agent(Nap).clock(SkewedClock::new(offset_ms)))
}
