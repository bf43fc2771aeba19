//! A fake OpenAI-compatible chat-completions server on 127.0.0.1, so a model-calling agent is
//! tested without the internet: `POST /v1/chat/completions`, streamed over server-sent events
//! (`"stream": true`) or answered whole, with tool calls and usage as the real API sends them.
//!
//! What it answers is scripted: each request takes the next [`Reply`] queued with
//! [`FakeOpenAi::script`], or the default answer ([`FakeOpenAi::default_answer`]) once the
//! queue is empty. A reply can be a `429` with `Retry-After`, or a stream cut in the middle.
//! Every request is recorded with its `Idempotency-Key`, so a test counts model calls where
//! they were made; the most calls in flight at once are counted too.
//!
//! It honours `Idempotency-Key` as an idempotent gateway in front of a provider does: a
//! request whose key already got a complete answer gets that answer again, recorded as a
//! call but not as a new completion. (OpenAI's own API does not: a call made again after its
//! answer and before its receipt's commit is billed twice there.)
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use durafiber_testkit::openai::{FakeOpenAi, Reply};
//! let model = FakeOpenAi::start().await?;
//! model.script(Reply::rate_limited(2));             // the first call: 429, Retry-After: 2
//! model.script(Reply::text_cut(&["Hel", "lo"], 1)); // the second: one chunk, then the cut
//! // the third and later: the default answer
//! # Ok(()) }
//! ```

use parking_lot::Mutex;
use std::{
    collections::VecDeque,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{
    Router,
    body::Body,
    extract::State,
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::post,
};
use serde_json::{Value, json};

/// One scripted answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// An assistant message: its text in these chunks (streamed one by one).
    Text {
        /// The content's pieces, each one streamed chunk.
        chunks: Vec<String>,
        /// With `Some(n)`, the stream is cut — the connection dropped — after `n` chunks.
        cut_after: Option<usize>,
    },
    /// A call of the tool `name` with `arguments` (a JSON object, as text).
    ToolCall {
        /// The call's id; an empty one is numbered by the server, `call_1`, `call_2`, … in the
        /// order tool calls are answered.
        id: String,
        /// The tool's name.
        name: String,
        /// Its arguments, as the JSON text the model writes.
        arguments: String,
    },
    /// `429 Too Many Requests` with `Retry-After: secs`.
    RateLimited {
        /// What `Retry-After` says.
        secs: u64,
    },
    /// An answer with this status and body.
    Status {
        /// The HTTP status.
        status: u16,
        /// The body, as text.
        body: String,
    },
}

impl Reply {
    /// An assistant message streamed in `chunks`.
    pub fn text(chunks: &[&str]) -> Reply {
        Reply::Text { chunks: chunks.iter().map(ToString::to_string).collect(), cut_after: None }
    }

    /// An assistant message whose stream is cut after `after` of its `chunks`.
    pub fn text_cut(chunks: &[&str], after: usize) -> Reply {
        Reply::Text { chunks: chunks.iter().map(ToString::to_string).collect(), cut_after: Some(after) }
    }

    /// A call of tool `name` with `arguments`.
    pub fn tool_call(name: &str, arguments: &Value) -> Reply {
        Reply::ToolCall { id: String::new(), name: name.to_string(), arguments: arguments.to_string() }
    }

    /// A `429` asking to wait `secs`.
    pub fn rate_limited(secs: u64) -> Reply {
        Reply::RateLimited { secs }
    }
}

/// `n` tokens, `"t0 "`, `"t1 "`, …: an answer whose every chunk says where it belongs.
pub fn numbered_tokens(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("t{i} ")).collect()
}

/// One request as the server got it.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// Its `Idempotency-Key` header, if any.
    pub idempotency_key: Option<String>,
    /// Its JSON body.
    pub body: Value,
    /// The reply it was given.
    pub reply: Reply,
    /// It repeated a key whose answer was complete: that answer was given again.
    pub replayed: bool,
}

struct Inner {
    script: Mutex<VecDeque<Reply>>,
    /// Every reply ever scripted, for [`FakeOpenAi::reset`] to queue again.
    scripted: Mutex<Vec<Reply>>,
    /// Complete answers by idempotency key.
    completed: Mutex<std::collections::HashMap<String, Reply>>,
    default_answer: Mutex<Reply>,
    recorded: Mutex<Vec<Recorded>>,
    api_key: Mutex<Option<String>>,
    /// Pause between streamed chunks.
    chunk_delay: Mutex<Duration>,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    /// Until this many requests are in flight at once, each waits for the others (once).
    gather: Mutex<Option<usize>>,
    gathered: tokio::sync::Notify,
    /// Tool calls answered so far, to number the next.
    tool_calls: AtomicUsize,
    /// The next stream stops before this chunk of its text until [`FakeOpenAi::release`].
    hold_at: Mutex<Option<usize>>,
    gate: Arc<tokio::sync::Semaphore>,
}

/// A running fake server. Dropping it stops it.
pub struct FakeOpenAi {
    addr: SocketAddr,
    inner: Arc<Inner>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeOpenAi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeOpenAi {
    /// Starts on an ephemeral port of 127.0.0.1, answering 20 numbered tokens by default.
    pub async fn start() -> std::io::Result<FakeOpenAi> {
        let inner = Arc::new(Inner {
            script: Mutex::new(VecDeque::new()),
            scripted: Mutex::new(Vec::new()),
            completed: Mutex::new(Default::default()),
            default_answer: Mutex::new(Reply::Text { chunks: numbered_tokens(20), cut_after: None }),
            recorded: Mutex::new(Vec::new()),
            api_key: Mutex::new(None),
            chunk_delay: Mutex::new(Duration::ZERO),
            in_flight: AtomicUsize::new(0),
            most_in_flight: AtomicUsize::new(0),
            tool_calls: AtomicUsize::new(0),
            gather: Mutex::new(None),
            gathered: tokio::sync::Notify::new(),
            hold_at: Mutex::new(None),
            gate: Arc::new(tokio::sync::Semaphore::new(0)),
        });
        let app = Router::new().route("/v1/chat/completions", post(completions)).with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "the fake model server stopped");
            }
        });
        Ok(FakeOpenAi { addr, inner, task })
    }

    /// The base URL an OpenAI client is given: `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Queues `reply` for the next request not yet answered.
    pub fn script(&self, reply: Reply) {
        self.inner.scripted.lock().push(reply.clone());
        self.inner.script.lock().push_back(reply);
    }

    /// Forgets every request and answer, and queues the script again from its start.
    pub fn reset(&self) {
        self.inner.recorded.lock().clear();
        self.inner.completed.lock().clear();
        *self.inner.script.lock() = self.inner.scripted.lock().iter().cloned().collect();
        self.inner.most_in_flight.store(0, Ordering::SeqCst);
        self.inner.tool_calls.store(0, Ordering::SeqCst);
    }

    /// What a request gets once the script is spent.
    pub fn default_answer(&self, reply: Reply) {
        *self.inner.default_answer.lock() = reply;
    }

    /// Requires `Authorization: Bearer <key>` (a `401` otherwise).
    pub fn require_key(&self, key: &str) {
        *self.inner.api_key.lock() = Some(key.to_string());
    }

    /// Waits `delay` before each streamed chunk, so that a test can act mid-stream.
    pub fn chunk_delay(&self, delay: Duration) {
        *self.inner.chunk_delay.lock() = delay;
    }

    /// The next text stream stops before its chunk `chunk` (from 0) until [`FakeOpenAi::release`]:
    /// a test acts while a call is half-way.
    pub fn hold_at(&self, chunk: usize) {
        *self.inner.hold_at.lock() = Some(chunk);
    }

    /// The first requests wait for each other until `n` are in flight at once (at most 30 s),
    /// then every request is answered as it comes: a test of a limit of `n` calls at once
    /// sees it reached, whatever the machine's speed.
    pub fn gather(&self, n: usize) {
        *self.inner.gather.lock() = Some(n);
    }

    /// Lets a held stream go on.
    pub fn release(&self) {
        self.inner.gate.add_permits(1);
    }

    /// Every request answered, in order.
    pub fn recorded(&self) -> Vec<Recorded> {
        self.inner.recorded.lock().clone()
    }

    /// The idempotency keys that got a complete answer.
    pub fn completed_keys(&self) -> std::collections::HashSet<String> {
        self.inner.completed.lock().keys().cloned().collect()
    }

    /// How many requests carried the idempotency key `key`.
    pub fn calls_with_key(&self, key: &str) -> usize {
        self.inner.recorded.lock().iter().filter(|r| r.idempotency_key.as_deref() == Some(key)).count()
    }

    /// The most requests that were being answered at once.
    pub fn most_in_flight(&self) -> usize {
        self.inner.most_in_flight.load(Ordering::SeqCst)
    }
}

/// Counts a request in flight until dropped.
struct InFlight(Arc<Inner>);

impl InFlight {
    fn enter(inner: &Arc<Inner>) -> InFlight {
        let now = inner.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        inner.most_in_flight.fetch_max(now, Ordering::SeqCst);
        inner.gathered.notify_waiters();
        InFlight(inner.clone())
    }
}

/// Waits, while a gathering is on, until it is complete (see [`FakeOpenAi::gather`]).
async fn gather(inner: &Inner) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let notified = inner.gathered.notified();
        let Some(n) = *inner.gather.lock() else { return };
        if inner.in_flight.load(Ordering::SeqCst) >= n {
            *inner.gather.lock() = None;
            inner.gathered.notify_waiters();
            return;
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return;
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn completions(State(inner): State<Arc<Inner>>, headers: HeaderMap, body: String) -> Response {
    let in_flight = InFlight::enter(&inner);
    gather(&inner).await;
    if let Some(key) = inner.api_key.lock().clone() {
        let given = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("");
        if given != format!("Bearer {key}") {
            return error(StatusCode::UNAUTHORIZED, "invalid_api_key", "Incorrect API key provided");
        }
    }
    let Ok(request) = serde_json::from_str::<Value>(&body) else {
        return error(StatusCode::BAD_REQUEST, "invalid_request_error", "the body is not JSON");
    };
    if !request["messages"].is_array() {
        return error(StatusCode::BAD_REQUEST, "invalid_request_error", "`messages` is required");
    }
    let idempotency_key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).map(str::to_string);
    let answered = idempotency_key.as_ref().and_then(|key| inner.completed.lock().get(key).cloned());
    let replayed = answered.is_some();
    let reply = match answered {
        Some(reply) => reply,
        None => {
            match inner.script.lock().pop_front().unwrap_or_else(|| inner.default_answer.lock().clone()) {
                Reply::ToolCall { id, name, arguments } if id.is_empty() => {
                    let n = inner.tool_calls.fetch_add(1, Ordering::SeqCst) + 1;
                    Reply::ToolCall { id: format!("call_{n}"), name, arguments }
                }
                reply => reply,
            }
        }
    };
    let complete = match &reply {
        Reply::Text { cut_after, .. } => cut_after.is_none(),
        Reply::ToolCall { .. } => true,
        Reply::RateLimited { .. } | Reply::Status { .. } => false,
    };
    if let (Some(key), true) = (&idempotency_key, complete) {
        inner.completed.lock().insert(key.clone(), reply.clone());
    }
    let recorded = Recorded { idempotency_key, body: request.clone(), reply: reply.clone(), replayed };
    inner.recorded.lock().push(recorded);
    let model = request["model"].as_str().unwrap_or("fake-model").to_string();
    let prompt_tokens = request["messages"].as_array().map_or(0, Vec::len) as u64 * 10;
    let streams = request["stream"].as_bool().unwrap_or(false);
    match reply {
        Reply::RateLimited { secs } => {
            let mut response =
                error(StatusCode::TOO_MANY_REQUESTS, "rate_limit_exceeded", "Rate limit reached");
            if let Ok(value) = secs.to_string().parse() {
                response.headers_mut().insert("retry-after", value);
            }
            response
        }
        Reply::Status { status, body } => {
            (StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), body).into_response()
        }
        reply if !streams => whole(&model, &reply, prompt_tokens).into_response(),
        reply => {
            let pace = Pace {
                delay: *inner.chunk_delay.lock(),
                hold: match reply {
                    Reply::Text { .. } => inner.hold_at.lock().take().map(|at| (at, inner.gate.clone())),
                    _ => None,
                },
            };
            streamed(model, reply, prompt_tokens, pace, in_flight)
        }
    }
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    let body = json!({"error": {"message": message, "type": code, "code": code}});
    (status, [("content-type", "application/json")], body.to_string()).into_response()
}

fn usage(prompt_tokens: u64, completion_tokens: u64) -> Value {
    json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens})
}

/// A `chat.completion` answered at once.
fn whole(model: &str, reply: &Reply, prompt_tokens: u64) -> ([(&'static str, &'static str); 1], String) {
    let (message, finish, completion) = match reply {
        Reply::ToolCall { id, name, arguments } => (
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}]}),
            "tool_calls",
            5,
        ),
        Reply::Text { chunks, .. } => {
            (json!({"role": "assistant", "content": chunks.concat()}), "stop", chunks.len() as u64)
        }
        Reply::RateLimited { .. } | Reply::Status { .. } => (json!({}), "stop", 0),
    };
    let body = json!({
        "id": "chatcmpl-fake", "object": "chat.completion", "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage(prompt_tokens, completion),
    });
    ([("content-type", "application/json")], body.to_string())
}

/// A `chat.completion.chunk` stream: one event per piece, the last with the finish reason and
/// usage, then `[DONE]` — or the connection dropped where the reply is cut.
/// How a stream goes: a pause before each chunk, and where it stops until released.
struct Pace {
    delay: Duration,
    /// Before this chunk of text (from 0), the stream waits for a permit of the gate.
    hold: Option<(usize, Arc<tokio::sync::Semaphore>)>,
}

fn streamed(model: String, reply: Reply, prompt_tokens: u64, pace: Pace, in_flight: InFlight) -> Response {
    let chunk = move |delta: Value, finish: Option<&str>, usage: Option<Value>| {
        let mut event = json!({
            "id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        });
        if let Some(usage) = usage {
            event["usage"] = usage;
        }
        format!("data: {event}\n\n")
    };
    let mut events: Vec<String> = Vec::new();
    let mut cut = None;
    match &reply {
        Reply::Text { chunks, cut_after } => {
            events.push(chunk(json!({"role": "assistant", "content": ""}), None, None));
            events.extend(chunks.iter().map(|c| chunk(json!({"content": c}), None, None)));
            let done = usage(prompt_tokens, chunks.len() as u64);
            events.push(chunk(json!({}), Some("stop"), Some(done)));
            cut = cut_after.map(|n| n + 1);
        }
        Reply::ToolCall { id, name, arguments } => {
            let call = json!([{"index": 0, "id": id, "type": "function", "function": {"name": name, "arguments": arguments}}]);
            events.push(chunk(json!({"role": "assistant", "tool_calls": call}), None, None));
            events.push(chunk(json!({}), Some("tool_calls"), Some(usage(prompt_tokens, 5))));
        }
        Reply::RateLimited { .. } | Reply::Status { .. } => {}
    }
    events.push("data: [DONE]\n\n".to_string());
    let stream = futures_stream(events, cut, pace, in_flight);
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// The events one by one, paced; past `cut` events, an error that drops the connection
/// mid-body. Holds the request in flight until the last.
fn futures_stream(
    events: Vec<String>,
    cut: Option<usize>,
    pace: Pace,
    in_flight: InFlight,
) -> impl futures::Stream<Item = Result<String, std::io::Error>> + Send {
    let Pace { delay, hold } = pace;
    let state = (events.into_iter().enumerate(), Some(in_flight), false);
    futures::stream::unfold(state, move |(mut events, mut in_flight, cut_off)| {
        let hold = hold.clone();
        async move {
            if cut_off {
                return None;
            }
            let (n, event) = events.next()?;
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            // Event 0 is the role; text chunk `at` is event `at + 1`.
            if let Some((_, gate)) = hold.as_ref().filter(|(at, _)| n == at + 1)
                && let Ok(permit) = gate.acquire().await
            {
                permit.forget();
            }
            if cut.is_some_and(|cut| n >= cut) {
                // The first error ends the body without its terminator: the client sees a cut.
                in_flight.take();
                return Some((Err(std::io::Error::other("the stream is cut here")), (events, None, true)));
            }
            if events.len() == 0 {
                in_flight.take();
            }
            Some((Ok(event), (events, in_flight, false)))
        }
    })
}
