//! What operators have paused — kinds and single runs — held in memory as the store says, so
//! the check on every effect and fiber start reads no disk; and the alarms held meanwhile.

use std::collections::{BTreeSet, HashMap};

use durafiber_store::{
    Store, StoreError,
    tables::{self, PauseRecord},
};

#[derive(Debug, Default)]
pub(crate) struct Pauses {
    pub kinds: HashMap<String, PauseRecord>,
    pub runs: HashMap<String, PauseRecord>,
    /// Alarms that fell due for a paused run: `(run_id, due name)`, delivered on resume.
    pub held_alarms: BTreeSet<(String, String)>,
}

impl Pauses {
    /// Every pause the store holds.
    pub fn load(store: &Store) -> Result<Pauses, StoreError> {
        let mut pauses = Pauses::default();
        for (table, into) in
            [(tables::PAUSED_KINDS, &mut pauses.kinds), (tables::PAUSED_RUNS, &mut pauses.runs)]
        {
            for (key, record) in store.scan::<PauseRecord>(table, &[table.prefix], None, usize::MAX)? {
                let name = String::from_utf8_lossy(key.get(1..).unwrap_or_default()).into_owned();
                into.insert(name, record?);
            }
        }
        Ok(pauses)
    }

    /// Why a run of `kind` is held, if it is: the run's own pause, else its kind's.
    pub fn reason(&self, kind: &str, run_id: &str) -> Option<String> {
        self.runs.get(run_id).or_else(|| self.kinds.get(kind)).map(|p| p.reason.clone())
    }
}
