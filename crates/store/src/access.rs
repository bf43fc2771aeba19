//! Who may do what, and who did: the records behind API tokens and the audit trail. The
//! store keeps them; the server decides what they allow.

use serde::{Deserialize, Serialize};

/// An API token as stored: its SHA-256, never the token itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// Unique; shown in the audit trail beside everything the token did.
    pub name: String,
    /// `reader`, `reviewer`, `operator` or `admin`.
    pub role: String,
    /// Lower-case hex SHA-256 of the token.
    pub hash: String,
    /// When it was created.
    pub created_at_ms: u64,
}

/// One entry of the append-only audit trail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// Its place in the trail: strictly increasing.
    pub seq: u64,
    /// When it was recorded.
    pub at_ms: u64,
    /// The name of the token that asked.
    pub actor: String,
    /// What was asked: `approve`, `cancel`, `set_alarm`, `token_create`, ...
    pub action: String,
    /// The run it concerns, if any.
    pub run_id: Option<String>,
    /// The request's particulars (an approval id and decision, an alarm name, ...).
    pub detail: String,
}
