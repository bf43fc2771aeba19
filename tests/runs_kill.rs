//! A real SIGKILL in the middle of 100 runs: every run completes under its original run id
//! after a restart, each recovered from a stash no older than its last acknowledged one.
//!
//! The child (`runs-child`) starts 100 `steps` runs that stash every few milliseconds and
//! prints each acknowledged stash. The parent kills it with SIGKILL mid-flight, then starts
//! it again in `recover` mode on the same directory, without any request from outside.
//! The same test runs on the PostgreSQL backend, in a private server.

use std::{
    collections::{HashMap, HashSet},
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use durafiber_demo::agents::{Steps, StepsOutput};
use durafiber_runtime::{ListFilter, RunStatus, Runtime};
use durafiber_store::{Store, StoreConfig};
use durafiber_testkit::postgres::PgServer;

const RUNS: usize = 100;

fn spawn(location: &str, mode: &[&str]) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_runs-child"))
        .arg(location)
        .args(mode)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn runs-child");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

#[test]
fn one_hundred_runs_killed_mid_flight_all_complete_under_their_ids() {
    let dir = tempfile::tempdir().expect("tempdir");
    killed_mid_flight_all_complete(dir.path().to_str().expect("utf-8 path"));
}

#[test]
fn one_hundred_runs_killed_mid_flight_all_complete_under_their_ids_on_postgres() {
    let server = PgServer::start().expect("a PostgreSQL server");
    killed_mid_flight_all_complete(&server.fresh_database().expect("a database"));
}

fn killed_mid_flight_all_complete(location: &str) {
    let (mut child, lines) = spawn(location, &["start", &RUNS.to_string()]);
    let mut started = HashSet::new();
    let mut last_ack: HashMap<String, u32> = HashMap::new();
    // Kill once every run is started and a good number of stashes were acknowledged.
    let mut acks = 0;
    while started.len() < RUNS || acks < 1_500 {
        let line = lines.recv_timeout(Duration::from_secs(60)).expect("the child keeps working");
        let parts: Vec<&str> = line.split_whitespace().collect();
        match parts.as_slice() {
            ["started", id] => {
                started.insert(id.to_string());
            }
            ["ack", id, done] => {
                last_ack.insert(id.to_string(), done.parse().expect("number"));
                acks += 1;
            }
            ["done", _] => {}
            _ => {}
        }
    }
    let _ = child.kill(); // SIGKILL
    let _ = child.wait();
    for line in lines.try_iter() {
        if let ["ack", id, done] = line.split_whitespace().collect::<Vec<_>>().as_slice() {
            last_ack.insert(id.to_string(), done.parse().expect("number"));
        }
    }

    let (mut child, lines) = spawn(location, &["recover"]);
    let status = child.wait().expect("recovering child exits");
    assert!(status.success(), "the recovering child failed");
    let done: HashSet<String> =
        lines.try_iter().filter_map(|l| l.strip_prefix("done ").map(str::to_string)).collect();
    assert_eq!(done, started, "every run completes, under the id it was started with");

    let rt = tokio::runtime::Runtime::new().expect("tokio");
    rt.block_on(async {
        let store = Store::open_at(location, StoreConfig::default()).expect("open");
        let runtime = Runtime::builder(store).agent(Steps::default()).open().await.expect("runtime");
        let runs = runtime.list(&ListFilter { limit: 1000, ..Default::default() }).expect("list").runs;
        assert_eq!(runs.len(), RUNS, "no run was invented");
        for run in runs {
            assert!(matches!(run.status, RunStatus::Completed { .. }));
            let out: StepsOutput = runtime.output(&run.run_id).expect("output").expect("completed");
            let acked = last_ack.get(run.run_id.as_str()).copied().unwrap_or(0);
            if let Some(first) = out.resumed_from.first() {
                assert!(*first >= acked, "{}: resumed from {first}, {acked} was acknowledged", run.run_id);
            } else {
                assert!(acked == 0 || acked == out.done, "{}: not recovered, yet acked {acked}", run.run_id);
            }
        }
        runtime.shutdown().await;
    });
}
