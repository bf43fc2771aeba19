//! Every operational command of a user's own binary (the deploy example's `trip-v1`), on a
//! live server and on its data directory: `start` (the same key, the same run), `storage
//! get|list`, `request`, `pause`/`resume` of a kind, `send-event`, `stream` (following the
//! run to its end), `runs history|fork|delete`, all listed in `--help`.

use durafiber_testkit::process::{CHILD_DEADLINE, OutputWithin};
use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use serde_json::{Value, json};

mod common;
use common::{Served, example::example_bin};

/// `trip-v1 ARGS`: exit code, stdout, stderr.
fn trip(args: &[&str]) -> (i32, String, String) {
    let out =
        Command::new(example_bin("trip-v1")).args(args).output_within(CHILD_DEADLINE).expect("run trip-v1");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// `trip-v1 ARGS` that must succeed; its output as JSON.
fn ok(args: &[&str]) -> Value {
    let (code, stdout, stderr) = trip(args);
    assert_eq!(code, 0, "trip-v1 {args:?}: {stdout}{stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|_| panic!("trip-v1 {args:?} printed no JSON: {stdout}"))
}

/// `args` followed by `target`.
fn with<'a>(args: &[&'a str], target: &[&'a str]) -> Vec<&'a str> {
    args.iter().chain(target).copied().collect()
}

/// Polls `runs show` until the run's state is `state`.
fn wait_state(target: &[&str], run_id: &str, state: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let shown = ok(&with(&["runs", "show", run_id], target));
        let status = &shown["run"]["status"];
        let name = status.as_str().map(str::to_string).or_else(|| status.as_object()?.keys().next().cloned());
        if name.as_deref() == Some(state) {
            return shown;
        }
        assert!(Instant::now() < deadline, "run {run_id} is {status}, not {state}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn help_commands(args: &[&str]) -> Vec<String> {
    let (_, help, _) = trip(args);
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

#[test]
fn every_operational_command_is_in_the_users_binary() {
    let commands = help_commands(&["--help"]);
    for wanted in ["start", "request", "storage", "stream", "pause", "resume", "send-event", "runs"] {
        assert!(commands.iter().any(|c| c == wanted), "no {wanted} in {commands:?}");
    }
    let runs = help_commands(&["runs", "--help"]);
    for wanted in ["list", "show", "history", "fork", "delete"] {
        assert!(runs.iter().any(|c| c == wanted), "no runs {wanted} in {runs:?}");
    }
}

#[test]
fn a_run_is_started_asked_paused_streamed_forked_and_deleted_from_the_command_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let mut server = Served::start_program(&example_bin("trip-v1"), &data, &[], &[]);
    let addr = server.addr.to_string();
    let data_arg = data.to_str().expect("utf-8");
    let live = ["--server", addr.as_str(), "--data", data_arg];
    let input = json!({"trip": "lyon", "wait": "event"}).to_string();

    let started = ok(&with(&["start", "trip", "--key", "cli-1", "--input", &input], &live));
    let run_id = started["run_id"].as_str().expect("run id").to_string();
    let again = ok(&with(&["start", "trip", "--key", "cli-1", "--input", &input], &live));
    assert_eq!((again["run_id"].as_str(), again["accepted"].as_bool()), (Some(run_id.as_str()), Some(false)));
    wait_state(&live, &run_id, "waiting_event");

    let hotel = ok(&with(&["storage", "get", &run_id, "hotel"], &live));
    assert!(hotel.as_str().is_some_and(|h| h.starts_with("htl_")), "{hotel}");
    let listed = ok(&with(&["storage", "list", &run_id], &live));
    assert_eq!(listed["entries"], json!([{"key": "hotel", "value": hotel}]), "{listed}");
    assert_eq!(ok(&with(&["storage", "get", &run_id, "nothing"], &live)), Value::Null);
    let asked = ok(&with(&["request", &run_id], &live));
    assert_eq!(asked["reply"]["hotel"], hotel, "{asked}");

    // The kill switch: a run of a paused kind is held at its start until the kind resumes.
    ok(&with(&["pause", "--kind", "trip", "--reason", "maintenance"], &live));
    let held = ok(&with(&["start", "trip", "--key", "cli-2", "--input", &input], &live));
    let held = held["run_id"].as_str().expect("run id").to_string();
    wait_state(&live, &held, "paused");
    ok(&with(&["resume", "--kind", "trip"], &live));
    wait_state(&live, &held, "waiting_event");

    ok(&with(&["send-event", &run_id, "payment", "--payload", r#"{"paid":true}"#], &live));
    wait_state(&live, &run_id, "completed");
    let (code, stdout, stderr) = trip(&with(&["stream", &run_id], &live));
    assert_eq!(code, 0, "{stderr}");
    let items: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
    let texts: Vec<&Value> = items.iter().map(|i| &i["data"]["text"]).collect();
    assert_eq!(
        texts,
        [&json!("trip:planning"), &json!("payment:waiting"), &json!("trip:booked")],
        "{stdout}"
    );

    let history = ok(&with(&["runs", "history", &run_id], &live));
    let at = history.as_array().and_then(|h| h.first()).and_then(|h| h["seq"].as_u64()).expect("a boundary");
    let forked = ok(&with(&["runs", "fork", &run_id, "--at", &at.to_string(), "--key", "fork-1"], &live));
    let fork = forked["run_id"].as_str().expect("fork id").to_string();
    wait_state(&live, &fork, "waiting_event");
    // Forked at the plan, before the booking: the fork books for itself, under its own key.
    let forks_hotel = ok(&with(&["storage", "get", &fork, "hotel"], &live));
    assert!(
        forks_hotel.as_str().is_some_and(|h| h.starts_with("htl_")) && forks_hotel != hotel,
        "{forks_hotel}"
    );
    ok(&with(&["runs", "delete", &run_id], &live));
    let (code, _, stderr) = trip(&with(&["runs", "show", &run_id], &live));
    assert_ne!(code, 0, "a deleted run is gone");
    assert_eq!(stderr.trim().lines().count(), 1, "one readable line: {stderr}");

    // On the data directory once the server is gone: the same reads.
    server.sigkill();
    let bare = ["--data", data_arg];
    assert_eq!(ok(&with(&["storage", "get", &fork, "hotel"], &bare)), forks_hotel);
    let (code, stdout, _) = trip(&with(&["stream", &fork], &bare));
    assert_eq!((code, stdout.lines().count()), (0, 2), "the fork's durable chunks: {stdout}");
    let (code, _, stderr) = trip(&with(&["request", &fork], &bare));
    assert!(code != 0 && stderr.contains("running server"), "{stderr}");
    assert!(Path::new(data_arg).exists());
}
