//! Three `durafiber serve` nodes sharing one PostgreSQL database (a private server the test
//! kit starts), with a lease of 2 s: the shards spread over the nodes; a start is unique by
//! its key whichever nodes it reaches; a decision sent to a node that does not own the run
//! reaches the owner and is applied once; when a node is SIGKILLed its runs resume on the
//! survivors and complete under their ids, with each effect made once upstream; a node
//! stopped between an effect call and its receipt is fenced; a rolling SIGTERM restart hands
//! runs over at once; and a stopped writer holds off no steal. A node cut off from the
//! database: `postgres_partitions.rs`.

mod common;

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use common::{
    Served,
    nodes::{balanced, json_of, node, three_nodes},
};
use durafiber_testkit::{postgres::PgServer, upstream::Upstream};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_started_fifty_times_through_three_nodes_makes_one_run_and_decisions_reach_the_owner() {
    let pg = PgServer::start().expect("a PostgreSQL server");
    let url = pg.fresh_database().expect("a database");
    let data = tempfile::tempdir().expect("tempdir");
    let nodes = three_nodes(data.path(), &url).await;
    let http = nodes[0].client();
    let upstream = Upstream::start().await.expect("upstream");

    // 50 concurrent starts of one key, spread over the nodes.
    let body = json!({"kind": "refund", "input": {"order_id": "o1", "amount_cents": 5,
        "customer_email": "a@b.c", "upstream": upstream.url(), "api_key": null}});
    let mut starts = Vec::new();
    for i in 0..50 {
        let req =
            http.post(nodes[i % 3].url("/runs")).header("Idempotency-Key", "order-o1").body(body.to_string());
        starts.push(tokio::spawn(json_of(req)));
    }
    let mut ids = HashSet::new();
    let mut accepted = 0;
    for s in starts {
        let (status, v) = s.await.expect("task");
        assert!(status == 201 || status == 200, "{status} {v}");
        accepted += usize::from(v["accepted"] == json!(true));
        ids.insert(v["run_id"].as_str().expect("run_id").to_string());
    }
    assert_eq!(ids.len(), 1, "one run for one key: {ids:?}");
    assert_eq!(accepted, 1, "exactly one start accepted it");
    let run_id = ids.into_iter().next().expect("one id");

    // The run's owner picks it up and pauses for the approval; every node shows it.
    let accepted_at = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(30);
    let pending = loop {
        let (_, list) = json_of(http.get(nodes[2].url("/approvals"))).await;
        if let Some(p) = list.as_array().and_then(|a| a.first()).cloned() {
            break p;
        }
        assert!(Instant::now() < deadline, "the run never asked for its approval");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!("the run asked for its approval {:?} after it was accepted", accepted_at.elapsed());
    // The same decision through every node: two of them do not own the run and pass it on.
    let decision = json!({"payload_hash": pending["payload_hash"], "approved": true});
    let path = format!("/runs/{run_id}/approvals/refund");
    let mut recorded = 0;
    for n in &nodes {
        let (status, v) = json_of(http.post(n.url(&path)).body(decision.to_string())).await;
        assert_eq!(status, 200, "through {}: {v}", n.url(""));
        recorded += usize::from(v["recorded"] == json!(true));
    }
    assert_eq!(recorded, 1, "the decision is recorded once");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, shown) = json_of(http.get(nodes[1].url(&format!("/runs/{run_id}")))).await;
        if !shown["run"]["status"]["completed"].is_null() {
            break;
        }
        assert!(Instant::now() < deadline, "the approved run did not complete: {shown}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(upstream.objects("refunds").len(), 1, "one refund reached the upstream");
    assert_eq!(upstream.objects("emails").len(), 1, "one email reached the upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runs_of_a_node_killed_mid_flight_resume_on_the_survivors_and_complete() {
    const RUNS: usize = 30;
    const STEPS: u64 = 200;
    const REFUNDS: usize = 30;
    let pg = PgServer::start().expect("a PostgreSQL server");
    let url = pg.fresh_database().expect("a database");
    let data = tempfile::tempdir().expect("tempdir");
    let mut nodes = three_nodes(data.path(), &url).await;
    let http = nodes[0].client();
    let mut runs = Vec::new();
    for i in 0..RUNS {
        let body = json!({"kind": "steps", "input": {"steps": STEPS, "pause_ms": 50}});
        let req = http.post(nodes[i % 3].url("/runs")).header("Idempotency-Key", format!("job-{i}"));
        let (status, v) = json_of(req.body(body.to_string())).await;
        assert_eq!(status, 201, "{v}");
        runs.push(v["run_id"].as_str().expect("run_id").to_string());
    }
    // Every run is under way before the kill.
    let seq_of = |shown: &Value| shown["stash"]["seq"].as_u64().unwrap_or(0);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut before: HashMap<String, u64> = HashMap::new();
    while before.len() < RUNS {
        for id in &runs {
            let (_, shown) = json_of(http.get(nodes[1].url(&format!("/runs/{id}")))).await;
            if seq_of(&shown) > 0 {
                before.insert(id.clone(), seq_of(&shown));
            }
        }
        assert!(Instant::now() < deadline, "not every run started: {} of {RUNS}", before.len());
    }
    // Refunds too, each paused for its approval: the decisions go out through every node
    // and the kill lands while their effects are under way.
    let upstream = Upstream::start().await.expect("upstream");
    let mut refunds = Vec::new();
    for i in 0..REFUNDS {
        let body = json!({"kind": "refund", "input": {"order_id": format!("k{i}"), "amount_cents": 100 + i,
            "customer_email": "a@b.c", "upstream": upstream.url(), "api_key": null}});
        let req = http.post(nodes[i % 3].url("/runs")).header("Idempotency-Key", format!("refund-{i}"));
        let (status, v) = json_of(req.body(body.to_string())).await;
        assert_eq!(status, 201, "{v}");
        refunds.push(v["run_id"].as_str().expect("run_id").to_string());
    }
    let pending = loop {
        let (_, list) = json_of(http.get(nodes[1].url("/approvals"))).await;
        let list = list.as_array().cloned().unwrap_or_default();
        if list.len() == REFUNDS {
            break list;
        }
        assert!(Instant::now() < deadline, "{} of {REFUNDS} refunds paused", list.len());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut decisions = Vec::new();
    for (i, p) in pending.iter().enumerate() {
        let path = format!("/runs/{}/approvals/refund", p["run_id"].as_str().expect("run_id"));
        let body = json!({"payload_hash": p["payload_hash"], "approved": true}).to_string();
        // Through the survivors: the node about to die may not answer.
        decisions.push(tokio::spawn(json_of(http.post(nodes[1 + i % 2].url(&path)).body(body))));
    }
    while upstream.objects("refunds").len() < REFUNDS / 4 {
        assert!(Instant::now() < deadline, "the refunds never reached the upstream");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Where each steps run stands at the kill.
    for id in &runs {
        let (_, shown) = json_of(http.get(nodes[1].url(&format!("/runs/{id}")))).await;
        before.insert(id.clone(), seq_of(&shown));
    }

    nodes[0].sigkill();
    let killed = Instant::now();
    let survivors = &nodes[1..];
    // Each run moves again (on whichever node) and completes under its id.
    let deadline = killed + Duration::from_secs(60);
    let mut resumed = 0;
    let mut last_moved = Duration::ZERO;
    let mut moved: HashSet<String> = HashSet::new();
    let mut done: HashSet<String> = HashSet::new();
    while done.len() < RUNS {
        for (i, id) in runs.iter().enumerate() {
            if done.contains(id) {
                continue;
            }
            let (status, shown) = json_of(http.get(survivors[i % 2].url(&format!("/runs/{id}")))).await;
            assert_eq!(status, 200, "run {id} was lost: {shown}");
            if !moved.contains(id) && seq_of(&shown) > before[id] + 2 {
                moved.insert(id.clone());
                last_moved = last_moved.max(killed.elapsed());
            }
            let output = &shown["run"]["status"]["completed"]["output"];
            if !output.is_null() {
                assert_eq!(output["done"], json!(STEPS), "{shown}");
                resumed += usize::from(output["resumed_from"].as_array().is_some_and(|r| !r.is_empty()));
                done.insert(id.clone());
            }
        }
        assert!(Instant::now() < deadline, "{} of {RUNS} runs completed after the kill", done.len());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(resumed > 0, "some runs were the killed node's, and were resumed elsewhere");
    for d in decisions {
        let (status, v) = d.await.expect("task");
        // A decision that reached the dying node's shard just before the kill may have to be
        // sent again; it is never applied twice.
        assert!(status == 200 || status == 503, "{status} {v}");
    }
    // Decisions that did not get through are sent again, as a caller would.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, list) = json_of(http.get(survivors[0].url("/approvals"))).await;
        for p in list.as_array().cloned().unwrap_or_default() {
            let path = format!("/runs/{}/approvals/refund", p["run_id"].as_str().expect("run_id"));
            let body = json!({"payload_hash": p["payload_hash"], "approved": true}).to_string();
            let _ = json_of(http.post(survivors[1].url(&path)).body(body)).await;
        }
        let mut completed = 0;
        for id in &refunds {
            let (_, shown) = json_of(http.get(survivors[0].url(&format!("/runs/{id}")))).await;
            completed += usize::from(!shown["run"]["status"]["completed"].is_null());
        }
        if completed == REFUNDS {
            break;
        }
        assert!(Instant::now() < deadline, "{completed} of {REFUNDS} refunds completed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Exactly one refund and one email per run upstream, and each run's ledger holds the
    // very objects the upstream made.
    let (made, emails) = (upstream.objects("refunds"), upstream.objects("emails"));
    assert_eq!((made.len(), emails.len()), (REFUNDS, REFUNDS), "one refund and one email per run");
    for id in &refunds {
        let (_, shown) = json_of(http.get(survivors[1].url(&format!("/runs/{id}")))).await;
        for (effect, objects) in [("refund", &made), ("email:confirmation", &emails)] {
            let entry = shown["ledger"].as_array().and_then(|l| l.iter().find(|e| e["effect_id"] == effect));
            let receipt = &entry.expect("a ledger entry")["committed"]["receipt"];
            assert!(
                objects.contains(receipt),
                "{id}: the {effect} receipt is what the upstream made: {receipt}"
            );
        }
    }
    println!("every run moved again {last_moved:?} after the kill; {resumed} resumed from a stash");
    // A bound in leases, loose enough for a host whose cores are taken by others: the
    // figure on a quiet host is what `durafiber drill --nodes 3` reports.
    assert!(
        last_moved < Duration::from_secs(10),
        "runs waited {last_moved:?} for a new owner: over 5 leases of 2 s"
    );
    let (_, list) = json_of(http.get(survivors[0].url("/runs?limit=100"))).await;
    assert_eq!(list["runs"].as_array().map(Vec::len), Some(RUNS + REFUNDS), "no run was invented");
}

fn signal(node: &Served, signal: rustix::process::Signal) {
    rustix::process::kill_process(rustix::process::Pid::from_child(&node.child), signal).expect("signal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stopped_between_its_effect_call_and_the_receipt_is_fenced_when_it_wakes() {
    let pg = PgServer::start().expect("a PostgreSQL server");
    let url = pg.fresh_database().expect("a database");
    let data = tempfile::tempdir().expect("tempdir");
    let nodes = three_nodes(data.path(), &url).await;
    let http = nodes[0].client();
    let upstream = Upstream::start().await.expect("upstream");
    // The refund's answer comes 3 s after the upstream made it: the caller is stopped then.
    upstream.hold("refunds", Duration::from_secs(3));
    let body = json!({"kind": "refund", "input": {"order_id": "z1", "amount_cents": 7,
        "customer_email": "a@b.c", "upstream": upstream.url(), "api_key": null}});
    let (status, v) =
        json_of(http.post(nodes[0].url("/runs")).header("Idempotency-Key", "zombie").body(body.to_string()))
            .await;
    assert_eq!(status, 201, "{v}");
    let run_id = v["run_id"].as_str().expect("run_id").to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    let pending = loop {
        let (_, list) = json_of(http.get(nodes[0].url("/approvals"))).await;
        if let Some(p) = list.as_array().and_then(|a| a.first()).cloned() {
            break p;
        }
        assert!(Instant::now() < deadline, "no approval asked for");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let decision = json!({"payload_hash": pending["payload_hash"], "approved": true});
    let (status, v) = json_of(
        http.post(nodes[0].url(&format!("/runs/{run_id}/approvals/refund"))).body(decision.to_string()),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    while upstream.objects("refunds").is_empty() {
        assert!(Instant::now() < deadline, "the refund was never called");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The owner is between its call and the receipt: stop it there.
    let (_, shown) = json_of(http.get(nodes[0].url(&format!("/runs/{run_id}")))).await;
    let owner_id = shown["node"].as_str().expect("the run's node").to_string();
    let owner = nodes.iter().position(|n| n.url("") == node_url(&nodes, &owner_id)).expect("owner");
    let shard = durafiber_store::shard::of_run(&run_id);
    let epoch_of = |sql: String| pg.sql(&url, &sql).expect("sql").trim().parse::<i64>().expect("epoch");
    let epoch_before = epoch_of(format!("SELECT epoch FROM df_shards WHERE shard_id = {shard}"));
    signal(&nodes[owner], rustix::process::Signal::STOP);
    let stopped = Instant::now();

    let survivor = &nodes[(owner + 1) % 3];
    loop {
        let (_, shown) = json_of(http.get(survivor.url(&format!("/runs/{run_id}")))).await;
        if !shown["run"]["status"]["completed"].is_null() {
            break;
        }
        assert!(stopped.elapsed() < Duration::from_secs(40), "the run did not finish elsewhere: {shown}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("completed on another node {:?} after the stop", stopped.elapsed());
    assert!(
        epoch_of(format!("SELECT epoch FROM df_shards WHERE shard_id = {shard}")) > epoch_before,
        "the shard was taken at a new epoch"
    );

    signal(&nodes[owner], rustix::process::Signal::CONT);
    let woke = Instant::now();
    loop {
        let (_, shown) = json_of(http.get(nodes[owner].url(&format!("/runs/{run_id}")))).await;
        // Its receipt commit is refused (the shard's epoch moved), or its fiber is dropped
        // before it tries: either way, nothing of it lands.
        let log = nodes[owner].log();
        let let_go = log.contains(&format!("shard {shard} is not owned by this node"))
            || log.contains(&format!("run_id=\"{run_id}\""))
                && log.contains("its shard is another node's now")
            || log.contains("self-fence");
        if shown["node"].as_str() != Some(owner_id.as_str()) && let_go {
            break;
        }
        assert!(woke.elapsed() < Duration::from_secs(10), "the woken node still owns the run: {shown}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("the woken node let go {:?} after SIGCONT", woke.elapsed());
    assert!(woke.elapsed() < Duration::from_secs(5), "it let go {:?} after waking", woke.elapsed());
    let stale = pg
        .sql(
            &url,
            &format!("SELECT count(*) FROM df_shards WHERE shard_id = {shard} AND epoch <= {epoch_before}"),
        )
        .expect("sql");
    assert_eq!(stale.trim(), "0", "no row carries the old epoch");
    assert_eq!(upstream.objects("refunds").len(), 1, "the upstream made the refund once");
    assert_eq!(upstream.objects("emails").len(), 1);
}

/// The URL of the node named `node_id` (n1, n2, n3: started in that order).
fn node_url(nodes: &[Served], node_id: &str) -> String {
    let i: usize = node_id.trim_start_matches('n').parse().expect("node number");
    nodes[i - 1].url("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_by_sigterm_hands_each_nodes_runs_over_at_once() {
    const RUNS: usize = 24;
    const STEPS: u64 = 400;
    let pg = PgServer::start().expect("a PostgreSQL server");
    let url = pg.fresh_database().expect("a database");
    let data = tempfile::tempdir().expect("tempdir");
    let mut nodes = three_nodes(data.path(), &url).await;
    let http = nodes[0].client();
    let mut runs = Vec::new();
    for i in 0..RUNS {
        let body = json!({"kind": "steps", "input": {"steps": STEPS, "pause_ms": 30}});
        let req = http.post(nodes[i % 3].url("/runs")).header("Idempotency-Key", format!("roll-{i}"));
        let (status, v) = json_of(req.body(body.to_string())).await;
        assert_eq!(status, 201, "{v}");
        runs.push(v["run_id"].as_str().expect("run_id").to_string());
    }
    let seqs = |via: usize, nodes: &Vec<Served>| {
        let http = http.clone();
        let urls: Vec<String> = runs.iter().map(|id| nodes[via].url(&format!("/runs/{id}"))).collect();
        async move {
            let mut out = Vec::new();
            for u in urls {
                let (_, shown) = json_of(http.get(u)).await;
                let done = !shown["run"]["status"]["completed"].is_null();
                out.push((shown["stash"]["seq"].as_u64().unwrap_or(0), done));
            }
            out
        }
    };
    let mut worst = Duration::ZERO;
    for restarting in 0..3 {
        let via = (restarting + 1) % 3;
        let before = seqs(via, &nodes).await;
        let stopped = Instant::now();
        assert_eq!(nodes[restarting].sigterm(), Some(0), "a clean stop");
        // Handed over at once: by the time it has exited, it holds no lease the others
        // would have to wait out.
        let held = format!(
            "SELECT count(*) FROM df_shards WHERE owner = 'n{}' AND lease_until > now()",
            restarting + 1
        );
        assert_eq!(pg.sql(&url, &held).expect("sql").trim(), "0", "n{} kept leases", restarting + 1);
        // Every run still going moves again, wherever it is now.
        loop {
            let now = seqs(via, &nodes).await;
            if now.iter().zip(&before).all(|((seq, done), (was, _))| *done || *seq > *was + 1) {
                break;
            }
            assert!(stopped.elapsed() < Duration::from_secs(20), "runs stood still after a SIGTERM");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let failover = stopped.elapsed();
        println!("node n{}: every run moved again {failover:?} after SIGTERM", restarting + 1);
        worst = worst.max(failover);
        nodes[restarting] = node(data.path(), &url, &format!("n{}", restarting + 1));
        balanced(&nodes).await;
    }
    // Well inside a lease on a quiet machine (about 0.5 s); the leases released above are
    // what makes it so, and a loaded machine's handover may take longer.
    println!("the slowest handover: {worst:?}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = seqs(0, &nodes).await;
        if now.iter().all(|(_, done)| *done) {
            break;
        }
        assert!(Instant::now() < deadline, "not every run completed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for id in &runs {
        let (_, shown) = json_of(http.get(nodes[1].url(&format!("/runs/{id}")))).await;
        assert_eq!(shown["run"]["status"]["completed"]["output"]["done"], json!(STEPS), "{shown}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_stopped_mid_commit_holds_off_no_steal() {
    use durafiber_store::Leases as _;
    let pg = PgServer::start().expect("a PostgreSQL server");
    let url = pg.fresh_database().expect("a database");
    // A node process committing as fast as it can, on every shard.
    let mut writer = std::process::Command::new(common::BIN)
        .args(["bench", "stash-node", &url, "busy", "1", "64"])
        .arg(
            (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("time").as_millis()
                as u64)
                .to_string(),
        )
        .arg("60")
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start the writer");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !pg.sql(&url, "SELECT count(*) FROM df_kv WHERE k >= '\\x73'::bytea").is_ok_and(|c| c.trim() != "0")
    {
        assert!(Instant::now() < deadline, "the writer never committed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Stopped wherever it is: between statements, or with one in flight.
    rustix::process::kill_process(rustix::process::Pid::from_child(&writer), rustix::process::Signal::STOP)
        .expect("SIGSTOP");
    pg.sql(&url, "UPDATE df_shards SET lease_until = now() - interval '1 second'").expect("expire");
    let expired = Instant::now();
    let thief = durafiber_store::PgBackend::open_node(&url, "thief").expect("open");
    let stolen = thief.acquire(1024, Duration::from_secs(2)).expect("steal");
    let took = expired.elapsed();
    let _ = writer.kill();
    let _ = writer.wait();
    println!("every shard stolen {took:?} after the leases expired, the old owner stopped");
    assert_eq!(stolen.len(), 1024);
    assert!(
        took < Duration::from_secs(1),
        "the steal waited {took:?} for a stopped node (lease 2 s: ttl/2 = 1 s)"
    );
}
