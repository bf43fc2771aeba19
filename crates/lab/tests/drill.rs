//! The drill is the project's main job: it runs here, end to end, with real processes, and
//! must pass all five metrics — on one node, and across three nodes sharing a private
//! PostgreSQL server.

use durafiber_testkit::process::{CHILD_DEADLINE, OutputWithin};
use std::process::Command;

mod common;

const FIVE_METRICS: [&str; 5] =
    ["same_run_id", "side_effects_once", "state_position", "human_sees_context", "ledger_matches_upstream"];

/// Runs `durafiber drill` with `args`; its JSON line, once every metric named and `pass`
/// hold.
fn drill_passes(args: &[&str], out: &std::path::Path, more_metrics: &[&str]) -> serde_json::Value {
    let result = Command::new(common::BIN)
        .arg("drill")
        .args(args)
        .arg("--out")
        .arg(out)
        .output_within(CHILD_DEADLINE * 3)
        .expect("run the drill");
    let stdout = String::from_utf8_lossy(&result.stdout);
    assert!(result.status.success(), "drill failed:\n{stdout}\n{}", String::from_utf8_lossy(&result.stderr));
    let last: serde_json::Value =
        serde_json::from_str(stdout.lines().last().expect("a last line")).expect("JSON");
    for metric in FIVE_METRICS.iter().chain(more_metrics).chain(&["pass"]) {
        assert_eq!(last[*metric], true, "{metric}: {stdout}");
    }
    last
}

#[test]
fn the_kill_and_resume_drill_passes_all_five_metrics() {
    let out = tempfile::tempdir().expect("tempdir");
    let last = drill_passes(&["--json", "--seed", "3"], out.path(), &[]);
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
    let args = ["--json", "--seed", "5", "--nodes", "3", "--pg-url", &url];
    let last = drill_passes(&args, out.path(), &["zombie_fenced"]);
    assert_eq!(last["nodes"], 3);
    // Lease 2 s: the killed node's run is taken once its lease runs out, and no later.
    let failover = last["failover_ms"].as_u64().expect("failover_ms");
    assert!(failover <= 4_000, "failover took {failover} ms: {last}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("report.json")).expect("report"))
            .expect("JSON");
    assert_eq!(report["zombie_fenced"], true, "the recording carries the nodes' figures");
    let scratch = pg.sql(&url, "SELECT count(*) FROM pg_database WHERE datname LIKE 'durafiber_scratch_%'");
    assert_eq!(scratch.expect("sql").trim(), "0", "the scratch database is dropped");
}

#[test]
fn a_sigkill_at_every_boundary_of_the_refund_leaves_one_refund_upstream() {
    for point in ["after_effect_prepare:refund", "after_effect_call:refund", "after_effect_commit:refund"] {
        let out = tempfile::tempdir().expect("tempdir");
        // Every metric, one refund upstream among them, whichever boundary the kill lands on.
        let last = drill_passes(&["--json", "--stop-at", point], out.path(), &[]);
        assert_eq!(last["side_effects_once"], true, "{point}");
    }
}
