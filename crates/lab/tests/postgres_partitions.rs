//! A `durafiber serve` node cut off from the PostgreSQL database it shares with two others
//! (a private server the test kit starts), through a TCP relay the test cuts: whether the
//! relay refuses the node's connections or lets them hang, the node fences itself within its
//! lease and drops its runs, and the other nodes take them over and complete them.

mod common;

use std::time::{Duration, Instant};

use common::nodes::{balanced, json_of, node};
use durafiber_testkit::postgres::PgServer;
use serde_json::json;

/// How a relay cuts its node off from the database.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Partition {
    /// Open connections are closed and new ones refused: the node learns at once.
    Refused,
    /// Connections stay open and new ones are accepted, but nothing passes either way (a
    /// network that drops packets): the node's calls hang until they time out.
    Silent,
}

/// A TCP relay in front of the database that a test can cut, as a network partition would.
struct Relay {
    addr: std::net::SocketAddr,
    cut: tokio::sync::watch::Sender<Option<Partition>>,
}

impl Relay {
    async fn to(target: std::net::SocketAddr) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (cut, partition) = tokio::sync::watch::channel(None);
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let mut partition = partition.clone();
                let now = *partition.borrow();
                tokio::spawn(async move {
                    match now {
                        Some(Partition::Refused) => return, // dropped at once
                        Some(Partition::Silent) => std::future::pending::<()>().await,
                        None => {}
                    }
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = partition.wait_for(Option::is_some) => {}
                    }
                    // Refused: both ends close here. Silent: both stay open, and nothing passes.
                    if *partition.borrow() == Some(Partition::Silent) {
                        std::future::pending::<()>().await;
                    }
                });
            }
        });
        Relay { addr, cut }
    }

    fn cut(&self, how: Partition) {
        self.cut.send_replace(Some(how));
    }
}

/// `url` reached through `relay` instead.
fn through(url: &str, relay: &Relay) -> String {
    let (scheme, rest) = url.split_once("://").expect("url");
    let (authority, db) = rest.split_once('/').expect("db");
    let user = authority.split_once('@').map(|(u, _)| u).expect("user");
    format!("{scheme}://{user}@{}/{db}", relay.addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_the_database_drops_its_runs_by_itself_and_the_others_take_them() {
    cut_off(Partition::Refused).await;
}

/// The node's calls to the database hang (its renewal among them), yet it fences itself at
/// its deadline, not when a call times out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_database_stops_answering_drops_its_runs_by_itself_and_the_others_take_them() {
    cut_off(Partition::Silent).await;
}

async fn cut_off(partition: Partition) {
    const RUNS: usize = 24;
    let pg = PgServer::start().expect("a PostgreSQL server");
    let url = pg.fresh_database().expect("a database");
    let target: std::net::SocketAddr = url
        .split_once('@')
        .and_then(|(_, rest)| rest.split('/').next())
        .and_then(|a| a.parse().ok())
        .expect("the server's address");
    let relay = Relay::to(target).await;
    let data = tempfile::tempdir().expect("tempdir");
    // n1 reaches the database through the relay; n2 and n3 directly.
    let mut nodes = vec![node(data.path(), &through(&url, &relay), "n1")];
    nodes.push(node(data.path(), &url, "n2"));
    nodes.push(node(data.path(), &url, "n3"));
    balanced(&nodes).await;
    let http = nodes[1].client();
    let mut runs = Vec::new();
    for i in 0..RUNS {
        let body = json!({"kind": "steps", "input": {"steps": 200, "pause_ms": 20}});
        let req = http.post(nodes[1 + i % 2].url("/runs")).header("Idempotency-Key", format!("cut-{i}"));
        let (status, v) = json_of(req.body(body.to_string())).await;
        assert_eq!(status, 201, "{v}");
        runs.push(v["run_id"].as_str().expect("run_id").to_string());
    }
    // Wait until n1 runs some of them.
    let deadline = Instant::now() + Duration::from_secs(30);
    let on_n1: Vec<String> = loop {
        let mut mine = Vec::new();
        for id in &runs {
            let (_, shown) = json_of(http.get(nodes[1].url(&format!("/runs/{id}")))).await;
            if shown["node"] == json!("n1") && shown["stash"]["seq"].as_u64().unwrap_or(0) > 0 {
                mine.push(id.clone());
            }
        }
        if !mine.is_empty() {
            break mine;
        }
        assert!(Instant::now() < deadline, "n1 never ran a run");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    relay.cut(partition);
    let cut = Instant::now();
    // n1 stops by itself at its self-fence deadline, before its leases can have expired.
    loop {
        if nodes[0].log().contains("self-fence") {
            break;
        }
        assert!(cut.elapsed() < Duration::from_secs(10), "n1 never fenced itself:\n{}", nodes[0].log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let fenced_after = cut.elapsed();
    // The others take its runs once its leases expire.
    let mut moved_after = Duration::ZERO;
    for id in &on_n1 {
        loop {
            let (_, shown) = json_of(http.get(nodes[1].url(&format!("/runs/{id}")))).await;
            let node = shown["node"].as_str().unwrap_or("");
            if node == "n2" || node == "n3" || !shown["run"]["status"]["completed"].is_null() {
                moved_after = moved_after.max(cut.elapsed());
                break;
            }
            assert!(
                cut.elapsed() < Duration::from_secs(20),
                "run {id} stayed with the cut-off node: {shown}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    println!("n1 fenced itself {fenced_after:?} after the cut; its runs moved {moved_after:?} after it");
    // Bounds in leases, loose enough for a host whose cores are taken by others (its writes
    // past the lease are refused by the database's fence whenever its log line comes).
    assert!(fenced_after < Duration::from_secs(5), "self-fence after {fenced_after:?} (lease 2 s)");
    assert!(moved_after < Duration::from_secs(10), "runs moved after {moved_after:?}: more than 5 leases");
    for id in &runs {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (_, shown) = json_of(http.get(nodes[2].url(&format!("/runs/{id}")))).await;
            if !shown["run"]["status"]["completed"].is_null() {
                assert_eq!(shown["run"]["status"]["completed"]["output"]["done"], json!(200), "{shown}");
                break;
            }
            assert!(Instant::now() < deadline, "run {id} did not complete: {shown}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
