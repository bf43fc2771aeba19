//! The answers of the HTTP API this client reads, as the server writes them (the server's
//! `schema.rs` and `/openapi.json` are their reference). Fields a caller rarely needs stay
//! JSON, so a newer server's additions never break an older client.

use serde::Deserialize;
use serde_json::Value;

use durafiber_api::{SendOutcome, Status};

/// `GET /health`.
#[derive(Debug, Clone, Deserialize)]
pub struct Health {
    /// Whether the store takes writes.
    pub ok: bool,
    /// Why the store failed, if it did.
    pub failed: Option<String>,
    /// Whether writes wait for disk space.
    #[serde(default)]
    pub parked: bool,
    /// Whether free space is below twice the reserve.
    #[serde(default)]
    pub low_on_space: bool,
    /// This node's id on a shared store.
    pub node_id: Option<String>,
}

/// A run's record as `GET /runs/{id}` shows it.
#[derive(Debug, Clone, Deserialize)]
pub struct RunSummary {
    /// The run's id.
    pub run_id: String,
    /// The agent kind.
    pub kind: String,
    /// The idempotency key it was started with.
    pub key: String,
    /// Its input.
    pub input: Value,
    /// Where it is.
    pub status: Status,
    /// When it was accepted, ms.
    pub created_at_ms: durafiber_api::Timestamp,
    /// When it last changed, ms.
    pub updated_at_ms: durafiber_api::Timestamp,
    /// Activations so far.
    pub attempt: u32,
}

/// `GET /runs/{id}`: the run, and the rest (stash, ledger, alarms, approvals, dead letters,
/// budget, audit) as the server shows it.
#[derive(Debug, Clone, Deserialize)]
pub struct RunView {
    /// The run's record.
    pub run: RunSummary,
    /// The last stash, the ledger, alarms, approvals, dead letters, budget and audit.
    #[serde(flatten)]
    pub more: serde_json::Map<String, Value>,
}

/// `POST /runs/{id}/cancel`.
#[derive(Debug, Clone, Deserialize)]
pub struct Cancelled {
    /// The run.
    pub run_id: String,
    /// Its state after the request (a running fiber stops at its next boundary).
    pub status: Value,
}

/// `DELETE /runs/{id}`.
#[derive(Debug, Clone, Deserialize)]
pub struct RunDeleted {
    /// The run, which no longer exists.
    pub run_id: String,
    /// How many stored records went with it.
    pub records: u64,
}

/// `POST /runs/{id}/requests`.
#[derive(Debug, Clone, Deserialize)]
pub struct Reply {
    /// The run.
    pub run_id: String,
    /// What `on_request` answered.
    pub reply: Value,
}

/// `POST /runs/{id}/events/{name}`.
#[derive(Debug, Clone, Deserialize)]
pub struct EventSent {
    /// The run.
    pub run_id: String,
    /// The event.
    pub name: String,
    /// Delivered, buffered, or a duplicate.
    pub outcome: SendOutcome,
}

/// One key of a run's storage.
#[derive(Debug, Clone, Deserialize)]
pub struct StorageEntry {
    /// The key.
    pub key: String,
    /// Its value.
    pub value: Value,
}

/// `GET /runs/{id}/storage`.
#[derive(Debug, Clone, Deserialize)]
pub struct StoragePage {
    /// The run.
    pub run_id: String,
    /// The keys, in order.
    pub entries: Vec<StorageEntry>,
    /// Pass as `start_after` for the next page; `None` on the last one.
    pub next: Option<String>,
}

/// `POST /tokens`: the only time a token is shown.
#[derive(Debug, Clone, Deserialize)]
pub struct TokenCreated {
    /// Its name.
    pub name: String,
    /// Its role.
    pub role: String,
    /// The secret to present as `Authorization: Bearer`.
    pub token: String,
}

/// A token as an admin sees it.
#[derive(Debug, Clone, Deserialize)]
pub struct TokenShown {
    /// Its name.
    pub name: String,
    /// Its role.
    pub role: String,
    /// When it was created, ms.
    pub created_at_ms: durafiber_api::Timestamp,
}

/// `DELETE /tokens/{name}`.
#[derive(Debug, Clone, Deserialize)]
pub struct TokenRevoked {
    /// Its name.
    pub name: String,
    /// False when no token had that name.
    pub revoked: bool,
}
