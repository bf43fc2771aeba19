//! Who may do what, and who did: the records behind API tokens, and the audit trail —
//! append-only but for its retention — which the server (who asked for a change) and the
//! runtime (a secret refused) both write. The store keeps them; the server decides what
//! tokens allow.

use std::sync::atomic::{AtomicU64, Ordering};

pub use crate::tables::{AuditRecord, TokenRecord};
use crate::{barrier::Durability, batch::Batch, error::StoreError, store::Store, tables::keys};
use durafiber_api::{RunId, Timestamp};

/// The last sequence number handed out by this process.
static LAST_SEQ: AtomicU64 = AtomicU64::new(0);

/// The next audit sequence number: the clock in microseconds, and always above the last,
/// so entries sort in the order they were made, across restarts too.
fn next_seq(now: Timestamp) -> u64 {
    let floor = now.as_millis().saturating_mul(1_000);
    let mut last = LAST_SEQ.load(Ordering::SeqCst);
    loop {
        let next = floor.max(last.saturating_add(1));
        match LAST_SEQ.compare_exchange(last, next, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => return next,
            Err(seen) => last = seen,
        }
    }
}

/// Appends one entry to the audit trail, durably.
pub async fn append(
    store: &Store,
    actor: &str,
    action: &str,
    run_id: Option<&str>,
    detail: &str,
    now: Timestamp,
) -> Result<(), StoreError> {
    // Entries are only ever created, never overwritten: on a store several nodes share, two
    // nodes that picked the same microsecond find out, and the later one takes the next.
    let mut floor = now;
    for _ in 0..AUDIT_TRIES {
        let seq = next_seq(floor);
        let entry = AuditRecord {
            seq,
            at_ms: now,
            actor: actor.to_string(),
            action: action.to_string(),
            run_id: run_id.map(RunId::new),
            detail: detail.to_string(),
        };
        let mut batch = Batch::new();
        batch.put(keys::audit(seq), &entry)?;
        if let Some(run_id) = run_id {
            batch.put(keys::audit_by_run(run_id, seq), &())?;
        }
        batch.all_new();
        match store.commit(batch, Durability::Sync).await {
            Err(StoreError::Exists { .. }) => floor = Timestamp::from_millis(seq / 1_000 + 1),
            other => return other,
        }
    }
    Err(StoreError::Exists { key: "audit sequence number".into() })
}

/// Attempts at a free audit sequence number before giving up.
const AUDIT_TRIES: usize = 8;

/// Up to `limit` audit entries after sequence number `after`, oldest first.
pub fn page(store: &Store, after: Option<u64>, limit: usize) -> Result<Vec<AuditRecord>, StoreError> {
    let after_key = after.map(keys::audit);
    let mut out = Vec::new();
    for (_, entry) in store.scan(&keys::AUDIT.all(), after_key.as_ref(), limit)? {
        out.push(entry?);
    }
    Ok(out)
}

/// Every audit entry about `run_id`, oldest first.
pub fn of_run(store: &Store, run_id: &RunId) -> Result<Vec<AuditRecord>, StoreError> {
    let mut out = Vec::new();
    for (key, _) in store.scan(&keys::AUDIT_BY_RUN.of_run(run_id), None, usize::MAX)? {
        let Some(seq) = keys::audit_seq(&key) else { continue };
        if let Some(entry) = store.get(&keys::audit(seq))? {
            out.push(entry);
        }
    }
    Ok(out)
}

/// Deletes up to `limit` of the oldest audit entries written before `before`, with their
/// marks on their runs, in one commit: the audit trail's retention. How many went; `limit`
/// of them means more may be due. An entry that no longer decodes is deleted by its key
/// alone, as its time is: its sequence number is its time in microseconds.
pub async fn forget_before(store: &Store, before: Timestamp, limit: usize) -> Result<usize, StoreError> {
    let before_seq = before.as_millis().saturating_mul(1_000);
    let mut batch = Batch::new();
    let mut forgotten = 0;
    for (key, entry) in store.scan(&keys::AUDIT.all(), None, limit)? {
        if keys::audit_seq(&key).is_none_or(|seq| seq >= before_seq) {
            break;
        }
        if let Ok(AuditRecord { seq, run_id: Some(run_id), .. }) = entry {
            batch.delete(keys::audit_by_run(run_id.as_str(), seq));
        }
        batch.delete(key);
        forgotten += 1;
    }
    if forgotten > 0 {
        store.commit(batch, Durability::Sync).await?;
    }
    Ok(forgotten)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audit_sequence_numbers_always_rise() {
        let a = next_seq(Timestamp::from_millis(5));
        let b = next_seq(Timestamp::from_millis(5));
        let c = next_seq(Timestamp::from_millis(1));
        assert!(a < b && b < c);
    }
}
