//! Shared by the model agent's tests: its binary serving on a port of 127.0.0.1 that it
//! comes back to after a kill, and polling with a deadline.

#![allow(dead_code)]

use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use durafiber::testkit::{openai::FakeOpenAi, upstream::Upstream};

/// A free port on 127.0.0.1, for servers that must come back at the same address.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// `model-agent serve` on `port` with more arguments and environment, returned once it
/// listens.
pub fn serve(
    data: &Path,
    port: u16,
    model: &FakeOpenAi,
    tools: &Upstream,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_model-agent"))
        .args(["serve", "--data"])
        .arg(data)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(extra)
        .envs(env.iter().copied())
        .env("DURAFIBER_MODEL_BASE_URL", model.base_url())
        .env("DURAFIBER_MODEL_NAME", "fake")
        .env("DURAFIBER_MODEL_KEY_SECRET", "model_key")
        .env("DURAFIBER_SECRET_MODEL_KEY", "sk-test-123")
        .env("DURAFIBER_SECRET_MODEL_KEY_HOSTS", model.base_url().trim_end_matches("/v1"))
        .env("DURAFIBER_TOOLS_URL", tools.url())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn model-agent serve");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let line = rx.recv_timeout(Duration::from_secs(60)).expect("the server announces its address");
    assert!(line.starts_with("listening on "), "{line}");
    child
}

/// The approval run `run_id` asks for, once it asks (within a minute).
pub async fn pending_approval(
    client: &durafiber::client::Client,
    run_id: &durafiber::RunId,
) -> durafiber::PendingApproval {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let pending = client.approvals().await.expect("approvals");
        if let Some(found) = pending.into_iter().find(|a| a.run_id == *run_id) {
            return found;
        }
        assert!(tokio::time::Instant::now() < deadline, "the run never asked for approval");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `check` every 20 ms until it holds, for at most a minute.
pub async fn eventually<F: std::future::Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A seed from the clock, printed by the test that draws from it.
pub fn rand_seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(7, |d| d.as_nanos() as u64)
}
