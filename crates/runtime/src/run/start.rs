//! Starting a run: the handle is minted durably before anything of the agent runs (§2),
//! then the run is activated beside the caller.
//!
//! Before: `Runtime::start` or `Runtime::start_run`, or a fiber's `start_child`. The key is
//! looked up: same input → the existing handle; other input → `KeyConflict`; new → an
//! `Accepted` run record, its key and its open-run index in one sync boundary. After: the
//! run is activated (`run/actor.rs`) and its fiber starts.

use durafiber_api::Timestamp;
use std::sync::Arc;

use durafiber_store::{
    Durability, StoreError,
    tables::{self, Key, RunRecord, RunStatus, keys},
};

use crate::trace;
use crate::{
    agent::Agent,
    error::RuntimeError,
    json,
    kernel::shared::{BoxFuture, Shared},
    limits,
    metrics::Metrics,
    rng::unguessable_hex,
    run::actor::reactivate,
    types::{RunId, RunOptions},
};

pub use durafiber_api::StartOutcome;

/// One start: which agent runs it, under which idempotency key, with which input, kept how,
/// and the caller's trace. The input is parsed once, by whoever made the request; the start
/// canonicalises and hashes it once.
///
/// ```no_run
/// # use durafiber_runtime::{Agent, DurabilityMode, RunOptions, Runtime, RuntimeError, StartRequest};
/// # async fn example<A: Agent>(rt: &Runtime, input: &A::Input) -> Result<(), RuntimeError> {
/// let options = RunOptions { durability: Some(DurabilityMode::Async), ..RunOptions::default() };
/// let run = rt.start_run(StartRequest::of::<A>("order-17", input)?.with_options(options)).await?;
/// rt.wait(&run.run_id).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct StartRequest<'a> {
    /// The agent kind that runs it.
    pub kind: &'a str,
    /// The idempotency key: the same key and input return the same run.
    pub key: &'a str,
    /// The input, as JSON.
    pub input: serde_json::Value,
    /// How the run is kept: durability, keep-alive, budget.
    pub options: RunOptions,
    /// A caller in a trace of its own: its W3C `traceparent` becomes a link of the run's root
    /// span, so the caller's trace leads to the run's (a malformed one is ignored). The run
    /// keeps its own trace, whose id is derived from its run id.
    pub traceparent: Option<&'a str>,
}

impl<'a> StartRequest<'a> {
    /// A start of `kind` under `key` with `input`, with the runtime's defaults.
    pub fn new(kind: &'a str, key: &'a str, input: serde_json::Value) -> Self {
        StartRequest { kind, key, input, options: RunOptions::default(), traceparent: None }
    }

    /// A start of agent `A` with its typed input.
    pub fn of<A: Agent>(key: &'a str, input: &A::Input) -> Result<Self, RuntimeError> {
        let input = serde_json::to_value(input).map_err(|e| RuntimeError::InvalidInput(e.to_string()))?;
        Ok(StartRequest::new(A::KIND, key, input))
    }

    /// With per-run options.
    pub fn with_options(mut self, options: RunOptions) -> Self {
        self.options = options;
        self
    }

    /// With the caller's W3C `traceparent`.
    pub fn with_traceparent(mut self, traceparent: Option<&'a str>) -> Self {
        self.traceparent = traceparent;
        self
    }
}

/// A new run id: creation time first, so ids sort roughly by age, then 128 bits from the
/// operating system's cryptographic generator.
pub(crate) fn mint_run_id(now: Timestamp) -> Result<RunId, RuntimeError> {
    let token =
        unguessable_hex().map_err(|source| RuntimeError::NoRandomness { what: "a run id", source })?;
    Ok(RunId::new(format!("run_{:012x}{token}", now.as_millis())))
}

/// Starts a run and, once its handle is durable, lets its activation go on beside the
/// caller: its registration write and its fiber. Virtual time and `settle` wait for it.
pub(crate) async fn start(
    shared: &Arc<Shared>,
    request: StartRequest<'_>,
) -> Result<StartOutcome, RuntimeError> {
    let outcome = accept(shared, request).await?;
    announce_if_elsewhere(shared, &outcome);
    if outcome.accepted || matches!(outcome.status, RunStatus::Accepted) {
        let (activating, run_id) = (shared.clone(), outcome.run_id.clone());
        let busy = shared.life.busy();
        shared.life.spawn_tracked(async move {
            reactivate(&activating, &run_id).await;
            drop(busy);
        });
    }
    Ok(outcome)
}

/// A run just accepted that another node of a shared store runs: that node is told now
/// rather than finding it at its next tick.
pub(crate) fn announce_if_elsewhere(shared: &Shared, outcome: &StartOutcome) {
    if outcome.accepted
        && !shared.ownership.owns(outcome.run_id.as_str())
        && let Some(leases) = shared.store.backend().leases()
        && let Err(e) = leases.announce(durafiber_store::shard::of_run(outcome.run_id.as_str()))
    {
        tracing::warn!(run_id = %outcome.run_id, error = %e, "could not tell the run's owner; it finds the run at its next tick");
    }
}

/// [`Agents::starter`](crate::kernel::shared::Agents::starter): a child's start, with the
/// runtime's defaults.
pub(crate) fn start_boxed(
    shared: Arc<Shared>,
    kind: String,
    key: String,
    input_json: String,
) -> BoxFuture<Result<RunId, RuntimeError>> {
    Box::pin(async move {
        let input = json::parse(&input_json).map_err(|e| RuntimeError::InvalidInput(e.into()))?;
        Ok(start(&shared, StartRequest::new(&kind, &key, input)).await?.run_id)
    })
}

/// The run durably accepted, or the one its key already names.
async fn accept(shared: &Arc<Shared>, request: StartRequest<'_>) -> Result<StartOutcome, RuntimeError> {
    let StartRequest { kind, key, input, options, traceparent } = request;
    let agent = shared.agents.agent(kind)?;
    tables::check_id("idempotency key", key).map_err(|e| RuntimeError::InvalidInput(e.into()))?;
    agent.check_input(&input).map_err(|e| RuntimeError::InvalidInput(format!("input for {kind}: {e}")))?;
    let (input_json, input_hash) =
        json::canonical_with_hash(&input).map_err(|e| RuntimeError::InvalidInput(e.into()))?;
    if input_json.len() > limits::PAYLOAD_BYTES_MAX {
        return Err(RuntimeError::InvalidInput(format!(
            "input is {} bytes, more than {}",
            input_json.len(),
            limits::PAYLOAD_BYTES_MAX
        )));
    }
    let caller = traceparent.and_then(trace::parse_traceparent);
    let key_record = keys::run_by_key(kind, key);

    let _guard = shared.stripes.start(key).await;
    if let Some(existing) = existing(shared, &key_record, key, &input)? {
        return Ok(existing);
    }
    // A new run is new work: refused while the disk is below its reserve (§ store faults).
    shared.store.check_room()?;
    let now = shared.now();
    let run = accepted_record(mint_run_id(now)?, kind, key, (input_json, input_hash), options, now);
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

/// A new run's record: `Accepted` at `now`, with its input and options.
fn accepted_record(
    run_id: RunId,
    kind: &str,
    key: &str,
    (input_json, input_hash): (String, String),
    options: RunOptions,
    now: Timestamp,
) -> RunRecord {
    RunRecord {
        run_id,
        kind: kind.to_string(),
        key: key.to_string(),
        input_json,
        input_hash,
        status: RunStatus::Accepted,
        created_at_ms: now,
        updated_at_ms: now,
        attempt: 0,
        recover_attempts: 0,
        next_recover_at_ms: Timestamp::ZERO,
        wake_reason: None,
        cancel_reason: None,
        options: options.stored(),
    }
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
    if !json::hash_matches(&run.input_hash, input).map_err(|e| RuntimeError::InvalidInput(e.into()))? {
        return Err(RuntimeError::KeyConflict { key: key.to_string(), run_id });
    }
    tracing::info!(%run_id, key, "duplicate start returns the existing handle");
    Ok(Some(StartOutcome { run_id, accepted: false, status: run.status }))
}
