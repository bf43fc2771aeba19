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
//!
//! The client depends on `durafiber-api` for what the API carries (the run status, the
//! answers, the error kinds), not on the runtime. Its feature `agents` adds
//! `Client::start_agent` and `Client::wait_agent`, typed by a Rust agent's `Input` and
//! `Output` (it builds the runtime; the `durafiber` facade's `client` feature turns it on).
//!
//! The crate root holds the client and how a request is sent, retried and refused; `calls`
//! has one method per call of the API; `wire` the answers as this client reads them (the
//! rest are `durafiber-api`'s); `sse` reads server-sent events; `error` says why a call failed.

mod calls;
mod error;
mod sse;
mod wire;

use std::time::{Duration, Instant};

use durafiber_api::{Budget, DurabilityMode};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::Value;

pub use durafiber_api::{ApiErrorKind, Status};
pub use error::ClientError;
pub use wire::{
    Cancelled, EventSent, Health, Reply, RunDeleted, RunSummary, RunView, StorageEntry, StoragePage,
    TokenCreated, TokenRevoked, TokenShown,
};

/// How long a request may wait, by default, for retries on `421` and `503 Retry-After`.
const RETRY_BUDGET: Duration = Duration::from_secs(30);
/// How long a `wait` sleeps between looks at a run that has not finished.
const WAIT_POLL: Duration = Duration::from_millis(100);
/// Longest a `Retry-After` is honoured for at once; a longer one waits this and tries again.
const RETRY_AFTER_MAX: Duration = Duration::from_secs(5);
/// The largest page a list endpoint gives (`limit`): the server's `LIST_PAGE_MAX`.
pub const PAGE_MAX: usize = durafiber_api::LIST_PAGE_MAX;

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
