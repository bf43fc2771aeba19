//! Accepting a run: the handle is minted durably before anything of the agent runs (§2).
//!
//! Before: `Runtime::start`. The key is looked up: same input → the existing handle; other
//! input → `KeyConflict`; new → an `Accepted` run record, its key and its open-run index in
//! one sync boundary. After: the registry activates the run and its actor starts the fiber.

use std::sync::Arc;

use durafiber_store::{
    Durability, StoreError,
    tables::{self, Key, RunRecord, RunStatus, keys},
};

use crate::trace;
use crate::{
    error::RuntimeError,
    json,
    kernel::shared::Shared,
    limits,
    metrics::Metrics,
    rng::unguessable_hex,
    types::{RunId, RunOptions},
};

pub use durafiber_api::StartOutcome;

/// A new run id: creation time first, so ids sort roughly by age, then 128 bits from the
/// operating system's cryptographic generator.
pub(crate) fn mint_run_id(now_ms: u64) -> Result<RunId, RuntimeError> {
    let token =
        unguessable_hex().map_err(|source| RuntimeError::NoRandomness { what: "a run id", source })?;
    Ok(RunId::new(format!("run_{now_ms:012x}{token}")))
}

pub(crate) async fn start(
    shared: &Arc<Shared>,
    kind: &str,
    key: &str,
    input_json: &str,
    options: RunOptions,
    caller: Option<opentelemetry::trace::SpanContext>,
) -> Result<StartOutcome, RuntimeError> {
    let agent = shared.agents.agent(kind)?;
    tables::check_id("idempotency key", key).map_err(RuntimeError::InvalidInput)?;
    if input_json.len() > limits::PAYLOAD_BYTES_MAX {
        return Err(RuntimeError::InvalidInput(format!(
            "input is {} bytes, more than {}",
            input_json.len(),
            limits::PAYLOAD_BYTES_MAX
        )));
    }
    agent
        .check_input(input_json)
        .map_err(|e| RuntimeError::InvalidInput(format!("input for {kind}: {e}")))?;
    let input: serde_json::Value = json::parse(input_json).map_err(RuntimeError::InvalidInput)?;
    let (input_json, input_hash) = json::canonical_with_hash(&input).map_err(RuntimeError::InvalidInput)?;
    let key_record = keys::run_by_key(kind, key);

    let _guard = shared.stripes.start(key).await;
    if let Some(existing) = existing(shared, &key_record, key, &input)? {
        return Ok(existing);
    }
    // A new run is new work: refused while the disk is below its reserve (§ store faults).
    shared.store.check_room()?;
    let now = shared.now_ms();
    let run = RunRecord {
        run_id: mint_run_id(now)?,
        kind: kind.to_string(),
        key: key.to_string(),
        input_json,
        input_hash,
        status: RunStatus::Accepted,
        created_at_ms: now,
        updated_at_ms: now,
        attempt: 0,
        recover_attempts: 0,
        next_recover_at_ms: 0,
        wake_reason: None,
        cancel_reason: None,
        options: options.stored(),
    };
    let mut batch = durafiber_store::Batch::new();
    batch.put(key_record.clone(), &run.run_id)?;
    crate::budget::stage_at_start(&mut batch, &run.run_id, options.budget.or(shared.config.budget).limits())?;
    batch.put(keys::run(&run.run_id), &run)?;
    batch.put(keys::open_run(&run.run_id), &())?;
    // The key is unique by the store, not by the lock above: on a store that several nodes
    // share, another node may accept the same key at the same moment, and one of the two
    // batches is refused whole. The run's own records are new too, so this needs no lease
    // on the run's shard: the shard's owner picks the run up.
    batch.all_new();
    match shared.store.commit(batch, Durability::Sync).await {
        Ok(()) => shared.signals.status_changed(),
        Err(StoreError::Exists { .. }) => {
            tracing::info!(key, "another node accepted this key first");
            return existing(shared, &key_record, key, &input)?
                .ok_or_else(|| RuntimeError::Store(StoreError::Exists { key: key.to_string() }));
        }
        Err(e) => return Err(e.into()),
    }
    drop(_guard);
    Metrics::bump(&shared.obs.metrics.starts);
    shared.event(&run.run_id, "accepted", format!("kind {kind}, key {key}"));
    // The trace's root: every later span of the run, in any process, is under it.
    shared.obs.span(|| {
        trace::Ended::new(&run.run_id, kind, "run", trace::Parent::Root)
            .id(trace::root_span_id(&run.run_id))
            .times(now, now)
            .attr("durafiber.run.key", key.to_string())
            .link(caller)
    });
    Ok(StartOutcome { run_id: RunId::new(run.run_id), accepted: true, status: RunStatus::Accepted })
}

/// The run already accepted under the key, if any: same input → its handle; another input
/// → `KeyConflict`.
pub(crate) fn existing(
    shared: &Shared,
    key_record: &Key<RunId>,
    key: &str,
    input: &serde_json::Value,
) -> Result<Option<StartOutcome>, RuntimeError> {
    let Some(run_id) = shared.store.get(key_record)? else { return Ok(None) };
    let run = shared.load_run(&run_id)?;
    if !json::hash_matches(&run.input_hash, input).map_err(RuntimeError::InvalidInput)? {
        return Err(RuntimeError::KeyConflict { key: key.to_string(), run_id });
    }
    tracing::info!(%run_id, key, "duplicate start returns the existing handle");
    Ok(Some(StartOutcome { run_id, accepted: false, status: run.status }))
}
