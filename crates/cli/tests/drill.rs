//! The drill is the project's main job: it runs here, end to end, with real processes, and
//! must pass all five metrics — on one node, and across three nodes sharing a private
//! PostgreSQL server.

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
fn the_drill_across_three_nodes_on_postgres_passes_and_fences_the_stopped_node() {
    let pg = durafiber_testkit::postgres::PgServer::start().expect("a PostgreSQL server");
    let url = pg.fresh_database().expect("a database");
    let out = tempfile::tempdir().expect("tempdir");
    let result = Command::new(common::BIN)
        .args(["drill", "--json", "--seed", "5", "--nodes", "3", "--pg-url", &url, "--out"])
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
        "zombie_fenced",
        "pass",
    ] {
        assert_eq!(last[metric], true, "{metric}: {stdout}");
    }
    assert_eq!(last["nodes"], 3);
    // Lease 2 s: the killed node's run is taken once its lease runs out, and no later.
    let failover = last["failover_ms"].as_u64().expect("failover_ms");
    assert!(failover <= 4_000, "failover took {failover} ms: {stdout}");
    let scratch = pg.sql(&url, "SELECT count(*) FROM pg_database WHERE datname LIKE 'durafiber_scratch_%'");
    assert_eq!(scratch.expect("sql").trim(), "0", "the scratch database is dropped");
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
