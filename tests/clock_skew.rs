//! Nodes whose clocks disagree, on one PostgreSQL database (a private server the test kit
//! starts): a node whose clock runs half an hour ahead stores its runs' wake times on the
//! database's clock, so that when it is killed the node that takes its runs over wakes them
//! on time; a node further off than `max_clock_skew` takes no shard and leaves them all to
//! the others. The nodes are `skewed-node` children, `serve` on a clock set off on purpose.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use durafiber_testkit::postgres::PgServer;
use serde_json::{Value, json};

const HALF_AN_HOUR_MS: i64 = 30 * 60 * 1000;
const NAP_MS: u64 = 3_000;
/// How far two nodes' measures of the database's clock may differ here: far below the half
/// hour a node without them would be off by.
const SPARE_MS: u64 = 5_000;

struct Node {
    child: Child,
    url: String,
    log: tempfile::NamedTempFile,
}

impl Node {
    /// `skewed-node serve` as node `id` of the database at `db`, its clock `offset_ms` off.
    fn start(data: &Path, db: &str, id: &str, offset_ms: i64, config: Option<&Path>) -> Node {
        let log = tempfile::NamedTempFile::new().expect("log file");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_skewed-node"));
        cmd.args(["serve", "--data"]).arg(data).args(["--listen", "127.0.0.1:0"]);
        cmd.args(["--store", db, "--node-id", id, "--lease-ttl", "2s"]);
        if let Some(config) = config {
            cmd.arg("--config").arg(config);
        }
        let mut child = cmd
            .env("CLOCK_OFFSET_MS", offset_ms.to_string())
            .stdout(Stdio::piped())
            .stderr(log.reopen().expect("log"))
            .spawn()
            .expect("spawn skewed-node");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let line = rx.recv_timeout(Duration::from_secs(60)).expect("the node announces its address");
        let addr = line.strip_prefix("listening on ").expect("listening line").to_string();
        Node { child, url: format!("http://{addr}"), log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client(data: &Path) -> reqwest::Client {
    let token = std::fs::read_to_string(data.join("admin.token")).expect("admin.token");
    let mut headers = reqwest::header::HeaderMap::new();
    headers
        .insert(reqwest::header::AUTHORIZATION, format!("Bearer {}", token.trim()).parse().expect("header"));
    headers.insert(reqwest::header::CONTENT_TYPE, "application/json".parse().expect("header"));
    reqwest::Client::builder().default_headers(headers).build().expect("client")
}

async fn get(http: &reqwest::Client, url: String) -> Value {
    http.get(url).send().await.expect("request").json().await.unwrap_or(Value::Null)
}

async fn shards(http: &reqwest::Client, node: &Node) -> u64 {
    get(http, format!("{}/health", node.url)).await["shards"].as_u64().unwrap_or(0)
}

fn epoch_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_half_an_hour_ahead_stores_wakes_on_the_databases_clock_and_its_runs_wake_on_time_elsewhere() {
    let pg = PgServer::start().expect("a PostgreSQL server");
    let db = pg.fresh_database().expect("a database");
    let data = tempfile::tempdir().expect("tempdir");
    // Within a bound of an hour, the skewed node takes its share.
    let config = data.path().join("config.json");
    std::fs::write(&config, json!({"max_clock_skew": "1h"}).to_string()).expect("config");
    let steady = Node::start(data.path(), &db, "steady", 0, Some(&config));
    let mut ahead = Node::start(data.path(), &db, "ahead", HALF_AN_HOUR_MS, Some(&config));
    let http = client(data.path());
    let deadline = Instant::now() + Duration::from_secs(30);
    while shards(&http, &ahead).await == 0 || shards(&http, &steady).await == 0 {
        assert!(Instant::now() < deadline, "the shards never spread:\n{}", ahead.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Naps started through the node that is ahead, until some run there.
    let mut mine = Vec::new();
    for i in 0..40 {
        let started = epoch_ms();
        let req = http.post(format!("{}/runs", ahead.url)).header("Idempotency-Key", format!("nap-{i}"));
        let r = req
            .body(json!({"kind": "nap", "input": {"ms": NAP_MS}}).to_string())
            .send()
            .await
            .expect("start");
        assert_eq!(r.status().as_u16(), 201);
        let id = r.json::<Value>().await.expect("json")["run_id"].as_str().expect("run_id").to_string();
        // Its wake, once stored, is the database's time (this machine's) plus the nap.
        let due = loop {
            let alarms = get(&http, format!("{}/runs/{id}/alarms", ahead.url)).await;
            let due = alarms.as_array().into_iter().flatten().find(|a| a["name"] == json!("sleep:nap"));
            if let Some(due) = due.and_then(|a| a["due_at_ms"].as_u64()) {
                break due;
            }
            assert!(Instant::now() < deadline + Duration::from_secs(30), "run {id} never slept");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        // The offset is measured to within half a heartbeat's round trip: seconds spare.
        assert!(
            due + SPARE_MS >= started + NAP_MS && due <= epoch_ms() + NAP_MS + SPARE_MS,
            "run {id} wakes at {due}, the nap began about {started}: not on the database's clock"
        );
        let shown = get(&http, format!("{}/runs/{id}", ahead.url)).await;
        if shown["node"] == json!("ahead") {
            mine.push((id, due));
        }
        if mine.len() >= 3 {
            break;
        }
    }
    assert!(!mine.is_empty(), "no run landed on the node that is ahead");
    let _ = ahead.child.kill();
    let _ = ahead.child.wait();
    for (id, due) in &mine {
        let deadline = Instant::now() + Duration::from_secs(30);
        let woke = loop {
            let shown = get(&http, format!("{}/runs/{id}", steady.url)).await;
            if let Some(woke) = shown["run"]["status"]["completed"]["output"].as_u64() {
                break woke;
            }
            assert!(Instant::now() < deadline, "run {id} did not wake on time elsewhere: {shown}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(woke + SPARE_MS >= *due, "run {id} woke at {woke}, before its wake at {due}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_clock_is_off_by_more_than_the_bound_takes_no_shard() {
    let pg = PgServer::start().expect("a PostgreSQL server");
    let db = pg.fresh_database().expect("a database");
    let data = tempfile::tempdir().expect("tempdir");
    let steady = Node::start(data.path(), &db, "steady", 0, None);
    let behind = Node::start(data.path(), &db, "behind", -HALF_AN_HOUR_MS, None);
    let http = client(data.path());
    // Once the node that is behind has said why it takes none, the steady one holds every
    // shard, and it none.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !behind.log().contains("max_clock_skew") || shards(&http, &steady).await != 1024 {
        assert!(Instant::now() < deadline, "the steady node never held every shard:\n{}", behind.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(shards(&http, &behind).await, 0, "{}", behind.log());
    assert!(behind.log().contains("max_clock_skew"), "the node says why:\n{}", behind.log());
}
