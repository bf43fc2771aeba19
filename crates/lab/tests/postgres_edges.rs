//! Where nodes sharing one PostgreSQL database meet each other: three nodes started at the
//! same instant on a fresh database make one admin token, which works on all of them; a
//! second live process under a node id is refused and changes nothing of the first; a node
//! restarted at once after a SIGKILL gets its id back.

mod common;

use std::{
    ffi::OsStr,
    path::Path,
    process::{Command, Stdio},
    sync::{Arc, Barrier},
    time::{Duration, Instant},
};

use common::{BIN, Served};
use durafiber_testkit::postgres::PgServer;
use serde_json::{Value, json};

const LEASE: &str = "2s";

fn node_args<'a>(url: &'a str, id: &'a str) -> [&'a OsStr; 6] {
    ["--store", url, "--node-id", id, "--lease-ttl", LEASE].map(OsStr::new)
}

fn node(data: &Path, url: &str, id: &str) -> Served {
    Served::start_with(data, &node_args(url, id))
}

async fn json_of(r: reqwest::RequestBuilder) -> (u16, Value) {
    let r = r.send().await.expect("request");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_started_at_once_on_a_fresh_database_make_one_admin_token_that_works_on_all() {
    let pg = PgServer::start().expect("a PostgreSQL server");
    let url = pg.fresh_database().expect("a database");
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().expect("tempdir")).collect();
    let together = Arc::new(Barrier::new(dirs.len()));
    let nodes: Vec<Served> = std::thread::scope(|s| {
        let starting: Vec<_> = dirs
            .iter()
            .enumerate()
            .map(|(i, dir)| {
                let (together, url) = (together.clone(), url.clone());
                s.spawn(move || {
                    together.wait();
                    node(dir.path(), &url, &format!("n{}", i + 1))
                })
            })
            .collect();
        starting.into_iter().map(|t| t.join().expect("a node starts")).collect()
    });
    let logs = || nodes.iter().map(Served::log).collect::<Vec<_>>().join("\n---\n");
    let made: Vec<&Served> = nodes.iter().filter(|n| !n.token.is_empty()).collect();
    assert_eq!(made.len(), 1, "exactly one node writes admin.token:\n{}", logs());
    let token = &made[0].token;
    for n in &nodes {
        let (status, tokens) = json_of(n.client_with(token).get(n.url("/tokens"))).await;
        assert_eq!(status, 200, "the admin token works on {}: {tokens}", n.addr);
        assert_eq!(
            tokens,
            json!([{"name": "admin", "role": "admin", "created_at_ms": tokens[0]["created_at_ms"]}])
        );
        if n.token.is_empty() {
            assert!(
                n.log().contains("made by another node"),
                "the node says where the token is:\n{}",
                n.log()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_live_process_under_a_node_id_is_refused_and_the_first_keeps_its_shards_and_address() {
    let pg = PgServer::start().expect("a PostgreSQL server");
    let url = pg.fresh_database().expect("a database");
    let (first_dir, second_dir) =
        (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    let first = node(first_dir.path(), &url, "n1");
    let started = Instant::now();
    let mut second = Command::new(BIN)
        .args(["serve", "--data"])
        .arg(second_dir.path())
        .args(["--listen", "127.0.0.1:0"])
        .args(node_args(&url, "n1"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the second n1");
    let deadline = Instant::now() + Duration::from_secs(30);
    while second.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = second.kill();
            panic!("a second live n1 was accepted");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let second = second.wait_with_output().expect("its output");
    let stderr = String::from_utf8_lossy(&second.stderr);
    println!("the second n1 gave up after {:?}", started.elapsed());
    assert!(!second.status.success(), "the second n1 must not run:\n{stderr}");
    assert!(stderr.contains("node id \"n1\" is held by a live node at"), "{stderr}");
    let http = first.client();
    let (_, health) = json_of(http.get(first.url("/health"))).await;
    assert_eq!(health["shards"], json!(1024), "{health}");
    let advertised = pg.sql(&url, "SELECT http_addr FROM df_nodes WHERE node_id = 'n1'").expect("sql");
    assert_eq!(advertised.trim(), first.addr.to_string());
    let body = json!({"kind": "steps", "input": {"steps": 2, "pause_ms": 0}});
    let (status, v) = json_of(
        http.post(first.url("/runs")).header("Idempotency-Key", "after-the-refusal").body(body.to_string()),
    )
    .await;
    assert_eq!(status, 201, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_at_once_after_a_sigkill_gets_its_id_back() {
    let pg = PgServer::start().expect("a PostgreSQL server");
    let url = pg.fresh_database().expect("a database");
    let data = tempfile::tempdir().expect("tempdir");
    let mut first = node(data.path(), &url, "n1");
    first.sigkill();
    let restarted = Instant::now();
    let again = node(data.path(), &url, "n1");
    let waited = restarted.elapsed();
    let http = again.client();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, health) = json_of(http.get(again.url("/health"))).await;
        if health["shards"] == json!(1024) {
            break;
        }
        assert!(Instant::now() < deadline, "the restarted n1 never held every shard: {health}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("the restarted n1 listened {waited:?} after the kill");
    assert!(waited < Duration::from_secs(15), "{waited:?}");
}
