//! Who is idle since when (§7.2–§7.3): each live run's activity, keep-alive guards and
//! fiber state, indexed by deadline, so the driver's tick decides which runs hibernate or are
//! evicted and touches only the due ones. The decisions are carried out by `eviction/`.
//!
//! A live run is *held* while a keep-alive guard exists (a running fiber holds one by itself
//! unless `fiber_keep_alive` is off, and lets it go while it waits for a human). A held run
//! counts a heartbeat as activity every `keep_alive_heartbeat`. An unheld run is
//! *hibernateable* when no fiber is in memory: idle for `hibernate_after`, it hibernates.
//! An unheld run whose fiber waits on a durable wait (an approval, a sleep, an event) is
//! *parkable*: idle for `hibernate_after`, it is parked — its fiber dropped, as its wait's
//! end re-enters it from the journal anyway. Otherwise, idle for `evict_after` (drawn anew
//! per idle period), it is evicted.

use durafiber_api::Timestamp;
use durafiber_store::RunId;
use durafiber_store::lock::{Mutex, MutexGuard};
use std::{
    collections::BTreeMap,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use super::by_run_id::{ByRunId, HasRunId};
use crate::{config::RuntimeConfig, metrics::Metrics, rng::SeededRng};

#[derive(Debug, Clone)]
struct LiveState {
    /// The run's id, shared by its entries in both maps: a deadline changes at every start
    /// and wait of a fiber, and a fresh string for each was a tenth of a recovery's
    /// bookkeeping.
    id: Arc<str>,
    last_activity: Timestamp,
    evict_after: Duration,
    guards: u32,
    fiber_active: bool,
    fiber_keep_alive: bool,
    fiber_waiting: bool,
    held_since: Option<Timestamp>,
    /// An action was decided and is in progress.
    closing: bool,
    /// This run's own stream of eviction draws, so one run's draws never depend on the
    /// order in which other runs happen to be handled.
    rng: SeededRng,
    /// The deadline under which the run sits in the index, if it does.
    indexed_at: Option<Timestamp>,
    /// Which activation this is: a guard taken in an earlier one releases nothing here.
    epoch: u64,
    /// Counted in `Table::waiting`: parkable and not yet closing.
    counted_waiting: bool,
}

/// Live runs and their deadlines, indexed by time so a tick touches only the due ones.
/// The index orders runs of one deadline by their activation's epoch, which is unique: many
/// runs share a millisecond, and comparing numbers instead of run ids made each move in
/// the index cheaper (a recovery moves every run twice).
#[derive(Default)]
struct Table {
    states: ByRunId<LiveState>,
    by_deadline: BTreeMap<(Timestamp, u64), Arc<str>>,
    /// Fibers waiting on a durable wait in memory, not yet being parked.
    waiting: usize,
}

impl HasRunId for LiveState {
    fn run_id(&self) -> &str {
        &self.id
    }
}

impl LiveState {
    fn held(&self) -> bool {
        self.guards > 0 || (self.fiber_active && self.fiber_keep_alive && !self.fiber_waiting)
    }

    fn parkable(&self) -> bool {
        !self.held() && self.fiber_active && self.fiber_waiting
    }
}

/// What the supervisor does to a run whose deadline has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Action {
    Hibernate,
    Park,
    Evict,
}

pub(crate) struct Liveness {
    runs: Mutex<Table>,
    /// Numbers activations, so guards know which one they were taken in.
    epochs: std::sync::atomic::AtomicU64,
    seed: u64,
    hibernate_after: Duration,
    evict_after: (Duration, Duration),
    heartbeat: Duration,
    /// Past this many fibers waiting in memory, the longest waiting are parked at once.
    waiting_max: usize,
}

impl Liveness {
    pub fn new(config: &RuntimeConfig) -> Self {
        let (lo, hi) = config
            .evict_after_range()
            .unwrap_or((crate::limits::EVICT_AFTER_MIN_DEFAULT, crate::limits::EVICT_AFTER_MAX_DEFAULT));
        Liveness {
            runs: Mutex::new(Table::default()),
            epochs: std::sync::atomic::AtomicU64::new(0),
            seed: config.seed,
            hibernate_after: config.hibernate_after,
            evict_after: (lo, hi),
            heartbeat: config.keep_alive_heartbeat,
            waiting_max: config.waiting_in_memory,
        }
    }

    fn draw(&self, rng: &mut SeededRng) -> Duration {
        let (lo, hi) = self.evict_after;
        Duration::from_millis(rng.between(millis(lo), millis(hi)))
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.runs.lock()
    }

    /// Puts the run back in the deadline index under its current deadline, and counts it
    /// among the waiting fibers if it is one.
    fn reindex(&self, table: &mut Table, id: &str) {
        let Table { states, by_deadline, waiting } = table;
        if let Some(state) = states.get_mut(id) {
            self.place(by_deadline, waiting, state);
        }
    }

    /// [`Liveness::reindex`] for a state in hand.
    fn place(
        &self,
        by_deadline: &mut BTreeMap<(Timestamp, u64), Arc<str>>,
        waiting: &mut usize,
        state: &mut LiveState,
    ) {
        let counted = !state.closing && state.parkable();
        if counted != state.counted_waiting {
            state.counted_waiting = counted;
            *waiting = if counted { *waiting + 1 } else { waiting.saturating_sub(1) };
        }
        let at = (!state.closing).then(|| self.deadline(state));
        if at == state.indexed_at {
            return;
        }
        if let Some(old) = state.indexed_at.take() {
            by_deadline.remove(&(old, state.epoch));
        }
        if let Some(at) = at {
            state.indexed_at = Some(at);
            by_deadline.insert((at, state.epoch), state.id.clone());
        }
    }

    /// Runs `f` on the run's state (if the run is live), then re-evaluates whether it is held.
    fn with<R>(&self, run_id: &RunId, now: Timestamp, f: impl FnOnce(&mut LiveState) -> R) -> Option<R> {
        let mut table = self.lock();
        let out = self.change(&mut table, run_id, now, f);
        self.reindex(&mut table, run_id);
        out
    }

    fn change<R>(
        &self,
        table: &mut Table,
        run_id: &RunId,
        now: Timestamp,
        f: impl FnOnce(&mut LiveState) -> R,
    ) -> Option<R> {
        let state = table.states.get_mut(run_id)?;
        let was_held = state.held();
        let out = f(state);
        match (was_held, state.held()) {
            (false, true) => state.held_since = Some(now),
            (true, false) => {
                // Letting go starts a new idle period and leaves no heartbeat behind.
                state.held_since = None;
                state.last_activity = now;
                state.evict_after = self.draw(&mut state.rng);
            }
            _ => {}
        }
        Some(out)
    }

    /// A run was activated; `stream` names its draw stream (the run's kind, key and time).
    /// `fiber` is the keep-alive of a fiber that starts with the activation, told here
    /// instead of by [`Liveness::fiber_started`]: a recovery tells the tracker of each run
    /// once, in one probe of its table and one place in its index.
    pub fn activated(&self, run_id: &RunId, now: Timestamp, stream: u64, fiber: Option<bool>) {
        let mut rng = SeededRng::new(self.seed ^ stream);
        let evict_after = self.draw(&mut rng);
        let mut guard = self.lock();
        // Numbered under the lock, as the table sees activations in the order of their epochs.
        let epoch = self.epochs.fetch_add(1, Ordering::Relaxed) + 1;
        let Table { states, by_deadline, waiting } = &mut *guard;
        let state = states.replace_with(run_id, |old| {
            let id: Arc<str> = match old {
                Some(old) => {
                    if let Some(at) = old.indexed_at {
                        by_deadline.remove(&(at, old.epoch));
                    }
                    if old.counted_waiting {
                        *waiting = waiting.saturating_sub(1);
                    }
                    old.id.clone()
                }
                None => Arc::from(run_id.as_str()),
            };
            LiveState {
                id,
                last_activity: now,
                evict_after,
                guards: 0,
                fiber_active: fiber.is_some(),
                fiber_keep_alive: fiber.unwrap_or(true),
                fiber_waiting: false,
                held_since: None,
                closing: false,
                rng,
                indexed_at: None,
                epoch,
                counted_waiting: false,
            }
        });
        // As `change` marks a run that a fiber's start makes held.
        if state.held() {
            state.held_since = Some(now);
        }
        self.place(by_deadline, waiting, state);
    }

    /// An inbound event was handled: a new idle period starts.
    pub fn activity(&self, run_id: &RunId, now: Timestamp) {
        self.with(run_id, now, |s| {
            s.last_activity = now;
            s.evict_after = self.draw(&mut s.rng);
        });
    }

    pub fn fiber_started(&self, run_id: &RunId, keep_alive: bool, now: Timestamp) {
        self.with(run_id, now, |s| {
            s.fiber_active = true;
            s.fiber_keep_alive = keep_alive;
            s.fiber_waiting = false;
        });
    }

    pub fn fiber_ended(&self, run_id: &RunId, now: Timestamp) {
        self.with(run_id, now, |s| {
            s.fiber_active = false;
            s.fiber_waiting = false;
            s.last_activity = s.last_activity.max(now);
        });
    }

    /// The run's fiber starts or stops waiting on a durable wait. True when more fibers wait
    /// in memory than `waiting_in_memory` allows: the driver should park some now.
    pub fn fiber_waiting(&self, run_id: &RunId, waiting: bool, now: Timestamp) -> bool {
        let mut table = self.lock();
        self.change(&mut table, run_id, now, |s| s.fiber_waiting = waiting);
        self.reindex(&mut table, run_id);
        table.waiting > self.waiting_max
    }

    /// A guard was taken: the activation it was taken in, or `None` when the run is not live.
    pub fn guard_acquired(&self, run_id: &RunId, now: Timestamp) -> Option<u64> {
        self.with(run_id, now, |s| {
            s.guards += 1;
            s.epoch
        })
    }

    /// A guard taken in activation `epoch` was released. A guard that outlived its
    /// activation (the run was evicted and activated again) releases nothing.
    pub fn guard_released(&self, run_id: &RunId, epoch: u64, now: Timestamp) {
        self.with(run_id, now, |s| {
            if s.epoch == epoch {
                s.guards = s.guards.saturating_sub(1);
            }
        });
    }

    pub fn remove(&self, run_id: &RunId) {
        let mut table = self.lock();
        if let Some(state) = table.states.remove(run_id) {
            if let Some(at) = state.indexed_at {
                table.by_deadline.remove(&(at, state.epoch));
            }
            if state.counted_waiting {
                table.waiting = table.waiting.saturating_sub(1);
            }
        }
    }

    pub fn is_hibernateable(&self, run_id: &RunId) -> bool {
        self.lock().states.get(run_id).is_some_and(|s| !s.held() && !s.fiber_active)
    }

    /// Whether the run's fiber waits on a durable wait with nothing holding the run.
    pub fn is_parkable(&self, run_id: &RunId) -> bool {
        self.lock().states.get(run_id).is_some_and(LiveState::parkable)
    }

    fn deadline(&self, s: &LiveState) -> Timestamp {
        if let Some(since) = s.held_since {
            let heartbeat = millis(self.heartbeat).max(1);
            let beats = millis(s.last_activity.saturating_since(since)) / heartbeat + 1;
            since.saturating_add(Duration::from_millis(beats.saturating_mul(heartbeat)))
        } else if !s.fiber_active || s.fiber_waiting {
            s.last_activity.saturating_add(self.hibernate_after)
        } else {
            s.last_activity.saturating_add(s.evict_after)
        }
    }

    pub fn next_deadline(&self) -> Option<Timestamp> {
        let table = self.lock();
        if table.waiting > self.waiting_max {
            return Some(Timestamp::ZERO);
        }
        table.by_deadline.first_key_value().map(|((at, _), _)| *at)
    }

    /// Counts due heartbeats (returned as `heartbeats`) and returns the runs to hibernate or
    /// evict, marking them closing.
    pub fn due_actions(
        &self,
        now: Timestamp,
        metrics: &Metrics,
        heartbeats: &mut Vec<RunId>,
    ) -> Vec<(RunId, Action)> {
        let mut table = self.lock();
        let mut out = Vec::new();
        let due: Vec<Arc<str>> = table
            .by_deadline
            .iter()
            .take_while(|((at, _), _)| *at <= now)
            .map(|(_, id)| id.clone())
            .collect();
        for run_id in due {
            let Some(s) = table.states.get_mut(&run_id) else { continue };
            if s.held_since.is_some() {
                s.last_activity = now;
                Metrics::bump(&metrics.heartbeats);
                heartbeats.push(RunId::from(&*run_id));
            } else {
                s.closing = true;
                let action = match (s.fiber_active, s.fiber_waiting) {
                    (false, _) => Action::Hibernate,
                    (true, true) => Action::Park,
                    (true, false) => Action::Evict,
                };
                out.push((RunId::from(&*run_id), action));
            }
            self.reindex(&mut table, &run_id);
        }
        self.park_the_excess(&mut table, &mut out);
        out.sort();
        out
    }

    /// Past `waiting_max` fibers waiting in memory, the ones that would be parked soonest
    /// are parked now: a burst of runs that all wait costs memory for at most that many.
    fn park_the_excess(&self, table: &mut Table, out: &mut Vec<(RunId, Action)>) {
        let excess = table.waiting.saturating_sub(self.waiting_max);
        if excess == 0 {
            return;
        }
        let picked: Vec<Arc<str>> = table
            .by_deadline
            .values()
            .filter(|id| table.states.get(id).is_some_and(|s| s.counted_waiting))
            .take(excess)
            .cloned()
            .collect();
        for run_id in picked {
            if let Some(s) = table.states.get_mut(&run_id) {
                s.closing = true;
                out.push((RunId::from(&*run_id), Action::Park));
            }
            self.reindex(table, &run_id);
        }
    }

    pub fn reopen(&self, run_id: &RunId) {
        let mut table = self.lock();
        if let Some(s) = table.states.get_mut(run_id) {
            s.closing = false;
        }
        self.reindex(&mut table, run_id);
    }
}

/// Whole milliseconds of `d`, the unit eviction draws are made in.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
