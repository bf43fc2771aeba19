//! A recovery hook that kills the process (§3.6), with real processes and three healthy runs
//! beside it: the first death makes every run whose hook was in flight a suspect; a suspect
//! is then recovered alone, its lone recovery counted before the hook runs, so the poisoned
//! hook's deaths are counted against it alone, and after five the next process start
//! escalates it instead of dying again. The healthy runs are never escalated. A death outside
//! a recovery (the first one, in the fresh fibers) is an interruption and is not counted. On
//! the embedded store and on PostgreSQL.

use durafiber_testkit::process::{CHILD_DEADLINE, OutputWithin};
use std::process::Command;

const EPOCH_MS: u64 = 1_000_000_000;

fn child(location: &str, mode: &str, now_ms: u64) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_hook-child"))
        .arg(location)
        .arg(mode)
        .arg(now_ms.to_string())
        .output_within(CHILD_DEADLINE)
        .expect("run hook-child")
}

#[test]
fn a_hook_that_kills_the_process_is_escalated_after_five_deaths_alone_and_no_bystander_is() {
    let dir = tempfile::tempdir().expect("tempdir");
    escalated_after_five_deaths(dir.path().to_str().expect("utf-8 path"));
}

#[test]
fn a_hook_that_kills_the_process_is_escalated_after_five_deaths_alone_on_postgres() {
    let server = durafiber_testkit::postgres::PgServer::start().expect("a PostgreSQL server");
    escalated_after_five_deaths(&server.fresh_database().expect("a database"));
}

fn escalated_after_five_deaths(location: &str) {
    let out = child(location, "start", EPOCH_MS);
    assert!(!out.status.success(), "the first process dies in its fiber");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("stashed"), "{said}");
    // An hour apart, so every recovery backoff has passed when the next process opens. The
    // first death comes with the hooks of the healthy runs in flight: a suspicion; the five
    // after it, alone.
    for death in 1..=6 {
        let out = child(location, "recover", EPOCH_MS + death * 3_600_000);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "death {death}: the hook should have killed the process: {stdout}");
    }
    let out = child(location, "recover", EPOCH_MS + 7 * 3_600_000);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "ended escalated its recovery hook ended the process 5 times in a row, each time running alone",
            "bystander running",
            "bystander running",
            "bystander running",
        ]
    );
}
