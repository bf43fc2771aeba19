//! `stash`: the run's typed snapshot, replaced whole, in the run's durability mode (§3.2).
//!
//! Each stash is stored with the agent's `STASH_VERSION`, so that code deployed later knows
//! which shape it holds (`Agent::upgrade_stash`). The version lives beside the stash in
//! `stash_versions`, written only when it is not 1: stores of agents that never bump it
//! hold exactly what they held before versions existed, and read as version 1.

use durafiber_store::{
    Batch, Durability, Store, StoreError,
    tables::{self, StashRecord},
};

use crate::{
    agent::Agent, clock::Stopwatch, config::DurabilityMode, error::AgentError, json, kernel::shared::RawCtx,
};

/// A stash as stored: the record and the agent's stash version that wrote it.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub record: StashRecord,
    pub version: u32,
}

impl Stored {
    /// Puts the stash, and its version when it is not 1, into `batch`.
    pub fn stage(&self, batch: &mut Batch) -> Result<(), StoreError> {
        let run = self.record.run_id.as_bytes();
        batch.put(tables::STASHES, tables::STASHES.key(&[run]), &self.record)?;
        if self.version != 1 {
            batch.put(tables::STASH_VERSIONS, tables::STASH_VERSIONS.key(&[run]), &self.version)?;
        }
        Ok(())
    }
}

/// The run's last stash with its version (1 when none is recorded); `None` before the first.
pub(crate) fn read(store: &Store, run_id: &str) -> Result<Option<Stored>, StoreError> {
    let Some(record) =
        store.get::<StashRecord>(tables::STASHES, &tables::STASHES.key(&[run_id.as_bytes()]))?
    else {
        return Ok(None);
    };
    Ok(Some(Stored { record, version: version_of(store, run_id)? }))
}

/// The stash version of the run's last stash (1 when none is recorded).
pub(crate) fn version_of(store: &Store, run_id: &str) -> Result<u32, StoreError> {
    let key = tables::STASH_VERSIONS.key(&[run_id.as_bytes()]);
    Ok(store.get::<u32>(tables::STASH_VERSIONS, &key)?.unwrap_or(1))
}

/// A stored stash as this code's `Stash`: decoded when its version is this code's,
/// upgraded when older; escalating, with both versions named, when newer, when there is no
/// upgrade, or when it does not decode as the version it claims.
pub(crate) fn typed<A: Agent>(stored: &Stored) -> Result<A::Stash, AgentError> {
    let (from, to) = (stored.version, A::STASH_VERSION);
    let text = &stored.record.stash_json;
    match from.cmp(&to) {
        std::cmp::Ordering::Equal => json::parse(text).map_err(|e| {
            AgentError::escalate(format!(
                "stash_version: the stored stash (version {from}) does not decode as this code's Stash \
                 (version {to}): {e}; bump Agent::STASH_VERSION and upgrade it in Agent::upgrade_stash"
            ))
        }),
        std::cmp::Ordering::Less => {
            let old = json::parse::<serde_json::Value>(text).map_err(AgentError::Serialization)?;
            A::upgrade_stash(from, old)
        }
        std::cmp::Ordering::Greater => Err(AgentError::escalate(format!(
            "stash_version: the stored stash is version {from}, newer than this code's version {to}: \
             deploy the newer code, or add a downgrade"
        ))),
    }
}

pub(crate) async fn write(
    raw: &mut RawCtx,
    step: &str,
    stash_json: String,
    version: u32,
) -> Result<(), AgentError> {
    let shared = raw.shared.clone();
    let run_id = raw.cell.run_id.clone();
    let stash_json = shared.redact(stash_json);
    let max = shared.config.stash_bytes_max;
    if stash_json.len() > max {
        return Err(AgentError::StashTooLarge { bytes: stash_json.len(), max });
    }
    tables::check_id("step", step).map_err(AgentError::fail)?;
    let record = StashRecord {
        run_id: run_id.clone(),
        attempt: raw.attempt,
        step: step.to_string(),
        seq: shared.next_seq(&raw.cell),
        stash_json,
        written_at_ms: shared.now_ms(),
    };
    let durability = match raw.cell.durability {
        DurabilityMode::Exit => {
            *raw.cell.pending_exit.lock() = Some(Stored { record, version });
            return Ok(());
        }
        DurabilityMode::Sync => Durability::Sync,
        DurabilityMode::Async => Durability::Async,
    };
    let watch = Stopwatch::start();
    let mut batch = Batch::new();
    let stored = Stored { record, version };
    stored.stage(&mut batch)?;
    let record = stored.record;
    shared.commit_boundary(&raw.cell, batch, durability).await?;
    shared.metrics.stash_commit.record_us(watch.elapsed_us());
    shared.event(&run_id, "stashed", format!("step {step}, seq {}", record.seq));
    crate::eviction::idle::boundary(raw, &format!("after_stash:{step}")).await;
    Ok(())
}
