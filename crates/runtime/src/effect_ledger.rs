//! An effect's entry in the idempotency ledger (§5): read when the fiber reaches the effect —
//! other arguments are a conflict, a committed entry's receipt is returned without a call, a
//! prepared one is called again under its key — prepared with its key minted and durable
//! before any call, and committed with the call's answer. What a streaming effect does
//! beside a plain one (`ReceiptHooks`), and the replay's stop before a call (`stop_calls`).
//! The calls themselves, their retries and timeouts are `effect.rs`'s.

use crate::kernel::commit::{self as committer, After};
use durafiber_store::{
    Batch, Durability,
    tables::{Key, LedgerEntry, Receipt, keys, keys::Journaled},
};
use serde::{Serialize, de::DeserializeOwned};

use crate::{error::AgentError, json, kernel::shared::RawCtx, metrics::Metrics, rng::unguessable_hex};

/// What an effect does around its ledger entry beyond a plain call: a streaming effect writes
/// its chunks with its receipt, and shows them again when its receipt is replayed.
pub(crate) trait ReceiptHooks<R> {
    /// The entry is about to be called: `prepared_before` when an earlier entry of the fiber
    /// (in this process or one before it) prepared it and did not commit it.
    fn entered(&self, _prepared_before: bool) {}
    /// Before `receipt` is committed; what it stages goes into the commit's batch.
    fn before_commit(&self, _raw: &RawCtx, _receipt: &mut R) -> Result<(), AgentError> {
        Ok(())
    }
    /// A stored receipt is returned without a call.
    fn replayed(&self, _raw: &RawCtx, _receipt: &R) -> Result<(), AgentError> {
        Ok(())
    }
}

/// A plain effect: its receipt is all there is.
pub(crate) struct Plain;

impl<R> ReceiptHooks<R> for Plain {}

/// Where an effect's entry into the ledger left it.
pub(crate) enum Entered<R> {
    /// Committed before: its receipt, returned without a call.
    Replayed(R),
    /// Prepared (now, or before and never committed): the entry to call under.
    Entry(LedgerEntry),
}

/// Reads the effect's ledger entry: other arguments are a conflict; a committed one is
/// replayed; a prepared one is called again under its key; none is prepared now, its key
/// minted and made durable before any call (§5).
pub(crate) async fn enter<Args: Serialize, R: DeserializeOwned>(
    raw: &RawCtx,
    effect_id: &str,
    args: &Args,
    key: &Key<LedgerEntry>,
    hooks: &(impl ReceiptHooks<R> + Sync),
) -> Result<Entered<R>, AgentError> {
    let shared = &raw.shared;
    let Some(entry) = shared.store.get::<LedgerEntry>(key)? else {
        stop_if_replaying(shared, effect_id, "it would make a new call before its next boundary")?;
        let entry = prepare(raw, effect_id, args, key).await?;
        hooks.entered(false);
        return Ok(Entered::Entry(entry));
    };
    if !json::hash_matches(&entry.args_hash, args).map_err(|e| AgentError::Serialization(e.into()))? {
        return Err(AgentError::EffectConflict { effect_id: effect_id.to_string() });
    }
    let Some(receipt) = &entry.committed else {
        stop_if_replaying(
            shared,
            effect_id,
            "it would call it again under its key: its last call's answer was never recorded",
        )?;
        hooks.entered(true);
        return Ok(Entered::Entry(entry));
    };
    Metrics::bump(&shared.obs.metrics.effects_prevented);
    shared.obs.span(|| {
        raw.span_since(format!("effect {effect_id}"), shared.now())
            .client()
            .attr("durafiber.effect.id", effect_id.to_string())
            .attr("durafiber.effect.key", entry.idempotency_key.clone())
            .attr("durafiber.effect.outcome", "replayed")
    });
    shared.event(
        &entry.run_id,
        "effect_replayed",
        format!("{effect_id}: stored receipt returned, not called again"),
    );
    let receipt = json::parse(&receipt.receipt_json).map_err(|e| AgentError::Serialization(e.into()))?;
    hooks.replayed(raw, &receipt)?;
    Ok(Entered::Replayed(receipt))
}

/// A new ledger entry for the effect: its idempotency key minted and the entry committed as
/// a boundary, before any call. Refused for a cancelled run or one past its budget.
async fn prepare<Args: Serialize>(
    raw: &RawCtx,
    effect_id: &str,
    args: &Args,
    key: &Key<LedgerEntry>,
) -> Result<LedgerEntry, AgentError> {
    let (shared, run_id) = (&raw.shared, &raw.cell.run_id);
    if raw.cell.cancel.is_requested() {
        return Err(AgentError::Cancelled(format!("effect {effect_id} not started: the run was cancelled")));
    }
    crate::budget::admit_effect(raw)?;
    let token = unguessable_hex().map_err(|source| {
        AgentError::from(crate::error::RuntimeError::NoRandomness { what: "an idempotency key", source })
    })?;
    let (_, args_hash) = json::canonical_with_hash(args).map_err(|e| AgentError::Serialization(e.into()))?;
    let entry = LedgerEntry {
        run_id: run_id.clone(),
        effect_id: effect_id.to_string(),
        idempotency_key: format!("{run_id}:{effect_id}:{token}"),
        args_hash,
        prepared_at_ms: shared.now(),
        committed: None,
    };
    let mut batch = Batch::new();
    batch.put(key.clone(), &entry)?;
    let after =
        After::default().event("effect_prepared", format!("{effect_id}: key {}", entry.idempotency_key));
    committer::commit(raw, batch, Durability::Sync, after).await?;
    Ok(entry)
}

/// Under `stop_calls`, the call that would leave here is not made.
fn stop_if_replaying(
    shared: &crate::kernel::shared::Shared,
    effect_id: &str,
    what: &str,
) -> Result<(), AgentError> {
    if shared.config.stop_calls {
        return Err(AgentError::CallStopped { effect_id: effect_id.to_string(), what: what.to_string() });
    }
    Ok(())
}

pub(crate) async fn commit<R: Serialize>(
    raw: &RawCtx,
    key: Key<LedgerEntry>,
    mut entry: LedgerEntry,
    receipt: &R,
) -> Result<(), AgentError> {
    assert!(entry.committed.is_none(), "only a prepared effect is committed");
    // An upstream that echoes what it was sent must not put a secret into the ledger.
    let (receipt_json, receipt_hash) =
        raw.shared.obs.redacted_with_hash(receipt).map_err(|e| AgentError::Serialization(e.into()))?;
    entry.committed = Some(Receipt { receipt_json, receipt_hash, committed_at_ms: raw.shared.now() });
    let mut batch = Batch::new();
    batch.put(key, &entry)?;
    // Which boundary it came after: a fork from a later one inherits it.
    let seq = raw.cell.seq.load(std::sync::atomic::Ordering::SeqCst);
    batch.put(keys::journal_seq(&entry.run_id, Journaled::Effect, &entry.effect_id), &seq)?;
    let after = After::default().event("effect_committed", entry.effect_id.clone()).count(|m| &m.effects);
    committer::commit(raw, batch, Durability::Sync, after).await?;
    Ok(())
}
