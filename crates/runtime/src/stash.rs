//! `stash`: the run's typed snapshot, replaced whole, in the run's durability mode (§3.2).
//!
//! Each stash is stored with the agent's `STASH_VERSION` (`kernel/stash_record.rs`), so that
//! code deployed later knows which shape it holds (`Agent::upgrade_stash`).

use durafiber_store::{
    Batch, Durability,
    tables::{self, StashRecord},
};

use serde::de::DeserializeOwned;

use crate::boundary::Boundary;
pub(crate) use crate::kernel::stash_record::{Stored, read};
use crate::{clock::Stopwatch, config::DurabilityMode, error::AgentError, json, kernel::shared::RawCtx};

/// A stored stash as the code's `Stash` (version `code_version`): decoded when its version
/// is the code's, upgraded by `upgrade` when older; escalating, with both versions named,
/// when newer, when there is no upgrade, or when it does not decode as the version it claims.
pub(crate) fn decode_versioned<T: DeserializeOwned>(
    stored: &Stored,
    code_version: u32,
    upgrade: impl FnOnce(u32, serde_json::Value) -> Result<T, AgentError>,
) -> Result<T, AgentError> {
    let (from, to) = (stored.version, code_version);
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
            upgrade(from, old)
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
    let stash_json = shared.obs.redact(stash_json);
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
    let stream_mark = crate::stream::new_mark(raw);
    let durability = match raw.cell.durability {
        DurabilityMode::Exit => {
            // The mark goes with the stash when it is written; the buffer keeps the stored one.
            *raw.cell.pending_exit.lock() = Some(Box::new(Stored { record, version, stream_mark }));
            return Ok(());
        }
        DurabilityMode::Sync => Durability::Sync,
        DurabilityMode::Async => Durability::Async,
    };
    let watch = Stopwatch::start();
    let mut batch = Batch::new();
    let stored = Stored { record, version, stream_mark };
    stored.stage(&mut batch, shared.config.history_max)?;
    let record = stored.record;
    shared.commit_boundary(&raw.cell, batch, durability).await?;
    if let Some(mark) = stream_mark {
        crate::stream::marked(raw, mark);
    }
    shared.obs.metrics.stash_commit.record_us(watch.elapsed_us());
    shared.event(&run_id, "stashed", format!("step {step}, seq {}", record.seq));
    shared.obs.span(|| {
        raw.span_since("stash", record.written_at_ms)
            .attr("durafiber.stash.step", step.to_string())
            .attr("durafiber.stash.seq", i64::try_from(record.seq).unwrap_or(i64::MAX))
            .attr("durafiber.stash.bytes", i64::try_from(record.stash_json.len()).unwrap_or(i64::MAX))
    });
    crate::eviction::idle::boundary(raw, || Boundary::AfterStash(step.to_string())).await;
    Ok(())
}
