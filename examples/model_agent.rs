//! A model-calling agent to copy: a tool-calling loop against any OpenAI-compatible chat
//! endpoint that survives crashes, deploys and evictions without paying for a model turn
//! twice or calling a tool twice.
//!
//! - Each model turn is a **streaming effect** (`ctx.effect_stream`): its text reaches the
//!   client as it is generated (`GET /runs/{id}/stream`), a call cut off is taken back and
//!   made again with the same idempotency key, and a committed turn is never asked for again
//!   — a re-entered fiber gets the stored answer. Its token usage is charged to the run's
//!   budget (`ctx.charge`), so `cost_units_max` stops a run that talks too much.
//! - Each tool call is an **effect** keyed by the model's call id.
//! - A risky tool (`refund`) waits for a **human approval** bound to the exact call.
//! - The **transcript** lives in the run's storage, one key per turn (`transcript:N`, the
//!   conversation as turn `N` began), written before the stash that moves to that turn: a
//!   re-entered fiber reads its turn's there, never from memory or from the model.
//! - The API key is a **bound secret**: handed to the model's host only.
//!
//! The binary `model-agent` serves it with every durafiber command; it reads
//! `DURAFIBER_MODEL_BASE_URL`, `DURAFIBER_MODEL_NAME`, `DURAFIBER_MODEL_KEY_SECRET` (the
//! secret's name, e.g. `openai_key` for `DURAFIBER_SECRET_OPENAI_KEY` and its `_HOSTS`),
//! `DURAFIBER_MODEL_LIMIT` (optional: the named limit model calls wait their turn in, from
//! `limits` in the `--config` file) and `DURAFIBER_TOOLS_URL` (where the tools are, as
//! `POST {url}/v1/{tool}` with an `Idempotency-Key`).

use std::time::Duration;

use durafiber::{Agent, AgentError, Ctx, EffectError, EffectOptions, Recovered, Secret};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::openai::{self, Message, ModelConfig, ToolCall, Turn};

/// The storage key of the conversation as it stood when model turn `turn` began.
///
/// One key per turn, written before the stash that moves to it and never changed after: a
/// storage write may be durable before the stash after it (another run's barrier can carry
/// it), so a fiber re-entered at turn `n`'s stash must find turn `n`'s conversation as it
/// was, whatever was written for turn `n + 1` before the crash.
fn transcript_key(turn: u32) -> String {
    format!("transcript:{turn}")
}

/// The agent: where its model and tools are.
#[derive(Clone)]
pub struct ModelAgent {
    /// The model it talks to.
    pub model: ModelConfig,
    /// Where its tools are: `POST {tools_url}/v1/{tool}`.
    pub tools_url: String,
    http: reqwest::Client,
}

impl ModelAgent {
    /// An agent talking to `model`, with its tools at `tools_url`.
    pub fn new(model: ModelConfig, tools_url: &str) -> Self {
        ModelAgent { model, tools_url: tools_url.to_string(), http: openai::http_client() }
    }

    /// The agent the environment describes (see the module's documentation).
    pub fn from_env() -> Result<Self, String> {
        let var = |name: &str| std::env::var(name).map_err(|_| format!("{name} is not set"));
        let model = ModelConfig {
            base_url: var("DURAFIBER_MODEL_BASE_URL")?,
            model: var("DURAFIBER_MODEL_NAME")?,
            key_secret: std::env::var("DURAFIBER_MODEL_KEY_SECRET").ok(),
            limit: std::env::var("DURAFIBER_MODEL_LIMIT").ok(),
        };
        Ok(ModelAgent::new(model, &var("DURAFIBER_TOOLS_URL")?))
    }
}

/// What the agent is asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    /// The user's request.
    pub prompt: String,
    /// Model turns at most; the run fails past them.
    pub max_turns: u32,
}

/// The tools the model may call, as the API describes them.
fn tools() -> Value {
    let tool = |name: &str, description: &str, properties: Value| {
        json!({"type": "function", "function": {"name": name, "description": description,
            "parameters": {"type": "object", "properties": properties, "required": properties.as_object().map(|p| p.keys().cloned().collect::<Vec<_>>())}}})
    };
    json!([
        tool("lookup_order", "Look an order up by its id.", json!({"order_id": {"type": "string"}})),
        tool(
            "refund",
            "Refund part of an order; a person approves it first.",
            json!({"order_id": {"type": "string"}, "cents": {"type": "integer"}})
        ),
    ])
}

/// Tools that a person approves before they are called.
const RISKY: &[&str] = &["refund"];

impl Agent for ModelAgent {
    const KIND: &'static str = "model-agent";
    type Input = Task;
    /// The next model turn.
    type Stash = u32;
    /// The model's final answer.
    type Output = String;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, task: Task) -> Result<String, AgentError> {
        let system = "You are a support agent. Use the tools; refunds need a person's approval.";
        let transcript = vec![Message::text("system", system), Message::text("user", &task.prompt)];
        ctx.storage().put(&transcript_key(0), &transcript).await?;
        ctx.stash("turn", &0).await?;
        self.converse(ctx, &task, 0).await
    }

    async fn on_fiber_recovered(
        &self,
        ctx: &mut Ctx<Self>,
        r: Recovered<Self>,
    ) -> Result<String, AgentError> {
        match r.stash {
            Some(turn) => self.converse(ctx, &r.input, turn).await,
            None => self.run_fiber(ctx, r.input).await,
        }
    }
}

impl ModelAgent {
    /// The loop from model turn `from`: ask the model, call the tools it asks for, store the
    /// turn, until it answers in words.
    async fn converse(&self, ctx: &mut Ctx<Self>, task: &Task, from: u32) -> Result<String, AgentError> {
        for turn in from..task.max_turns {
            if let Some(before) = turn.checked_sub(1) {
                // Only this turn's conversation is read from here on: the last one's goes.
                ctx.storage().delete(&transcript_key(before)).await?;
            }
            let mut transcript: Vec<Message> = ctx
                .storage()
                .get(&transcript_key(turn))?
                .ok_or_else(|| AgentError::fail("the run's transcript is missing from its storage"))?;
            let answer = self.ask_model(ctx, turn, &transcript).await?;
            ctx.charge(answer.usage.total_tokens, "model turn");
            transcript.push(answer.message.clone());
            let calls = answer.message.tool_calls.clone();
            if calls.is_empty() {
                // The whole conversation, kept after the run. No stash here, or a fiber
                // re-entered there would ask the model for a turn after its answer.
                ctx.storage().put(&transcript_key(turn.saturating_add(1)), &transcript).await?;
                return Ok(answer.message.content.unwrap_or_default());
            }
            for call in &calls {
                let result = self.call_tool(ctx, call).await?;
                transcript.push(Message::tool(&call.id, &result));
            }
            // The next turn's conversation, then the stash that moves to it.
            ctx.storage().put(&transcript_key(turn.saturating_add(1)), &transcript).await?;
            ctx.stash("turn", &turn.saturating_add(1)).await?;
        }
        Err(AgentError::fail(format!("no answer within {} model turns", task.max_turns)))
    }

    /// One model turn, streamed to the run's readers; made once, whatever re-enters the fiber.
    async fn ask_model(
        &self,
        ctx: &mut Ctx<Self>,
        turn: u32,
        transcript: &[Message],
    ) -> Result<Turn, AgentError> {
        let api_key = match &self.model.key_secret {
            Some(name) => Some(ctx.secret_for(&Secret::named(name), &self.model.base_url)?),
            None => None,
        };
        let policy = EffectOptions {
            attempts: 5,
            backoff_initial: Duration::from_millis(200),
            backoff_max: Duration::from_secs(5),
            timeout: Some(Duration::from_secs(120)),
            limit: self.model.limit.clone(),
        };
        let (http, model) = (self.http.clone(), self.model.clone());
        ctx.effect_stream(
            &format!("model:{turn}"),
            transcript.to_vec(),
            policy,
            move |key, messages, sink| {
                let (http, model, api_key) = (http.clone(), model.clone(), api_key.clone());
                async move {
                    openai::stream_turn(&http, &model, api_key.as_deref(), &key, &messages, &tools(), &sink)
                        .await
                }
            },
        )
        .await
    }

    /// Calls the tool the model asked for — after a person's approval when it is risky — and
    /// returns what the model is told.
    async fn call_tool(&self, ctx: &mut Ctx<Self>, call: &ToolCall) -> Result<String, AgentError> {
        let name = call.function.name.clone();
        let Ok(arguments) = serde_json::from_str::<Value>(&call.function.arguments) else {
            return Ok(format!("error: the arguments of {name} are not JSON"));
        };
        if !["lookup_order", "refund"].contains(&name.as_str()) {
            return Ok(format!("error: there is no tool {name}"));
        }
        if RISKY.contains(&name.as_str()) {
            let asked = json!({"tool": name, "arguments": arguments});
            let decision = ctx.request_approval(&format!("tool:{}", call.id), &asked).await?;
            if !decision.approved {
                return Ok(format!("a person declined this {name}: {}", decision.comment));
            }
        }
        let url = format!("{}/v1/{name}", self.tools_url.trim_end_matches('/'));
        let http = self.http.clone();
        let mut done: Value = ctx
            .effect_with(
                &format!("tool:{}", call.id),
                arguments,
                EffectOptions::default(),
                move |key, arguments| {
                    let (http, url) = (http.clone(), url.clone());
                    async move {
                        let response =
                            http.post(&url).header("Idempotency-Key", key).json(&arguments).send().await?;
                        let status = response.status().as_u16();
                        let retry_after = response
                            .headers()
                            .get("retry-after")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_string);
                        let text = response.text().await?;
                        if status >= 300 {
                            return Err(EffectError::from_response(status, retry_after.as_deref(), text));
                        }
                        serde_json::from_str::<Value>(&text).map_err(EffectError::retryable)
                    }
                },
            )
            .await?;
        // The model is told what the tool answered, not the key this run called it with.
        if let Some(object) = done.as_object_mut() {
            object.remove("idempotency_key");
        }
        Ok(done.to_string())
    }
}
