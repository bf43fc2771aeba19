//! Agents shared by the tests, the drill, the examples and the benchmarks.
//!
//! - [`Steps`]: stashes a counter N times; recovery continues from the last stash.
//! - [`Refund`]: the article's refund job: draft → human approval → refund through an
//!   idempotent upstream → confirmation email, each effect through the ledger.

use durafiber_runtime::{Agent, AgentError, ApprovalRule, Ctx, Recovered, Secret};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use durafiber_testkit::upstream::post_idempotent;

/// Acknowledged stashes, `(run_id, done)`, in order.
pub type AckLog = std::sync::Arc<parking_lot::Mutex<Vec<(String, u32)>>>;

/// When each stash started, how long it took as the agent saw it (µs), and the core its
/// thread was on when it returned — the core that waited for the disk — in order.
pub type StashTimes = std::sync::Arc<parking_lot::Mutex<Vec<(std::time::Instant, u64, usize)>>>;

/// Stashes `done = 1..=steps`, sleeping `pause_ms` (clock time) between stashes.
#[derive(Default, Clone)]
pub struct Steps {
    /// Print `ack <run_id> <done>` after each stash returns (for kill tests).
    pub print_acks: bool,
    /// Record `(run_id, done)` after each stash returns (for simulated crash tests).
    pub ack_log: Option<AckLog>,
    /// Record how long each stash took (for benchmarks).
    pub stash_times: Option<StashTimes>,
}

/// Input of [`Steps`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct StepsInput {
    /// How many stashes.
    pub steps: u32,
    /// Clock time between stashes.
    pub pause_ms: u64,
}

/// Stash of [`Steps`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepsStash {
    /// Steps done.
    pub done: u32,
    /// The `done` each recovery started from.
    pub resumed_from: Vec<u32>,
}

/// Output of [`Steps`].
pub type StepsOutput = StepsStash;

impl Steps {
    async fn count(
        &self,
        ctx: &mut Ctx<Self>,
        input: StepsInput,
        mut s: StepsStash,
    ) -> Result<StepsStash, AgentError> {
        while s.done < input.steps {
            if input.pause_ms > 0 {
                ctx.sleep_in_memory(std::time::Duration::from_millis(input.pause_ms)).await;
            }
            s.done += 1;
            let started = std::time::Instant::now();
            ctx.stash("step", &s).await?;
            if let Some(times) = &self.stash_times {
                let took = started.elapsed().as_micros() as u64;
                times.lock().push((started, took, rustix::thread::sched_getcpu()));
            }
            if self.print_acks {
                println!("ack {} {}", ctx.run_id(), s.done);
            }
            if let Some(log) = &self.ack_log {
                log.lock().push((ctx.run_id().to_string(), s.done));
            }
        }
        Ok(s)
    }
}

impl Agent for Steps {
    const KIND: &'static str = "steps";
    type Input = StepsInput;
    type Stash = StepsStash;
    type Output = StepsOutput;
    type Message = ();

    fn input_schema() -> Option<serde_json::Value> {
        Some(durafiber_runtime::input_schema_of::<StepsInput>())
    }

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, input: StepsInput) -> Result<StepsOutput, AgentError> {
        self.count(ctx, input, StepsStash { done: 0, resumed_from: vec![] }).await
    }

    async fn on_fiber_recovered(
        &self,
        ctx: &mut Ctx<Self>,
        r: Recovered<Self>,
    ) -> Result<StepsOutput, AgentError> {
        let mut s = r.stash.unwrap_or(StepsStash { done: 0, resumed_from: vec![] });
        s.resumed_from.push(s.done);
        self.count(ctx, r.input, s).await
    }
}

/// Writes `token 0`, `token 1`, … to its durable output stream, a stash every `per_stash`
/// chunks: what a model's streamed answer looks like to the runtime. A chunk is durable with
/// the stash that counts it, so a re-entered run continues its stream without a gap or a
/// repeat (the stream tests check a client's transcript through kills).
#[derive(Default, Clone)]
pub struct Writer;

/// Input of [`Writer`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WriterInput {
    /// Chunks in all.
    pub chunks: u32,
    /// Chunks per stash.
    pub per_stash: u32,
    /// Clock time before each chunk.
    pub pause_ms: u64,
}

impl Writer {
    async fn write(&self, ctx: &mut Ctx<Self>, input: WriterInput, from: u32) -> Result<u32, AgentError> {
        let per_stash = input.per_stash.max(1);
        for n in from..input.chunks {
            if input.pause_ms > 0 {
                ctx.sleep_in_memory(std::time::Duration::from_millis(input.pause_ms)).await;
            }
            ctx.emit(&format!("token {n}"))?;
            let done = n + 1;
            if done % per_stash == 0 || done == input.chunks {
                ctx.stash("written", &done).await?;
            }
        }
        Ok(input.chunks)
    }
}

impl Agent for Writer {
    const KIND: &'static str = "writer";
    type Input = WriterInput;
    type Stash = u32;
    type Output = u32;
    type Message = ();

    fn input_schema() -> Option<serde_json::Value> {
        Some(durafiber_runtime::input_schema_of::<WriterInput>())
    }

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, input: WriterInput) -> Result<u32, AgentError> {
        self.write(ctx, input, 0).await
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, r: Recovered<Self>) -> Result<u32, AgentError> {
        self.write(ctx, r.input, r.stash.unwrap_or(0)).await
    }
}

/// The refund job of the drill.
#[derive(Default, Clone)]
pub struct Refund {
    http: reqwest::Client,
}

/// Input of [`Refund`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RefundInput {
    /// The order to refund.
    pub order_id: String,
    /// How much, in cents.
    pub amount_cents: u64,
    /// Who gets the confirmation.
    pub customer_email: String,
    /// Base URL of the payment/email upstream.
    pub upstream: String,
    /// The upstream's API key: a pointer, resolved at use, never stored.
    pub api_key: Option<Secret>,
    /// Who must approve when one person is not enough (a refund over a limit):
    /// `{"required": 2, "from": {"named": ["alice", "bob", "carol"]}}`. None: anyone, once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_rule: Option<ApprovalRule>,
}

/// What the reviewer sees and approves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RefundDraft {
    /// The order.
    pub order_id: String,
    /// The amount, cents.
    pub amount_cents: u64,
    /// Why.
    pub reason: String,
}

/// Stash of [`Refund`]: where the job stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RefundStash {
    /// `drafted`, `refunded`, `emailed`.
    pub phase: String,
    /// The upstream refund id, once known.
    pub refund_id: Option<String>,
}

/// Output of [`Refund`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RefundOutput {
    /// Whether the human approved.
    pub approved: bool,
    /// The upstream refund object's id.
    pub refund_id: Option<String>,
    /// The upstream email object's id.
    pub email_id: Option<String>,
}

impl Refund {
    /// Every step is a boundary or an effect, so re-entering from the top is safe: the
    /// approval returns its recorded decision and each effect its stored receipt.
    async fn flow(&self, ctx: &mut Ctx<Self>, input: RefundInput) -> Result<RefundOutput, AgentError> {
        let draft = RefundDraft {
            order_id: input.order_id.clone(),
            amount_cents: input.amount_cents,
            reason: "customer request".into(),
        };
        ctx.stash("drafted", &RefundStash { phase: "drafted".into(), refund_id: None }).await?;
        let decision = match &input.approval_rule {
            Some(rule) => ctx.request_approval_with("refund", &draft, rule).await?,
            None => ctx.request_approval("refund", &draft).await?,
        };
        if !decision.approved {
            return Ok(RefundOutput { approved: false, refund_id: None, email_id: None });
        }
        // The key goes only where it is bound to (DURAFIBER_SECRET_<NAME>_HOSTS): a run whose
        // input names another upstream fails here, before anything is sent.
        let token = match &input.api_key {
            Some(secret) => Some(ctx.secret_for(secret, &input.upstream)?),
            None => None,
        };
        let (http, base) = (self.http.clone(), input.upstream.clone());
        let auth = token.clone();
        let refund: Value = ctx
            .effect("refund", draft, move |key, args| {
                let (http, base, auth) = (http.clone(), base.clone(), auth.clone());
                async move { post_idempotent(&http, &base, "refunds", &key, auth.as_deref(), &json!(args)).await }
            })
            .await?;
        let refund_id = refund["id"].as_str().map(str::to_string);
        ctx.stash("refunded", &RefundStash { phase: "refunded".into(), refund_id: refund_id.clone() })
            .await?;
        let (http, base) = (self.http.clone(), input.upstream.clone());
        let email_args =
            json!({"to": input.customer_email, "template": "refund_confirmation", "refund_id": refund_id});
        let email: Value = ctx
            .effect("email:confirmation", email_args, move |key, args| {
                let (http, base, auth) = (http.clone(), base.clone(), token.clone());
                async move { post_idempotent(&http, &base, "emails", &key, auth.as_deref(), &args).await }
            })
            .await?;
        ctx.stash("emailed", &RefundStash { phase: "emailed".into(), refund_id: refund_id.clone() }).await?;
        Ok(RefundOutput { approved: true, refund_id, email_id: email["id"].as_str().map(str::to_string) })
    }
}

impl Agent for Refund {
    const KIND: &'static str = "refund";
    type Input = RefundInput;
    type Stash = RefundStash;
    type Output = RefundOutput;
    type Message = ();

    fn input_schema() -> Option<serde_json::Value> {
        Some(durafiber_runtime::input_schema_of::<RefundInput>())
    }

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, input: RefundInput) -> Result<RefundOutput, AgentError> {
        self.flow(ctx, input).await
    }

    async fn on_fiber_recovered(
        &self,
        ctx: &mut Ctx<Self>,
        r: Recovered<Self>,
    ) -> Result<RefundOutput, AgentError> {
        self.flow(ctx, r.input).await
    }
}

pub use crate::order::{
    Label, LabelInput, ORDER_ALARMS, ORDER_RECEIPT, ORDER_STORAGE, ORDER_STREAM, Order, OrderInput,
    OrderOutput, OrderProgress, OrderStash, OrderV2,
};
