//! Recovery never rewinds past the last durable stash and never invents a run id (§3.5).
//!
//! Through the public checker, a 10-step fiber is crashed right after each of its stashes
//! and with each store write lost before its barrier; a new runtime opens the same simulated
//! disk, a repeated start finds the same run, and the run finishes all ten steps. A crash
//! right after the k-th stash was acknowledged resumes from exactly k — never earlier.

use durafiber_demo::agents::{Steps, StepsInput, StepsOutput};
use durafiber_runtime::Boundary;
use durafiber_testkit::check::{AgentCheck, CrashPoint};
use serde_json::Value;

fn done(output: &Value) -> Option<u64> {
    output["done"].as_u64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ten_step_fiber_crashed_at_every_write_resumes_from_the_last_durable_stash() {
    let report = AgentCheck::new(Steps::default())
        .input(&StepsInput { steps: 10, pause_ms: 0 })
        .crash_at_every_boundary()
        // The output lists where each recovery started; what must match is the work done.
        .output_matches(|baseline, case| done(baseline) == Some(10) && done(case) == Some(10))
        .run()
        .await;
    report.assert_ok();
    let stashes: Vec<_> = report
        .cases
        .iter()
        .filter(|c| matches!(c.crash_point, Some(CrashPoint::At(Boundary::AfterStash(_)))))
        .collect();
    assert_eq!(stashes.len(), 10, "a crash after each of the ten stashes");
    for (k, case) in stashes.iter().enumerate() {
        let Some(durafiber_runtime::RunStatus::Completed { output_json }) = &case.final_state else {
            panic!("{}: {:?}", case.name, case.final_state)
        };
        let out: StepsOutput = serde_json::from_str(output_json.as_str()).expect("steps output");
        assert_eq!(
            out.resumed_from.first().copied(),
            Some(k as u32 + 1),
            "{}: resumed from the acknowledged stash",
            case.name
        );
    }
    let lost =
        report.cases.iter().filter(|c| matches!(c.crash_point, Some(CrashPoint::WriteLost(_)))).count();
    // start + registration + 10 stashes + finish.
    assert!(lost >= 13, "only {lost} writes were lost in turn");
}
