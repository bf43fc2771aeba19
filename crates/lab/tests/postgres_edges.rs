//! Where nodes sharing one PostgreSQL database meet each other: three nodes started at the
//! same instant on a fresh database make one admin token, which works on all of them; a
//! second live process under a node id is refused and changes nothing of the first; a node
//! restarted at once after a SIGKILL gets its id back; a request passed on to the node that
//! runs its run is audited once, there, and one for a killed or stopped node is answered 503
//! with `Retry-After` within the forward timeout; nodes that serve TLS pass requests on
//! over TLS, as the caller.

mod common;

use std::{
    ffi::OsStr,
    process::{Command, Stdio},
    sync::{Arc, Barrier},
    time::{Duration, Instant},
};

use common::{
    BIN, Served,
    nodes::{json_of, node, node_args, three_nodes},
};
use durafiber_testkit::postgres::PgServer;
use serde_json::{Value, json};

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

/// Starts a long run through `via` and returns its id and the index of the node that runs it.
async fn long_run(nodes: &[Served], via: usize, key: &str) -> (String, usize) {
    let http = nodes[via].client();
    let body = json!({"kind": "steps", "input": {"steps": 100_000, "pause_ms": 1_000}});
    let req = http.post(nodes[via].url("/runs")).header("Idempotency-Key", key);
    let (status, v) = json_of(req.body(body.to_string())).await;
    assert_eq!(status, 201, "{v}");
    let id = v["run_id"].as_str().expect("run_id").to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, shown) = json_of(http.get(nodes[via].url(&format!("/runs/{id}")))).await;
        if let Some(n) = shown["node"].as_str().and_then(|n| n.strip_prefix('n')) {
            return (id, n.parse::<usize>().expect("node number") - 1);
        }
        assert!(Instant::now() < deadline, "run {id} never ran: {shown}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The audit entries of `action` on `run_id`.
async fn audited(node: &Served, action: &str, run_id: &str) -> usize {
    let (status, page) = json_of(node.client().get(node.url("/audit?limit=1000"))).await;
    assert_eq!(status, 200, "{page}");
    let entries = page["entries"].as_array().expect("entries");
    entries.iter().filter(|e| e["action"] == json!(action) && e["run_id"] == json!(run_id)).count()
}

/// Cancels `run_id` through `via` until it is cancelled, waiting as each 503 says.
async fn cancel_until_done(via: &Served, run_id: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let req = via.client().post(via.url(&format!("/runs/{run_id}/cancel")));
        let r = req.body(json!({"reason": "edge"}).to_string()).send().await.expect("request");
        let status = r.status().as_u16();
        if status == 200 {
            return;
        }
        let wait = r.headers().get("retry-after").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(1);
        assert!(matches!(status, 421 | 503), "{status}: {}", r.text().await.unwrap_or_default());
        assert!(Instant::now() < deadline, "run {run_id} was never cancelled");
        tokio::time::sleep(Duration::from_secs(wait)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_passed_on_to_the_runs_node_is_audited_once_there() {
    let pg = PgServer::start().expect("a PostgreSQL server");
    let url = pg.fresh_database().expect("a database");
    let data = tempfile::tempdir().expect("tempdir");
    let nodes = three_nodes(data.path(), &url).await;
    let (id, owner) = long_run(&nodes, 0, "audit-once").await;
    let via = (owner + 1) % 3;
    cancel_until_done(&nodes[via], &id).await;
    assert_eq!(audited(&nodes[via], "cancel", &id).await, 1, "one entry for one request passed on");
}

/// A dead owner (SIGKILL: the connection is refused) and a stopped one (SIGSTOP: nothing
/// answers) both get the caller a 503 with `Retry-After` within the forward timeout, and
/// the request sent again is carried out by the node that takes the run over, audited once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_for_a_killed_or_stopped_node_is_answered_503_with_retry_after_in_bounded_time() {
    let pg = PgServer::start().expect("a PostgreSQL server");
    let url = pg.fresh_database().expect("a database");
    let data = tempfile::tempdir().expect("tempdir");
    let mut nodes = three_nodes(data.path(), &url).await;
    for (key, stop) in [("killed", false), ("stopped", true)] {
        // A run on a node other than n1, which takes the requests.
        let (id, owner) = {
            let mut n = 0;
            loop {
                let (id, owner) = long_run(&nodes, 0, &format!("{key}-{n}")).await;
                if owner != 0 {
                    break (id, owner);
                }
                n += 1;
            }
        };
        if stop {
            rustix::process::kill_process(
                rustix::process::Pid::from_child(&nodes[owner].child),
                rustix::process::Signal::STOP,
            )
            .expect("SIGSTOP");
        } else {
            nodes[owner].sigkill();
        }
        let sent = Instant::now();
        let req = nodes[0].client().post(nodes[0].url(&format!("/runs/{id}/cancel")));
        let r = req.body(json!({"reason": "edge"}).to_string()).send().await.expect("request");
        let took = sent.elapsed();
        let (status, retry_after) = (r.status().as_u16(), r.headers().get("retry-after").cloned());
        let body = r.text().await.unwrap_or_default();
        println!("{key} owner: {status} after {took:?}");
        assert_eq!(status, 503, "{key} owner: {body}");
        assert!(retry_after.is_some(), "{key} owner: 503 without Retry-After");
        assert!(took < Duration::from_secs(10), "{key} owner answered after {took:?} (forward timeout 5 s)");
        cancel_until_done(&nodes[0], &id).await;
        if stop {
            rustix::process::kill_process(
                rustix::process::Pid::from_child(&nodes[owner].child),
                rustix::process::Signal::CONT,
            )
            .expect("SIGCONT");
        }
        // The stopped node, woken, finds it lost the run: it carries nothing out and
        // records nothing.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(audited(&nodes[0], "cancel", &id).await, 1, "{key} owner: one entry, where it was done");
        nodes[owner].sigkill();
    }
}

/// Starts sent while the database is down (stopped as a crash would, then started again)
/// wait for it and succeed; the runs they started complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_sent_while_the_database_restarts_wait_for_it_and_succeed() {
    const STARTS: usize = 6;
    let pg = PgServer::start().expect("a PostgreSQL server");
    let url = pg.fresh_database().expect("a database");
    let data = tempfile::tempdir().expect("tempdir");
    let n1 = node(data.path(), &url, "n1");
    let http = n1.client();
    pg.stop_immediately().expect("stop the database");
    let down = Instant::now();
    let mut sent = Vec::new();
    for i in 0..STARTS {
        let body = json!({"kind": "steps", "input": {"steps": 3, "pause_ms": 10}});
        let req = http.post(n1.url("/runs")).header("Idempotency-Key", format!("restart-{i}"));
        sent.push(tokio::spawn(json_of(req.body(body.to_string()))));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    pg.start_again().expect("start the database again");
    println!("the database was down {:?}", down.elapsed());
    let mut runs = Vec::new();
    for start in sent {
        let (status, v) = start.await.expect("task");
        assert_eq!(status, 201, "a start sent while the database restarted: {v}\n{}", n1.log());
        runs.push(v["run_id"].as_str().expect("run_id").to_string());
    }
    for id in &runs {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (_, shown) = json_of(http.get(n1.url(&format!("/runs/{id}")))).await;
            if shown["run"]["status"]["completed"]["output"]["done"] == json!(3) {
                break;
            }
            assert!(Instant::now() < deadline, "run {id} did not complete: {shown}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Nodes that serve TLS speak TLS to each other too, each checking that the peer's
/// certificate is for the address it advertises; a request passed on carries the caller's
/// own token, so the owner acts and audits as the caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_serving_tls_pass_requests_on_over_tls_as_the_caller() {
    use tokio_rustls::rustls;
    let pg = PgServer::start().expect("a PostgreSQL server");
    let url = pg.fresh_database().expect("a database");
    let data = tempfile::tempdir().expect("tempdir");
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
        .expect("certificate");
    let (cert_file, key_file) = (data.path().join("cert.pem"), data.path().join("key.pem"));
    std::fs::write(&cert_file, cert.cert.pem()).expect("cert");
    std::fs::write(&key_file, cert.key_pair.serialize_pem()).expect("key");
    let tls =
        ["--tls-cert", cert_file.to_str().expect("path"), "--tls-key", key_file.to_str().expect("path")];
    let start = |id: &str| {
        let mut args: Vec<&OsStr> = node_args(&url, id).to_vec();
        args.extend(tls.iter().map(OsStr::new));
        Served::start_with(data.path(), &args)
    };
    let nodes: Vec<Served> = ["n1", "n2", "n3"].iter().map(|id| start(id)).collect();
    // The test's own client trusts the nodes' certificate.
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.cert.der().clone()).expect("root");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let https = |token: &str| {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {token}").parse().expect("header"));
        headers.insert(reqwest::header::CONTENT_TYPE, "application/json".parse().expect("header"));
        reqwest::Client::builder()
            .use_preconfigured_tls(config.clone())
            .default_headers(headers)
            .build()
            .expect("client")
    };
    let url_of = |n: &Served, path: &str| format!("https://{}{path}", n.addr);
    let admin = https(&nodes[0].token);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut counts = Vec::new();
        for n in &nodes {
            let (_, h) = json_of(admin.get(url_of(n, "/health"))).await;
            counts.push(h["shards"].as_u64().unwrap_or(0));
        }
        if counts.iter().all(|c| *c > 0) && counts.iter().sum::<u64>() == 1024 {
            break;
        }
        assert!(Instant::now() < deadline, "the shards never spread over the nodes: {counts:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let body = json!({"name": "olga", "role": "operator"}).to_string();
    let (status, created) = json_of(admin.post(url_of(&nodes[0], "/tokens")).body(body)).await;
    assert_eq!(status, 201, "{created}");
    let olga = https(created["token"].as_str().expect("token"));
    let body = json!({"kind": "steps", "input": {"steps": 100_000, "pause_ms": 1_000}}).to_string();
    let (status, v) =
        json_of(olga.post(url_of(&nodes[0], "/runs")).header("Idempotency-Key", "tls").body(body)).await;
    assert_eq!(status, 201, "{v}");
    let id = v["run_id"].as_str().expect("run_id").to_string();
    let owner = loop {
        let (_, shown) = json_of(olga.get(url_of(&nodes[0], &format!("/runs/{id}")))).await;
        if let Some(n) = shown["node"].as_str().and_then(|n| n.strip_prefix('n')) {
            break n.parse::<usize>().expect("node number") - 1;
        }
        assert!(Instant::now() < deadline + Duration::from_secs(30), "run {id} never ran: {shown}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let via = &nodes[(owner + 1) % 3];
    let cancel =
        olga.post(url_of(via, &format!("/runs/{id}/cancel"))).body(json!({"reason": "tls"}).to_string());
    let (status, v) = json_of(cancel).await;
    assert_eq!(status, 200, "a request passed on over TLS: {v}\n{}", via.log());
    let (_, page) = json_of(admin.get(url_of(via, "/audit?limit=1000"))).await;
    let entries: Vec<&Value> = page["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter(|e| e["action"] == json!("cancel") && e["run_id"] == json!(id))
        .collect();
    assert_eq!(entries.len(), 1, "{page}");
    assert_eq!(entries[0]["actor"], json!("olga"), "the owner acted as the caller");
}
