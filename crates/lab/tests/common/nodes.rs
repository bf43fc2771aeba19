//! Nodes of one PostgreSQL database for the several-node tests: `serve` as a node with a
//! lease of 2 s, and three of them once the shards are spread.

use std::{
    ffi::OsStr,
    path::Path,
    time::{Duration, Instant},
};

use serde_json::Value;

use super::Served;

/// Every node's lease: short, so that a dead node's runs move within seconds.
pub const LEASE: &str = "2s";

/// The arguments that make `serve` node `id` of the database at `url`.
pub fn node_args<'a>(url: &'a str, id: &'a str) -> [&'a OsStr; 6] {
    ["--store", url, "--node-id", id, "--lease-ttl", LEASE].map(OsStr::new)
}

/// `serve` as node `id` of the database at `url`.
pub fn node(data: &Path, url: &str, id: &str) -> Served {
    Served::start_with(data, &node_args(url, id))
}

/// A request's status and JSON answer (null when it is not JSON).
pub async fn json_of(r: reqwest::RequestBuilder) -> (u16, Value) {
    let r = r.send().await.expect("request");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Three nodes on one database, started one after another in one data directory (so they
/// share its admin token), once each holds shards and together they hold all.
pub async fn three_nodes(data: &Path, url: &str) -> Vec<Served> {
    let nodes: Vec<Served> = ["n1", "n2", "n3"].iter().map(|id| node(data, url, id)).collect();
    balanced(&nodes).await;
    nodes
}

/// Waits until every node holds shards and together they hold all 1,024.
pub async fn balanced(nodes: &[Served]) {
    let http = nodes[0].client();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut counts = Vec::new();
        for n in nodes {
            let (_, h) = json_of(http.get(n.url("/health"))).await;
            counts.push(h["shards"].as_u64().unwrap_or(0));
        }
        if counts.iter().all(|c| *c > 0) && counts.iter().sum::<u64>() == 1024 {
            return;
        }
        assert!(Instant::now() < deadline, "the shards never spread over the nodes: {counts:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
