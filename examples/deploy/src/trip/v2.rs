//! The trip agent as deployed next: its stash is version 2 (renamed, one field more),
//! upgraded from version 1; its progress line says `v2`. `NIGHTS` is what the booking asks
//! for: the same as version 1 in `trip-v2`, another in `trip-v2-conflict`, which a run
//! re-entered after its booking cannot take (its key was minted for other arguments).

use durafiber::serde::{Deserialize, Serialize};
use durafiber::{Agent, AgentError, Ctx, Recovered, serde_json::json};

use crate::common::{Booked, TripInput, after_plan, booking};

/// The agent; it books `NIGHTS` nights.
pub struct Trip<const NIGHTS: u32>;

/// Version 2 of the stash.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(crate = "durafiber::serde")]
pub struct Planned {
    /// Where to (`trip` in version 1).
    pub destination: String,
    /// Who travels (not in version 1: one).
    pub travellers: u32,
}

/// Version 1's stash, read by the upgrade.
#[derive(Deserialize)]
#[serde(crate = "durafiber::serde")]
struct PlannedV1 {
    trip: String,
}

impl<const NIGHTS: u32> Agent for Trip<NIGHTS> {
    const KIND: &'static str = "trip";
    const STASH_VERSION: u32 = 2;
    type Input = TripInput;
    type Stash = Planned;
    type Output = Booked;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, input: TripInput) -> Result<Booked, AgentError> {
        ctx.emit(&json!({"text": "trip:planning"}))?;
        ctx.stash("planned", &Planned { destination: input.trip.clone(), travellers: 1 }).await?;
        after_plan(ctx, &input, "v2", NIGHTS).await
    }

    async fn on_request(&self, ctx: &mut Ctx<Self>, (): ()) -> Result<durafiber::serde_json::Value, AgentError> {
        booking(ctx)
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, r: Recovered<Self>) -> Result<Booked, AgentError> {
        match r.stash {
            Some(_) => after_plan(ctx, &r.input, "v2", NIGHTS).await,
            None => self.run_fiber(ctx, r.input).await,
        }
    }

    fn upgrade_stash(from_version: u32, old: durafiber::serde_json::Value) -> Result<Planned, AgentError> {
        match from_version {
            1 => {
                let v1: PlannedV1 =
                    durafiber::serde_json::from_value(old).map_err(|e| AgentError::fail(e.to_string()))?;
                Ok(Planned { destination: v1.trip, travellers: 1 })
            }
            v => Err(AgentError::escalate(format!("stash_version: no upgrade from {v}"))),
        }
    }
}
