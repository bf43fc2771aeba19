//! Nobody decides what they are not allowed to, against a real `durafiber serve`: tokens and
//! roles on every endpoint, an audit trail of who did what, browser-safe requests, and a
//! server secret that no caller can have sent to a server of its own.

use durafiber_testkit::process::{CHILD_DEADLINE, OutputWithin};
use std::{collections::HashMap, ffi::OsStr};

use durafiber_testkit::upstream::Upstream;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

mod common;
use common::{BIN, Served};

async fn call(
    http: &reqwest::Client,
    server: &Served,
    method: Method,
    path: &str,
    body: Value,
) -> (u16, Value) {
    let mut req = http.request(method.clone(), server.url(path)).header("Idempotency-Key", "matrix");
    if method != Method::GET && method != Method::DELETE {
        req = req.header("content-type", "application/json").body(body.to_string());
    }
    let r = req.send().await.expect("an answer");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_needs_a_token_whose_role_allows_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Served::start(dir.path());
    let anonymous = reqwest::Client::new();
    // A fresh server refuses an unauthenticated start, as JSON.
    let (s, e) =
        call(&anonymous, &server, Method::POST, "/runs", json!({"kind": "steps", "input": {}})).await;
    assert_eq!((s, e["kind"].as_str()), (401, Some("Unauthorized")));
    assert_eq!(call(&anonymous, &server, Method::GET, "/health", Value::Null).await.0, 200, "health is open");
    let mode = std::fs::metadata(dir.path().join("admin.token")).expect("admin.token").permissions();
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777, 0o600);

    let mut tokens: HashMap<&str, String> = HashMap::new();
    for role in ["reader", "reviewer", "operator"] {
        tokens.insert(role, server.create_token(&format!("{role}-1"), role).await);
    }
    tokens.insert("admin", server.token.clone());
    let steps = json!({"kind": "steps", "input": {"steps": 100_000, "pause_ms": 1000}});
    let (_, run) = call(&server.client(), &server, Method::POST, "/runs", steps.clone()).await;
    let run_id = run["run_id"].as_str().expect("run id").to_string();

    // (method, path, body, least role that may)
    let matrix: Vec<(Method, String, Value, &str)> = vec![
        (Method::GET, "/runs".into(), Value::Null, "reader"),
        (Method::GET, format!("/runs/{run_id}"), Value::Null, "reader"),
        (Method::GET, "/approvals".into(), Value::Null, "reader"),
        (Method::GET, "/metrics".into(), Value::Null, "reader"),
        (
            Method::POST,
            format!("/runs/{run_id}/approvals/none"),
            json!({"payload_hash": "x", "approved": true}),
            "reviewer",
        ),
        (Method::POST, "/runs".into(), steps.clone(), "operator"),
        (Method::PUT, format!("/runs/{run_id}/alarms/a"), json!({"delay_ms": 60000}), "operator"),
        (Method::DELETE, format!("/runs/{run_id}/alarms/a"), Value::Null, "operator"),
        (Method::POST, format!("/runs/{run_id}/events/e"), json!({"payload": 1}), "operator"),
        // The run is open: an admin's delete is refused with 409, never carried out.
        (Method::DELETE, format!("/runs/{run_id}"), Value::Null, "admin"),
        (Method::GET, "/audit".into(), Value::Null, "admin"),
        (Method::GET, "/tokens".into(), Value::Null, "admin"),
        (Method::GET, "/backup".into(), Value::Null, "admin"),
    ];
    let rank =
        |r: &str| ["reader", "reviewer", "operator", "admin"].iter().position(|x| *x == r).expect("role");
    for (method, path, body, least) in &matrix {
        let (s, _) = call(&anonymous, &server, method.clone(), path, body.clone()).await;
        assert_eq!(s, 401, "{method} {path} without a token");
        let (s, _) =
            call(&server.client_with("dft_guess"), &server, method.clone(), path, body.clone()).await;
        assert_eq!(s, 401, "{method} {path} with a bad token");
        for role in ["reader", "reviewer", "operator", "admin"] {
            let (s, e) =
                call(&server.client_with(&tokens[role]), &server, method.clone(), path, body.clone()).await;
            if rank(role) < rank(least) {
                assert_eq!((s, e["kind"].as_str()), (403, Some("Forbidden")), "{method} {path} as {role}");
            } else {
                assert!(s != 401 && s != 403, "{method} {path} as {role}: {s} {e}");
            }
        }
    }

    // Who did what: the trail names the token, and the run's view shows it.
    let (s, audit) = call(&server.client(), &server, Method::GET, "/audit?limit=1000", Value::Null).await;
    assert_eq!(s, 200);
    let entries = audit["entries"].as_array().expect("entries");
    assert!(entries.iter().any(|e| e["actor"] == "reviewer-1" && e["action"] == "approve"), "{audit}");
    assert!(entries.iter().any(|e| e["actor"] == "operator-1" && e["action"] == "set_alarm"), "{audit}");
    let (_, shown) =
        call(&server.client(), &server, Method::GET, &format!("/runs/{run_id}"), Value::Null).await;
    assert!(
        shown["audit"].as_array().is_some_and(|a| a.iter().any(|e| e["actor"] == "operator-1")),
        "{shown}"
    );

    // A decision shows who made it.
    let refund = json!({"kind": "refund", "input": {"order_id": "o1", "amount_cents": 5, "customer_email": "a@b.c",
        "upstream": "http://127.0.0.1:9", "api_key": null}});
    let (_, started) = call(&server.client(), &server, Method::POST, "/runs", refund).await;
    let refund_id = started["run_id"].as_str().expect("run id").to_string();
    let pending = loop {
        let (_, list) = call(&server.client(), &server, Method::GET, "/approvals", Value::Null).await;
        if let Some(p) =
            list.as_array().and_then(|a| a.iter().find(|p| p["run_id"] == refund_id.as_str()).cloned())
        {
            break p;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    let path = format!("/runs/{refund_id}/approvals/refund");
    let no = json!({"payload_hash": pending["payload_hash"], "approved": false, "comment": "not this one"});
    let (s, _) = call(&server.client_with(&tokens["reviewer"]), &server, Method::POST, &path, no).await;
    assert_eq!(s, 200);
    let (_, shown) =
        call(&server.client(), &server, Method::GET, &format!("/runs/{refund_id}"), Value::Null).await;
    assert_eq!(shown["approvals"][0]["decided_by"], "reviewer-1", "{shown}");

    // A revocation holds at once.
    let (s, _) = call(&server.client(), &server, Method::DELETE, "/tokens/reader-1", Value::Null).await;
    assert_eq!(s, 200);
    assert_eq!(
        call(&server.client_with(&tokens["reader"]), &server, Method::GET, "/runs", Value::Null).await.0,
        401
    );

    // Tokens survive a restart; the admin token is not made again.
    let admin_file = std::fs::read_to_string(dir.path().join("admin.token")).expect("admin.token");
    drop(server);
    let server = Served::start(dir.path());
    assert_eq!(std::fs::read_to_string(dir.path().join("admin.token")).expect("admin.token"), admin_file);
    assert_eq!(
        call(&server.client_with(&tokens["reviewer"]), &server, Method::GET, "/runs", Value::Null).await.0,
        200
    );
    assert_eq!(
        call(&server.client_with(&tokens["reader"]), &server, Method::GET, "/runs", Value::Null).await.0,
        401
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browsers_cannot_be_turned_against_the_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Served::start(dir.path());
    let http = reqwest::Client::new();
    let bearer = format!("Bearer {}", server.token);
    let body = json!({"kind": "steps", "input": {"steps": 1, "pause_ms": 0}}).to_string();
    // DNS rebinding: the right address, another name.
    let r = http
        .get(server.url("/runs"))
        .header("host", "evil.example")
        .header("authorization", &bearer)
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::MISDIRECTED_REQUEST);
    assert_eq!(r.json::<Value>().await.expect("json")["kind"], "HostNotAllowed");
    // A cross-site form post: text/plain, another origin.
    let r = http
        .post(server.url("/runs"))
        .header("content-type", "text/plain")
        .header("origin", "http://evil.example")
        .header("idempotency-key", "x")
        .body(body.clone())
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status().as_u16(), 403, "another origin is refused first");
    // Without a token that is 401 first; with one, a body that is not JSON is 415.
    let r = http
        .post(server.url("/runs"))
        .header("content-type", "text/plain")
        .header("idempotency-key", "x")
        .body(body.clone())
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = http
        .post(server.url("/runs"))
        .header("content-type", "text/plain")
        .header("authorization", &bearer)
        .header("idempotency-key", "x")
        .body(body.clone())
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(r.json::<Value>().await.expect("json")["kind"], "UnsupportedMediaType");
    // The same origin, JSON, a token: accepted; no CORS headers are ever sent.
    let r = http
        .post(server.url("/runs"))
        .header("content-type", "application/json")
        .header("origin", format!("http://{}", server.addr))
        .header("authorization", &bearer)
        .header("idempotency-key", "x")
        .body(body)
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::CREATED);
    assert!(r.headers().keys().all(|k| !k.as_str().starts_with("access-control-")));
    // Off loopback only on purpose.
    let out = std::process::Command::new(BIN)
        .args(["serve", "--data"])
        .arg(dir.path().join("other"))
        .args(["--listen", "0.0.0.0:0"])
        .output_within(CHILD_DEADLINE)
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--insecure-plain-http"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_cannot_have_the_servers_secret_sent_to_its_own_server() {
    const KEY: &str = "sk_test_bound_secret_77731";
    let upstream =
        Upstream::start_on("127.0.0.1:0".parse().expect("addr"), Some(KEY.into())).await.expect("upstream");
    let thief = Upstream::start().await.expect("a caller's own server");
    let dir = tempfile::tempdir().expect("tempdir");
    let hosts = upstream.url().trim_start_matches("http://").to_string();
    let env =
        [("DURAFIBER_SECRET_UPSTREAM_KEY", KEY), ("DURAFIBER_SECRET_UPSTREAM_KEY_HOSTS", hosts.as_str())];
    let server = Served::start_env(dir.path(), &[] as &[&OsStr], &env);
    let http = server.client();
    let start = |order: &str, url: String| {
        let body = json!({"kind": "refund", "input": {"order_id": order, "amount_cents": 5, "customer_email": "a@b.c",
            "upstream": url, "api_key": {"secret": "upstream_key"}}});
        http.post(server.url("/runs")).header("Idempotency-Key", order).body(body.to_string()).send()
    };
    let mut runs = Vec::new();
    for (order, url) in [("honest", upstream.url()), ("stolen", thief.url())] {
        let started: Value = start(order, url).await.expect("start").json().await.expect("json");
        runs.push(started["run_id"].as_str().expect("id").to_string());
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut done: HashMap<String, Value> = HashMap::new();
    while done.len() < 2 {
        assert!(std::time::Instant::now() < deadline, "runs did not finish: {done:?}");
        let pending: Value =
            http.get(server.url("/approvals")).send().await.expect("list").json().await.expect("json");
        for p in pending.as_array().into_iter().flatten() {
            let path = format!(
                "/runs/{}/approvals/{}",
                p["run_id"].as_str().unwrap_or(""),
                p["approval_id"].as_str().unwrap_or("")
            );
            let decision = json!({"payload_hash": p["payload_hash"], "approved": true});
            let _ = http.post(server.url(&path)).body(decision.to_string()).send().await;
        }
        for run in &runs {
            let shown: Value = http
                .get(server.url(&format!("/runs/{run}")))
                .send()
                .await
                .expect("show")
                .json()
                .await
                .expect("json");
            let status = &shown["run"]["status"];
            if status.get("completed").is_some() || status.get("failed").is_some() {
                done.insert(run.clone(), shown);
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(done[&runs[0]]["run"]["status"].get("completed").is_some(), "the bound upstream got its key");
    let failed = done[&runs[1]]["run"]["status"]["failed"]["error"].as_str().unwrap_or_default().to_string();
    assert!(failed.contains("may not be sent to"), "{failed}");
    assert!(
        thief.objects("refunds").is_empty() && thief.objects("emails").is_empty(),
        "nothing reached the caller's server"
    );
    for shown in done.values() {
        assert!(!shown.to_string().contains(KEY));
    }
    // Nowhere else either: not the event stream, not the server's log, not the store's bytes.
    let events = http.get(server.url("/events")).send().await.expect("events").text().await.expect("text");
    assert!(events.contains("secret_refused") && !events.contains(KEY));
    let mut server = server;
    assert_eq!(server.sigterm(), Some(0));
    let log = server.log();
    assert!(log.contains("refused") && !log.contains(KEY), "the server's log");
    let mut stack = vec![dir.path().to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let bytes = std::fs::read(&path).expect("read");
                assert!(
                    !bytes.windows(KEY.len()).any(|w| w == KEY.as_bytes()),
                    "{} holds the key",
                    path.display()
                );
            }
        }
    }
}

/// Reads from `stream` until the server closes it; the time that took.
async fn closed_within(mut stream: tokio::net::TcpStream, limit: std::time::Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 4096];
    let read_to_end = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(limit, read_to_end).await.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_closed_and_every_refusal_is_json() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Served::start(dir.path());
    let limit = durafiber_runtime::limits::HTTP_HEADER_READ_TIMEOUT + std::time::Duration::from_secs(10);
    // Half-sent headers, and a connection left idle after its request: both are closed.
    let mut half = tokio::net::TcpStream::connect(server.addr).await.expect("connect");
    half.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1").await.expect("write");
    let mut idle = tokio::net::TcpStream::connect(server.addr).await.expect("connect");
    idle.write_all(format!("GET /health HTTP/1.1\r\nHost: {}\r\n\r\n", server.addr).as_bytes())
        .await
        .expect("write");
    let (half, idle) = tokio::join!(closed_within(half, limit), closed_within(idle, limit));
    assert!(half, "a client that never finishes its headers is closed");
    assert!(idle, "an idle keep-alive connection is closed");

    // A connection per request: the server closes one whose body it refused unread.
    let mut headers = reqwest::header::HeaderMap::new();
    headers
        .insert(reqwest::header::AUTHORIZATION, format!("Bearer {}", server.token).parse().expect("header"));
    headers.insert(reqwest::header::CONTENT_TYPE, "application/json".parse().expect("header"));
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .default_headers(headers)
        .build()
        .expect("client");
    let json_refusal = |r: reqwest::Response| async move {
        let status = r.status().as_u16();
        (
            status,
            r.json::<Value>().await.map(|v| v["kind"].as_str().unwrap_or("").to_string()).unwrap_or_default(),
        )
    };
    let long = format!("/runs/{}", "x".repeat(9 * 1024));
    assert_eq!(
        json_refusal(http.get(server.url(&long)).send().await.expect("answer")).await,
        (414, "UriTooLong".into())
    );
    let fat = "y".repeat(20 * 1024);
    let r = http.get(server.url("/runs")).header("x-fat", fat).send().await.expect("answer");
    assert_eq!(json_refusal(r).await, (431, "HeadersTooLarge".into()));
    let big = format!("{{\"kind\":\"steps\",\"input\":\"{}\"}}", "z".repeat(3 * 1024 * 1024));
    let r = http
        .post(server.url("/runs"))
        .header("Idempotency-Key", "big")
        .body(big)
        .send()
        .await
        .expect("answer");
    assert_eq!(r.headers().get("connection").and_then(|v| v.to_str().ok()), Some("close"));
    assert_eq!(json_refusal(r).await, (413, "PayloadTooLarge".into()));
    let r = http.get(server.url("/runs/%FF")).send().await.expect("answer");
    let (status, kind) = json_refusal(r).await;
    assert!(status == 400 && !kind.is_empty(), "a path that is not UTF-8: {status} {kind}");
    let r = http.delete(server.url("/runs/r/alarms/%00")).send().await.expect("answer");
    let (status, _) = json_refusal(r).await;
    let r = http.put(server.url("/runs/r/alarms/%00")).body("{\"delay_ms\":1}").send().await.expect("answer");
    assert_eq!(json_refusal(r).await.0, status, "a name is refused the same way on every method");
}

/// A GET of `/health` over TLS to `addr`, trusting only `cert`: the status line.
async fn https_health(addr: std::net::SocketAddr, cert: &rcgen::CertifiedKey) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::rustls::{self, pki_types::ServerName};
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.cert.der().clone()).expect("root");
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", addr.port())).await.expect("connect");
    let mut tls = connector
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
        .expect("TLS handshake");
    let request =
        format!("GET /health HTTP/1.1\r\nHost: localhost:{}\r\nConnection: close\r\n\r\n", addr.port());
    tls.write_all(request.as_bytes()).await.expect("write");
    let mut answer = String::new();
    let _ = tls.read_to_string(&mut answer).await;
    answer.lines().next().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_loopback_the_server_speaks_tls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("certificate");
    let (cert_file, key_file) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_file, cert.cert.pem()).expect("cert");
    std::fs::write(&key_file, cert.key_pair.serialize_pem()).expect("key");
    let mut child = std::process::Command::new(BIN)
        .args(["serve", "--data"])
        .arg(dir.path().join("data"))
        .args(["--listen", "0.0.0.0:0", "--tls-cert"])
        .arg(&cert_file)
        .arg("--tls-key")
        .arg(&key_file)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("serve");
    let stdout = child.stdout.take().expect("stdout");
    let line = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stdout).lines().next().and_then(Result::ok).unwrap_or_default()
    })
    .await
    .expect("line");
    let addr: std::net::SocketAddr =
        line.strip_prefix("listening on ").expect(&line).parse().expect("address");
    assert_eq!(https_health(addr, &cert).await, "HTTP/1.1 200 OK");
    // Plain HTTP to the TLS port gets no answer.
    let plain = reqwest::Client::new().get(format!("http://127.0.0.1:{}/health", addr.port())).send().await;
    assert!(plain.is_err() || plain.is_ok_and(|r| !r.status().is_success()));
    let _ = child.kill();
    let _ = child.wait();
}
