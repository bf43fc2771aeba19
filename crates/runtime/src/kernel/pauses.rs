//! What operators have paused — kinds and single runs — held in memory as the store says, so
//! the check on every effect and fiber start reads no disk; and the alarms held meanwhile.

use durafiber_store::RunId;
use std::collections::{BTreeSet, HashMap};

use durafiber_store::{
    Store, StoreError,
    tables::{PauseRecord, keys},
};

#[derive(Debug, Default)]
pub(crate) struct Pauses {
    pub kinds: HashMap<String, PauseRecord>,
    pub runs: HashMap<String, PauseRecord>,
    /// Alarms that fell due for a paused run: `(run_id, due name)`, delivered on resume.
    pub held_alarms: BTreeSet<(RunId, String)>,
}

impl Pauses {
    /// Every pause the store holds.
    pub fn load(store: &Store) -> Result<Pauses, StoreError> {
        let mut pauses = Pauses::default();
        for (table, into) in [(keys::PAUSED_KINDS, &mut pauses.kinds), (keys::PAUSED_RUNS, &mut pauses.runs)]
        {
            for (key, record) in store.scan(&table.all(), None, usize::MAX)? {
                let name = key.first_part().unwrap_or_default().to_string();
                into.insert(name, record?);
            }
        }
        Ok(pauses)
    }

    /// Whether nothing is paused: the check before every effect stops here.
    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty() && self.runs.is_empty()
    }

    /// Why a run of `kind` is held, if it is: the run's own pause, else its kind's.
    pub fn reason(&self, kind: &str, run_id: &RunId) -> Option<String> {
        self.runs.get(run_id.as_str()).or_else(|| self.kinds.get(kind)).map(|p| p.reason.clone())
    }
}
