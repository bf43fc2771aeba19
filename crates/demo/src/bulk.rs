//! Writing many pending alarms straight into a store, for tests and benchmarks of the
//! scheduler at scale (a million alarms set one by one would measure the API, not the
//! scheduler).

use durafiber_runtime::Timestamp;
use durafiber_store::{
    Batch, Durability, RunId, Store, StoreError,
    tables::{AlarmRecord, keys},
};

/// Writes `count` alarms named `{prefix}-{i}`, spread over `runs` round-robin, due at
/// `first_due + i * step`, in batches of 10,000 alarms.
pub async fn write_pending_alarms(
    store: &Store,
    runs: &[RunId],
    prefix: &str,
    count: usize,
    first_due: Timestamp,
    step: std::time::Duration,
) -> Result<(), StoreError> {
    let mut batch = Batch::new();
    for i in 0..count {
        let run = &runs[i % runs.len().max(1)];
        let name = format!("{prefix}-{i:07}");
        let due = first_due.saturating_add(step.saturating_mul(u32::try_from(i).unwrap_or(u32::MAX)));
        let alarm = AlarmRecord {
            run_id: run.clone(),
            name: name.clone(),
            due_at_ms: due,
            scheduled_at_ms: due,
            payload_json: "null".into(),
            every_ms: None,
            attempts_started: 0,
            generation: 1,
            system: None,
        };
        batch.put(keys::alarm(run, &name), &alarm)?;
        batch.put(keys::alarm_due(due, run, &name), &())?;
        if batch.ops.len() >= 20_000 {
            store.commit(std::mem::take(&mut batch), Durability::Sync).await?;
        }
    }
    store.commit(batch, Durability::Sync).await
}
