//! The random-kill torture runs in the suite: a real server SIGKILLed 150 times at seeded
//! random times (30% of them while the store opens and the recovery scan runs) while runs
//! keep starting, each order streaming a receipt and joining a child run; every promise is
//! then checked against the independent upstream. Two
//! poison runs, whose recovery hook aborts the process, end escalated; no other run does.

use durafiber_testkit::process::{CHILD_DEADLINE, OutputWithin};
use std::process::Command;

mod common;

#[test]
fn a_server_killed_150_times_loses_nothing_and_duplicates_nothing() {
    let out = tempfile::tempdir().expect("tempdir");
    let result = Command::new(common::BIN)
        .args(["torture", "--json", "--seed", "11", "--kills", "150", "--chaos", "0.1", "--out"])
        .arg(out.path())
        .output_within(CHILD_DEADLINE * 3)
        .expect("run the torture");
    let stdout = String::from_utf8_lossy(&result.stdout);
    let stderr = String::from_utf8_lossy(&result.stderr);
    let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("no JSON last line ({e}):\n{stdout}\n{stderr}"));
    for count in [
        "escalated",
        "duplicate_effects",
        "missing_effects",
        "ledger_mismatches",
        "alarms_lost",
        "storage_mismatches",
        "streams_wrong",
        "children_wrong",
        "events_twice",
        "store_unopenable",
        "panics",
        "stuck",
        "server_exits",
    ] {
        assert_eq!(last[count], 0, "{count}: {stdout}\nrecording kept in {}", out.keep().display());
    }
    assert_eq!(last["kills"], 150);
    assert_eq!(last["ids_per_key_max"], 1, "{stdout}");
    let runs = last["runs"].as_u64().expect("runs");
    assert!(runs >= 100, "only {runs} runs were started");
    assert_eq!(last["poison_runs"], 2, "{stdout}");
    assert_eq!(last["poison_escalated"], 2, "{stdout}");
    assert_eq!(last["completed"].as_u64(), Some(runs - 2), "every order completed: {stdout}");
    assert_eq!(last["pass"], true, "{stdout}");
    assert!(result.status.success());
}
