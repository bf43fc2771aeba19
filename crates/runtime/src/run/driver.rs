//! The driver: the one loop that moves runs on time. Each tick carries out the activity
//! tracker's due decisions (hibernate, park, evict, heartbeat), re-enters the runs whose wake has
//! come, and starts due alarm deliveries; on the system clock it sleeps until the next
//! deadline, on a virtual clock `Runtime::advance` calls `tick` itself.

use durafiber_api::Timestamp;
use durafiber_store::RunId;
use std::{
    sync::{Arc, Weak, atomic::Ordering},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use durafiber_store::lock::{Condvar, Mutex};

use crate::{eviction::idle, kernel::activity::Action, kernel::shared::Shared, run::actor::reactivate};

/// One pass over every deadline due now. Returns the next deadline.
pub(crate) async fn tick(shared: &Arc<Shared>) -> Option<Timestamp> {
    let now = shared.now();
    let mut heartbeats = Vec::new();
    let actions = shared.liveness.due_actions(now, &shared.obs.metrics, &mut heartbeats);
    heartbeats.sort();
    for run_id in heartbeats {
        shared.event(&run_id, "heartbeat", "keep-alive held");
    }
    for (run_id, action) in actions {
        let shared2 = shared.clone();
        shared.life.spawn_tracked(async move {
            match action {
                Action::Hibernate => idle::hibernate(&shared2, &run_id).await,
                Action::Park => idle::park(&shared2, &run_id).await,
                Action::Evict => idle::evict(&shared2, &run_id, "idle without keep-alive").await,
            }
        });
    }
    let due: Vec<RunId> = {
        let mut wakeups = shared.timers.wakeups.lock();
        let later =
            wakeups.split_off(&(now.saturating_add(Duration::from_millis(1)), RunId::new(String::new())));
        std::mem::replace(&mut *wakeups, later).into_iter().map(|(_, id)| id).collect()
    };
    for run_id in due {
        reactivate(shared, &run_id).await;
    }
    crate::run::alarm_delivery::start_due(shared);
    crate::retention::start_due(shared);
    next_deadline(shared)
}

pub(crate) fn next_deadline(shared: &Shared) -> Option<Timestamp> {
    let wake = shared.timers.wakeups.lock().first().map(|(at, _)| *at);
    let sweep = Some(shared.timers.retention_due_ms.load(Ordering::SeqCst))
        .filter(|at| *at != u64::MAX)
        .map(Timestamp::from_millis);
    [shared.liveness.next_deadline(), wake, shared.timers.scheduler.next_due(), sweep]
        .into_iter()
        .flatten()
        .min()
}

pub(crate) async fn drive_system_clock(shared: Arc<Shared>) {
    // Ends with this task, aborted or returned.
    let alarm_clock = match AlarmClock::start(&shared) {
        Ok(clock) => Some(clock),
        Err(e) => {
            tracing::warn!(error = %e, "no thread for the driver's clock; waking on tokio's timer alone");
            None
        }
    };
    loop {
        if shared.life.shutting_down.load(Ordering::SeqCst) {
            return;
        }
        let next = tick(&shared).await;
        let now = shared.now();
        // Wake at least once a second, so a missed notification costs a second, not forever.
        let at = next
            .unwrap_or(Timestamp::MAX)
            .min(now.saturating_add(Duration::from_secs(1)))
            .max(now.saturating_add(Duration::from_millis(1)));
        if let Some(clock) = &alarm_clock {
            clock.wake_at(shared.time.to_local(at));
        }
        tokio::select! {
            () = shared.time.clock.sleep_until(at) => {}
            () = shared.timers.driver_wake.notified() => {}
        }
    }
}

/// Wakes the driver at its deadline from a thread of its own, within a few microseconds.
/// tokio's timers round a deadline up to the next millisecond and fire when a worker gets
/// round to them: on a busy runtime an alarm's pick-up came milliseconds late
/// (`bench alarms`). The tokio sleep stays beside it as a fallback.
struct AlarmClock {
    state: Arc<(Mutex<Deadline>, Condvar)>,
}

#[derive(Default)]
struct Deadline {
    /// The system clock's millisecond to wake the driver at.
    at: Option<Timestamp>,
    stop: bool,
}

impl AlarmClock {
    fn start(shared: &Arc<Shared>) -> std::io::Result<AlarmClock> {
        let state = Arc::new((Mutex::new(Deadline::default()), Condvar::new()));
        let (thread_state, driver) = (state.clone(), Arc::downgrade(shared));
        std::thread::Builder::new()
            .name("durafiber-clock".into())
            .spawn(move || AlarmClock::run(&thread_state, &driver))?;
        Ok(AlarmClock { state })
    }

    fn wake_at(&self, at: Timestamp) {
        let (lock, changed) = &*self.state;
        lock.lock().at = Some(at);
        changed.notify_one();
    }

    fn run(state: &(Mutex<Deadline>, Condvar), driver: &Weak<Shared>) {
        let (lock, changed) = state;
        let mut deadline = lock.lock();
        while !deadline.stop {
            let Some(at) = deadline.at else {
                deadline = changed.wait(deadline);
                continue;
            };
            let left_us = at.as_millis().saturating_mul(1_000).saturating_sub(epoch_us());
            if left_us > 0 {
                deadline = changed.wait_for(deadline, Duration::from_micros(left_us));
                continue;
            }
            deadline.at = None;
            match driver.upgrade() {
                Some(shared) => shared.timers.driver_wake.notify_one(),
                None => return,
            }
        }
    }
}

impl Drop for AlarmClock {
    fn drop(&mut self) {
        let (lock, changed) = &*self.state;
        lock.lock().stop = true;
        changed.notify_one();
    }
}

/// The system clock in microseconds since the epoch (`SystemClock::now`, finer).
fn epoch_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}
