//! The approvals that wait for a reviewer, as a reviewer's screen loads them: every one, a
//! run's, or a page at a time, each with its rule and the votes so far.

use durafiber_api::Timestamp;
use durafiber_store::tables::{ApprovalRecord, Key, keys};

use crate::{approval::votes_of, error::RuntimeError, kernel::shared::Shared, limits};

pub use durafiber_api::PendingApproval;

pub(crate) fn pending(shared: &Shared, run_id: Option<&str>) -> Result<Vec<PendingApproval>, RuntimeError> {
    let prefix = match run_id {
        Some(id) => keys::APPROVALS.of_run(id),
        None => keys::APPROVALS.all(),
    };
    let now = shared.now();
    let mut out = Vec::new();
    for (key, record) in shared.store.scan(&prefix, None, usize::MAX)? {
        out.extend(still_pending(&key, record, now));
    }
    with_votes(shared, out)
}

/// Each pause with its rule's count and the decisions made so far.
fn with_votes(
    shared: &Shared,
    mut pending: Vec<PendingApproval>,
) -> Result<Vec<PendingApproval>, RuntimeError> {
    for p in &mut pending {
        if let Some(rule) = shared.store.get(&keys::approval_rule(&p.run_id, &p.approval_id))? {
            p.required = rule.required;
            p.votes = votes_of(shared, &p.run_id, &p.approval_id)?;
        }
    }
    Ok(pending)
}

/// At most `limit` pending approvals across runs, in the order of their keys (the run's id,
/// then the approval's: runs in the order they were started), after approval `after`
/// (a run id and an approval id). The records are read a bounded page at a time, so a page
/// of pending approvals among many decided ones never holds more than one page of records.
pub(crate) fn pending_page(
    shared: &Shared,
    after: Option<(&str, &str)>,
    limit: usize,
) -> Result<Vec<PendingApproval>, RuntimeError> {
    let prefix = keys::APPROVALS.all();
    let mut cursor = after.map(|(run_id, approval_id)| keys::approval(run_id, approval_id));
    let now = shared.now();
    let mut out = Vec::new();
    while out.len() < limit {
        let page = shared.store.scan(&prefix, cursor.as_ref(), limits::LIST_PAGE_MAX)?;
        let exhausted = page.len() < limits::LIST_PAGE_MAX;
        for (key, record) in page {
            if out.len() == limit {
                break;
            }
            out.extend(still_pending(&key, record, now));
            cursor = Some(key);
        }
        if exhausted {
            break;
        }
    }
    with_votes(shared, out)
}

/// The approval read at `key` as a reviewer sees it, when it still waits for a decision.
fn still_pending(
    key: &Key<ApprovalRecord>,
    record: Result<ApprovalRecord, durafiber_store::StoreError>,
    now: Timestamp,
) -> Option<PendingApproval> {
    let record = match record {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(key = %key.printable(), error = %e, "unreadable approval");
            return None;
        }
    };
    if record.decision.is_some() || record.escalated {
        return None;
    }
    Some(PendingApproval {
        payload: serde_json::from_str(&record.payload_json).unwrap_or(serde_json::Value::Null),
        run_id: record.run_id,
        approval_id: record.approval_id,
        payload_hash: record.payload_hash,
        requested_at_ms: record.requested_at_ms,
        age_ms: now.saturating_since(record.requested_at_ms),
        escalate_at_ms: record.escalate_at_ms,
        required: 1,
        votes: Vec::new(),
    })
}
