//! What every version of the trip agent shares: its input, what it books, and the steps
//! after its plan. Each version is its own binary (`trip-v1`, `trip-v2`,
//! `trip-v2-conflict`), as successive deploys of one application would be.

use std::time::Duration;

use durafiber::serde::{Deserialize, Serialize};
use durafiber::{Agent, AgentError, Ctx, serde_json::json};

/// A trip to book, and what it waits for once the hotel is booked.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(crate = "durafiber::serde")]
pub struct TripInput {
    /// Where to.
    pub trip: String,
    /// `event` (the payment, sent as the event `payment`), `sleep` (a cooling-off period of
    /// `sleep_secs`) or `approval` (a manager's).
    pub wait: String,
    /// How long the cooling-off period is, seconds.
    #[serde(default)]
    pub sleep_secs: u64,
}

/// What the hotel's booking call is sent.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(crate = "durafiber::serde")]
pub struct HotelArgs {
    /// Where to.
    pub trip: String,
    /// How many nights.
    pub nights: u32,
}

/// A booked trip.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(crate = "durafiber::serde")]
pub struct Booked {
    /// The hotel's booking id.
    pub hotel: String,
    /// Whether the wait ended as hoped (paid, approved, cooled off).
    pub confirmed: bool,
}

/// The steps after the plan's stash, written for re-entry: the booking answers from its
/// receipt, the progress chunk is emitted again at its place, the wait from its journal.
/// `by` is the version saying the progress line; `nights` what the booking asks for.
pub async fn after_plan<A: Agent>(
    ctx: &mut Ctx<A>,
    input: &TripInput,
    by: &str,
    nights: u32,
) -> Result<Booked, AgentError> {
    let args = HotelArgs { trip: input.trip.clone(), nights };
    let hotel: String = ctx
        .effect("hotel", args, |idempotency_key, _args| async move {
            // Stands in for the hotel's API; its booking id is derived from the key.
            let tail = idempotency_key.rsplit(':').next().unwrap_or(&idempotency_key).to_string();
            Ok::<_, AgentError>(format!("htl_{tail}"))
        })
        .await?;
    // Kept where requests read it (`on_request`): the run's storage, not the prompt.
    ctx.storage().put("hotel", &hotel).await?;
    ctx.emit(&json!({"text": "payment:waiting", "by": by}))?;
    let confirmed = match input.wait.as_str() {
        "event" => ctx.wait_for_event::<durafiber::serde_json::Value>("payment", None).await?.is_some(),
        "sleep" => {
            ctx.sleep_for("cooling-off", Duration::from_secs(input.sleep_secs)).await?;
            true
        }
        "approval" => {
            let asked = json!({"trip": input.trip, "hotel": hotel});
            ctx.request_approval("manager", &asked).await?.approved
        }
        other => return Err(AgentError::fail(format!("unknown wait {other:?}"))),
    };
    ctx.emit(&json!({"text": "trip:booked"}))?;
    Ok(Booked { hotel, confirmed })
}

/// What a request for the run's booking answers: the hotel it booked, once it has.
pub fn booking<A: Agent>(ctx: &Ctx<A>) -> Result<durafiber::serde_json::Value, AgentError> {
    let hotel: Option<String> = ctx.storage().get("hotel")?;
    Ok(json!({"hotel": hotel}))
}
