//! Slow or idle clients cannot hold the server: 300 connections from one address that send
//! their headers and then stall in the body take at most that client's share of the slots,
//! are answered 408 once `http_body_timeout` has passed, and meanwhile `/health` and an
//! admin's request from another address are answered at once. Stalled bodies from sixteen
//! addresses, renewed as they are cut, fill every connection but the share kept for callers
//! who sign in, and an admin is answered within a second all the while.

use std::{
    io::{Read, Write},
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;
use common::Served;

/// A request whose headers promise a body of 1,000 bytes, of which 10 are sent.
fn stalled(addr: std::net::SocketAddr, path: &str, token: &str) -> Option<TcpStream> {
    let mut stream = TcpStream::connect(addr).ok()?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"name\": \""
    );
    stream.write_all(head.as_bytes()).ok()?;
    Some(stream)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_bodies_from_one_client_do_not_stop_health_or_an_admin() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let config = dir.path().join("config.json");
    std::fs::write(&config, r#"{"http_body_timeout": "3s"}"#).expect("config");
    let server = Served::start_with(&data, &["--config".as_ref(), config.as_os_str()]);

    // 300 stalled bodies from 127.0.0.1: half on the unauthenticated sign-in form, half on
    // an API route with a valid token.
    let mut held = Vec::new();
    for n in 0..300 {
        let path = if n % 2 == 0 { "/ui/sign-in" } else { "/tokens" };
        held.extend(stalled(server.addr, path, &server.token));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Another client (127.0.0.2) is answered at once.
    let other = reqwest::Client::builder()
        .local_address(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)))
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    let began = Instant::now();
    let health = other.get(server.url("/health")).send().await.expect("/health answers");
    assert_eq!(health.status(), 200);
    let runs =
        other.get(server.url("/runs")).bearer_auth(&server.token).send().await.expect("an admin's read");
    assert_eq!(runs.status(), 200);
    assert!(began.elapsed() < Duration::from_secs(1), "answered after {:?}", began.elapsed());

    // The stalled bodies are refused with 408 once their time is up, and closed.
    let mut timed_out = 0;
    for mut stream in held {
        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        if answer.starts_with("HTTP/1.1 408") {
            assert!(answer.contains("RequestTimeout"), "{answer}");
            timed_out += 1;
        }
    }
    assert!(timed_out >= 1, "no stalled body was answered 408");
    let (status, _) = (other.get(server.url("/health")).send().await.expect("health").status(), ());
    assert_eq!(status, 200);
}

/// What the stalled requests of a siege heard back.
#[derive(Default)]
struct Heard {
    /// Cut at `http_body_timeout`.
    timed_out: AtomicUsize,
    /// Refused on a connection kept for callers who sign in.
    busy: AtomicUsize,
}

/// One stalled request after another from `from`, until `until`: a body promised and never
/// finished, without a token, opened again as soon as the server cuts it.
async fn stall_from(from: Ipv4Addr, server: SocketAddr, until: Instant, heard: Arc<Heard>) {
    while Instant::now() < until {
        let Ok(socket) = tokio::net::TcpSocket::new_v4() else { return };
        if socket.bind(SocketAddr::from((from, 0))).is_err() {
            return;
        }
        let Ok(mut stream) = socket.connect(server).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let head = format!(
            "POST /ui/sign-in HTTP/1.1\r\nHost: {server}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\ntoken="
        );
        if stream.write_all(head.as_bytes()).await.is_err() {
            continue;
        }
        let mut answer = Vec::new();
        let left = until.saturating_duration_since(Instant::now());
        let _ = tokio::time::timeout(left, stream.read_to_end(&mut answer)).await;
        let answer = String::from_utf8_lossy(&answer);
        if answer.starts_with("HTTP/1.1 408") {
            heard.timed_out.fetch_add(1, Ordering::Relaxed);
        } else if answer.starts_with("HTTP/1.1 503") && answer.contains("Busy") {
            heard.busy.fetch_add(1, Ordering::Relaxed);
            // Refused at once: a pause before the next, or the loop would only measure how
            // fast this machine opens connections.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_bodies_from_sixteen_addresses_never_keep_an_admin_out() {
    const ADDRESSES: u8 = 16;
    const PER_ADDRESS: usize = 40;
    const SIEGE: Duration = Duration::from_secs(60);
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let config = dir.path().join("config.json");
    // 512 connections: 384 for anyone and 128 kept for the signed-in, which the 640 stalled
    // requests overflow; the body timeout is the default's.
    std::fs::write(&config, r#"{"http_connections_max": 512}"#).expect("config");
    let server = Served::start_with(&data, &["--config".as_ref(), config.as_os_str()]);

    let until = Instant::now() + SIEGE;
    let heard = Arc::new(Heard::default());
    let mut siege = Vec::new();
    for a in 0..ADDRESSES {
        for _ in 0..PER_ADDRESS {
            let from = Ipv4Addr::new(127, 0, 1, 10 + a);
            siege.push(tokio::spawn(stall_from(from, server.addr, until, heard.clone())));
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A new connection for every probe, from an address of its own.
    let admin = reqwest::Client::builder()
        .local_address(IpAddr::V4(Ipv4Addr::new(127, 0, 2, 1)))
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    let mut probes = 0;
    while Instant::now() + Duration::from_secs(1) < until {
        let began = Instant::now();
        let runs = admin.get(server.url("/runs")).bearer_auth(&server.token).send().await;
        let runs_took = began.elapsed();
        let health = admin.get(server.url("/health")).send().await;
        let took = began.elapsed();
        let health_took = took.saturating_sub(runs_took);
        let runs = runs.map(|r| r.status().as_u16());
        let health = health.map(|r| r.status().as_u16());
        assert!(matches!(runs, Ok(200)), "probe {probes}: GET /runs answered {runs:?}");
        assert!(matches!(health, Ok(200)), "probe {probes}: /health answered {health:?}");
        assert!(runs_took < Duration::from_secs(1), "probe {probes}: GET /runs took {runs_took:?}");
        assert!(health_took < Duration::from_secs(1), "probe {probes}: /health took {health_took:?}");
        probes += 1;
        tokio::time::sleep(Duration::from_secs(1).saturating_sub(took)).await;
    }
    for task in siege {
        let _ = task.await;
    }
    assert!(probes >= 55, "{probes} probes in a minute");
    let (timed_out, busy) = (heard.timed_out.load(Ordering::Relaxed), heard.busy.load(Ordering::Relaxed));
    assert!(
        timed_out >= 384,
        "the stalled bodies held the open connections: {timed_out} cut at the body timeout"
    );
    assert!(
        busy >= 1,
        "the stalled requests overflowed into the share kept for the signed-in: {busy} refused there"
    );
}
