//! The operator commands end to end: `store verify` on the drill's store reports no bad
//! record; `backup --server` copies a serving store consistently while runs keep starting;
//! `restore` brings it back into a new directory that verifies; a directory that does not
//! exist is an error and is not created.

use durafiber_testkit::process::{CHILD_DEADLINE, OutputWithin};
use std::process::Command;

mod common;

fn durafiber(args: &[&str]) -> (bool, String) {
    let out = Command::new(common::BIN).args(args).output_within(CHILD_DEADLINE).expect("run durafiber");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_backup_restore_and_a_typo_in_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let drill = dir.path().join("drill");
    let (ok, text) = durafiber(&["drill", "--out", drill.to_str().expect("path")]);
    assert!(ok, "{text}");
    let data = drill.join("data");
    let (ok, text) = durafiber(&["store", "verify", "--json", "--data", data.to_str().expect("path")]);
    assert!(ok, "{text}");
    let report: serde_json::Value = serde_json::from_str(text.trim()).expect("JSON");
    assert_eq!(report["bad_records"], 0, "{report}");
    assert_eq!(report["records"]["runs"], 1, "{report}");

    let typo = dir.path().join("dat");
    let (ok, text) = durafiber(&["runs", "list", "--data", typo.to_str().expect("path")]);
    assert!(!ok && text.contains("not a durafiber data directory"), "{text}");
    assert!(!typo.exists(), "an inspection created {}", typo.display());

    // Online: a backup while the server takes new runs.
    let live = dir.path().join("live");
    let served = common::Served::start(&live);
    let http = served.client();
    let start = |i: u32| {
        http.post(served.url("/runs"))
            .header("Idempotency-Key", format!("b{i}"))
            .json(&serde_json::json!({"kind": "steps", "input": {"steps": 20, "pause_ms": 1}}))
            .send()
    };
    for i in 0..20 {
        assert!(start(i).await.expect("start").status().is_success());
    }
    let file = dir.path().join("live.backup");
    let addr = served.addr.to_string();
    let (ok, text) = durafiber(&[
        "backup",
        "--server",
        &addr,
        "--token",
        &served.token,
        "--out",
        file.to_str().expect("path"),
    ]);
    assert!(ok, "{text}");
    for i in 20..30 {
        assert!(start(i).await.expect("start").status().is_success());
    }
    drop(served);
    let restored = dir.path().join("restored");
    let (ok, text) =
        durafiber(&["restore", file.to_str().expect("path"), "--data", restored.to_str().expect("path")]);
    assert!(ok, "{text}");
    let (ok, text) = durafiber(&["store", "verify", "--json", "--data", restored.to_str().expect("path")]);
    assert!(ok, "{text}");
    let report: serde_json::Value = serde_json::from_str(text.trim()).expect("JSON");
    let runs = report["records"]["runs"].as_u64().expect("runs");
    assert!((20..30).contains(&runs), "the backup holds the runs started before it: {report}");
    assert_eq!(report["records"]["run_keys"].as_u64(), Some(runs), "every run with its key: {report}");
    let (ok, text) =
        durafiber(&["restore", file.to_str().expect("path"), "--data", restored.to_str().expect("path")]);
    assert!(!ok && text.contains("already holds a store"), "{text}");
}

/// `store salvage --json` of `data` into `out`: its report.
fn salvage(data: &std::path::Path, out: &std::path::Path) -> serde_json::Value {
    let (ok, text) = durafiber(&[
        "store",
        "salvage",
        "--json",
        "--data",
        data.to_str().expect("path"),
        "--out",
        out.to_str().expect("path"),
    ]);
    assert!(ok, "{text}");
    serde_json::from_str(text.lines().find(|l| l.starts_with('{')).expect("a report")).expect("JSON")
}

/// sled cannot open at all, but the write-ahead log holds the runs: `salvage` copies them
/// from the log instead of giving up, and a run it cannot copy is listed as lost — every run
/// the witness knew, whichever part of the store held it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn salvage_reads_the_log_when_sled_will_not_open_and_lists_every_run_it_cannot_copy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let mut served = common::Served::start(&data);
    let http = served.client();
    for i in 0..20 {
        let start = http
            .post(served.url("/runs"))
            .header("Idempotency-Key", format!("s{i}"))
            .json(&serde_json::json!({"kind": "steps", "input": {"steps": 2, "pause_ms": 0}}))
            .send()
            .await
            .expect("start");
        assert!(start.status().is_success());
    }
    assert_eq!(served.sigterm(), Some(0), "a clean close writes the witness");
    // sled's file replaced by something it cannot open.
    let db = data.join("sled").join("db");
    std::fs::remove_file(&db).expect("rm db");
    std::fs::create_dir(&db).expect("a folder where sled's file was");

    let out = dir.path().join("out");
    let report = salvage(&data, &out);
    assert_eq!(report["copied"]["runs"], 20, "{report}");
    assert_eq!(report["lost_runs"].as_array().map(Vec::len), Some(0), "{report}");
    let (ok, text) = durafiber(&["store", "verify", "--data", out.to_str().expect("path")]);
    assert!(ok, "{text}");

    // The log gone too: nothing can be copied, and every run the witness knew is named.
    std::fs::write(data.join("durafiber.wal"), vec![0u8; 1 << 20]).expect("zero the log");
    let out = dir.path().join("out-2");
    let report = salvage(&data, &out);
    assert_eq!(report["lost_runs"].as_array().map(Vec::len), Some(20), "{report}");
}
