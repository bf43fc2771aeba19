//! Recovery never rewinds past the last durable stash and never invents a run id (§3.5).
//!
//! On the crash-simulating store, a 10-step fiber is crashed after every write — once right
//! after the write is applied (before its barrier: the write is lost) and once right after
//! its barrier (the write is kept, the acknowledgement is not). Each time a new runtime opens
//! the same simulated disk and must finish the run under its original id, resuming from the
//! last durable stash: never earlier than a stash that was acknowledged.

use std::sync::Arc;

use durafiber_runtime::{ListFilter, RunStatus, Runtime};
use durafiber_store::{CrashPoint, SimBackend, Store, StoreConfig, tables};
use durafiber_testkit::agents::{AckLog, Steps, StepsInput, StepsOutput, StepsStash};

async fn open(sim: &SimBackend, acks: &AckLog) -> Runtime {
    let store = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store");
    Runtime::builder(store)
        .agent(Steps { print_acks: false, ack_log: Some(acks.clone()) })
        .open()
        .await
        .expect("runtime")
}

/// Runs one scenario; returns false when the run finished before the crash point was reached.
async fn crash_and_recover(point: CrashPoint) -> bool {
    let sim = SimBackend::new();
    let acks: AckLog = Arc::default();
    let mut crashed = sim.crashed_signal();
    sim.crash_at(point);
    let rt = open(&sim, &acks).await;
    let started = rt.start::<Steps>("ten-steps", &StepsInput { steps: 10, pause_ms: 0 }).await;
    let run_id = match &started {
        Ok(out) => Some(out.run_id.clone()),
        Err(_) => None, // the accept itself crashed: no handle was given out
    };
    if let Some(id) = &run_id {
        tokio::select! {
            status = rt.wait(id) => {
                if matches!(status, Ok(RunStatus::Completed { .. })) && !sim.is_crashed() {
                    rt.shutdown().await;
                    return false;
                }
            }
            _ = crashed.wait_for(|c| *c) => {}
        }
    }
    rt.shutdown().await;
    assert!(sim.is_crashed(), "{point:?}: the store should have crashed");
    sim.revive();
    let durable_done = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default())
        .expect("store")
        .scan::<tables::StashRecord>(tables::STASHES, &[tables::STASHES.prefix], None, 10)
        .expect("scan")
        .first()
        .map(|(_, s)| {
            serde_json::from_str::<StepsStash>(&s.as_ref().expect("stash decodes").stash_json)
                .expect("json")
                .done
        })
        .unwrap_or(0);
    let last_acked = acks.lock().iter().map(|(_, d)| *d).max().unwrap_or(0);

    let rt = open(&sim, &acks).await;
    let existing = rt.list(&ListFilter { limit: 10, ..Default::default() }).expect("list").runs;
    let run_id = match run_id {
        Some(id) => Some(id),
        None => {
            // The caller saw an error, so it retries with the same key: it gets the run the
            // crashed accept may have made durable, or a new one; never two.
            let again =
                rt.start::<Steps>("ten-steps", &StepsInput { steps: 10, pause_ms: 0 }).await.expect("retry");
            assert_eq!(again.accepted, existing.is_empty(), "{point:?}");
            Some(again.run_id)
        }
    };
    let runs = rt.list(&ListFilter { limit: 10, ..Default::default() }).expect("list").runs;
    match run_id {
        None => unreachable!("a handle exists by now"),
        Some(id) => {
            assert_eq!(runs.len(), 1, "{point:?}: exactly one run, never a sibling");
            assert_eq!(runs[0].run_id, id, "{point:?}: the same run id continues");
            assert!(matches!(rt.wait(&id).await.expect("wait"), RunStatus::Completed { .. }), "{point:?}");
            let out: StepsOutput = rt.output(&id).expect("output").expect("completed");
            assert_eq!(out.done, 10);
            if let Some(first) = out.resumed_from.first() {
                assert_eq!(*first, durable_done, "{point:?}: resumed from the last durable stash");
                assert!(
                    *first >= last_acked,
                    "{point:?}: resumed from {first}, but {last_acked} was acknowledged"
                );
            } else {
                // No recovery: crashed before the fiber was registered (it starts fresh), or
                // after its completion was durable (nothing left to do).
                assert!(durable_done == 0 || durable_done == 10, "{point:?}: {durable_done}");
            }
        }
    }
    rt.shutdown().await;
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ten_step_fiber_crashed_at_every_write_resumes_from_the_last_durable_stash() {
    let mut scenarios = 0;
    for n in 1..=40 {
        let before = crash_and_recover(CrashPoint::AfterApply(n)).await;
        let after = crash_and_recover(CrashPoint::AfterBarrier(n)).await;
        if !before && !after {
            break;
        }
        scenarios += 1;
    }
    // start + registration + 10 stashes + finish: at least 13 boundaries were crashed at.
    assert!(scenarios >= 13, "only {scenarios} crash points were reached");
}
