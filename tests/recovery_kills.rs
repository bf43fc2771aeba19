//! A recovery hook that kills the process (§3.6), with real processes: the recovery count is
//! written before the hook runs, so each death is counted, and after five the next process
//! start escalates the run instead of dying a sixth time. A death outside a recovery (the
//! first one, in the fresh fiber) is an interruption and is not counted. On the embedded
//! store and on PostgreSQL.

use std::process::Command;

const EPOCH_MS: u64 = 1_000_000_000;

fn child(location: &str, mode: &str, now_ms: u64) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_hook-child"))
        .arg(location)
        .arg(mode)
        .arg(now_ms.to_string())
        .output()
        .expect("run hook-child")
}

#[test]
fn a_hook_that_kills_the_process_is_escalated_after_five_deaths() {
    let dir = tempfile::tempdir().expect("tempdir");
    escalated_after_five_deaths(dir.path().to_str().expect("utf-8 path"));
}

#[test]
fn a_hook_that_kills_the_process_is_escalated_after_five_deaths_on_postgres() {
    let server = durafiber_testkit::postgres::PgServer::start().expect("a PostgreSQL server");
    escalated_after_five_deaths(&server.fresh_database().expect("a database"));
}

fn escalated_after_five_deaths(location: &str) {
    let out = child(location, "start", EPOCH_MS);
    assert!(!out.status.success(), "the first process dies in its fiber");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("stashed"), "{said}");
    // An hour apart, so every recovery backoff has passed when the next process opens.
    for death in 1..=5 {
        let out = child(location, "recover", EPOCH_MS + death * 3_600_000);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "death {death}: the hook should have killed the process: {stdout}");
    }
    let out = child(location, "recover", EPOCH_MS + 6 * 3_600_000);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.trim(), "ended escalated interrupted 5 times without progress");
}
