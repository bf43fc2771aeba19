//! Sub-agents: a run started by another run's fiber (`Ctx::start_child`), joined durably
//! (`Ctx::join`).
//!
//! A child is started as any run is — durably, its handle minted before it runs — under the
//! idempotency key `<parent>:child:<name>`, so a re-entered parent that starts it again gets
//! the same run. The parent and its children are linked (`children`, `parents`), written as
//! new records (a node needs no lease to create them).
//!
//! `join` reads the child's state: ended, it answers at once. Otherwise it waits for the
//! event `child:<child id>` — a durable wait: the parent may be parked or evicted — which the
//! child's settlement sends it. That send is not in the child's settling write (the parent's
//! records are another run's), so a crash between the two could lose it: each wait has a
//! timeout (a minute, doubling up to an hour), after which `join` reads the child's state
//! again under a new wait name. The parent always gets there.

use durafiber_store::{
    Batch, Durability, RunId,
    tables::{self, ChildRecord, ParentRecord, RunRecord, RunStatus, keys},
};
use std::sync::Arc;

use crate::{
    error::{AgentError, RuntimeError},
    event,
    kernel::{
        lineage::{self, CHILD_KEY_MARK},
        shared::{RawCtx, Shared},
    },
    limits,
};

/// A child run a fiber started (`Ctx::start_child`), of agent kind `B`: what `Ctx::join`
/// waits for. The same name in a re-entered fiber is the same child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Child<B> {
    run_id: RunId,
    name: String,
    _kind: std::marker::PhantomData<fn() -> B>,
}

impl<B> Child<B> {
    pub(crate) fn new(run_id: RunId, name: &str) -> Self {
        Child { run_id, name: name.to_string(), _kind: std::marker::PhantomData }
    }

    /// The child's run.
    pub fn run_id(&self) -> &RunId {
        &self.run_id
    }

    /// Its name among its parent's children.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// The idempotency key child `name` of `parent` is started under.
fn start_key(parent: &str, name: &str) -> String {
    format!("{parent}{CHILD_KEY_MARK}{name}")
}

/// The event a child's settlement sends its parent, for the parent's wait number `wait`.
fn wait_name(child: &str, wait: u32) -> String {
    match wait {
        0 => format!("child:{child}"),
        n => format!("child:{child}:{n}"),
    }
}

/// Starts (or finds again) child `name` of the fiber's run: a run of `kind` with `input_json`.
pub(crate) async fn start(
    raw: &RawCtx,
    name: &str,
    kind: &str,
    input_json: String,
) -> Result<RunId, AgentError> {
    if !raw.in_fiber {
        return Err(AgentError::fail("only the fiber starts child runs"));
    }
    tables::check_id("child name", name).map_err(AgentError::fail)?;
    raw.refuse_if_cancelled(&format!("child {name}"))?;
    crate::pause::gate(raw).await?;
    let shared = &raw.shared;
    let parent = raw.cell.run_id.clone();
    let link = keys::child(&parent, name);
    if let Some(linked) = shared.store.get(&link)? {
        // A child this run started before, or one a fork inherited from the run it came
        // from: the same child run, never started again.
        return same_child(shared, name, kind, &input_json, linked);
    }
    let key = start_key(&parent, name);
    let child = (shared.agents.starter)(shared.clone(), kind.to_string(), key, input_json).await?;
    let mut batch = Batch::new();
    batch.put(
        link,
        &ChildRecord { child_run_id: child.clone(), kind: kind.to_string(), started_at_ms: shared.now() },
    )?;
    batch.put(
        keys::parent_of(&child),
        &ParentRecord { parent_run_id: parent.clone(), name: name.to_string() },
    )?;
    // Which boundary it was started after: a fork from a later one has the same child.
    let seq = raw.cell.seq.load(std::sync::atomic::Ordering::SeqCst);
    batch.put(keys::journal_seq(&parent, keys::Journaled::Child, name), &seq)?;
    // New records, as a start's: no lease on either run's shard is needed.
    batch.all_new();
    match shared.store.commit(batch, Durability::Sync).await {
        Ok(()) | Err(durafiber_store::StoreError::Exists { .. }) => {}
        Err(e) => return Err(RuntimeError::from(e).into()),
    }
    shared.event(&parent, "child_started", format!("{name}: {kind} {child}"));
    tracing::debug!(run_id = %parent, child = %child, name, "child run started");
    Ok(child)
}

/// The child a link names, when the fiber starts child `name` again: its kind and input
/// must be the ones it was started with.
fn same_child(
    shared: &Shared,
    name: &str,
    kind: &str,
    input_json: &str,
    linked: ChildRecord,
) -> Result<RunId, AgentError> {
    let run = shared.load_run(&linked.child_run_id)?;
    let input: serde_json::Value =
        crate::json::parse(input_json).map_err(|e| AgentError::Serialization(e.into()))?;
    let same_input = crate::json::hash_matches(&run.input_hash, &input)
        .map_err(|e| AgentError::Serialization(e.into()))?;
    if linked.kind != kind || !same_input {
        return Err(RuntimeError::KeyConflict { key: run.key, run_id: linked.child_run_id }.into());
    }
    tracing::debug!(child = %linked.child_run_id, name, "child run found again");
    Ok(linked.child_run_id)
}

/// Waits durably until `child` has ended; its final state.
pub(crate) async fn join(raw: &mut RawCtx, child: &RunId) -> Result<RunStatus, AgentError> {
    let mut wait = 0u32;
    loop {
        let run = raw.shared.load_run(child)?;
        if run.status.is_terminal() {
            return Ok(run.status);
        }
        let timeout = limits::JOIN_RECHECK_FIRST
            .checked_mul(1u32 << wait.min(6))
            .unwrap_or(limits::JOIN_RECHECK_MAX)
            .min(limits::JOIN_RECHECK_MAX);
        raw.refuse_if_cancelled(&format!("join {child}"))?;
        Box::pin(event::wait(raw, &wait_name(child, wait), Some(timeout))).await?;
        wait = wait.saturating_add(1);
    }
}

/// A run has settled: its span is sent and, if a run started it, that parent is told, and
/// so is every fork that inherited it.
pub(crate) fn settled(shared: &Arc<Shared>, run: &RunRecord) {
    shared.send_settled(run);
    if !lineage::may_have_parent(&run.key) {
        return;
    }
    let parents = match lineage::parents_to_tell(shared, &run.run_id) {
        Ok(parents) => parents,
        Err(e) => {
            tracing::warn!(run_id = %run.run_id, error = %e, "could not read a run's parent; its join reads the run again later");
            return;
        }
    };
    for to in parents {
        let (shared_, child) = (shared.clone(), run.run_id.clone());
        shared.life.spawn_tracked(async move {
            // The wait the parent is in now, if it waits for this child; else the first, which
            // keeps the event until the parent's join waits for it.
            let name = match shared_.load_run(&to).map(|p| p.status) {
                Ok(RunStatus::WaitingEvent { name }) if name.starts_with(&wait_name(&child, 0)) => name,
                Ok(status) if status.is_terminal() => return,
                _ => wait_name(&child, 0),
            };
            let key = format!("settled:{child}:{name}");
            if let Err(e) = event::send(&shared_, &to, &name, "{}", Some(&key)).await {
                tracing::info!(run_id = %to, %child, error = %e, "a child's end was not sent to its parent; its join reads the child again later");
            }
        });
    }
}
