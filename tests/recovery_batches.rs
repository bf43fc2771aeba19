//! Interrupted runs re-activated in batches at start-up (`run/recovery.rs`): more runs than
//! several batches hold, mixed with runs that are finished, are each re-entered exactly once,
//! with one registration each, and finish from where they were; finished runs are left alone.
//! The re-entered runs have no actor until an event needs one, and one that does gets it.

use durafiber_runtime::Timestamp;
use std::{sync::Arc, time::Duration};

use durafiber_demo::agents::{Steps, StepsInput, StepsOutput};
use durafiber_runtime::{RunStatus, Runtime, clock::VirtualClock};
use durafiber_store::tables::keys;
use durafiber_store::{SimBackend, Store, StoreConfig, tables};

const EPOCH_MS: u64 = 1_000_000_000;
/// More than three batches of 256.
const INTERRUPTED: usize = 700;
const FINISHED: usize = 40;

async fn open(sim: &SimBackend, clock: &VirtualClock) -> Runtime {
    let store = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store");
    Runtime::builder(store)
        .virtual_clock(clock.clone())
        .agent(Steps::default())
        .open()
        .await
        .expect("runtime")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_interrupted_runs_are_each_re_entered_once_from_where_they_were() {
    let (sim, clock) = (SimBackend::new(), VirtualClock::new(Timestamp::from_millis(EPOCH_MS)));
    let rt = open(&sim, &clock).await;
    // Each waits an hour, then stashes its one step: interrupted mid-sleep, nothing stashed.
    let waiting = StepsInput { steps: 1, pause_ms: 3_600_000 };
    let mut interrupted = Vec::new();
    for i in 0..INTERRUPTED {
        interrupted.push(rt.start::<Steps>(&format!("wait-{i}"), &waiting).await.expect("start").run_id);
    }
    let mut finished = Vec::new();
    for i in 0..FINISHED {
        finished.push(
            rt.start::<Steps>(&format!("done-{i}"), &StepsInput { steps: 0, pause_ms: 0 })
                .await
                .expect("start")
                .run_id,
        );
    }
    rt.advance(Duration::ZERO).await.expect("advance");
    for run in &finished {
        assert!(matches!(rt.status(run).expect("status"), RunStatus::Completed { .. }), "{run}");
    }
    // The process dies: the disk stops taking writes, and what is in memory is gone.
    sim.crash();
    rt.shutdown().await;
    sim.revive();

    let rt = open(&sim, &clock).await;
    rt.advance(Duration::ZERO).await.expect("advance");
    assert_eq!(rt.metrics().recoveries, INTERRUPTED as u64, "every interrupted run re-entered, once");
    let events = rt.events();
    for run in &interrupted {
        let recovered = events.iter().filter(|e| &e.run_id == run && e.kind == "recovered").count();
        assert_eq!(recovered, 1, "{run} re-entered once");
        let record: tables::RunRecord = rt.store().get(&keys::run(run)).expect("read").expect("run");
        assert_eq!((record.attempt, record.recover_attempts), (2, 1), "{run}: one registration");
    }
    for run in &finished {
        assert!(!events.iter().any(|e| &e.run_id == run), "{run} is finished: left alone");
    }
    // A re-entered run's first inbound event spawns its actor: a message reaches its hook.
    let answered = rt.send_json(&interrupted[0], "null").await.expect_err("steps takes no messages");
    assert!(answered.to_string().contains("takes no messages"), "the hook answered: {answered}");

    rt.advance(Duration::from_secs(3_600)).await.expect("advance");
    for run in &interrupted {
        let out: StepsOutput = match rt.status(run).expect("status") {
            RunStatus::Completed { output_json } => serde_json::from_str(&output_json).expect("output"),
            other => panic!("{run}: {other:?}"),
        };
        assert_eq!((out.done, out.resumed_from), (1, vec![0]), "{run}: resumed once, from nothing stashed");
    }
    assert!(rt.check_liveness().expect("liveness").is_empty());
}
