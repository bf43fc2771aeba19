//! `durafiber drill --nodes N --pg-url URL`: the kill-and-resume drill across nodes that
//! share a PostgreSQL database.
//!
//! 1. a scratch database is created on the server `URL` names, and N nodes start on it
//!    (lease 2 s); the refund job starts and pauses for a human;
//! 2. the node running it is SIGKILLed mid-wait: the run must be taken by another node
//!    (`failover_ms`: kill → the run owned by a survivor);
//! 3. the decision is sent, with the hash the pending-approval view shows, to a node that
//!    does not run the run (it is passed on to the owner);
//! 4. the upstream holds the refund's answer, so the owner is between the call and the
//!    receipt commit: it is stopped there (SIGSTOP) until the run completes on another
//!    node, then woken: it must let go without a write (`zombie_fenced`), and is killed;
//! 5. the five metrics are scored against the upstream, as in the one-node drill. The
//!    scratch database is dropped at the end.

use durafiber_runtime::RunId;
use std::{
    path::Path,
    str::FromStr,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use durafiber_demo::agents::RefundDraft;
use durafiber_testkit::upstream::Upstream;
use serde_json::{Value, json};

use super::drill::{
    AcrossNodes, DrillReport, Outcome, Server, Snapshots, conclude, out_dir, pending_approval, print_report,
    read_log, refund_draft, sigkill, sigterm, spawn_server_with, start_refund, wait_run,
};

/// The lease the drill's nodes hold their shards by.
const LEASE: &str = "2s";

/// `url` with its database replaced by `db`.
fn with_database(url: &str, db: &str) -> anyhow::Result<String> {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (url, String::new()),
    };
    let (scheme, rest) = base.split_once("://").context("a postgres:// URL")?;
    let authority = rest.split('/').next().unwrap_or(rest);
    Ok(format!("{scheme}://{authority}/{db}{query}"))
}

/// A database of the drill's (or a benchmark's) own, dropped when it ends.
pub(super) struct Scratch {
    admin: tokio_postgres::Client,
    name: String,
    pub url: String,
}

impl Scratch {
    pub async fn create(url: &str) -> anyhow::Result<Scratch> {
        let config = tokio_postgres::Config::from_str(url).context("--pg-url")?;
        let (admin, connection) =
            config.connect(tokio_postgres::NoTls).await.context("connecting to --pg-url")?;
        tokio::spawn(connection);
        let name = format!("durafiber_scratch_{}_{}", std::process::id(), super::measure::epoch_ms());
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .context("creating a scratch database (the --pg-url user needs CREATEDB)")?;
        Ok(Scratch { url: with_database(url, &name)?, admin, name })
    }

    pub async fn drop_it(self) {
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        if let Err(e) = self.admin.batch_execute(&sql).await {
            eprintln!("drill: could not drop the scratch database {}: {e}", self.name);
        }
    }
}

/// `durafiber drill --nodes N --pg-url URL`: prints the score table; exit 0 only if every
/// metric passes and the stopped node was fenced.
pub async fn run(
    json_line: bool,
    seed: u64,
    out: Option<&Path>,
    nodes: usize,
    pg_url: &str,
) -> anyhow::Result<i32> {
    let exe = std::env::current_exe().context("locating the durafiber binary")?;
    let (report, across) = drill(&exe, seed, &out_dir(out, seed), nodes, pg_url).await?;
    Ok(print_report(&report, Some(&across), json_line))
}

fn node_args<'a>(url: &'a str, id: &'a str) -> [&'a str; 6] {
    ["--store", url, "--node-id", id, "--lease-ttl", LEASE]
}

/// The index of the node named in the run's view (`node`), among `ids`.
fn owner_index(run: &Value, ids: &[String]) -> Option<usize> {
    let node = run["node"].as_str()?;
    ids.iter().position(|id| id == node)
}

/// Approves the refund with the hash the view of `viewer` shows, through `decider`, and waits
/// until the refund is called (the upstream holds its answer, so the owner stands between
/// its call and the receipt's commit). Whether the view showed the draft and its hash.
async fn approve_through(
    viewer: &Server,
    decider: &Server,
    run_id: &RunId,
    draft: &RefundDraft,
    upstream: &Upstream,
) -> anyhow::Result<bool> {
    let (human_sees_context, hash) = pending_approval(viewer, run_id, draft).await?;
    upstream.hold("refunds", Duration::from_secs(3));
    let body = json!({"payload_hash": hash, "approved": true, "comment": "drill"});
    decider.client.post_json(&format!("/runs/{run_id}/approvals/refund"), &body, None).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while upstream.objects("refunds").is_empty() {
        if Instant::now() > deadline {
            bail!("the refund was never called");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(human_sees_context)
}

/// The run completed on `owner`, and whether `stopped` (id `id`), woken then, lets go of it
/// and wrote nothing of it.
async fn finished_and_fenced(
    owner: &Server,
    stopped: &Server,
    run_id: &RunId,
    id: &str,
) -> anyhow::Result<(Value, bool)> {
    let done = wait_run(&owner.client, run_id, "complete", |r| r["run"]["status"].get("completed").is_some())
        .await?;
    signal(stopped, rustix::process::Signal::CONT);
    let let_go = lets_go(stopped, run_id, id).await;
    let after_wake = owner.client.get_json(&format!("/runs/{run_id}")).await?;
    let fenced = let_go && after_wake["ledger"] == done["ledger"] && after_wake["run"] == done["run"];
    Ok((done, fenced))
}

/// Whether the woken node `woken` (id `id`) lets go of the run within 5 s.
async fn lets_go(woken: &Server, run_id: &RunId, id: &str) -> bool {
    let woke = Instant::now();
    while woke.elapsed() < Duration::from_secs(5) {
        if let Ok(run) = woken.client.get_json(&format!("/runs/{run_id}")).await
            && run["node"].as_str() != Some(id)
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// Polls `via` until the run is owned by one of `alive`; its index.
async fn owned_by(
    via: &Server,
    run_id: &RunId,
    ids: &[String],
    alive: &[bool],
) -> anyhow::Result<(usize, Value)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(run) = via.client.get_json(&format!("/runs/{run_id}")).await
            && let Some(i) = owner_index(&run, ids)
            && alive[i]
        {
            return Ok((i, run));
        }
        if Instant::now() > deadline {
            bail!("no live node took the run within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn signal(server: &Server, signal: rustix::process::Signal) {
    let _ = rustix::process::kill_process(rustix::process::Pid::from_child(&server.child), signal);
}

/// Runs the drill across `n` nodes on the server `pg_url` names.
/// (`failover_ms`: SIGKILL of the run's node → the run owned by another node;
/// `zombie_fenced`: the node stopped between the effect call and the receipt let go of the
/// run when it woke, and nothing of it landed.)
pub async fn drill(
    exe: &Path,
    seed: u64,
    out: &Path,
    n: usize,
    pg_url: &str,
) -> anyhow::Result<(DrillReport, AcrossNodes)> {
    if n < 2 {
        bail!("--nodes needs at least 2 nodes: a run must have somewhere to go");
    }
    let started = Instant::now();
    std::fs::create_dir_all(out)?;
    let data = out.join("data");
    if data.exists() {
        std::fs::remove_dir_all(&data).with_context(|| format!("clearing {}", data.display()))?;
    }
    let scratch = Scratch::create(pg_url).await?;
    let result = run_nodes(exe, seed, out, &data, n, &scratch.url, started).await;
    scratch.drop_it().await;
    result
}

/// Where node `i`'s log goes.
fn node_log(out: &Path, i: usize) -> std::path::PathBuf {
    out.join(format!("node-{}.log", i + 1))
}

async fn run_nodes(
    exe: &Path,
    seed: u64,
    out: &Path,
    data: &Path,
    n: usize,
    url: &str,
    started: Instant,
) -> anyhow::Result<(DrillReport, AcrossNodes)> {
    let upstream = Upstream::start().await.context("starting the upstream")?;
    let draft = refund_draft(seed);
    let ids: Vec<String> = (1..=n).map(|i| format!("drill-n{i}")).collect();
    eprintln!("drill: [1/5] {n} nodes on a scratch database; start the refund job; it pauses for a human");
    let mut nodes = ids
        .iter()
        .enumerate()
        .map(|(i, id)| spawn_server_with(exe, data, &node_log(out, i), None, &node_args(url, id)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut alive = vec![true; n];
    let (run_id, _) = start_refund(&nodes[0], seed, &draft, &upstream).await?;
    // While the three nodes share the shards out, a shard can be between two of them for a
    // moment, and the run's view names no node: ask until one is named.
    let (first, before_kill_1) = owned_by(&nodes[0], &run_id, &ids, &alive).await?;

    eprintln!("drill: [2/5] SIGKILL node {} (it holds the run) mid-wait", ids[first]);
    sigkill(&mut nodes[first]);
    alive[first] = false;
    let killed = Instant::now();
    let via = (first + 1) % n;
    let (second, after_kill_1) = owned_by(&nodes[via], &run_id, &ids, &alive).await?;
    let failover = killed.elapsed();
    let failover_ms = failover.as_millis() as u64;

    eprintln!("drill: [3/5] approve through a node that does not run it, with the hash the view shows");
    let other = (0..n).find(|i| alive[*i] && *i != second).unwrap_or(second);
    let human_sees_context = approve_through(&nodes[via], &nodes[other], &run_id, &draft, &upstream).await?;
    let before_kill_2 = nodes[other].client.get_json(&format!("/runs/{run_id}")).await?;

    eprintln!(
        "drill: [4/5] stop node {} between the refund call and its receipt; the run goes on elsewhere",
        ids[second]
    );
    signal(&nodes[second], rustix::process::Signal::STOP);
    alive[second] = false;
    let (third, after_kill_2) = owned_by(&nodes[other], &run_id, &ids, &alive).await?;
    let owners = [first, second, third];
    let (done, zombie_fenced) =
        finished_and_fenced(&nodes[third], &nodes[second], &run_id, &ids[second]).await?;
    sigkill(&mut nodes[second]);
    let runs =
        nodes[third].client.get_query("/runs", &[("kind", "refund".into()), ("limit", "100".into())]).await?;
    nodes.iter_mut().zip(&alive).filter(|(_, alive)| **alive).for_each(|(node, _)| sigterm(node));

    eprintln!("drill: [5/5] score against the upstream");
    let snaps = Snapshots { before_kill_1, after_kill_1, before_kill_2, after_kill_2, done, runs };
    // The logs of the nodes that carried the run on: the first node named may only have
    // held its shard while it waited (shards move to the nodes that join after the run
    // starts, and a node that takes a shard leaves its waiting runs where they are), so its
    // log need not name the run; the second ran the decision and the third finished it.
    let logs: Vec<String> = owners.iter().skip(1).map(|i| read_log(&node_log(out, *i))).collect();
    let stop_at = "after_effect_call:refund";
    let outcome = Outcome { snaps, run_id, stop_at, logs, human_sees_context, seed, started };
    let extra = json!({
        "nodes": n, "failover_ms": failover_ms, "zombie_fenced": zombie_fenced,
        "owners": owners.iter().map(|i| ids[*i].clone()).collect::<Vec<_>>(),
    });
    let report = conclude(outcome, &upstream, out, zombie_fenced, extra)?;
    Ok((report, AcrossNodes { nodes: n, failover, zombie_fenced }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scratch_database_replaces_the_urls_own() {
        let u = |s: &str| with_database(s, "x").expect("url");
        assert_eq!(u("postgres://u@h:5/db"), "postgres://u@h:5/x");
        assert_eq!(u("postgres://u:p@h:5"), "postgres://u:p@h:5/x");
        assert_eq!(u("postgresql://u@h/db?sslmode=disable"), "postgresql://u@h/x?sslmode=disable");
    }
}
