//! `stash`: the run's typed snapshot, replaced whole, in the run's durability mode (§3.2).

use durafiber_store::{Batch, Durability, tables};

use crate::{clock::Stopwatch, config::DurabilityMode, error::AgentError, kernel::shared::RawCtx};

pub(crate) async fn write(raw: &mut RawCtx, step: &str, stash_json: String) -> Result<(), AgentError> {
    let shared = raw.shared.clone();
    let run_id = raw.cell.run_id.clone();
    let stash_json = shared.redact(stash_json);
    let max = shared.config.stash_bytes_max;
    if stash_json.len() > max {
        return Err(AgentError::StashTooLarge { bytes: stash_json.len(), max });
    }
    tables::check_id("step", step).map_err(AgentError::fail)?;
    let record = tables::StashRecord {
        run_id: run_id.clone(),
        attempt: raw.attempt,
        step: step.to_string(),
        seq: shared.next_seq(&raw.cell),
        stash_json,
        written_at_ms: shared.now_ms(),
    };
    let durability = match raw.cell.durability {
        DurabilityMode::Exit => {
            *raw.cell.pending_exit.lock() = Some(record);
            return Ok(());
        }
        DurabilityMode::Sync => Durability::Sync,
        DurabilityMode::Async => Durability::Async,
    };
    let watch = Stopwatch::start();
    let mut batch = Batch::new();
    batch.put(tables::STASHES, tables::STASHES.key(&[run_id.as_bytes()]), &record)?;
    shared.commit_boundary(&raw.cell, batch, durability).await?;
    shared.metrics.stash_commit.record_us(watch.elapsed_us());
    shared.event(&run_id, "stashed", format!("step {step}, seq {}", record.seq));
    crate::eviction::idle::boundary(raw, &format!("after_stash:{step}")).await;
    Ok(())
}
