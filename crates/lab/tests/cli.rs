//! The command line against a live server and against a bare data directory: the same
//! answers, one readable error line and a non-zero exit on failure.

use durafiber_testkit::process::{CHILD_DEADLINE, OutputWithin};
use std::process::Command;

use serde_json::Value;

mod common;
use common::{BIN, Served};

fn durafiber(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).output_within(CHILD_DEADLINE).expect("run durafiber");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).expect("JSON output")
}

/// Runs a `bench` command that must succeed and returns its JSON report, the last line,
/// which says how much CPU time the host took meanwhile (Linux tells).
fn bench_report(args: &[&str]) -> Value {
    let (code, stdout, stderr) = durafiber(args);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let report: Value =
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("JSON last line");
    let steal = report["host_steal_pct"].as_f64();
    assert!(steal.is_some_and(|pct| (0.0..=100.0).contains(&pct)), "{report}");
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspection_works_on_a_server_and_on_a_bare_directory() {
    let upstream = durafiber_testkit::upstream::Upstream::start().await.expect("upstream");
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_str().expect("utf-8").to_string();
    let mut server = Served::start(dir.path());
    let addr = server.addr.to_string();
    let body = serde_json::json!({"kind": "refund", "input": {"order_id": "o9", "amount_cents": 9,
        "customer_email": "c@d.e", "upstream": upstream.url(), "api_key": null}});
    let http = server.client();
    let started: Value = http
        .post(server.url("/runs"))
        .header("Idempotency-Key", "o9")
        .body(body.to_string())
        .send()
        .await
        .expect("start")
        .json()
        .await
        .expect("json");
    let run_id = started["run_id"].as_str().expect("id").to_string();

    let pending = loop {
        let (code, out, _) = durafiber(&["approvals", "list", "--server", &addr, "--data", &data]);
        assert_eq!(code, 0);
        let list = json(&out);
        if let Some(p) = list.as_array().and_then(|a| a.first()).cloned() {
            break p;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let (code, out, _) = durafiber(&["runs", "list", "--server", &addr, "--token", &server.token]);
    assert_eq!((code, json(&out)["runs"][0]["run_id"].as_str()), (0, Some(run_id.as_str())));
    let (code, out, _) = durafiber(&["alarms", "list", &run_id, "--server", &addr, "--token", &server.token]);
    assert_eq!(code, 0);
    assert_eq!(json(&out)[0]["name"], "escalate:refund", "the escalation alarm is armed");

    // While the server runs, the directory is its own.
    let (code, _, err) = durafiber(&["runs", "list", "--data", &data]);
    assert_ne!(code, 0);
    assert!(err.contains("in use by a running server"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one readable line");

    assert_eq!(server.sigterm(), Some(0), "SIGTERM stops the server gracefully");

    let (code, out, _) = durafiber(&["runs", "show", &run_id, "--data", &data]);
    assert_eq!(
        (code, json(&out)["run"]["status"]["waiting_approval"]["approval_id"].as_str()),
        (0, Some("refund"))
    );
    let (code, out, _) = durafiber(&["approvals", "list", "--data", &data]);
    assert_eq!((code, json(&out)[0]["payload_hash"].clone()), (0, pending["payload_hash"].clone()));
    let hash = pending["payload_hash"].as_str().expect("hash");
    let (code, _, err) = durafiber(&["approve", &run_id, "refund", "--hash", "abc", "--data", &data]);
    assert_ne!(code, 0);
    assert!(err.starts_with("durafiber: stale approval"), "{err}");
    let (code, out, _) = durafiber(&["approve", &run_id, "refund", "--hash", hash, "--data", &data]);
    assert_eq!((code, json(&out)["recorded"].as_bool()), (0, Some(true)));
    let (code, _, err) = durafiber(&["runs", "show", "run_missing", "--data", &data]);
    assert_ne!(code, 0);
    assert!(err.contains("unknown run id run_missing"), "{err}");

    // The next server picks the decision recorded on the bare directory up by itself.
    let server = Served::start(dir.path());
    let addr = server.addr.to_string();
    let done = loop {
        let (_, out, _) = durafiber(&["runs", "show", &run_id, "--server", &addr, "--data", &data]);
        let run = json(&out);
        if run["run"]["status"].get("completed").is_some() {
            break run;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert_eq!(done["ledger"].as_array().map(Vec::len), Some(2));
    assert_eq!(upstream.objects("refunds").len(), 1);
    let (code, _, _) = durafiber(&["cancel", &run_id, "--server", &addr, "--data", &data]);
    assert_eq!(code, 0, "cancelling a finished run is a no-op answer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_made_used_and_revoked_from_the_command_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_str().expect("utf-8").to_string();
    let mut server = Served::start(dir.path());
    let addr = server.addr.to_string();
    // The admin token is read from DATA/admin.token when --data is given.
    let (code, out, err) = durafiber(&[
        "tokens", "create", "--role", "reader", "--name", "dash", "--server", &addr, "--data", &data,
    ]);
    assert_eq!(code, 0, "{err}");
    let token = json(&out)["token"].as_str().expect("token").to_string();
    let (code, _, err) = durafiber(&["runs", "list", "--server", &addr, "--token", &token]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = durafiber(&["cancel", "run_x", "--server", &addr, "--token", &token]);
    assert_ne!(code, 0);
    assert!(err.contains("is a reader") && err.trim().lines().count() == 1, "{err}");
    let (code, _, err) = durafiber(&["runs", "list", "--server", &addr]);
    assert_ne!(code, 0, "no token, no answer");
    assert!(err.contains("Authorization"), "{err}");
    let (code, out, _) = durafiber(&["tokens", "revoke", "dash", "--server", &addr, "--data", &data]);
    assert_eq!((code, json(&out)["revoked"].as_bool()), (0, Some(true)));
    let (code, _, _) = durafiber(&["runs", "list", "--server", &addr, "--token", &token]);
    assert_ne!(code, 0, "revoked at once");
    assert_eq!(server.sigterm(), Some(0));
    // On the bare directory the same commands work on the store itself.
    let (code, out, _) = durafiber(&["tokens", "list", "--data", &data]);
    let names: Vec<String> = json(&out)
        .as_array()
        .expect("list")
        .iter()
        .map(|t| t["name"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!((code, names), (0, vec!["admin".to_string()]));
    let (code, _, err) = durafiber(&["tokens", "create", "--role", "root", "--name", "x", "--data", &data]);
    assert!(code != 0 && err.contains("unknown role"), "{err}");
}

/// `bench steps` at a small size: it runs every part, the kill lands with steps acknowledged,
/// and no acknowledged step runs again after the restart. `--out` writes each sequential
/// step's time and each gapped raw sync's, with their histograms, across the turns they take.
#[test]
fn bench_steps_kills_with_runs_in_flight_and_reruns_no_acknowledged_step() {
    let out = tempfile::tempdir().expect("tempdir");
    let out_dir = out.path().to_str().expect("utf-8 path");
    let report = bench_report(&[
        "bench",
        "steps",
        "--json",
        "--runs",
        "4",
        "--steps",
        "5",
        "--sequential",
        "50",
        "--kill-runs",
        "10",
        "--out",
        out_dir,
    ]);
    for name in ["step", "raw-gapped-fdatasync"] {
        let csv = std::fs::read_to_string(out.path().join(format!("{name}-samples.csv"))).expect("samples");
        assert_eq!(csv.lines().count(), 1 + 50, "a header and one time per step: {csv}");
        assert!(out.path().join(format!("{name}-histogram.svg")).exists(), "{name}");
    }
    assert_eq!(report["steps_rerun"], 0, "{report}");
    assert!(
        report["acked_before_kill"].as_u64().is_some_and(|n| n > 0),
        "the kill came after steps: {report}"
    );
    assert!(report["restart_to_first_step_ms"].as_u64().is_some_and(|ms| ms > 0), "{report}");
    assert!(
        report["steps_per_s"].as_f64().is_some_and(|r| r > 0.0)
            && report["raw_fdatasync_per_s"].as_f64().is_some_and(|r| r > 0.0),
        "{report}"
    );
    // The sequential steps' own baseline: raw syncs as far apart as the steps were (a clock
    // sleep of `--gap-ms 1` lasts at least that), measured in the same run.
    assert!(report["step_gap_p50_ms"].as_f64().is_some_and(|ms| ms >= 1.0), "{report}");
    assert!(report["raw_gapped_fdatasync_p50_ms"].as_f64().is_some_and(|ms| ms >= 0.0), "{report}");
    // 50 steps take two turns of 25 with their raw syncs: a disk that drifts weighs on both.
    assert_eq!(report["sequential_turns"], 2, "{report}");
}

/// `bench idle` at a small size, every waiting fiber parked at once: each approved run goes on
/// once, from its journal, and none is left in memory.
#[test]
fn bench_idle_parks_every_waiting_run_and_the_approved_ones_go_on() {
    let report = bench_report(&[
        "bench",
        "idle",
        "--json",
        "--runs",
        "300",
        "--approve-share",
        "0.1",
        "--waiting-in-memory",
        "0",
    ]);
    assert_eq!(report["still_live"], 0, "every waiting fiber left memory: {report}");
    assert_eq!(report["approved"], 30, "{report}");
    assert_eq!((report["went_on"].clone(), report["completed"].clone()), (30.into(), 30.into()), "{report}");
    assert!(report["parked_bytes_per_run"].as_f64().is_some(), "{report}");
}

/// `bench recover --repeat` recovers every run of the killed store on each fresh copy of it,
/// with the runs' history set as asked, before the kill and after.
#[test]
fn bench_recover_repeated_recovers_every_run_on_each_copy_of_the_killed_store() {
    let report = bench_report(&[
        "bench",
        "recover",
        "--json",
        "--runs",
        "40",
        "--pause-ms",
        "60000",
        "--repeat",
        "2",
        "--history-max",
        "0",
    ]);
    assert_eq!(report["recovered"], 40, "{report}");
    assert_eq!(report["history_max"], 0, "{report}");
    let each = report["all_recovered_ms_each"].as_array().expect("one time per recovery");
    assert_eq!(each.len(), 2, "{report}");
    assert!(each.iter().all(|t| t.as_f64().is_some_and(|ms| ms > 0.0)), "{report}");
    assert!(
        report["all_recovered_ms_best"].as_f64() <= report["all_recovered_ms_median"].as_f64(),
        "{report}"
    );
}

#[test]
fn bench_stash_across_nodes_commits_fenced_boundaries_on_every_node() {
    let pg = durafiber_testkit::postgres::PgServer::start().expect("a PostgreSQL server");
    let url = pg.fresh_database().expect("a database");
    let report = bench_report(&[
        "bench",
        "stash",
        "--json",
        "--nodes",
        "2",
        "--writers",
        "20",
        "--seconds",
        "0.5",
        "--pg-url",
        &url,
    ]);
    let nodes = report["per_node"].as_array().expect("per node");
    assert_eq!(nodes.len(), 2, "{report}");
    let shards: u64 = nodes.iter().filter_map(|n| n["shards"].as_u64()).sum();
    assert_eq!(shards, 1024, "the nodes split the shards: {report}");
    assert!(nodes.iter().all(|n| n["commits"].as_u64().is_some_and(|c| c > 0)), "{report}");
    assert!(report["raw_fdatasync_per_s"].as_f64().is_some_and(|r| r > 0.0), "{report}");
}

/// SIGTERM is the server's from its first moment: sent the instant it says it listens, it
/// still stops the server gracefully (exit 0), never kills the process by the signal.
#[test]
fn a_sigterm_right_after_listening_stops_the_server_cleanly() {
    for attempt in 0..8 {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut server = Served::start(dir.path());
        let code = server.sigterm();
        assert_eq!(code, Some(0), "start {attempt}: ended by the signal, not a clean stop\n{}", server.log());
    }
}

/// Everything the server keeps is its owner's only: the data directory 0700, every file in
/// it (the log, sled's files, the admin token, the witness) and a backup 0600; a data
/// directory others may write to is refused.
#[test]
fn the_data_directory_and_every_file_are_the_owners_only() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let mut server = Served::start(&data);
    let backup = dir.path().join("all.backup");
    let out = std::process::Command::new(common::BIN)
        .args(["backup", "--server", &server.addr.to_string(), "--data"])
        .arg(&data)
        .arg("--out")
        .arg(&backup)
        .output_within(CHILD_DEADLINE)
        .expect("backup");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(server.sigterm(), Some(0));
    let mode = |p: &std::path::Path| std::fs::metadata(p).expect("metadata").permissions().mode() & 0o777;
    assert_eq!(mode(&data), 0o700);
    let mut files = 0;
    let mut folders = vec![data.clone()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("read_dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                assert_eq!(mode(&path), 0o700, "{}", path.display());
                folders.push(path);
            } else {
                assert_eq!(mode(&path), 0o600, "{}", path.display());
                files += 1;
            }
        }
    }
    assert!(files >= 5, "{files} files checked");
    assert_eq!(mode(&backup), 0o600);

    // A data directory others may write to is refused, with the reason.
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).expect("mkdir");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let out = std::process::Command::new(common::BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(&shared)
        .output_within(CHILD_DEADLINE)
        .expect("serve");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("others may write to") && err.contains("chmod 700"), "{err}");
}
