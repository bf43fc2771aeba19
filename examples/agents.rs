//! The agents of the examples, in the library so that the examples run them and
//! `cargo test -p durafiber-examples` checks them with the crash and eviction checker.

use durafiber::serde::{Deserialize, Serialize};
use durafiber::{Agent, AgentError, Ctx, Recovered};

/// The README's summarizer: stashes after every document.
#[derive(Clone, Copy, Default)]
pub struct Summarizer;

/// What the summarizer has done so far.
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(crate = "durafiber::serde")]
pub struct Progress {
    /// Documents summarized.
    pub done: usize,
    /// Their summaries.
    pub summaries: Vec<String>,
}

type Summaries = Result<Vec<String>, AgentError>;

impl Agent for Summarizer {
    const KIND: &'static str = "summarizer";
    type Input = Vec<String>;
    type Stash = Progress;
    type Output = Vec<String>;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, docs: Vec<String>) -> Summaries {
        work(ctx, docs, Progress::default()).await
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, r: Recovered<Self>) -> Summaries {
        work(ctx, r.input, r.stash.unwrap_or_default()).await // resume after the last stash
    }
}

async fn work(ctx: &mut Ctx<Summarizer>, docs: Vec<String>, mut p: Progress) -> Summaries {
    for doc in &docs[p.done..] {
        p.summaries.push(doc.chars().take(24).collect()); // call your model here
        p.done += 1;
        ctx.stash("summarized", &p).await?; // durable before the next step starts
    }
    Ok(p.summaries)
}

/// Handles one `invoice.paid` event.
#[derive(Clone, Copy, Default)]
pub struct InvoicePaid;

/// An `invoice.paid` webhook's payload.
#[derive(Clone, Serialize, Deserialize)]
#[serde(crate = "durafiber::serde")]
pub struct Event {
    /// The invoice.
    pub invoice: String,
    /// The amount paid, cents.
    pub cents: u64,
}

impl Agent for InvoicePaid {
    const KIND: &'static str = "invoice_paid";
    type Input = Event;
    type Stash = ();
    type Output = String;
    type Message = ();

    async fn run_fiber(&self, _ctx: &mut Ctx<Self>, e: Event) -> Result<String, AgentError> {
        Ok(format!("booked {} cents for {}", e.cents, e.invoice))
    }

    /// Booking has no side effect of its own, so an interrupted run simply books again. (The
    /// default hook escalates: the checker found that a crash right after the fiber was
    /// registered left this run to a human.)
    async fn on_fiber_recovered(
        &self,
        ctx: &mut Ctx<Self>,
        r: Recovered<Self>,
    ) -> Result<String, AgentError> {
        self.run_fiber(ctx, r.input).await
    }
}
