//! An in-memory backend that simulates a crash: on `crash()`, every write after the last
//! completed barrier is lost, and nothing before it. Crash points make a crash happen at an
//! exact write or barrier, so tests can crash a run at every boundary, before and after its
//! barrier, deterministically.

use std::{collections::BTreeMap, sync::Arc};

use crate::{
    backend::Backend,
    backend::Entries,
    batch::Batch,
    batch::Op,
    error::StoreError,
    lock::{Mutex, MutexGuard},
};

/// Where a scheduled crash happens, counted from the moment it is armed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimCrash {
    /// Right after the n-th `apply` (1-based), before any barrier covers it.
    AfterApply(u64),
    /// Right after the n-th completed barrier (1-based).
    AfterBarrier(u64),
}

struct SimState {
    durable: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Batches applied since the last barrier, in order: what a crash loses.
    undurable: Vec<Batch>,
    visible: BTreeMap<Vec<u8>, Vec<u8>>,
    crashed: bool,
    armed: Option<SimCrash>,
    applies: u64,
    barriers: u64,
    quiet_spells: u64,
    crashed_tx: tokio::sync::watch::Sender<bool>,
}

impl Default for SimState {
    fn default() -> Self {
        SimState {
            durable: BTreeMap::new(),
            undurable: Vec::new(),
            visible: BTreeMap::new(),
            crashed: false,
            armed: None,
            applies: 0,
            barriers: 0,
            quiet_spells: 0,
            crashed_tx: tokio::sync::watch::Sender::new(false),
        }
    }
}

/// The crash-simulating backend. Clones share one simulated disk.
#[derive(Clone, Default)]
pub struct SimBackend {
    state: Arc<Mutex<SimState>>,
    /// While set, every barrier hangs, as on a disk that stopped answering.
    stalled: Arc<std::sync::atomic::AtomicBool>,
    /// Whether lone commits write themselves ([`Backend::writes_inline`]); off unless asked.
    inline: Arc<std::sync::atomic::AtomicBool>,
}

impl SimBackend {
    /// An empty simulated disk.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, SimState> {
        // A panic while holding the lock leaves plain maps behind, still consistent.
        self.state.lock()
    }

    fn live(&self) -> Result<MutexGuard<'_, SimState>, StoreError> {
        let s = self.lock();
        if s.crashed { Err(StoreError::Crashed) } else { Ok(s) }
    }

    /// How many times the store's writer said it was quiet ([`Backend::quiet`]).
    pub fn quiet_spells(&self) -> u64 {
        self.lock().quiet_spells
    }

    /// Crashes now: every write no barrier covered is lost; every call fails until `revive`.
    pub fn crash(&self) {
        Self::crash_locked(&mut self.lock());
    }

    fn crash_locked(s: &mut SimState) {
        s.visible = s.durable.clone();
        s.undurable.clear();
        s.crashed = true;
        s.armed = None;
        s.crashed_tx.send_replace(true);
    }

    /// Changes to `true` when the backend crashes, so tests can await it.
    pub fn crashed_signal(&self) -> tokio::sync::watch::Receiver<bool> {
        self.lock().crashed_tx.subscribe()
    }

    /// Boots the "machine" again after a crash, with what was durable.
    pub fn revive(&self) {
        let mut s = self.lock();
        s.crashed = false;
        s.crashed_tx.send_replace(false);
        s.applies = 0;
        s.barriers = 0;
    }

    /// Lets lone `Sync` commits be written on their committers' threads, as a local disk's
    /// are ([`Backend::writes_inline`]).
    pub fn write_inline(&self, inline: bool) {
        self.inline.store(inline, std::sync::atomic::Ordering::SeqCst);
    }

    /// Makes every barrier hang (as on a disk that stopped answering) until unset.
    pub fn stall_barriers(&self, stalled: bool) {
        self.stalled.store(stalled, std::sync::atomic::Ordering::SeqCst);
    }

    /// Arms a crash at `point`, counted from now.
    pub fn crash_at(&self, point: SimCrash) {
        let mut s = self.lock();
        s.applies = 0;
        s.barriers = 0;
        s.armed = Some(point);
    }

    /// Whether a crash has happened and the backend has not been revived.
    pub fn is_crashed(&self) -> bool {
        self.lock().crashed
    }

    /// How many applies and barriers happened since the last arm or revive.
    pub fn counts(&self) -> (u64, u64) {
        let s = self.lock();
        (s.applies, s.barriers)
    }

    /// Number of durable keys, for tests.
    pub fn durable_len(&self) -> usize {
        self.lock().durable.len()
    }

    /// Every durable value, for scanning bytes in tests.
    pub fn durable_bytes(&self) -> Vec<u8> {
        let s = self.lock();
        s.durable.iter().flat_map(|(k, v)| k.iter().chain(v.iter()).copied()).collect()
    }
}

fn apply_to(map: &mut BTreeMap<Vec<u8>, Vec<u8>>, batch: &Batch) {
    for op in &batch.ops {
        match op {
            Op::Put { key, value } => map.insert(key.clone(), value.clone()),
            Op::Delete { key } => map.remove(key),
        };
    }
}

impl Backend for SimBackend {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.live()?.visible.get(key).cloned())
    }

    fn range(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Entries, StoreError> {
        if start >= end {
            return Ok(Vec::new());
        }
        let s = self.live()?;
        Ok(s.visible
            .range(start.to_vec()..end.to_vec())
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn apply(&self, batch: &Batch) -> Result<(), StoreError> {
        let mut s = self.live()?;
        if let Some(key) = batch.first_present(|k| Ok(s.visible.contains_key(k)))? {
            return Err(StoreError::Exists { key: crate::tables::printable(key) });
        }
        apply_to(&mut s.visible, batch);
        s.undurable.push(batch.clone());
        s.applies += 1;
        if let Some(SimCrash::AfterApply(n)) = s.armed
            && s.applies >= n
        {
            Self::crash_locked(&mut s);
        }
        Ok(())
    }

    fn quiet(&self) -> Result<Option<std::time::Duration>, StoreError> {
        self.live()?.quiet_spells += 1;
        Ok(None)
    }

    fn writes_inline(&self) -> bool {
        self.inline.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn barrier(&self) -> Result<(), StoreError> {
        while self.stalled.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let mut s = self.live()?;
        let pending = std::mem::take(&mut s.undurable);
        for batch in &pending {
            apply_to(&mut s.durable, batch);
        }
        s.barriers += 1;
        if let Some(SimCrash::AfterBarrier(n)) = s.armed
            && s.barriers >= n
        {
            Self::crash_locked(&mut s);
            // The barrier itself completed; the caller dies before hearing so.
            return Err(StoreError::Crashed);
        }
        Ok(())
    }
}
