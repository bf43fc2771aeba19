//! What the runtime holds right now, for `/metrics` and the console: runs by state, live and
//! hibernated runs, pending alarms, the store's size and checkpoint lag, the named limits.

use serde::Serialize;

use super::handle::Runtime;
use crate::{error::RuntimeError, limits};
use durafiber_store::tables::keys;

/// What the runtime holds right now, for gauges: read from the store at each call, so its
/// cost grows with the number of runs (a scrape every few seconds, not a hot path).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Gauges {
    /// Runs in each state, by the state's name (`running`, `waiting_approval`, ...).
    pub runs_by_state: std::collections::BTreeMap<&'static str, u64>,
    /// Runs live in this process: in memory, with an actor while one of their events is
    /// handled. The name is older than actors that come and go.
    pub live_actors: u64,
    /// Open runs not live in this process: hibernated, evicted or waiting for a wake.
    pub hibernated_runs: u64,
    /// Alarms not yet delivered, the runtime's own among them.
    pub pending_alarms: u64,
    /// Bytes of the store's files on disk (0 for a store without files of its own).
    pub store_bytes: u64,
    /// How long acknowledged writes have waited in the write-ahead log for their checkpoint
    /// into sled at most; zero when none wait, `None` on PostgreSQL.
    pub checkpoint_lag: Option<std::time::Duration>,
    /// Each named limit's calls waiting and in flight in this process, by name.
    pub limits: std::collections::BTreeMap<String, crate::kernel::limiters::LimitGauge>,
}

/// The store's size and its checkpoint's lag: read without a scan, cheap enough for every
/// page of the console.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct StoreGauges {
    /// Bytes of the store's files on disk (0 for a store without files of its own).
    pub store_bytes: u64,
    /// How long acknowledged writes have waited in the write-ahead log for their checkpoint
    /// into sled at most; zero when none wait, `None` on PostgreSQL.
    pub checkpoint_lag: Option<std::time::Duration>,
}

impl Runtime {
    /// Counts of runs by state, live and hibernated actors, and pending alarms.
    pub fn gauges(&self) -> Result<Gauges, RuntimeError> {
        let store = &self.shared.store;
        let mut gauges = Gauges::default();
        let mut after = None;
        loop {
            let page = store.scan(&keys::RUNS.all(), after.as_ref(), limits::LIST_PAGE_MAX)?;
            let exhausted = page.len() < limits::LIST_PAGE_MAX;
            for (key, run) in page {
                after = Some(key);
                if let Ok(run) = run {
                    *gauges.runs_by_state.entry(run.status.name()).or_default() += 1;
                }
            }
            if exhausted {
                break;
            }
        }
        let open = store.keys_and_sizes(&keys::OPEN_RUNS.all(), usize::MAX)?.len() as u64;
        gauges.live_actors = self.shared.registry.len() as u64;
        gauges.hibernated_runs = open.saturating_sub(gauges.live_actors);
        gauges.pending_alarms = store.keys_and_sizes(&keys::ALARMS.all(), usize::MAX)?.len() as u64;
        let StoreGauges { store_bytes, checkpoint_lag } = self.store_gauges();
        gauges.store_bytes = store_bytes;
        gauges.checkpoint_lag = checkpoint_lag;
        gauges.limits = self.shared.controls.limiters.gauges();
        Ok(gauges)
    }

    /// The store's size on disk and how far its checkpoint lags.
    pub fn store_gauges(&self) -> StoreGauges {
        let backend = self.shared.store.backend();
        StoreGauges { store_bytes: backend.disk_bytes(), checkpoint_lag: backend.checkpoint_lag() }
    }
}
