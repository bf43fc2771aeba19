//! The torture's poison: an agent whose recovery hook takes the whole process down, every
//! time. Its runs must end escalated after their hook killed the process while it ran alone;
//! no other run may be escalated for the deaths it causes.

use durafiber_runtime::{Agent, AgentError, Ctx, Recovered};

/// What the poison writes to standard error just before it aborts the process, so that a
/// harness tells its deaths from a server's own failures.
pub const POISON_MARK: &str = "poison: the recovery hook aborts the process";

/// Stashes and waits to be cancelled; its recovery hook aborts the process.
#[derive(Debug, Clone, Copy, Default)]
pub struct Poison;

impl Agent for Poison {
    const KIND: &'static str = "poison";
    type Input = ();
    type Stash = u32;
    type Output = ();
    type Message = ();

    fn input_schema() -> Option<serde_json::Value> {
        Some(durafiber_runtime::input_schema_of::<()>())
    }

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<(), AgentError> {
        ctx.stash("started", &1).await?;
        ctx.cancelled().await;
        Err(AgentError::Cancelled("cancelled".into()))
    }

    async fn on_fiber_recovered(&self, _: &mut Ctx<Self>, _: Recovered<Self>) -> Result<(), AgentError> {
        eprintln!("{POISON_MARK}");
        std::process::abort();
    }
}
