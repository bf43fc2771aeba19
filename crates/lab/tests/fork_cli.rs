//! `runs history` and `runs fork` through `durafiber serve`: a `steps` run of three stashes
//! lists its three boundaries, a fork from the second goes on from `done = 2` — one step
//! more, not three — says where it came from, and the same key again is the same fork.

use std::process::Command;

use durafiber_testkit::process::{CHILD_DEADLINE, OutputWithin};
use serde_json::{Value, json};

mod common;
use common::{BIN, Served};

fn cli(args: &[&str]) -> Value {
    let out = Command::new(BIN).args(args).output_within(CHILD_DEADLINE).expect("run the command");
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("one JSON answer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_listed_by_its_boundaries_and_forked_from_one_on_the_command_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Served::start(dir.path());
    let run_id = server.start_run("steps", "three", json!({"steps": 3, "pause_ms": 0}), &[]).await;
    server.wait_run(&run_id, "completed", |v| v["run"]["status"].get("completed").is_some()).await;
    let (addr, data) = (server.addr.to_string(), dir.path().to_str().expect("utf-8").to_string());
    let target = ["--server", addr.as_str(), "--data", data.as_str()];

    let mut args = vec!["runs", "history", run_id.as_str()];
    args.extend_from_slice(&target);
    let history = cli(&args);
    let seqs: Vec<u64> =
        history.as_array().expect("a list").iter().filter_map(|h| h["seq"].as_u64()).collect();
    assert_eq!(seqs, [1, 2, 3], "{history}");
    assert_eq!(history[1]["stash"]["done"], json!(2));

    let mut args = vec!["runs", "fork", run_id.as_str(), "--at", "2", "--key", "from-two"];
    args.extend_from_slice(&target);
    let fork = cli(&args);
    assert_eq!(fork["accepted"], json!(true), "{fork}");
    let fork_id = fork["run_id"].as_str().expect("run id").to_string();
    let done =
        server.wait_run(&fork_id, "completed", |v| v["run"]["status"].get("completed").is_some()).await;
    let output = &done["run"]["status"]["completed"]["output"];
    assert_eq!((output["done"].clone(), output["resumed_from"].clone()), (json!(3), json!([2])), "{done}");
    assert_eq!(done["forked_from"]["source_run_id"], json!(run_id));
    assert_eq!(done["forked_from"]["at_seq"], json!(2));
    let again = cli(&args);
    assert_eq!((again["run_id"].clone(), again["accepted"].clone()), (json!(fork_id), json!(false)));
}
