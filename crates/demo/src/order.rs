//! The torture's order agent, in two stash versions, and what it writes: its output stream,
//! its storage keys, the upstream collection its alarm handler reports to; and the label
//! agent it starts as a child run.

use durafiber_runtime::RunId;
use durafiber_runtime::{Agent, AgentError, Ctx, Recovered};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use durafiber_testkit::upstream::post_idempotent;

/// The torture's order job: stashes, two named alarms, a human approval, two effects through
/// an idempotent upstream and a streaming one (the receipt, streamed to the run's output),
/// a child run that makes the shipping label ([`Label`]) and is joined, a durable sleep, a
/// wait for the external event `packed`, storage written in transactions, and a wait until
/// both alarms were delivered. Every step is a boundary, an effect, a child started under
/// its name or a guarded storage write, so re-entering from the top at any point is safe.
/// What it stores, `on_request` answers (see [`ORDER_STORAGE`]).
///
/// It comes in two stash versions, so the torture can deploy version 2 over a store full of
/// version 1 runs: [`Order`] stashes its phase as a number, [`OrderV2`] as an
/// [`OrderProgress`] and upgrades a version 1 stash on recovery.
pub struct Order<S = u32> {
    http: reqwest::Client,
    stash: std::marker::PhantomData<fn() -> S>,
}

/// The order agent with stash version 2.
pub type OrderV2 = Order<OrderProgress>;

impl<S> Default for Order<S> {
    fn default() -> Self {
        Order { http: reqwest::Client::default(), stash: std::marker::PhantomData }
    }
}

impl<S> Clone for Order<S> {
    fn clone(&self) -> Self {
        Order { http: self.http.clone(), stash: std::marker::PhantomData }
    }
}

/// How an [`Order`] stashes its phase, per stash version.
pub trait OrderStash: Serialize + serde::de::DeserializeOwned + Clone + Send + Sync + 'static {
    /// The agent's `STASH_VERSION`.
    const VERSION: u32;
    /// The stash at `phase`.
    fn at(phase: u32) -> Self;
    /// A stash of an older version, as this one.
    fn upgrade(from_version: u32, old: Value) -> Result<Self, AgentError>;
}

impl OrderStash for u32 {
    const VERSION: u32 = 1;

    fn at(phase: u32) -> Self {
        phase
    }

    fn upgrade(from_version: u32, _: Value) -> Result<Self, AgentError> {
        Err(AgentError::escalate(format!("stash_version: no upgrade from {from_version} to 1")))
    }
}

/// Version 2 of [`Order`]'s stash: the phase in an object, and which version wrote it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OrderProgress {
    /// The phase reached (0 received, 1 alarms set, 2 charged, 3 done).
    pub phase: u32,
    /// `"v2"`, or `"upgraded from v1"` for a stash version 1 wrote.
    pub written_by: String,
}

impl OrderStash for OrderProgress {
    const VERSION: u32 = 2;

    fn at(phase: u32) -> Self {
        OrderProgress { phase, written_by: "v2".into() }
    }

    fn upgrade(from_version: u32, old: Value) -> Result<Self, AgentError> {
        match (from_version, old.as_u64().and_then(|n| u32::try_from(n).ok())) {
            (1, Some(phase)) => Ok(OrderProgress { phase, written_by: "upgraded from v1".into() }),
            _ => {
                Err(AgentError::escalate(format!("stash_version: cannot upgrade {old} from {from_version}")))
            }
        }
    }
}

/// Input of [`Order`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct OrderInput {
    /// The order.
    pub order_id: String,
    /// Amount to charge, cents.
    pub amount_cents: u64,
    /// Base URL of the upstream.
    pub upstream: String,
    /// Delays of the run's alarms, ms: one alarm per entry, named `alarm:<i>`.
    pub alarm_delays_ms: Vec<u64>,
    /// A durable sleep `cool-off` this long after the email, ms (0: none).
    #[serde(default)]
    pub cool_off_ms: u64,
    /// Wait for the external event `packed` after the cool-off, and store its payload.
    #[serde(default)]
    pub wait_for_packing: bool,
    /// Alarm `alarm:0` fires on this cron schedule instead of after its delay.
    #[serde(default)]
    pub cron: Option<String>,
    /// How long each alarm delivery's handler works before it reports, ms (0: at once).
    #[serde(default)]
    pub alarm_handler_ms: u64,
}

/// The receipt [`Order`] streams, chunk by chunk, from its streaming effect `receipt`.
pub const ORDER_RECEIPT: [&str; 4] = ["thank you:", "your order", "is charged", "and on its way"];

/// What [`Order`] writes to its output stream, each once and in this order: a chunk per
/// phase, and the receipt's chunks after `charged`.
pub const ORDER_STREAM: [&str; 8] = [
    "received",
    "alarms_set",
    "charged",
    ORDER_RECEIPT[0],
    ORDER_RECEIPT[1],
    ORDER_RECEIPT[2],
    ORDER_RECEIPT[3],
    "done",
];

/// Where in [`ORDER_STREAM`] each phase is.
const AT_RECEIVED: u64 = 0;
const AT_ALARMS_SET: u64 = 1;
const AT_CHARGED: u64 = 2;
const AT_DONE: u64 = 7;

/// Output of [`Order`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OrderOutput {
    /// The upstream charge's id.
    pub charge_id: Option<String>,
    /// The upstream email's id.
    pub email_id: Option<String>,
    /// The shipping label's id, as the child run that made it answered.
    #[serde(default)]
    pub label_id: Option<String>,
}

/// The upstream collection where [`Order`]'s alarm handler reports each delivery, keyed
/// `<run_id>:<alarm name>`.
pub const ORDER_ALARMS: &str = "alarm_deliveries";

/// The storage keys [`Order`] writes, each once: `charge_id` (the upstream charge's id),
/// `cool_off` (`[slept_at_ms, woke_at_ms]`: the first time the fiber reached the sleep and
/// the first time it came back from it), `packed` (the event's payload).
pub const ORDER_STORAGE: [&str; 3] = ["charge_id", "cool_off", "packed"];

impl<S: OrderStash> Order<S> {
    /// Emits the phase at `at` in [`ORDER_STREAM`] when the fiber stands at its place in the
    /// stream. The flow re-enters from the top rather than at its last stash, where the
    /// stream stands past the phases before it: those are skipped, not emitted again out of
    /// place.
    fn phase(ctx: &Ctx<Self>, at: u64) -> Result<(), AgentError> {
        if ctx.stream_len()? == at {
            ctx.emit(ORDER_STREAM[at as usize])?;
        }
        Ok(())
    }

    async fn flow(&self, ctx: &mut Ctx<Self>, input: OrderInput) -> Result<OrderOutput, AgentError> {
        Self::phase(ctx, AT_RECEIVED)?;
        ctx.stash("received", &S::at(0)).await?;
        self.set_alarms(ctx, &input).await?;
        Self::phase(ctx, AT_ALARMS_SET)?;
        ctx.stash("alarms_set", &S::at(1)).await?;
        let ask = json!({"order_id": input.order_id, "amount_cents": input.amount_cents});
        let decision = ctx.request_approval("ship", &ask).await?;
        if !decision.approved {
            return Err(AgentError::fail("declined"));
        }
        let (http, base) = (self.http.clone(), input.upstream.clone());
        let charge: Value = ctx
            .effect("charge", ask.clone(), move |key, args| {
                let (http, base) = (http.clone(), base.clone());
                async move { post_idempotent(&http, &base, "charges", &key, None, &args).await }
            })
            .await?;
        Self::phase(ctx, AT_CHARGED)?;
        ctx.stash("charged", &S::at(2)).await?;
        let email = self.receipt_and_email(ctx, &input, &charge).await?;
        let label = LabelInput { order_id: input.order_id.clone(), upstream: input.upstream.clone() };
        let label = ctx.start_child::<Label>("label", &label).await?;
        let label_id = ctx.join(&label).await?;
        record_once(ctx, "charge_id", &charge["id"]).await?;
        Self::after_charge(ctx, &input).await?;
        self.await_alarms(ctx, &input).await?;
        Self::phase(ctx, AT_DONE)?;
        ctx.stash("done", &S::at(3)).await?;
        Ok(OrderOutput {
            charge_id: charge["id"].as_str().map(str::to_string),
            email_id: email["id"].as_str().map(str::to_string),
            label_id: Some(label_id),
        })
    }

    /// Sets the order's alarms (the first a cron one when the input has a schedule), each
    /// unless it was delivered already.
    async fn set_alarms(&self, ctx: &mut Ctx<Self>, input: &OrderInput) -> Result<(), AgentError> {
        for (i, delay_ms) in input.alarm_delays_ms.iter().enumerate() {
            let payload = json!({"upstream": input.upstream, "handler_ms": input.alarm_handler_ms});
            let spec = match &input.cron {
                Some(cron) if i == 0 => durafiber_runtime::AlarmSpec::cron(cron, &payload)?,
                _ => durafiber_runtime::AlarmSpec::after(
                    std::time::Duration::from_millis(*delay_ms),
                    &payload,
                )?,
            };
            // Re-entry re-sets an alarm that was not delivered yet: harmless, it is due again.
            if !self.delivered(&input.upstream, ctx.run_id(), i).await {
                ctx.set_alarm(&format!("alarm:{i}"), spec).await?;
            }
        }
        Ok(())
    }

    /// The receipt, streamed a chunk at a time, and the email, with a policy of its own; the
    /// email's upstream object.
    async fn receipt_and_email(
        &self,
        ctx: &mut Ctx<Self>,
        input: &OrderInput,
        charge: &Value,
    ) -> Result<Value, AgentError> {
        // Streamed a chunk at a time, a little apart, so kills land in the middle of it: the
        // stream keeps one copy, of the call that committed.
        let (http, base) = (self.http.clone(), input.upstream.clone());
        let receipt_args = json!({"order_id": input.order_id, "charge": charge["id"]});
        let _receipt: Value = ctx
            .effect_stream("receipt", receipt_args, Default::default(), move |key, args, sink| {
                let (http, base) = (http.clone(), base.clone());
                async move {
                    for part in ORDER_RECEIPT {
                        sink.send(part)?;
                        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                    }
                    post_idempotent(&http, &base, "receipts", &key, None, &args)
                        .await
                        .map_err(durafiber_runtime::EffectError::retryable)
                }
            })
            .await?;
        let (http, base) = (self.http.clone(), input.upstream.clone());
        let email_args = json!({"order_id": input.order_id, "charge": charge["id"]});
        // A policy of its own: more attempts, shorter waits than the default.
        let policy = durafiber_runtime::EffectOptions {
            attempts: 5,
            backoff_initial: std::time::Duration::from_millis(50),
            backoff_max: std::time::Duration::from_secs(1),
            timeout: Some(std::time::Duration::from_secs(10)),
            limit: None,
        };
        ctx.effect_with("email", email_args, policy, move |key, args| {
            let (http, base) = (http.clone(), base.clone());
            async move {
                post_idempotent(&http, &base, "emails", &key, None, &args)
                    .await
                    .map_err(durafiber_runtime::EffectError::retryable)
            }
        })
        .await
    }

    /// The cool-off sleep and the wait for packing, when the input asks for them, each
    /// recorded in the run's storage once.
    async fn after_charge(ctx: &mut Ctx<Self>, input: &OrderInput) -> Result<(), AgentError> {
        if input.cool_off_ms > 0 {
            let now = ctx.now().as_millis();
            // The first arrival at the sleep is recorded once: a re-entry finds it there.
            let slept_at: u64 = ctx
                .storage()
                .transaction(|txn| match txn.get::<u64>("slept_at")? {
                    Some(at) => Ok(at),
                    None => txn.put("slept_at", &now).map(|_| now),
                })
                .await?;
            ctx.sleep_for("cool-off", std::time::Duration::from_millis(input.cool_off_ms)).await?;
            let now = ctx.now();
            record_once(ctx, "cool_off", &[slept_at, now.as_millis()]).await?;
        }
        if input.wait_for_packing {
            let packed: Option<Value> = ctx.wait_for_event("packed", None).await?;
            record_once(ctx, "packed", &packed).await?;
        }
        Ok(())
    }

    /// The run stays open until every alarm was delivered: a finished run's alarms go. An
    /// alarm abandoned before its handler ever reached the upstream (every attempt cut by a
    /// kill) is set again, every 3 s, until it gets through.
    async fn await_alarms(&self, ctx: &mut Ctx<Self>, input: &OrderInput) -> Result<(), AgentError> {
        for round in 1..=6_000u32 {
            let all =
                futures_all(&input.alarm_delays_ms, |i| self.delivered(&input.upstream, ctx.run_id(), i))
                    .await;
            if all {
                break;
            }
            if round % 300 == 0 {
                for i in 0..input.alarm_delays_ms.len() {
                    if !self.delivered(&input.upstream, ctx.run_id(), i).await {
                        let spec = durafiber_runtime::AlarmSpec::after(
                            std::time::Duration::ZERO,
                            &json!({"upstream": input.upstream, "handler_ms": input.alarm_handler_ms}),
                        )?;
                        ctx.set_alarm(&format!("alarm:{i}"), spec).await?;
                    }
                }
            }
            ctx.sleep_in_memory(std::time::Duration::from_millis(10)).await;
        }
        Ok(())
    }

    async fn delivered(&self, upstream: &str, run_id: &RunId, i: usize) -> bool {
        let key = format!("{run_id}:alarm:{i}");
        durafiber_testkit::upstream::list_remote(&self.http, upstream, ORDER_ALARMS)
            .await
            .is_ok_and(|objects| objects.iter().any(|o| o["idempotency_key"] == key.as_str()))
    }
}

/// Whether `check` holds for every index of `items`, asked one after another.
async fn futures_all<T, F, Fut>(items: &[T], check: F) -> bool
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for i in 0..items.len() {
        if !check(i).await {
            return false;
        }
    }
    true
}

impl<S: OrderStash> Agent for Order<S> {
    const KIND: &'static str = "order";
    const STASH_VERSION: u32 = S::VERSION;
    type Input = OrderInput;
    type Stash = S;
    type Output = OrderOutput;
    type Message = ();

    fn input_schema() -> Option<serde_json::Value> {
        Some(durafiber_runtime::input_schema_of::<OrderInput>())
    }

    fn upgrade_stash(from_version: u32, old: Value) -> Result<S, AgentError> {
        S::upgrade(from_version, old)
    }

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, input: OrderInput) -> Result<OrderOutput, AgentError> {
        self.flow(ctx, input).await
    }

    async fn on_fiber_recovered(
        &self,
        ctx: &mut Ctx<Self>,
        r: Recovered<Self>,
    ) -> Result<OrderOutput, AgentError> {
        self.flow(ctx, r.input).await
    }

    /// Under a kill storm, deliveries the process dies in count as failed attempts (§8.4)
    /// even when the handler already reached the upstream; the fiber checks the upstream
    /// itself, so an abandoned alarm is no reason to escalate.
    fn on_alarm_exhausted(
        &self,
        _ctx: &Ctx<Self>,
        _alarm: &durafiber_runtime::AlarmEvent,
    ) -> durafiber_runtime::ExhaustedAction {
        durafiber_runtime::ExhaustedAction::Ignore
    }

    /// Answers with what the run has stored so far.
    async fn on_request(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<Value, AgentError> {
        let stored = ctx.storage().get_many::<Value>(&ORDER_STORAGE)?;
        Ok(json!(stored))
    }

    async fn on_alarm(
        &self,
        ctx: &mut Ctx<Self>,
        alarm: durafiber_runtime::AlarmEvent,
    ) -> Result<(), AgentError> {
        let payload: Value = alarm.payload()?;
        let base = payload["upstream"].as_str().unwrap_or_default();
        // A handler that works a while: kills land in the middle of deliveries.
        let work = payload["handler_ms"].as_u64().unwrap_or(0);
        ctx.sleep_in_memory(std::time::Duration::from_millis(work)).await;
        let key = format!("{}:{}", ctx.run_id(), alarm.name);
        let body = json!({"run_id": ctx.run_id(), "alarm": alarm.name});
        post_idempotent(&self.http, base, ORDER_ALARMS, &key, None, &body)
            .await
            .map_err(|e| AgentError::fail(e.to_string()))?;
        Ok(())
    }
}

/// Input of [`Label`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LabelInput {
    /// The order the label is for.
    pub order_id: String,
    /// Base URL of the upstream.
    pub upstream: String,
}

/// The shipping label of an [`Order`], made by a child run: one effect through the upstream
/// (collection `labels`), answering with the label's id.
#[derive(Clone, Default)]
pub struct Label {
    http: reqwest::Client,
}

impl Label {
    async fn flow(&self, ctx: &mut Ctx<Self>, input: LabelInput) -> Result<String, AgentError> {
        let (http, base) = (self.http.clone(), input.upstream.clone());
        let made: Value = ctx
            .effect("label", json!({"order_id": input.order_id}), move |key, args| {
                let (http, base) = (http.clone(), base.clone());
                async move { post_idempotent(&http, &base, "labels", &key, None, &args).await }
            })
            .await?;
        Ok(made["id"].as_str().unwrap_or_default().to_string())
    }
}

impl Agent for Label {
    const KIND: &'static str = "label";
    type Input = LabelInput;
    type Stash = ();
    type Output = String;
    type Message = ();

    fn input_schema() -> Option<serde_json::Value> {
        Some(durafiber_runtime::input_schema_of::<LabelInput>())
    }

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, input: LabelInput) -> Result<String, AgentError> {
        self.flow(ctx, input).await
    }

    async fn on_fiber_recovered(
        &self,
        ctx: &mut Ctx<Self>,
        r: Recovered<Self>,
    ) -> Result<String, AgentError> {
        self.flow(ctx, r.input).await
    }
}

/// Puts `value` under `key` in the run's storage unless a re-entered fiber put it there.
async fn record_once<A: Agent, T: Serialize>(ctx: &Ctx<A>, key: &str, value: &T) -> Result<(), AgentError> {
    ctx.storage()
        .transaction(|txn| match txn.contains(key)? {
            true => Ok(()),
            false => txn.put(key, value),
        })
        .await
}
