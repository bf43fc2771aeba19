//! The drill is the project's main job: it runs here, end to end, with real processes, and
//! must pass all five metrics.

use std::process::Command;

mod common;

#[test]
fn the_kill_and_resume_drill_passes_all_five_metrics() {
    let out = tempfile::tempdir().expect("tempdir");
    let result = Command::new(common::BIN)
        .args(["drill", "--json", "--seed", "3", "--out"])
        .arg(out.path())
        .output()
        .expect("run the drill");
    let stdout = String::from_utf8_lossy(&result.stdout);
    assert!(result.status.success(), "drill failed:\n{stdout}\n{}", String::from_utf8_lossy(&result.stderr));
    let last: serde_json::Value =
        serde_json::from_str(stdout.lines().last().expect("a last line")).expect("JSON");
    for metric in [
        "same_run_id",
        "side_effects_once",
        "state_position",
        "human_sees_context",
        "ledger_matches_upstream",
        "pass",
    ] {
        assert_eq!(last[metric], true, "{metric}: {stdout}");
    }
    assert_eq!(last["seed"], 3);
    for file in ["server-1.log", "server-2.log", "server-3.log", "report.json"] {
        assert!(out.path().join(file).exists(), "the recording has {file}");
    }
}

#[test]
fn a_sigkill_at_every_boundary_of_the_refund_leaves_one_refund_upstream() {
    for point in ["after_effect_prepare:refund", "after_effect_call:refund", "after_effect_commit:refund"] {
        let out = tempfile::tempdir().expect("tempdir");
        let result = Command::new(common::BIN)
            .args(["drill", "--json", "--stop-at", point, "--out"])
            .arg(out.path())
            .output()
            .expect("run the drill");
        let stdout = String::from_utf8_lossy(&result.stdout);
        assert!(result.status.success(), "{point}:\n{stdout}\n{}", String::from_utf8_lossy(&result.stderr));
        let last: serde_json::Value =
            serde_json::from_str(stdout.lines().last().expect("a line")).expect("JSON");
        assert_eq!(last["side_effects_once"], true, "{point}");
        assert_eq!(last["ledger_matches_upstream"], true, "{point}");
        assert_eq!(last["pass"], true, "{point}: {stdout}");
    }
}
