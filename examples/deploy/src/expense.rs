//! An expense claim: it waits for the scanned receipt, asks a manager, and reimburses once.
//!
//! Every step is durable. The receipt's event, the manager's decision and the payment's
//! receipt are each recorded before the next step starts, so a kill at any moment resumes
//! the same claim where it stood, and the payment is never made twice.

use std::time::Duration;

use durafiber::schemars::JsonSchema;
use durafiber::serde::{Deserialize, Serialize};
use durafiber::{Agent, AgentError, ApprovalView, Ctx, FieldValue, Recovered};

/// The agent. It keeps nothing in memory: everything it knows is in the run's records.
pub struct Expense;

/// A claim, as an employee files it. Its schema is the start body the server's OpenAPI
/// document shows for this kind.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(crate = "durafiber::serde")]
#[schemars(crate = "durafiber::schemars")]
pub struct Claim {
    /// Who is owed.
    pub employee: String,
    /// How much, in cents.
    pub amount_cents: i64,
    /// In which currency (ISO 4217).
    pub currency: String,
    /// What for.
    pub description: String,
}

/// The scanned receipt, sent as the external event `receipt`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(crate = "durafiber::serde")]
pub struct Receipt {
    /// Where the scan is.
    pub url: String,
}

/// What the manager is shown.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(crate = "durafiber::serde")]
struct ForApproval {
    claim: Claim,
    receipt_url: String,
}

/// How a claim ends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(crate = "durafiber::serde")]
pub struct Settled {
    /// Whether the manager approved.
    pub approved: bool,
    /// The payment's id, when one was made.
    pub payment_id: Option<String>,
}

/// How long a claim waits for its receipt before it is declined.
const RECEIPT_WAIT: Duration = Duration::from_secs(7 * 24 * 3600);

impl Agent for Expense {
    const KIND: &'static str = "expense";
    type Input = Claim;
    type Stash = ();
    type Output = Settled;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, claim: Claim) -> Result<Settled, AgentError> {
        settle(ctx, claim).await
    }

    // Every step below answers from its record when re-entered: resuming is running again.
    async fn on_fiber_recovered(
        &self,
        ctx: &mut Ctx<Self>,
        r: Recovered<Self>,
    ) -> Result<Settled, AgentError> {
        settle(ctx, r.input).await
    }

    fn input_schema() -> Option<durafiber::serde_json::Value> {
        Some(durafiber::input_schema_of::<Claim>())
    }

    fn approval_view(
        &self,
        _approval_id: &str,
        payload: &durafiber::serde_json::Value,
    ) -> Option<ApprovalView> {
        let shown: ForApproval = durafiber::serde_json::from_value(payload.clone()).ok()?;
        let amount =
            FieldValue::Money { minor_units: shown.claim.amount_cents, currency: shown.claim.currency };
        let summary =
            format!("{}: {} for {}", shown.claim.employee, amount.display(), shown.claim.description);
        Some(
            ApprovalView::new(format!("Reimburse {}", shown.claim.employee))
                .summary(summary)
                .field("Amount", amount)
                .field("For", FieldValue::Text(shown.claim.description))
                .field(
                    "Receipt",
                    FieldValue::Link { text: "the scanned receipt".into(), url: shown.receipt_url },
                ),
        )
    }
}

async fn settle(ctx: &mut Ctx<Expense>, claim: Claim) -> Result<Settled, AgentError> {
    let Some(receipt) = ctx.wait_for_event::<Receipt>("receipt", Some(RECEIPT_WAIT)).await? else {
        return Ok(Settled { approved: false, payment_id: None });
    };
    let asked = ForApproval { claim: claim.clone(), receipt_url: receipt.url };
    let decision = ctx.request_approval("manager", &asked).await?;
    if !decision.approved {
        return Ok(Settled { approved: false, payment_id: None });
    }
    // The key is minted once and recorded before the first call: a payment API given it
    // pays once however often this line is re-entered.
    let payment_id: String = ctx
        .effect("reimburse", claim, |idempotency_key, _claim| async move {
            // Stands in for the payment API's call; its id is derived from the key.
            let tail = idempotency_key.rsplit(':').next().unwrap_or(&idempotency_key).to_string();
            Ok::<_, AgentError>(format!("pay_{tail}"))
        })
        .await?;
    Ok(Settled { approved: true, payment_id: Some(payment_id) })
}
