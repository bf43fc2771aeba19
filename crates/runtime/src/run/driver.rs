//! The driver: the one loop that moves runs on time. Each tick carries out the activity
//! tracker's due decisions (hibernate, evict, heartbeat), re-enters the runs whose wake has
//! come, and starts due alarm deliveries; on the system clock it sleeps until the next
//! deadline, on a virtual clock `Runtime::advance` calls `tick` itself.

use std::sync::{Arc, atomic::Ordering};

use crate::{eviction::idle, kernel::activity::Action, kernel::shared::Shared, run::actor::reactivate};

/// One pass over every deadline due now. Returns the next deadline.
pub(crate) async fn tick(shared: &Arc<Shared>) -> Option<u64> {
    let now = shared.now_ms();
    let mut heartbeats = Vec::new();
    let actions = shared.liveness.due_actions(now, &shared.metrics, &mut heartbeats);
    heartbeats.sort();
    for run_id in heartbeats {
        shared.event(&run_id, "heartbeat", "keep-alive held");
    }
    for (run_id, action) in actions {
        let shared2 = shared.clone();
        shared.spawn_tracked(async move {
            match action {
                Action::Hibernate => idle::hibernate(&shared2, &run_id).await,
                Action::Evict => idle::evict(&shared2, &run_id, "idle without keep-alive").await,
            }
        });
    }
    let due: Vec<String> = {
        let mut wakeups = shared.wakeups.lock();
        let later = wakeups.split_off(&(now + 1, String::new()));
        std::mem::replace(&mut *wakeups, later).into_iter().map(|(_, id)| id).collect()
    };
    for run_id in due {
        reactivate(shared, &run_id).await;
    }
    crate::run::alarm_delivery::start_due(shared);
    next_deadline(shared)
}

pub(crate) fn next_deadline(shared: &Shared) -> Option<u64> {
    let wake = shared.wakeups.lock().first().map(|(at, _)| *at);
    [shared.liveness.next_deadline_ms(), wake, shared.scheduler.next_due_ms()].into_iter().flatten().min()
}

pub(crate) async fn drive_system_clock(shared: Arc<Shared>) {
    loop {
        if shared.shutting_down.load(Ordering::SeqCst) {
            return;
        }
        let next = tick(&shared).await;
        let now = shared.now_ms();
        // Wake at least once a second, so a missed notification costs a second, not forever.
        let at = next.unwrap_or(u64::MAX).min(now + 1_000).max(now + 1);
        tokio::select! {
            () = shared.clock.sleep_until(at) => {}
            () = shared.driver_wake.notified() => {}
        }
    }
}
