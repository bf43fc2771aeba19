//! Shared by the command-line tests: a real `durafiber serve` child on 127.0.0.1.

#![allow(dead_code)]

pub mod browser;
pub mod example;
pub mod nodes;

use std::{
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

pub const BIN: &str = env!("CARGO_BIN_EXE_durafiber");

pub struct Served {
    pub child: Child,
    pub addr: SocketAddr,
    /// The admin token the server wrote into its data directory.
    pub token: String,
    /// Where the server's stderr goes.
    log: tempfile::NamedTempFile,
}

impl Served {
    pub fn start(data: &Path) -> Served {
        Served::start_with(data, &[])
    }

    /// `serve` with more arguments (`--config FILE`).
    pub fn start_with(data: &Path, extra: &[&std::ffi::OsStr]) -> Served {
        Served::start_env(data, extra, &[])
    }

    /// `serve` with more arguments and environment variables (`DURAFIBER_SECRET_*`).
    pub fn start_env(data: &Path, extra: &[&std::ffi::OsStr], env: &[(&str, &str)]) -> Served {
        Served::start_program(Path::new(BIN), data, extra, env)
    }

    /// `PROGRAM serve` of any binary built on `durafiber-cli`, with more arguments and
    /// environment variables. The admin token is read when the data directory has one (a
    /// node that joins a database whose tokens exist writes none).
    pub fn start_program(
        program: &Path,
        data: &Path,
        extra: &[&std::ffi::OsStr],
        env: &[(&str, &str)],
    ) -> Served {
        let log = tempfile::NamedTempFile::new().expect("log file");
        let mut child = Command::new(program)
            .args(["serve", "--data"])
            .arg(data)
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .envs(env.iter().copied())
            .stderr(log.reopen().expect("server log"))
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn durafiber serve");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let line = rx.recv_timeout(Duration::from_secs(60)).expect("the server announces its address");
        let addr = line.strip_prefix("listening on ").expect("listening line").parse().expect("address");
        let token = std::fs::read_to_string(data.join("admin.token")).unwrap_or_default().trim().to_string();
        Served { child, addr, token, log }
    }

    /// An HTTP client that presents the admin token and speaks JSON.
    pub fn client(&self) -> reqwest::Client {
        self.client_with(&self.token)
    }

    /// An HTTP client that presents `token` and speaks JSON.
    pub fn client_with(&self, token: &str) -> reqwest::Client {
        let mut headers = reqwest::header::HeaderMap::new();
        let bearer = format!("Bearer {token}").parse().expect("header");
        headers.insert(reqwest::header::AUTHORIZATION, bearer);
        headers.insert(reqwest::header::CONTENT_TYPE, "application/json".parse().expect("header"));
        reqwest::Client::builder()
            .default_headers(headers)
            .timeout(Duration::from_secs(30))
            .build()
            .expect("client")
    }

    /// A token named `name` with `role`, made through the admin API.
    pub async fn create_token(&self, name: &str, role: &str) -> String {
        let r = self
            .client()
            .post(self.url("/tokens"))
            .body(serde_json::json!({"name": name, "role": role}).to_string())
            .send()
            .await
            .expect("an answer");
        assert_eq!(r.status(), reqwest::StatusCode::CREATED);
        let body: serde_json::Value = r.json().await.expect("json");
        body["token"].as_str().expect("token").to_string()
    }

    /// Starts a run of `kind` with `input` under idempotency key `key` (and `headers`, such
    /// as a `traceparent`), as the admin; the run's id.
    pub async fn start_run(
        &self,
        kind: &str,
        key: &str,
        input: serde_json::Value,
        headers: &[(&str, &str)],
    ) -> String {
        let mut request = self
            .client()
            .post(self.url("/runs"))
            .header("Idempotency-Key", key)
            .body(serde_json::json!({"kind": kind, "input": input}).to_string());
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let started: serde_json::Value = request.send().await.expect("start").json().await.expect("json");
        started["run_id"].as_str().unwrap_or_else(|| panic!("no run id in {started}")).to_string()
    }

    /// `GET /runs/{id}`, as the admin sees it.
    pub async fn run_view(&self, run_id: &str) -> serde_json::Value {
        let r = self.client().get(self.url(&format!("/runs/{run_id}"))).send().await.expect("run");
        r.json().await.expect("json")
    }

    /// Polls the run's view until `done` holds of it (a minute at most).
    pub async fn wait_run(
        &self,
        run_id: &str,
        what: &str,
        done: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let view = self.run_view(run_id).await;
            if done(&view) {
                return view;
            }
            assert!(std::time::Instant::now() < deadline, "the run is not {what}: {view}\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// What the server has written to stderr.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn sigkill(&mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }

    pub fn sigterm(&mut self) -> Option<i32> {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_child(&self.child),
            rustix::process::Signal::TERM,
        );
        self.child.wait().ok().and_then(|s| s.code())
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
