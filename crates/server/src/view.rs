//! A run as a person reads it, for the API's `GET /runs/{id}` and the console: everything
//! stored about it, the audit entries about it, who decided each approval — secrets
//! redacted.

use durafiber_api::ApiErrorKind;
use durafiber_runtime::{RunId, RuntimeError};
use durafiber_store::access::{self, AuditRecord};
use serde_json::{Value, json};

use crate::state::{ApiError, AppState};

/// The run's inspection with `audit` and each decided approval's `decided_by`, redacted.
pub fn run(app: &AppState, run_id: &RunId) -> Result<Value, ApiError> {
    let inspection = app.runtime.inspect(run_id)?;
    let mut shown = serde_json::to_value(&inspection).map_err(internal)?;
    let audit = access::of_run(app.runtime.store(), run_id).map_err(RuntimeError::from)?;
    for approval in shown["approvals"].as_array_mut().into_iter().flatten() {
        if let Some(name) = decided_by(&audit, approval) {
            approval["decided_by"] = json!(name);
        }
    }
    shown["audit"] = json!(audit);
    if let Some(here) = app.runtime.node_id() {
        shown["node"] = match app.runtime.owner_of(run_id)? {
            durafiber_runtime::RunOwner::Here => json!(here),
            durafiber_runtime::RunOwner::Node { node_id, .. } => json!(node_id),
            durafiber_runtime::RunOwner::Nobody { .. } => Value::Null,
        };
    }
    redacted(app, &shown)
}

/// `value` with every secret value the server knows replaced by its placeholder.
pub fn redacted(app: &AppState, value: &Value) -> Result<Value, ApiError> {
    let text = serde_json::to_string(value).map_err(internal)?;
    serde_json::from_str(&app.secrets.redact(&text)).map_err(internal)
}

fn internal(e: serde_json::Error) -> ApiError {
    ApiError(axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string(), ApiErrorKind::Internal)
}

/// The token that recorded `approval`'s decision: the first audited request for it with
/// the same payload hash and answer (a repeat of it changes nothing; another answer is
/// refused as already decided).
fn decided_by<'a>(audit: &'a [AuditRecord], approval: &Value) -> Option<&'a str> {
    let id = approval["approval_id"].as_str()?;
    let approved = approval["decision"]["approved"].as_bool()?;
    let hash = approval["payload_hash"].as_str()?;
    audit
        .iter()
        .find(|e| {
            e.action == "approve"
                && e.detail.starts_with(&format!("approval={id} "))
                && e.detail.contains(&format!("approved={approved}"))
                && e.detail.contains(&format!("payload_hash={}", json!(hash)))
        })
        .map(|e| e.actor.as_str())
}
