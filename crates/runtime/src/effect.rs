//! Effects through the idempotency ledger (§5).
//!
//! Ledger entry lifecycle: absent → `Prepared{key, args_hash}` → `Committed{receipt}`.
//! The key is minted once, written durably before the first call, and reused on every
//! re-entry, so an upstream that deduplicates on it sees one request however often the
//! run is resumed. A committed entry returns its receipt without calling the outside world.

use std::future::Future;

use durafiber_store::{
    Batch, Durability,
    tables::{self, LedgerEntry, Receipt},
};
use serde::{Serialize, de::DeserializeOwned};

use crate::{
    clock, error::AgentError, json, kernel::shared::RawCtx, limits, metrics::Metrics, rng::unguessable_hex,
};

/// Full-jitter backoff before call `attempt + 1`: uniform in `0..=min(max, min × 2^(attempt-1))`.
fn retry_delay_ms(raw: &RawCtx, attempt: u32) -> u64 {
    let base = limits::EFFECT_BACKOFF_MIN.as_millis() as u64;
    let cap =
        (base << (attempt.saturating_sub(1)).min(16)).min(limits::EFFECT_BACKOFF_MAX.as_millis() as u64);
    raw.shared.jitter_between(0, cap)
}

pub(crate) async fn perform<Args, R, F, Fut, E>(
    raw: &mut RawCtx,
    effect_id: &str,
    args: Args,
    mut f: F,
) -> Result<R, AgentError>
where
    Args: Serialize + Clone + Send,
    R: Serialize + DeserializeOwned + Send,
    F: FnMut(String, Args) -> Fut + Send,
    Fut: Future<Output = Result<R, E>> + Send,
    E: std::fmt::Display,
{
    tables::check_id("effect id", effect_id).map_err(AgentError::fail)?;
    let shared = raw.shared.clone();
    let run_id = raw.cell.run_id.clone();
    let (_, args_hash) = json::canonical_with_hash(&args).map_err(AgentError::Serialization)?;
    let same_args = |stored: &str| json::hash_matches(stored, &args).map_err(AgentError::Serialization);
    let key = tables::LEDGER.key(&[run_id.as_bytes(), effect_id.as_bytes()]);
    let conflict = || AgentError::EffectConflict { effect_id: effect_id.to_string() };

    let entry = match shared.store.get::<LedgerEntry>(tables::LEDGER, &key)? {
        Some(entry) if !same_args(&entry.args_hash)? => return Err(conflict()),
        Some(LedgerEntry { committed: Some(receipt), .. }) => {
            Metrics::bump(&shared.metrics.effects_prevented);
            shared.event(
                &run_id,
                "effect_replayed",
                format!("{effect_id}: stored receipt returned, not called again"),
            );
            return json::parse(&receipt.receipt_json).map_err(AgentError::Serialization);
        }
        Some(prepared) => prepared,
        None => {
            if raw.cell.cancel.borrow().is_some() {
                return Err(AgentError::Cancelled(format!(
                    "effect {effect_id} not started: the run was cancelled"
                )));
            }
            let token = unguessable_hex()
                .map_err(|e| AgentError::Runtime(format!("no randomness for an idempotency key: {e}")))?;
            let entry = LedgerEntry {
                run_id: run_id.clone(),
                effect_id: effect_id.to_string(),
                idempotency_key: format!("{run_id}:{effect_id}:{token}"),
                args_hash,
                prepared_at_ms: shared.now_ms(),
                committed: None,
            };
            let mut batch = Batch::new();
            batch.put(tables::LEDGER, key.clone(), &entry)?;
            shared.commit_boundary(&raw.cell, batch, Durability::Sync).await?;
            shared.event(&run_id, "effect_prepared", format!("{effect_id}: key {}", entry.idempotency_key));
            entry
        }
    };
    crate::eviction::idle::boundary(raw, &format!("after_effect_prepare:{effect_id}")).await;

    let mut last_error = String::new();
    for attempt in 1..=limits::EFFECT_ATTEMPTS_MAX {
        match f(entry.idempotency_key.clone(), args.clone()).await {
            Ok(receipt) => {
                crate::eviction::idle::boundary(raw, &format!("after_effect_call:{effect_id}")).await;
                commit(raw, key, entry, &receipt).await?;
                crate::eviction::idle::boundary(raw, &format!("after_effect_commit:{effect_id}")).await;
                return Ok(receipt);
            }
            Err(e) => {
                last_error = e.to_string();
                tracing::warn!(run_id, effect_id, attempt, error = %last_error, "effect call failed");
                if attempt < limits::EFFECT_ATTEMPTS_MAX {
                    let delay = retry_delay_ms(raw, attempt);
                    let sleep = clock::sleep(shared.clock.as_ref(), std::time::Duration::from_millis(delay));
                    shared.parked(raw.in_fiber, sleep).await;
                }
            }
        }
    }
    Err(AgentError::EffectFailed {
        effect_id: effect_id.to_string(),
        attempts: limits::EFFECT_ATTEMPTS_MAX,
        error: last_error,
    })
}

async fn commit<R: Serialize>(
    raw: &RawCtx,
    key: Vec<u8>,
    mut entry: LedgerEntry,
    receipt: &R,
) -> Result<(), AgentError> {
    assert!(entry.committed.is_none(), "only a prepared effect is committed");
    // An upstream that echoes what it was sent must not put a secret into the ledger.
    let (receipt_json, receipt_hash) =
        raw.shared.redacted_with_hash(receipt).map_err(AgentError::Serialization)?;
    entry.committed = Some(Receipt { receipt_json, receipt_hash, committed_at_ms: raw.shared.now_ms() });
    let mut batch = Batch::new();
    batch.put(tables::LEDGER, key, &entry)?;
    raw.shared.commit_boundary(&raw.cell, batch, Durability::Sync).await?;
    raw.shared.event(&entry.run_id, "effect_committed", entry.effect_id.clone());
    Metrics::bump(&raw.shared.metrics.effects);
    Ok(())
}
