//! A small client of any OpenAI-compatible chat-completions endpoint, made to be called inside
//! a streaming effect: it streams the answer's text into the effect's sink as it comes, sends
//! the effect's idempotency key, and says which failures are worth another call — a `429` or
//! `503` with `Retry-After` waits what the provider asked.

use std::time::Duration;

use durafiber::{EffectError, StreamSink};
use futures::StreamExt as _;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Where the model is: any server that speaks OpenAI's chat completions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// The API's base URL, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    /// The model's name.
    pub model: String,
    /// The name of the secret that holds the API key, bound to `base_url`'s host
    /// (`DURAFIBER_SECRET_<NAME>` and `DURAFIBER_SECRET_<NAME>_HOSTS`); `None` for a server
    /// that wants none.
    pub key_secret: Option<String>,
    /// The named limit (`limits` in the runtime's config) each call to the model waits its
    /// turn in: the provider's concurrency and rate, for every run and node at once.
    #[serde(default)]
    pub limit: Option<String>,
}

/// One message of the conversation, as the API writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// Its text; `None` for an assistant message that only calls tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// The tools an assistant message calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// The call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    /// A message of `role` saying `text`.
    pub fn text(role: &str, text: &str) -> Message {
        Message { role: role.into(), content: Some(text.into()), tool_calls: Vec::new(), tool_call_id: None }
    }

    /// A tool's answer to call `call_id`.
    pub fn tool(call_id: &str, text: &str) -> Message {
        Message { tool_call_id: Some(call_id.into()), ..Message::text("tool", text) }
    }
}

/// A call of a tool the model asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id, quoted by the tool's answer.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// What to call, and with what.
    pub function: FunctionCall,
}

/// The function and its arguments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// The tool's name.
    pub name: String,
    /// Its arguments: JSON text, as the model wrote it.
    pub arguments: String,
}

/// Tokens a turn cost, as the provider counted them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens of the prompt.
    pub prompt_tokens: u64,
    /// Tokens of the answer.
    pub completion_tokens: u64,
    /// Both.
    pub total_tokens: u64,
}

/// One model turn: the assistant's message and what it cost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Turn {
    /// The assistant's message: text, tool calls, or both.
    pub message: Message,
    /// What it cost.
    pub usage: Usage,
}

/// Asks the model for the next turn of `messages`, streaming: each piece of the answer's text
/// goes to `sink` as it arrives. `key` goes as the `Idempotency-Key` (providers and gateways
/// that honour it answer a repeated call once), `api_key` as the bearer token.
pub async fn stream_turn(
    http: &reqwest::Client,
    model: &ModelConfig,
    api_key: Option<&str>,
    key: &str,
    messages: &[Message],
    tools: &Value,
    sink: &StreamSink,
) -> Result<Turn, EffectError> {
    let mut body = json!({
        "model": model.model,
        "messages": messages,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if tools.as_array().is_some_and(|t| !t.is_empty()) {
        body["tools"] = tools.clone();
    }
    let mut request = http
        .post(format!("{}/chat/completions", model.base_url.trim_end_matches('/')))
        .header("Idempotency-Key", key)
        .json(&body);
    if let Some(api_key) = api_key {
        request = request.bearer_auth(api_key);
    }
    if let Some(parent) = durafiber::trace::traceparent() {
        request = request.header("traceparent", parent);
    }
    let response = request.send().await?;
    let status = response.status().as_u16();
    if status != 200 {
        let retry_after =
            response.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_string);
        let text = response.text().await.unwrap_or_default();
        return Err(EffectError::from_response(status, retry_after.as_deref(), text));
    }
    let mut turn = TurnBuilder::default();
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    while let Some(bytes) = body.next().await {
        // A body that breaks off mid-answer: retryable, and the sink's chunks are taken back.
        let bytes =
            bytes.map_err(|e| EffectError::retryable(format!("the model's stream broke off: {e}")))?;
        buffer.push_str(&String::from_utf8_lossy(&bytes));
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            for data in event.lines().filter_map(|line| line.strip_prefix("data:")) {
                let data = data.trim();
                if data == "[DONE]" {
                    return Ok(turn.finish());
                }
                let chunk: Value = serde_json::from_str(data)
                    .map_err(|e| EffectError::retryable(format!("the model sent bad JSON: {e}")))?;
                if let Some(text) = turn.add(&chunk) {
                    sink.send(&text)?;
                }
            }
        }
    }
    Err(EffectError::retryable("the model's stream ended before [DONE]"))
}

/// The HTTP client the agent calls the model with: a connect timeout, and no overall one —
/// the effect's own timeout bounds a call.
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder().connect_timeout(Duration::from_secs(10)).build().unwrap_or_default()
}

/// A turn assembled from its streamed chunks.
#[derive(Default)]
struct TurnBuilder {
    text: String,
    tool_calls: Vec<ToolCall>,
    usage: Usage,
}

impl TurnBuilder {
    /// Takes one `chat.completion.chunk`; the text it adds, if any.
    fn add(&mut self, chunk: &Value) -> Option<String> {
        if let Ok(usage) = serde_json::from_value::<Usage>(chunk["usage"].clone()) {
            self.usage = usage;
        }
        let delta = &chunk["choices"][0]["delta"];
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().unwrap_or(0) as usize;
            if self.tool_calls.len() <= index {
                self.tool_calls.resize_with(index + 1, || ToolCall {
                    id: String::new(),
                    kind: "function".into(),
                    function: FunctionCall { name: String::new(), arguments: String::new() },
                });
            }
            let slot = &mut self.tool_calls[index];
            if let Some(id) = call["id"].as_str() {
                slot.id = id.to_string();
            }
            if let Some(name) = call["function"]["name"].as_str() {
                slot.function.name.push_str(name);
            }
            if let Some(arguments) = call["function"]["arguments"].as_str() {
                slot.function.arguments.push_str(arguments);
            }
        }
        let text = delta["content"].as_str().filter(|t| !t.is_empty())?;
        self.text.push_str(text);
        Some(text.to_string())
    }

    fn finish(self) -> Turn {
        let content = (!self.text.is_empty()).then_some(self.text);
        let message =
            Message { role: "assistant".into(), content, tool_calls: self.tool_calls, tool_call_id: None };
        Turn { message, usage: self.usage }
    }
}
