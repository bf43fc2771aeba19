//! The trip agent as first deployed: its stash is version 1.

use durafiber::serde::{Deserialize, Serialize};
use durafiber::{Agent, AgentError, Ctx, Recovered, serde_json::json};

use crate::common::{Booked, TripInput, after_plan, booking};

/// The agent.
pub struct Trip;

/// Version 1 of the stash: the trip's name.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(crate = "durafiber::serde")]
pub struct Planned {
    /// Where to.
    pub trip: String,
}

impl Agent for Trip {
    const KIND: &'static str = "trip";
    type Input = TripInput;
    type Stash = Planned;
    type Output = Booked;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, input: TripInput) -> Result<Booked, AgentError> {
        ctx.emit(&json!({"text": "trip:planning"}))?;
        ctx.stash("planned", &Planned { trip: input.trip.clone() }).await?;
        after_plan(ctx, &input, "v1", 2).await
    }

    async fn on_request(&self, ctx: &mut Ctx<Self>, (): ()) -> Result<durafiber::serde_json::Value, AgentError> {
        booking(ctx)
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, r: Recovered<Self>) -> Result<Booked, AgentError> {
        match r.stash {
            Some(_) => after_plan(ctx, &r.input, "v1", 2).await,
            None => self.run_fiber(ctx, r.input).await,
        }
    }
}
