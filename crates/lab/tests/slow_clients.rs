//! Slow or idle clients cannot hold the server: 300 connections from one address that send
//! their headers and then stall in the body take at most that client's share of the slots,
//! are answered 408 once `http_body_timeout` has passed, and meanwhile `/health` and an
//! admin's request from another address are answered at once.

use std::{
    io::{Read, Write},
    net::{IpAddr, Ipv4Addr, TcpStream},
    time::{Duration, Instant},
};

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
