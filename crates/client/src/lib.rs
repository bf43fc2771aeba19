//! A typed Rust client of durafiber's HTTP API.
//!
//! ```no_run
//! use durafiber_client::{Client, StartOptions};
//! # async fn demo() -> Result<(), durafiber_client::ClientError> {
//! let client = Client::new("127.0.0.1:7878")?.with_token(Some("…".into()));
//! let started = client.start("refund", "order-1042", &serde_json::json!({"amount": 120}), &StartOptions::default()).await?;
//! for approval in client.approvals().await? {
//!     // Quote the hash of exactly the payload that was shown.
//!     client.decide(&approval.run_id, &approval.approval_id, &approval.payload_hash, true, "ok").await?;
//! }
//! let output: serde_json::Value = client.wait_output(&started.run_id, std::time::Duration::from_secs(60)).await?;
//! # let _ = output; Ok(()) }
//! ```
//!
//! Every refusal is a [`ClientError::Api`] whose [`ApiErrorKind`] is the API's `kind`. On
//! several nodes, a request another node owns now (421) is sent again, a `503` with
//! `Retry-After` is retried after the time it names (within [`Client::with_retry_budget`]),
//! and a node that does not answer is passed over for the next one given to
//! [`Client::with_nodes`].

mod error;
mod sse;
mod wire;

use std::time::{Duration, Instant};

use durafiber_runtime::{
    Agent, Alarm, ApproveOutcome, Budget, DurabilityMode, PendingApproval, RunPage, SendOutcome,
    StartOutcome, StreamChunk,
};
use futures::Stream;
use reqwest::{Method, StatusCode};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::{Value, json};

pub use error::{ApiErrorKind, ClientError};
pub use wire::{
    Cancelled, EventSent, Health, Reply, RunSummary, RunView, Status, StorageEntry, StoragePage,
    TokenCreated, TokenRevoked, TokenShown,
};

/// How long a request may wait, by default, for retries on `421` and `503 Retry-After`.
const RETRY_BUDGET: Duration = Duration::from_secs(30);
/// How long a `wait` sleeps between looks at a run that has not finished.
const WAIT_POLL: Duration = Duration::from_millis(100);
/// Longest a `Retry-After` is honoured for at once; a longer one waits this and tries again.
const RETRY_AFTER_MAX: Duration = Duration::from_secs(5);
/// The largest page a list endpoint gives (`limit`): the server's `LIST_PAGE_MAX`.
pub const PAGE_MAX: usize = durafiber_runtime::limits::LIST_PAGE_MAX;

/// Options of one start: durability, keep-alive and budget, as `POST /runs` takes them.
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// How durable the run's stashes are when `stash` returns.
    pub durability: Option<DurabilityMode>,
    /// Whether a running fiber holds a keep-alive.
    pub fiber_keep_alive: Option<bool>,
    /// What the run may spend.
    pub budget: Option<Budget>,
}

/// Which runs [`Client::list`] returns.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    /// Only runs in this state (`running`, `waiting_approval`, `completed`, …).
    pub state: Option<String>,
    /// Only runs of this kind.
    pub kind: Option<String>,
    /// The previous page's `next`.
    pub after: Option<String>,
    /// Page size; the server's default (50) when `None`.
    pub limit: Option<usize>,
    /// Only open runs whose last stash is older than this `STASH_VERSION`.
    pub stash_version_below: Option<u32>,
}

/// A client of one server, or of several nodes sharing a store.
#[derive(Debug, Clone)]
pub struct Client {
    /// Base URLs without a trailing slash; the first that answers is used.
    nodes: Vec<String>,
    http: reqwest::Client,
    token: Option<String>,
    retry_budget: Duration,
}

fn base_url(address: &str) -> Result<String, ClientError> {
    let with_scheme = if address.contains("://") { address.to_string() } else { format!("http://{address}") };
    let parsed = url::Url::parse(&with_scheme).map_err(|_| ClientError::BadAddress(address.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
        return Err(ClientError::BadAddress(address.to_string()));
    }
    Ok(with_scheme.trim_end_matches('/').to_string())
}

impl Client {
    /// A client of the server at `address` (`http://host:port`, `https://host`, or
    /// `host:port` for plain HTTP).
    pub fn new(address: &str) -> Result<Self, ClientError> {
        Ok(Client {
            nodes: vec![base_url(address)?],
            http: reqwest::Client::new(),
            token: None,
            retry_budget: RETRY_BUDGET,
        })
    }

    /// A client of the server at `addr`, over plain HTTP.
    pub fn from_addr(addr: std::net::SocketAddr) -> Self {
        Client {
            nodes: vec![format!("http://{addr}")],
            http: reqwest::Client::new(),
            token: None,
            retry_budget: RETRY_BUDGET,
        }
    }

    /// A client of several nodes sharing a store: requests go to the first that answers.
    pub fn with_nodes<'a>(addresses: impl IntoIterator<Item = &'a str>) -> Result<Self, ClientError> {
        let nodes = addresses.into_iter().map(base_url).collect::<Result<Vec<_>, _>>()?;
        if nodes.is_empty() {
            return Err(ClientError::BadAddress(String::new()));
        }
        Ok(Client { nodes, http: reqwest::Client::new(), token: None, retry_budget: RETRY_BUDGET })
    }

    /// The same client, sending `token` as `Authorization: Bearer`.
    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.token = token;
        self
    }

    /// The same client, giving up on any one request after `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.http = reqwest::Client::builder().timeout(timeout).build().unwrap_or_default();
        self
    }

    /// How long one call may keep retrying on `421` and `503 Retry-After` (30 s by default).
    pub fn with_retry_budget(mut self, budget: Duration) -> Self {
        self.retry_budget = budget;
        self
    }

    /// Whether a node answers `/health` with 200.
    pub async fn is_up(&self) -> bool {
        for base in &self.nodes {
            let answer = self.http.get(format!("{base}/health")).send().await;
            if answer.is_ok_and(|r| r.status().is_success()) {
                return true;
            }
        }
        false
    }

    fn builder(&self, base: &str, method: Method, path: &str) -> reqwest::RequestBuilder {
        let req = self.http.request(method, format!("{base}{path}"));
        match &self.token {
            Some(token) => req.bearer_auth(token),
            None => req,
        }
    }

    /// Sends one request, with the retries the module's doc describes; `build` adds the body,
    /// query and headers to each attempt.
    async fn send(
        &self,
        method: Method,
        path: &str,
        build: impl Fn(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ClientError> {
        let began = Instant::now();
        let mut node = 0;
        loop {
            let base = &self.nodes[node % self.nodes.len()];
            let sent = build(self.builder(base, method.clone(), path)).send().await;
            let response = match sent {
                Ok(r) => r,
                // Never reached the server: the next node may answer.
                Err(e) if e.is_connect() && node + 1 < self.nodes.len() => {
                    tracing::debug!(node = %base, error = %e, "node unreachable; trying the next");
                    node += 1;
                    continue;
                }
                Err(source) => return Err(ClientError::Unreachable { base: base.clone(), source }),
            };
            if response.status().is_success() {
                return Ok(response);
            }
            let error = refusal(response).await;
            let wait = match &error {
                ClientError::Api { kind: ApiErrorKind::NotOwner, .. } => Some(Duration::from_millis(50)),
                ClientError::Api { retry_after: Some(after), .. } => Some((*after).min(RETRY_AFTER_MAX)),
                _ => None,
            };
            match wait {
                Some(wait) if began.elapsed().saturating_add(wait) < self.retry_budget => {
                    tracing::debug!(path, ?wait, error = %error, "retrying");
                    tokio::time::sleep(wait).await;
                }
                _ => return Err(error),
            }
        }
    }

    async fn json<T: DeserializeOwned>(response: reqwest::Response) -> Result<T, ClientError> {
        let bytes = response.bytes().await.map_err(|e| ClientError::Decode(e.to_string()))?;
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Decode(e.to_string()))
    }

    /// `GET path`, the answer as JSON.
    pub async fn get_json(&self, path: &str) -> Result<Value, ClientError> {
        Self::json(self.send(Method::GET, path, |r| r).await?).await
    }

    /// `GET path?query`, the answer as JSON.
    pub async fn get_query(&self, path: &str, query: &[(&str, String)]) -> Result<Value, ClientError> {
        Self::json(self.send(Method::GET, path, |r| r.query(query)).await?).await
    }

    /// `POST path` with a JSON body and an optional `Idempotency-Key`, the answer as JSON.
    pub async fn post_json(&self, path: &str, body: &Value, key: Option<&str>) -> Result<Value, ClientError> {
        let answer = self
            .send(Method::POST, path, |r| {
                let r = r.json(body);
                match key {
                    Some(key) => r.header("Idempotency-Key", key),
                    None => r,
                }
            })
            .await?;
        Self::json(answer).await
    }

    /// `DELETE path`, the answer as JSON.
    pub async fn delete_json(&self, path: &str) -> Result<Value, ClientError> {
        Self::json(self.send(Method::DELETE, path, |r| r).await?).await
    }

    /// `GET path` as raw bytes (a backup).
    pub async fn get_bytes(&self, path: &str) -> Result<Vec<u8>, ClientError> {
        let answer = self.send(Method::GET, path, |r| r).await?;
        Ok(answer.bytes().await.map_err(|e| ClientError::Decode(e.to_string()))?.to_vec())
    }

    async fn typed<T: DeserializeOwned>(&self, answer: Result<Value, ClientError>) -> Result<T, ClientError> {
        serde_json::from_value(answer?).map_err(|e| ClientError::Decode(e.to_string()))
    }

    /// `GET /health`.
    pub async fn health(&self) -> Result<Health, ClientError> {
        self.typed(self.get_json("/health").await).await
    }

    /// Starts a run of `kind` under the idempotency `key`: the same key and input return the
    /// same run (`accepted == false`); the same key with another input is
    /// [`ApiErrorKind::KeyConflict`].
    pub async fn start(
        &self,
        kind: &str,
        key: &str,
        input: &impl Serialize,
        options: &StartOptions,
    ) -> Result<StartOutcome, ClientError> {
        let input = serde_json::to_value(input).map_err(|e| ClientError::Encode(e.to_string()))?;
        let budget = options.budget.map(|b| {
            json!({
                "effects_max": b.effects_max,
                "cost_units_max": b.cost_units_max,
                "wall_time_max": b.wall_time_max.map(|d| format!("{}ms", d.as_millis())),
                "recoveries_max": b.recoveries_max,
            })
        });
        let body = json!({
            "kind": kind,
            "input": input,
            "options": {
                "durability": options.durability.map(DurabilityMode::name),
                "fiber_keep_alive": options.fiber_keep_alive,
                "budget": budget,
            },
        });
        self.typed(self.post_json("/runs", &body, Some(key)).await).await
    }

    /// Starts a run of agent `A` with its typed input.
    pub async fn start_agent<A: Agent>(
        &self,
        key: &str,
        input: &A::Input,
        options: &StartOptions,
    ) -> Result<StartOutcome, ClientError> {
        self.start(A::KIND, key, input, options).await
    }

    /// Everything stored about a run (secrets redacted).
    pub async fn run(&self, run_id: &str) -> Result<RunView, ClientError> {
        self.typed(self.get_json(&format!("/runs/{run_id}")).await).await
    }

    /// A run's state.
    pub async fn status(&self, run_id: &str) -> Result<Status, ClientError> {
        Ok(self.run(run_id).await?.run.status)
    }

    /// Waits until the run has finished (completed, failed, cancelled or escalated), at most
    /// `timeout`; its final state.
    pub async fn wait(&self, run_id: &str, timeout: Duration) -> Result<Status, ClientError> {
        let began = Instant::now();
        loop {
            let status = self.status(run_id).await?;
            if status.is_terminal() {
                return Ok(status);
            }
            if began.elapsed() >= timeout {
                return Err(ClientError::Timeout { run_id: run_id.to_string(), waited: timeout });
            }
            tokio::time::sleep(WAIT_POLL).await;
        }
    }

    /// Waits for the run's output, typed: [`ClientError::NoOutput`] when it ended otherwise.
    pub async fn wait_output<T: DeserializeOwned>(
        &self,
        run_id: &str,
        timeout: Duration,
    ) -> Result<T, ClientError> {
        match self.wait(run_id, timeout).await? {
            Status::Completed { output } => {
                serde_json::from_value(output).map_err(|e| ClientError::Decode(e.to_string()))
            }
            other => Err(ClientError::NoOutput {
                run_id: run_id.to_string(),
                state: other.name().to_string(),
                detail: other.detail().to_string(),
            }),
        }
    }

    /// Waits for the output of a run of agent `A`, typed as `A::Output`.
    pub async fn wait_agent<A: Agent>(
        &self,
        run_id: &str,
        timeout: Duration,
    ) -> Result<A::Output, ClientError> {
        self.wait_output(run_id, timeout).await
    }

    /// One page of runs.
    pub async fn list(&self, query: &ListQuery) -> Result<RunPage, ClientError> {
        let mut q = Vec::new();
        if let Some(limit) = query.limit {
            q.push(("limit", limit.to_string()));
        }
        if let Some(below) = query.stash_version_below {
            q.push(("stash_version_below", below.to_string()));
        }
        for (k, v) in [("state", &query.state), ("kind", &query.kind), ("after", &query.after)] {
            if let Some(v) = v {
                q.push((k, v.clone()));
            }
        }
        self.typed(self.get_query("/runs", &q).await).await
    }

    /// Asks a run to stop.
    pub async fn cancel(&self, run_id: &str, reason: &str) -> Result<Cancelled, ClientError> {
        self.typed(self.post_json(&format!("/runs/{run_id}/cancel"), &json!({"reason": reason}), None).await)
            .await
    }

    /// Sends the external event `name` to a run; a repeated `key` is delivered once.
    pub async fn send_event(
        &self,
        run_id: &str,
        name: &str,
        payload: &impl Serialize,
        key: Option<&str>,
    ) -> Result<SendOutcome, ClientError> {
        let payload = serde_json::to_value(payload).map_err(|e| ClientError::Encode(e.to_string()))?;
        let body = json!({"payload": payload, "idempotency_key": key});
        let sent: EventSent =
            self.typed(self.post_json(&format!("/runs/{run_id}/events/{name}"), &body, None).await).await?;
        Ok(sent.outcome)
    }

    /// A message for the run's `on_message`.
    pub async fn message(&self, run_id: &str, message: &impl Serialize) -> Result<(), ClientError> {
        let body = serde_json::to_value(message).map_err(|e| ClientError::Encode(e.to_string()))?;
        self.post_json(&format!("/runs/{run_id}/messages"), &body, None).await.map(|_| ())
    }

    /// A request for the run's `on_request`; its reply.
    pub async fn request<T: DeserializeOwned>(
        &self,
        run_id: &str,
        request: &impl Serialize,
    ) -> Result<T, ClientError> {
        let body = serde_json::to_value(request).map_err(|e| ClientError::Encode(e.to_string()))?;
        let reply: Reply =
            self.typed(self.post_json(&format!("/runs/{run_id}/requests"), &body, None).await).await?;
        serde_json::from_value(reply.reply).map_err(|e| ClientError::Decode(e.to_string()))
    }

    /// Every pending approval, with the payload and the hash a decision must quote, read a
    /// page of [`PAGE_MAX`] at a time (runs in the order they were started).
    pub async fn approvals(&self) -> Result<Vec<PendingApproval>, ClientError> {
        let mut all: Vec<PendingApproval> = Vec::new();
        loop {
            let after = all.last().map(|p| format!("{}/{}", p.run_id, p.approval_id));
            let page = self.approvals_page(after.as_deref(), PAGE_MAX).await?;
            let last = page.len() < PAGE_MAX;
            all.extend(page);
            if last {
                return Ok(all);
            }
        }
    }

    /// One page of the pending approvals: at most `limit` (1 to [`PAGE_MAX`]) after `after`,
    /// the previous page's last one as `<run_id>/<approval_id>`. A page shorter than `limit`
    /// is the last.
    pub async fn approvals_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<PendingApproval>, ClientError> {
        let mut q = vec![("limit", limit.to_string())];
        if let Some(after) = after {
            q.push(("after", after.to_string()));
        }
        self.typed(self.get_query("/approvals", &q).await).await
    }

    /// Decides an approval, quoting the hash of the payload the reviewer saw: a payload that
    /// changed since is [`ApiErrorKind::StaleApproval`].
    pub async fn decide(
        &self,
        run_id: &str,
        approval_id: &str,
        payload_hash: &str,
        approved: bool,
        comment: &str,
    ) -> Result<ApproveOutcome, ClientError> {
        let body = json!({"payload_hash": payload_hash, "approved": approved, "comment": comment});
        self.typed(self.post_json(&format!("/runs/{run_id}/approvals/{approval_id}"), &body, None).await)
            .await
    }

    /// A run's pending alarms, read a page of [`PAGE_MAX`] at a time.
    pub async fn alarms(&self, run_id: &str) -> Result<Vec<Alarm>, ClientError> {
        let mut all: Vec<Alarm> = Vec::new();
        loop {
            let mut q = vec![("limit", PAGE_MAX.to_string())];
            if let Some(last) = all.last() {
                q.push(("after", last.name.clone()));
            }
            let page: Vec<Alarm> =
                self.typed(self.get_query(&format!("/runs/{run_id}/alarms"), &q).await).await?;
            let last = page.len() < PAGE_MAX;
            all.extend(page);
            if last {
                return Ok(all);
            }
        }
    }

    /// One page of a run's storage: keys under `prefix`, after `start_after`.
    pub async fn storage(
        &self,
        run_id: &str,
        prefix: &str,
        start_after: Option<&str>,
        limit: Option<usize>,
    ) -> Result<StoragePage, ClientError> {
        let mut q = vec![("prefix", prefix.to_string())];
        if let Some(after) = start_after {
            q.push(("start_after", after.to_string()));
        }
        if let Some(limit) = limit {
            q.push(("limit", limit.to_string()));
        }
        self.typed(self.get_query(&format!("/runs/{run_id}/storage"), &q).await).await
    }

    /// The run's output stream from chunk `from`, as it is written: the chunks already
    /// durable, then each new one, until the run ends. A dropped connection is reopened
    /// with `Last-Event-ID`, so no chunk is missed or repeated.
    pub fn stream(
        &self,
        run_id: &str,
        from: u64,
    ) -> impl Stream<Item = Result<StreamChunk, ClientError>> + Send + 'static {
        sse::follow(self.clone(), format!("/runs/{run_id}/stream"), from)
    }

    /// Creates an API token (admin); its secret is in the answer, and only there.
    pub async fn tokens_create(&self, name: &str, role: &str) -> Result<TokenCreated, ClientError> {
        self.typed(self.post_json("/tokens", &json!({"name": name, "role": role}), None).await).await
    }

    /// Every token's name, role and creation time (admin).
    pub async fn tokens_list(&self) -> Result<Vec<TokenShown>, ClientError> {
        self.typed(self.get_json("/tokens").await).await
    }

    /// Revokes a token at once (admin).
    pub async fn tokens_revoke(&self, name: &str) -> Result<TokenRevoked, ClientError> {
        self.typed(self.delete_json(&format!("/tokens/{name}")).await).await
    }
}

/// A refusal read into a typed error: the JSON error shape, or the status alone.
async fn refusal(response: reqwest::Response) -> ClientError {
    let status = response.status();
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let body: Value = response.json().await.unwrap_or(Value::Null);
    let message = body["error"].as_str().map(str::to_string).unwrap_or_else(|| status.to_string());
    let kind = match body["kind"].as_str() {
        Some(kind) => ApiErrorKind::parse(kind),
        None if status == StatusCode::MISDIRECTED_REQUEST => ApiErrorKind::NotOwner,
        None if status == StatusCode::UNAUTHORIZED => ApiErrorKind::Unauthorized,
        None if status == StatusCode::FORBIDDEN => ApiErrorKind::Forbidden,
        None if status == StatusCode::NOT_FOUND => ApiErrorKind::NotFound,
        None if status.is_server_error() => ApiErrorKind::Internal,
        None => ApiErrorKind::BadRequest,
    };
    ClientError::Api { status: status.as_u16(), kind, message, retry_after }
}
