//! `durafiber bench stash --nodes N --pg-url URL`: sync commits per second across N node
//! processes sharing one PostgreSQL database, each commit fenced by its node's lease on the
//! run's shard, beside raw `fdatasync` measured in the same run on the local disk.
//!
//! Each node (`bench stash-node`, a child process) joins a scratch database, acquires its
//! share of the shards, and runs its writers against runs of its own shards; every node
//! starts committing at the same instant and stops after the same time.

use durafiber_api::Timestamp;
use durafiber_runtime::RunId;
use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use durafiber_store::{Leases, PgBackend, Store, StoreConfig, shard};
use serde_json::{Value, json};

use super::{
    drill_nodes::Scratch,
    measure::{commit_until, epoch_ms, print_bench_report, progress, raw_fdatasync_per_s},
};

/// The parent: a scratch database, N node processes, their figures summed.
pub async fn stash(
    json: bool,
    url: &str,
    nodes: usize,
    writers: usize,
    seconds: f64,
    out: Option<&Path>,
) -> anyhow::Result<i32> {
    if nodes == 0 {
        bail!("--nodes must be at least 1");
    }
    let dir = tempfile::Builder::new().prefix("durafiber-bench-").tempdir_in(std::env::temp_dir())?;
    progress(&format!("raw append + fdatasync for {seconds} s in {}", dir.path().display()));
    let raw = raw_fdatasync_per_s(dir.path(), seconds)?;
    let scratch = Scratch::create(url).await?;
    let result = across(&scratch.url, nodes, writers, seconds).await;
    scratch.drop_it().await;
    let (commits, elapsed, per_node) = result?;
    let rate = commits as f64 / elapsed;
    let p99_ms = per_node.iter().filter_map(|n| n["p99_us"].as_f64()).fold(0.0, f64::max) / 1000.0;
    let p50_ms = per_node.iter().filter_map(|n| n["p50_us"].as_f64()).fold(0.0, f64::max) / 1000.0;
    let report = json!({
        "nodes": nodes, "writers": writers, "commits_per_s": rate.round(), "raw_fdatasync_per_s": raw.round(),
        "ratio": (rate / raw * 100.0).round() / 100.0, "p50_ms": (p50_ms * 100.0).round() / 100.0,
        "p99_ms": (p99_ms * 100.0).round() / 100.0, "per_node": per_node,
    });
    if let Some(out) = out {
        std::fs::create_dir_all(out)?;
        std::fs::write(out.join("stash-nodes.json"), serde_json::to_string_pretty(&report)?)?;
    }
    let lines = vec![
        format!("raw fdatasync (local disk): {raw:>10.0} /s"),
        format!(
            "fenced sync commits, {nodes} nodes x {} writers: {rate:>8.0} /s  ({:.2}x raw), p50 {p50_ms:.1} ms, p99 {p99_ms:.1} ms over {seconds} s",
            writers / nodes,
            rate / raw
        ),
    ];
    print_bench_report(lines, report, json)?;
    Ok(0)
}

/// Runs the node processes; total commits, the seconds measured, each node's figures.
async fn across(
    url: &str,
    nodes: usize,
    writers: usize,
    seconds: f64,
) -> anyhow::Result<(u64, f64, Vec<Value>)> {
    let exe = std::env::current_exe()?;
    // Every node joins and takes its shards before the common start.
    let start_at_ms = epoch_ms() + 3_000;
    progress(&format!("{nodes} nodes, {writers} writers in all, fenced sync commits for {seconds} s"));
    let mut children = Vec::new();
    for i in 0..nodes {
        let child = Command::new(&exe)
            .args(["bench", "stash-node", url, &format!("bench-n{}", i + 1)])
            .args([nodes.to_string(), (writers / nodes).max(1).to_string(), start_at_ms.to_string()])
            .arg(seconds.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting a node")?;
        children.push(child);
    }
    let mut per_node = Vec::new();
    for mut child in children {
        let stdout = child.stdout.take().context("node stdout")?;
        let last = BufReader::new(stdout).lines().map_while(Result::ok).last().unwrap_or_default();
        let status = child.wait()?;
        if !status.success() {
            bail!("a node failed: {last}");
        }
        per_node.push(serde_json::from_str::<Value>(&last).context("a node's report")?);
    }
    let commits = per_node.iter().filter_map(|n| n["commits"].as_u64()).sum();
    Ok((commits, seconds, per_node))
}

/// One node: joins, acquires 1/nodes of the shards, then its writers commit stashes into
/// runs of those shards from `start_at` for `seconds`. Prints its figures as JSON.
pub async fn node(
    url: &str,
    node_id: &str,
    nodes: usize,
    writers: usize,
    start_at: Timestamp,
    seconds: f64,
) -> anyhow::Result<i32> {
    let backend = Arc::new(PgBackend::open_node(url, node_id)?);
    let ttl = Duration::from_secs(30);
    let _database_ms = backend.heartbeat("", ttl, true)?;
    let held = backend.acquire((shard::SHARDS as usize).div_ceil(nodes), ttl)?;
    if held.is_empty() {
        bail!("node {node_id} acquired no shard");
    }
    let owned: std::collections::HashSet<u32> = held.iter().map(|l| l.shard).collect();
    let store = Store::with_backend(backend.clone(), StoreConfig::default())?;
    // One run per writer, each in a shard this node owns.
    let mut runs = Vec::new();
    let mut n = 0u64;
    while runs.len() < writers {
        let run_id = format!("run_bench_{node_id}_{n}");
        n += 1;
        if owned.contains(&shard::of_run(&run_id)) {
            runs.push(RunId::new(run_id));
        }
    }
    tokio::time::sleep(Duration::from_millis(start_at.as_millis().saturating_sub(epoch_ms()))).await;
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let (commits, mut samples) = commit_until(&store, runs, deadline).await?;
    store.close();
    println!(
        "{}",
        json!({"node": node_id, "shards": owned.len(), "commits": commits,
               "p50_us": samples.quantile(0.5), "p99_us": samples.quantile(0.99)})
    );
    Ok(0)
}
